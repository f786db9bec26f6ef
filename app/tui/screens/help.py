"""The help screen (F1 or ?): every key, by where it works, made from the bindings (`help_keys.py`), and the words the
screens use."""

from __future__ import annotations

from typing import Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from app.tui.screens.help_keys import key_sections
from app.tui.screens.models_local import STATUS_WORDS

WORDS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    (
        "Models: words",
        (*STATUS_WORDS.items(), ("unreadable", "ctrl+l: the model's GGUF header could not be read")),
    ),
    (
        "Speculative decoding: words",
        (
            ("~×1.3", "a speedup within the spread of the last replies, or one reply so far: no measurable difference"),
            ("proposed", "tokens the drafters proposed"),
            ("drafted", "those sent to verify (llama.cpp's n_drafted; cut after an end-of-generation token)"),
            ("accepted", "drafted tokens kept"),
        ),
    ),
)
"""What the screens' status words mean (not keys: those come from the bindings)."""


KEY_COLUMN: Final = 18
"""The keys' column, in cells: a key list longer than this wraps between its keys."""


def keys_table(app: type[App[object]]) -> Group:
    """Every place's keys, then the words: a title per place over its keys."""
    rows = [(title, [(entry.key_text, entry.what) for entry in entries]) for title, entries in key_sections(app)]
    parts: list[RenderableType] = []
    for index, (section, keys) in enumerate([*rows, *((title, list(words)) for title, words in WORDS)]):
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", width=KEY_COLUMN)
        table.add_column()
        for key, what in keys:
            table.add_row(key, what)
        parts += [Text("" if index == 0 else "\n") + Text(section, style="bold underline"), table]
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    """Every key; its own keys in its footer (the chat's stay under it)."""

    BINDINGS = [
        Binding("escape,f1,question_mark,q", "close", "Close"),
        Binding("pagedown,space", "scroll('page_down')", "Page down"),
        Binding("pageup", "scroll('page_up')", "Page up"),
        Binding("end", "scroll('end')", "End"),
        Binding("home", "scroll('home')", "Top"),
        Binding("down,j", "scroll('down')", "Down", show=False),
        Binding("up,k", "scroll('up')", "Up", show=False),
    ]

    CSS = """
    HelpScreen #help-dialog {
        height: 1fr;
        max-height: 100%;
    }
    HelpScreen #help-body {
        height: 1fr;
        max-height: 100%;
    }
    """
    """The help fills the height above its footer; its body scrolls (PgDn, End), and the hint under it stays in view
    (at 80×24 the body is 14 rows)."""

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="help-dialog"):
            yield Label("Keys", classes="dialog-title")
            with VerticalScroll(id="help-body", can_focus=False):
                yield Static(keys_table(type(self.app)), id="help-keys")
            yield Label("Esc close · PgDn/End more · ctrl+p finds any action by name", classes="dialog-hint")
        yield Footer(compact=True)

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        if where == "page_down":
            body.scroll_page_down(animate=False)
        elif where == "page_up":
            body.scroll_page_up(animate=False)
        elif where == "end":
            body.scroll_end(animate=False)
        elif where == "home":
            body.scroll_home(animate=False)
        else:
            body.scroll_relative(y=1 if where == "down" else -1, animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
