"""What the chat screen's parts see of it, and the message tree's branches.

The chat screen (`chat_screen.py`: layout, keys, the message actions) is put together from parts that each own their
state: `chat_conversations.py` (the conversation list and what acts on a whole conversation), `chat_reply.py`
(sending and streaming through the generation controller), `chat_images.py` (attaching images) and
`chat_readouts.py` (the engine's and the features' readouts); the edit in progress is the `EditBanner`'s. A part
reaches the screen and its siblings only through `ChatView`, which the screen implements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from app.tui.widgets.message_view import BranchInfo

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel
    from textual.timer import Timer
    from textual.worker import Worker

    from app.core.store import Message
    from app.tui.screens.steering_panel import SteeringPanel
    from app.tui.shell import LlmtuiShell
    from app.tui.widgets.attachments import AttachmentsBar
    from app.tui.widgets.edit_banner import EditBanner
    from app.tui.widgets.prompt_input import PromptInput
    from app.tui.widgets.sidebar import ConversationList
    from app.tui.widgets.status import AppHeader, StatsBar
    from app.tui.widgets.transcript import Transcript


def branch_map(messages: list[Message]) -> dict[int, BranchInfo]:
    """Each message's position among its siblings (same parent), from one list of a conversation's messages."""
    by_parent: dict[int | None, list[Message]] = {}
    for message in messages:
        by_parent.setdefault(message.parent_id, []).append(message)
    branches: dict[int, BranchInfo] = {}
    for siblings in by_parent.values():
        siblings.sort(key=lambda m: (m.created_at, m.id))
        for index, message in enumerate(siblings):
            branches[message.id] = BranchInfo(index + 1, len(siblings))
    return branches


class ChatView(Protocol):
    """The chat screen as its parts see it: its widgets, the conversation on screen, and what one part asks of
    another (the screen passes it on)."""

    @property
    def app(self) -> LlmtuiShell: ...

    conversation_id: int | None
    """The conversation on screen (None: a new one, created with its first message)."""

    @property
    def transcript(self) -> Transcript: ...

    @property
    def prompt(self) -> PromptInput: ...

    @property
    def attachments(self) -> AttachmentsBar: ...

    @property
    def stats(self) -> StatsBar: ...

    @property
    def header(self) -> AppHeader: ...

    @property
    def conversation_list(self) -> ConversationList: ...

    @property
    def edit_banner(self) -> EditBanner: ...

    @property
    def steering_panel(self) -> SteeringPanel: ...

    def busy(self) -> bool:
        """Whether a reply is being written (then saying so: the action waits for it)."""
        ...

    def measured(self, message_id: int) -> bool:
        """Whether this reply's figures were measured in this session on the model loaded now."""
        ...

    async def reload_transcript(self) -> None:
        """Show the conversation's branch again (after a change to the tree)."""
        ...

    def refresh_conversation_list(self) -> None:
        """List the conversations again (or the search's hits)."""
        ...

    def back(self) -> None:
        """Esc when no reply is being written: leave editing, clear the search, or go back to the prompt."""
        ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...

    def refresh_bindings(self) -> None: ...

    def call_after_refresh(self, callback: Any, *args: Any, **kwargs: Any) -> bool: ...

    def call_later(self, callback: Any, *args: Any, **kwargs: Any) -> bool: ...

    def set_timer(
        self, delay: float, callback: Any = None, *, name: str | None = None, pause: bool = False
    ) -> Timer: ...

    def run_worker(
        self,
        work: Any,
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
        thread: bool = False,
    ) -> Worker[Any]: ...
