"""Dialogs of the models screen: what a download fetches (with which sidecars), and deleting a local model."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label
from textual.widgets.selection_list import Selection

from app.tui.widgets.tick_box import TickList
from engine_ext.gguf import format_bytes


class PullModal(ModalScreen[list[str] | None]):
    """Dismisses with the sidecar kinds to fetch with the model (maybe none), or None on Esc."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: nothing is downloaded"),
        Binding("d", "confirm", "Download", tooltip="Download the quant: with the sidecars ticked"),
    ]

    def __init__(
        self, title: str, model_files: list[tuple[str, int]], sidecars: dict[str, str], chosen: set[str], note: str = ""
    ) -> None:
        """`model_files`: (name, size); `sidecars`: kind -> what it is (file and size); `chosen`: kinds ticked."""
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.model_files = model_files
        self.sidecars = sidecars
        self.chosen = chosen
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="pull-dialog"):
            yield Label(self.title_text, classes="dialog-title")
            lines = Text("\n").join(
                Text.assemble((f"{name}  ", "bold"), (format_bytes(size), "dim")) for name, size in self.model_files
            )
            yield Label(lines, classes="dialog-text")
            if self.sidecars:
                yield Label("Sidecars paired with this quant (space toggles):", classes="field-label")
                yield TickList[str](
                    *(
                        Selection(f"{kind:<7} {what}", kind, kind in self.chosen)
                        for kind, what in self.sidecars.items()
                    ),
                    id="pull-sidecars",
                )
            if self.note:
                yield Label(self.note, classes="dialog-text warning")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Download", variant="primary", id="download", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Label("Enter on Download or d · shift+tab to the sidecars · Esc cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#download", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "download":
            self.action_confirm()
        else:
            self.action_cancel()

    def action_confirm(self) -> None:
        kinds: list[str] = []
        if self.sidecars:
            kinds = list(self.query_one("#pull-sidecars", TickList).selected)
        self.dismiss(kinds)

    def action_cancel(self) -> None:
        self.dismiss(None)


class DeleteModelModal(ModalScreen[bool]):
    """Asks before deleting a model; says what goes and how much space it frees. y deletes, n or Esc keeps."""

    BINDINGS = [
        Binding("escape,n", "keep", "Keep", tooltip="No: nothing is deleted"),
        Binding("y", "delete", "Delete", tooltip="Yes: delete (a model's files, or a download's partial file)"),
    ]

    def __init__(self, name: str, files: list[str], size: int) -> None:
        super().__init__(classes="dialog-screen")
        self.model_name = name
        self.files = files
        self.freed_bytes = size

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="delete-model-dialog"):
            yield Label(f"Delete {self.model_name}?", classes="dialog-title")
            yield Label("\n".join(self.files), classes="dialog-text")
            yield Label(f"This frees about {format_bytes(self.freed_bytes)}.", classes="dialog-text")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Delete", variant="error", id="delete", compact=True)
                yield Button("Keep", id="keep", compact=True)
            yield Label("y delete · n or Esc keep", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#keep", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "delete")

    def action_delete(self) -> None:
        self.dismiss(True)

    def action_keep(self) -> None:
        self.dismiss(False)
