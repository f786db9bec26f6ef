"""The line above the message box while a message is edited: what Enter does with it. It holds the edit: which
message, whether it is a reply (changed in place) or a question (resent as a new branch), and what the box held
before, given back when the edit is cancelled."""

from __future__ import annotations

from textual.widgets import Static

from app.core.store import Message
from app.tui.widgets.prompt_input import PromptInput

REPLY_NOTE = (
    "Editing a reply: Enter saves the new text in place (then ctrl+g continues it if it is the last one), Esc cancels."
)
QUESTION_NOTE = "Editing an earlier message: Enter resends it as a new branch (the old one stays), Esc cancels."


class EditBanner(Static):
    """Shown while a message is edited in the prompt; hidden otherwise."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False
        self.target: int | None = None
        """The message being edited, if any."""
        self.is_reply = False
        """Whether `target` is a reply (changed in place) rather than a question (resent as a new branch)."""
        self._draft_before = ""

    def begin(self, message: Message, prompt: PromptInput) -> None:
        """Edit `message` in `prompt` (what the prompt held is kept for `end(restore=True)`)."""
        if self.target is None:
            self._draft_before = prompt.text
        self.target = message.id
        self.is_reply = message.role == "assistant"
        self.update(REPLY_NOTE if self.is_reply else QUESTION_NOTE)
        self.display = True
        prompt.load_text(message.content)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    def end(self, prompt: PromptInput, *, restore: bool) -> None:
        """Stop editing (`restore`: put back what the prompt held before)."""
        if self.target is None:
            return
        self.target = None
        self.is_reply = False
        self.display = False
        if restore:
            prompt.load_text(self._draft_before)
        self._draft_before = ""
