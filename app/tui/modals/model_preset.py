"""F4's serve preset dialog: a model's `[models."ID"]` table in config.toml (app/core/model_presets.py), one field per
declaration of `MODEL_PRESET`; an empty field leaves the setting to `llmtui serve`'s flags."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select

from app.core.app_settings_schema import MODEL_PRESET
from app.core.model_presets import ModelPreset, PresetError, checked_value, value_text
from engine_ext import settings_schema as s
from engine_ext.setting import Setting, SettingError


class ModelPresetModal(ModalScreen[ModelPreset | None]):
    """Dismisses with the model's preset as edited (no values: none), or None on Esc.

    | key | action |
    |---|---|
    | ctrl+s | save |
    | escape | cancel |
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: the preset unchanged"),
        Binding("ctrl+s", "save", "Save", tooltip="Save the preset: written to config.toml, comments kept"),
    ]

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__(classes="dialog-screen")
        self.preset = preset

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="model-preset"):
            yield Label(f"Serve preset: {self.preset.model}", classes="dialog-title")
            yield Label(
                f'config.toml [models."{self.preset.model}"]: how `llmtui serve` loads and answers with this model; '
                "an empty field: serve's flags. A request's own fields win.",
                classes="dialog-text",
            )
            with VerticalScroll(id="model-preset-body"), Grid(id="model-preset-grid"):
                for setting in MODEL_PRESET:
                    yield Label(setting.screen_label, classes="field-label")
                    yield self._field(setting)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Label("Ctrl+S save · Esc cancel", classes="dialog-hint")

    def _field(self, setting: Setting[Any]) -> Input | Select[str]:
        value = self.preset.get(setting)
        text = "" if value is None else value_text(setting, value)
        field_id = f"preset-{setting.name}"
        if setting.choices or setting.kind is bool:
            choices = setting.choices or ("on", "off")
            # The value given to the constructor: one set before the Select is mounted is kept but not shown
            return Select(
                [(choice, choice) for choice in choices],
                id=field_id,
                allow_blank=True,
                prompt="(serve's)",
                value=text if text in choices else Select.NULL,
                compact=True,
                tooltip=setting.help,
            )
        return Input(text, placeholder="(serve's)", id=field_id, compact=True, tooltip=setting.help)

    def read_preset(self) -> ModelPreset:
        """The values typed or chosen, each checked by its declaration (PresetError names the bad one)."""
        values = []
        for setting in MODEL_PRESET:
            field = self.query_one(f"#preset-{setting.name}")
            raw = field.value if isinstance(field, Input | Select) else None
            text = raw.strip() if isinstance(raw, str) else ""
            if not text:
                continue
            where = setting.words
            try:
                if setting is s.N_GPU_LAYERS and text.lower() == "auto":
                    value: Any = text
                elif setting.kind is bool:
                    value = text == "on"
                else:
                    value = setting.parse(text, where)
            except SettingError as error:
                raise PresetError(str(error)) from None
            values.append((setting.name, checked_value(setting, value, where)))
        return ModelPreset(self.preset.model, tuple(values))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        try:
            preset = self.read_preset()
        except PresetError as error:
            self.notify(str(error), severity="error")
            return
        self.dismiss(preset)

    def action_cancel(self) -> None:
        self.dismiss(None)
