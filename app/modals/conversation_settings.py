"""Per-conversation settings: the system prompt, sampling values, and named presets to apply or save."""

from __future__ import annotations

from dataclasses import dataclass, fields

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

from app.config import ConfigError, SamplingSettings
from app.store import Preset

FIELD_LABELS = {
    "temperature": "Temperature",
    "top_k": "Top-k",
    "top_p": "Top-p",
    "min_p": "Min-p",
    "repeat_penalty": "Repeat penalty",
    "max_tokens": "Max tokens (-1: no limit)",
    "seed": "Seed (-1: random)",
}


@dataclass(frozen=True)
class ConversationSettingsResult:
    """What the user saved."""

    system_prompt: str
    sampling: SamplingSettings
    preset_name: str | None
    save_as: str | None


class ConversationSettingsModal(ModalScreen[ConversationSettingsResult | None]):
    """Ctrl+S saves, Esc cancels (nothing changes)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "save", "Save"),
    ]

    def __init__(self, system_prompt: str, sampling: SamplingSettings, presets: list[Preset]) -> None:
        super().__init__(classes="dialog-screen")
        self.system_prompt = system_prompt
        self.sampling = sampling
        self.presets = {preset.name: preset for preset in presets}
        self._applied_preset: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="conversation-settings"):
            yield Label("Conversation settings", classes="dialog-title")
            with VerticalScroll(id="conversation-settings-body"):
                yield Label("System prompt", classes="field-label")
                yield TextArea(self.system_prompt, id="system-prompt", soft_wrap=True, compact=True)
                yield Label("Preset", classes="field-label")
                yield Select(
                    [(name, name) for name in self.presets],
                    prompt="apply a saved preset…",
                    id="preset-select",
                    allow_blank=True,
                    compact=True,
                )
                with Grid(id="sampling-grid"):
                    for field in fields(SamplingSettings):
                        yield Label(FIELD_LABELS[field.name], classes="field-label")
                        yield Input(str(getattr(self.sampling, field.name)), id=f"sampling-{field.name}", compact=True)
                with Horizontal(id="preset-save-row"):
                    yield Input(placeholder="save these values as a preset named…", id="preset-name", compact=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Label("Ctrl+S save · Esc cancel", classes="dialog-hint")

    def on_select_changed(self, event: Select.Changed) -> None:
        if not isinstance(event.value, str) or event.value not in self.presets:
            return
        sampling = SamplingSettings.from_json(self.presets[event.value].settings)
        for field in fields(SamplingSettings):
            self.query_one(f"#sampling-{field.name}", Input).value = str(getattr(sampling, field.name))
        self._applied_preset = event.value

    def read_sampling(self) -> SamplingSettings:
        """The values typed, validated (ConfigError names the bad one)."""
        values: dict[str, float | int] = {}
        defaults = SamplingSettings()
        for field in fields(SamplingSettings):
            text = self.query_one(f"#sampling-{field.name}", Input).value.strip()
            kind = type(getattr(defaults, field.name))
            try:
                values[field.name] = kind(text)
            except ValueError:
                whole = "whole " if kind is int else ""
                raise ConfigError(f"{FIELD_LABELS[field.name]}: {text!r} is not a {whole}number") from None
        sampling = SamplingSettings(**values)  # type: ignore[arg-type]
        sampling.validate()
        return sampling

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        try:
            sampling = self.read_sampling()
        except ConfigError as error:
            self.notify(str(error), severity="error")
            return
        save_as = self.query_one("#preset-name", Input).value.strip() or None
        self.dismiss(
            ConversationSettingsResult(
                self.query_one("#system-prompt", TextArea).text, sampling, save_as or self._applied_preset, save_as
            )
        )

    def action_cancel(self) -> None:
        self.dismiss(None)
