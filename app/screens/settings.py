"""The settings screen: engine options and model folders, validated and saved to config.toml."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, TextArea

from app.config import FLASH_ATTENTION_MODES, THEMES, Config, ConfigError, EngineSettings
from engine_ext.params import KV_CACHE_TYPES

if TYPE_CHECKING:
    from app.tui import LlmtuiApp

NUMBER_FIELDS = {
    "n_ctx": "Context size (tokens; 0: the model's)",
    "n_threads": "Threads (0: automatic)",
    "n_gpu_layers": "GPU layers (-1: all, 0: none)",
    "n_batch": "Batch size",
}
CHOICE_FIELDS = {
    "flash_attn": ("Flash attention", FLASH_ATTENTION_MODES),
    "type_k": ("KV cache type K", KV_CACHE_TYPES),
    "type_v": ("KV cache type V", KV_CACHE_TYPES),
}


class SettingsScreen(Screen[bool]):
    """Ctrl+S saves (dismisses with True), Esc goes back without saving (False)."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("escape", "cancel", "Back"),
    ]

    app: LlmtuiApp

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config

    def compose(self) -> ComposeResult:
        engine = self.config.engine
        with Vertical(id="settings"):
            yield Label("Settings", classes="screen-title")
            with VerticalScroll(id="settings-body"):
                yield Label("Engine (applies when a model is next loaded)", classes="section-title")
                with Grid(classes="settings-grid"):
                    for name, label in NUMBER_FIELDS.items():
                        yield Label(label, classes="field-label")
                        yield Input(str(getattr(engine, name)), id=f"setting-{name}", type="integer", compact=True)
                    for name, (label, choices) in CHOICE_FIELDS.items():
                        yield Label(label, classes="field-label")
                        yield Select([(c, c) for c in choices], value=getattr(engine, name), allow_blank=False,
                                     id=f"setting-{name}", compact=True)
                    yield Label("Theme", classes="field-label")
                    yield Select([(t, t) for t in THEMES], value=self.config.theme, allow_blank=False,
                                 id="setting-theme", compact=True)
                yield Label("Model folders (one per line; .gguf files in them show in the model switcher)",
                            classes="section-title")
                yield TextArea("\n".join(self.config.model_folders), id="setting-model-folders", compact=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Back", id="cancel", compact=True)
        yield Footer()

    def read_config(self) -> Config:
        """The values on screen as a validated Config (ConfigError names the bad one)."""
        values: dict[str, object] = {}
        for name, label in NUMBER_FIELDS.items():
            text = self.query_one(f"#setting-{name}", Input).value.strip()
            try:
                values[name] = int(text)
            except ValueError:
                raise ConfigError(f"{label}: {text!r} is not a whole number") from None
        for name in CHOICE_FIELDS:
            values[name] = str(self.query_one(f"#setting-{name}", Select).value)
        engine = EngineSettings(**{f.name: values.get(f.name, getattr(self.config.engine, f.name))
                                   for f in fields(EngineSettings)})  # type: ignore[arg-type]
        folders_text = self.query_one("#setting-model-folders", TextArea).text
        folders = tuple(line.strip() for line in folders_text.splitlines() if line.strip())
        config = replace(self.config, engine=engine, model_folders=folders,
                         theme=str(self.query_one("#setting-theme", Select).value))
        config.validate()
        return config

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        try:
            config = self.read_config()
            self.app.save_settings(config)
        except ConfigError as error:
            self.notify(str(error), severity="error", timeout=8)
            return
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
