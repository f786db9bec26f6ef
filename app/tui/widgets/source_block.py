"""A source a reply was given, under the reply: its number, file, lines and score on one line (marked when the
reply cites it); Enter or Space unfolds it to the passage."""

from __future__ import annotations

from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import Static

from app.core.documents.retrieval import Citation
from engine_ext.untrusted_text import shown

MAX_PASSAGE_SHOWN = 6000


class SourceBlock(Static, can_focus=True):
    """One source of a reply, folded or unfolded."""

    BINDINGS = [
        Binding(
            "enter,space", "fold", "Show passage", show=False, tooltip="Show or hide a source's passage: under a reply"
        )
    ]
    DEFAULT_CSS = """
    SourceBlock { height: auto; padding: 0 1; border-left: tall $secondary; color: $text-muted; }
    SourceBlock.-cited { color: $text; }
    SourceBlock:focus { background: $boost; }
    """

    expanded: reactive[bool] = reactive(False)
    """Whether the passage is shown."""

    def __init__(self, citation: Citation, cited: bool, *, message_id: int) -> None:
        classes = f"-reply-{message_id}" + (" -cited" if cited else "")
        super().__init__(self._text(citation, cited, False), markup=False, classes=classes)
        self.citation = citation
        self.cited = cited
        self.message_id = message_id
        """The reply it was given to."""

    @staticmethod
    def summary(citation: Citation, cited: bool) -> str:
        mark = "cited" if cited else "given"
        return shown(f"[{citation.n}] {citation.where} · score {citation.score:.4f} · {mark}")[:300]

    @classmethod
    def _text(cls, citation: Citation, cited: bool, expanded: bool) -> str:
        head = ("▾ " if expanded else "▸ ") + cls.summary(citation, cited)
        if not expanded:
            return head
        passage = citation.text[:MAX_PASSAGE_SHOWN]
        more = "\n…" if len(citation.text) > MAX_PASSAGE_SHOWN else ""
        return f"{head}\n{shown(passage, multiline=True)}{more}"

    def watch_expanded(self, expanded: bool) -> None:
        self.update(self._text(self.citation, self.cited, expanded))

    def action_fold(self) -> None:
        self.expanded = not self.expanded
