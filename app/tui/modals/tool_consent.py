"""Consent for one tool call before it runs: the tool, where it comes from, its arguments. Keys: o allows once,
c for this conversation, a always (remembered in config.toml by whoever asked), d or Esc denies."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from app.core.generation.tools import ConsentAnswer
from app.core.tools.box import arguments_text
from engine_ext.protocol import ToolCall
from engine_ext.untrusted_text import shown


class ToolConsentModal(ModalScreen[ConsentAnswer]):
    """Asks whether a tool call may run; dismisses with the answer ("deny" on Esc)."""

    BINDINGS = [
        Binding("o", "answer('once')", "Allow once", tooltip="Allow the tool call once"),
        Binding("c", "answer('conversation')", "This conversation", tooltip="Allow the tool in this conversation"),
        Binding("a", "answer('always')", "Always", tooltip="Always allow this tool"),
        Binding("d,escape", "answer('deny')", "Deny", tooltip="Deny the tool call"),
    ]

    def __init__(self, call: ToolCall, source: str) -> None:
        super().__init__(classes="dialog-screen")
        self.call = call
        self.source = source

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="tool-consent"):
            yield Label(shown(f"Run tool {self.call.name}?")[:120], classes="dialog-title", id="tool-consent-title")
            yield Label(shown(f"from {self.source}")[:120], id="tool-consent-source")
            yield Static(arguments_text(self.call), id="tool-consent-arguments", markup=False)
            yield Label("o once · c this conversation · a always · d/Esc deny", classes="dialog-hint")

    def action_answer(self, answer: ConsentAnswer) -> None:
        self.dismiss(answer)
