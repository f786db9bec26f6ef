"""The quick model switcher: the starter model and the .gguf files in the configured model folders."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from app.model_list import LocalModel, human_size


class ModelSwitcherModal(ModalScreen[Path | None]):
    """Type to filter, Enter loads, Esc cancels; dismisses with the chosen model file."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("down", "move(1)", "Down", show=False),
        Binding("up", "move(-1)", "Up", show=False),
    ]

    def __init__(self, models: list[LocalModel], current: str | None) -> None:
        super().__init__(classes="dialog-screen")
        self.models = models
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Switch model", classes="dialog-title")
            yield Input(placeholder="Filter models", id="model-filter")
            yield OptionList(id="model-options")
            yield Label("Enter load · Esc cancel · add model folders in Settings (F3)", classes="dialog-hint")

    def on_mount(self) -> None:
        self._fill("")

    def _fill(self, query: str) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        needle = query.casefold().strip()
        for index, model in enumerate(self.models):
            if needle and needle not in model.name.casefold() and needle not in str(model.path).casefold():
                continue
            label = Text()
            label.append("● " if str(model.path) == self.current else "  ", style="bold green")
            label.append(model.name, style="bold")
            label.append(f"  {human_size(model.size_bytes)}  ", style="dim")
            label.append(model.source if model.source == "starter" else str(model.path.parent), style="dim italic")
            options.add_option(Option(label, id=str(index)))
        if options.option_count == 0:
            options.add_option(Option(Text("No models found. Add a folder with .gguf files in Settings (F3).",
                                           style="italic"), id="none", disabled=True))
        else:
            options.highlighted = 0

    def on_input_changed(self, event: Input.Changed) -> None:
        self._fill(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            self._choose(options.get_option_at_index(options.highlighted).id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._choose(event.option.id)

    def _choose(self, option_id: str | None) -> None:
        if option_id is not None and option_id.isdigit():
            self.dismiss(self.models[int(option_id)].path)

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        if step > 0:
            options.action_cursor_down()
        else:
            options.action_cursor_up()

    def action_cancel(self) -> None:
        self.dismiss(None)
