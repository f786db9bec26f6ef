"""A tool call and its result under a reply, folded to one line (the tool, its source, the outcome); Enter or Space
unfolds it to the arguments and the result."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from app.core.tools.box import arguments_text
from app.core.tools.loop import CallRecord
from engine_ext.untrusted_text import shown

MAX_RESULT_SHOWN = 4000


class ToolCallBlock(Static, can_focus=True):
    """One call of a reply, folded or unfolded."""

    BINDINGS = [Binding("enter,space", "fold", "Fold/unfold", show=False, tooltip="Fold or unfold a tool call")]
    DEFAULT_CSS = """
    ToolCallBlock { height: auto; padding: 0 1; border-left: tall $accent; }
    ToolCallBlock.-failed { border-left: tall $error; }
    """

    expanded: reactive[bool] = reactive(False)
    """Whether the arguments and the result are shown."""

    class Toggled(Message):
        def __init__(self, block: ToolCallBlock) -> None:
            super().__init__()
            self.block = block

        @property
        def control(self) -> ToolCallBlock:
            return self.block

    def __init__(self, record: CallRecord, *, message_id: int | None = None, id: str | None = None) -> None:
        classes = ("-failed" if record.failed else "") + (f" -reply-{message_id}" if message_id is not None else "")
        super().__init__(self._text(record, False), markup=False, id=id, classes=classes.strip())
        self.record = record
        self.message_id = message_id
        """The reply that made the call (None: shown on its own)."""

    @staticmethod
    def summary(record: CallRecord) -> str:
        if not record.allowed:
            outcome = "not offered" if not record.source else "denied"
        elif record.failed:
            outcome = f"failed after {record.seconds:.1f} s"
        else:
            outcome = f"{len(record.result)} characters in {record.seconds:.1f} s"
        return shown(f"tool {record.call.name} · {record.source or 'no such tool'} · {outcome}")[:200]

    def _text(self, record: CallRecord, expanded: bool) -> str:
        head = ("▾ " if expanded else "▸ ") + self.summary(record)
        if not expanded:
            return head
        result = record.result
        if len(result) > MAX_RESULT_SHOWN:
            result = result[:MAX_RESULT_SHOWN] + f"\n… ({len(record.result)} characters)"
        return f"{head}\narguments:\n{arguments_text(record.call)}\nresult:\n{shown(result, multiline=True)}"

    def watch_expanded(self, expanded: bool) -> None:
        self.update(self._text(self.record, expanded))
        self.post_message(self.Toggled(self))

    def action_fold(self) -> None:
        self.expanded = not self.expanded
