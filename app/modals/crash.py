"""Shown when the engine process dies: what happened, the end of its log, and R to restart it."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

LOG_LINES = 14  # the most lines of the engine's log shown at once (it scrolls)


class EngineCrashedModal(ModalScreen[bool]):
    """Dismisses with True when the user asks for a restart (R), False on Esc."""

    BINDINGS = [
        Binding("r", "restart", "Restart engine"),
        Binding("escape", "close", "Close"),
    ]

    def __init__(self, description: str, log_tail: str) -> None:
        super().__init__(classes="dialog-screen")
        self.description = description
        self.log_tail = log_tail

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="crash-dialog"):
            yield Label("The engine stopped", classes="dialog-title error")
            yield Static(
                f"{self.description[:1].upper()}{self.description[1:]}. Your conversation is saved; "
                "a reply being written was kept up to where it stopped.",
                classes="dialog-text",
            )
            with VerticalScroll(id="crash-log"):
                yield Static(Text(self.log_tail or "(the engine log is empty)", no_wrap=True), id="crash-log-text")
            yield Static("R restart the engine and reload the model · Esc close, F5 restarts later",
                         classes="dialog-hint")

    def on_mount(self) -> None:
        self.call_after_refresh(self._fit_log)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._fit_log)

    def _fit_log(self) -> None:
        """Give the log what the screen leaves once the title, message and keys are shown (the dialog may use 90 %
        of the height): a long log in an 80x24 terminal pushed the line saying which keys restart or close off
        the screen."""
        dialog, log = self.query_one("#crash-dialog"), self.query_one("#crash-log")
        chrome = dialog.styles.gutter.height + sum(child.outer_size.height for child in dialog.children
                                                   if child is not log)
        log.styles.max_height = max(3, min(LOG_LINES, int(self.size.height * 0.9) - chrome))
        log.scroll_end(animate=False)

    def action_restart(self) -> None:
        self.dismiss(True)

    def action_close(self) -> None:
        self.dismiss(False)
