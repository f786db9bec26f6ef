"""Shown when the engine process dies: what happened, where its log is and how it ends, R to restart it, and the
settings that could avoid the crash (1…5: restart with one of them)."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from engine_ext.recovery import Fallback

LOG_LINES = 14  # the most lines of the engine's log shown at once (it scrolls)
RESTART = "restart"


class EngineCrashedModal(ModalScreen[str | None]):
    """Dismisses with RESTART when the user asks for a restart (R), a fallback's key for a restart with it (its
    number), None on Esc."""

    BINDINGS = [
        Binding("r", "restart", "Restart engine", tooltip="Restart the engine: the same settings"),
        Binding("escape", "close", "Close", tooltip="Close: the engine stays stopped (F5 restarts it)"),
        *(
            Binding(
                str(n), f"fallback({n})", "Restart with", show=False, tooltip=f"Restart with fallback {n}: as listed"
            )
            for n in range(1, 6)
        ),
    ]

    def __init__(
        self, description: str, log_tail: str, log_path: str = "", fallbacks: tuple[Fallback, ...] = ()
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.description = description
        self.log_tail = log_tail
        self.log_path = log_path
        self.fallbacks = fallbacks[:5]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="crash-dialog"):
            yield Label("The engine stopped", classes="dialog-title error")
            yield Static(
                f"{self.description[:1].upper()}{self.description[1:]}. Your conversation is saved; "
                "a reply being written was kept up to where it stopped.",
                classes="dialog-text",
            )
            log = Text(self.log_tail or "(the engine log is empty)", no_wrap=True)
            if self.log_path:  # the last line, in view with the log's end: the whole log is there
                log.append(f"\n\nThe whole log: {self.log_path}", style="bold")
            with VerticalScroll(id="crash-log"):
                yield Static(log, id="crash-log-text")
            keys = "R restart the engine and reload the model"
            if self.fallbacks:
                # Flags only (llama.cpp's names) in the line of keys, so it fits a small terminal; words in the tooltip.
                keys = "R restart · or with " + " · ".join(f"{n} {f.flag}" for n, f in enumerate(self.fallbacks, 1))
            hint = Static(f"{keys} · Esc close, F5 restarts later", id="crash-keys", classes="dialog-hint")
            if self.fallbacks:
                hint.tooltip = "\n".join(
                    f"{n}: restart with {f.what} ({f.flag}), for this session" for n, f in enumerate(self.fallbacks, 1)
                )
            yield hint

    def on_mount(self) -> None:
        self.call_after_refresh(self._fit_log)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._fit_log)

    def _fit_log(self) -> None:
        """Give the log what the screen leaves once the title, message and keys are shown (the dialog may use 90 %
        of the height): a long log in an 80x24 terminal pushed the line saying which keys restart or close off
        the screen."""
        dialog, log = self.query_one("#crash-dialog"), self.query_one("#crash-log")
        chrome = dialog.styles.gutter.height + sum(
            child.outer_size.height for child in dialog.children if child is not log
        )
        log.styles.max_height = max(3, min(LOG_LINES, int(self.size.height * 0.9) - chrome))
        log.scroll_end(animate=False)

    def action_restart(self) -> None:
        self.dismiss(RESTART)

    def action_fallback(self, number: int) -> None:
        if 1 <= number <= len(self.fallbacks):
            self.dismiss(self.fallbacks[number - 1].key)

    def action_close(self) -> None:
        self.dismiss(None)
