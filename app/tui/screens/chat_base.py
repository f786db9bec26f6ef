"""What the chat screen's parts share: its widgets, the conversation on screen, and the message tree's branches.

The chat screen is put together from one class per job (`chat_conversations.py`: the conversation list and its
actions; `chat_reply.py`: sending and streaming through the generation controller; `chat.py`: layout, keys, editing,
the steering panel); each reads the screen's widgets and state through this base.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen

from app.tui.screens.steering import SteeringPanel
from app.tui.widgets.attachments import AttachmentsBar
from app.tui.widgets.message_view import BranchInfo
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import ConversationList
from app.tui.widgets.status import AppHeader, StatsBar
from app.tui.widgets.transcript import Transcript

if TYPE_CHECKING:
    from app.core.store import Message
    from app.tui.shell import LlmtuiShell


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


class ChatBase(Screen[None]):
    """The chat screen's widgets and the state its parts share."""

    app: LlmtuiShell

    conversation_id: int | None
    """The conversation on screen (None: a new one, created with its first message)."""
    edit_target: int | None
    """The message being edited in the prompt, if any."""
    measured: set[int]
    """Replies whose figures (tok/s, TTFT…) were measured in this session on the model loaded now: the only ones
    the stats bar shows (an earlier session's or another model's figures would mislead)."""

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def attachments(self) -> AttachmentsBar:
        return self.query_one(AttachmentsBar)

    @property
    def stats(self) -> StatsBar:
        return self.query_one(StatsBar)

    @property
    def steering_panel(self) -> SteeringPanel:
        return self.query_one(SteeringPanel)

    @property
    def header(self) -> AppHeader:
        return self.query_one(AppHeader)

    @property
    def conversation_list(self) -> ConversationList:
        return self.query_one(ConversationList)

    def _busy(self) -> bool:
        """Whether a reply is being written (then saying so: the action waits for it)."""
        if self.app.generation.active is not None:
            self.notify("A reply is being written; press Esc to stop it first.", severity="warning")
            return True
        return False

    def _leave_edit_mode(self, *, restore: bool) -> None:
        """Stop editing a message (`restore`: put back what the prompt held before)."""
        raise NotImplementedError

    async def reload_transcript(self) -> None:
        """Show the conversation's branch again (after a change to the tree)."""
        raise NotImplementedError

    def refresh_conversation_list(self) -> None:
        """List the conversations again (or the search's hits)."""
        raise NotImplementedError

    async def _save_reply_edit(self, message_id: int, text: str) -> None:
        """Change a reply's text in place."""
        raise NotImplementedError

    def action_back(self) -> None:
        """Esc when no reply is being written."""
        raise NotImplementedError
