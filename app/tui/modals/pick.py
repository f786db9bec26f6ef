"""A dialog that picks one item of a short list (which code block to copy…)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList


class PickModal(ModalScreen[int | None]):
    """Dismisses with the index of the chosen item, or None on Esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", tooltip="Cancel: nothing is chosen")]

    def __init__(self, title: str, labels: list[str]) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.labels = labels

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield OptionList(*self.labels, id="pick-options")
            yield Label("Enter to choose · Esc to cancel", classes="dialog-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option_index)

    def action_cancel(self) -> None:
        self.dismiss(None)
