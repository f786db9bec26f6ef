"""Per-conversation settings: the system prompt, sampling values, and named presets to apply or save."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea
from textual.widgets.select import InvalidSelectValueError

from app.core.app_settings_schema import PRESET, PRESET_REPLY_FIELDS, PRESET_SAMPLING_FIELDS
from app.core.config import ConfigError, SamplingSettings, parse_field
from app.core.store import Preset
from engine_ext.settings_schema import Setting


@dataclass(frozen=True)
class ConversationSettingsResult:
    """What the user saved."""

    system_prompt: str
    sampling: SamplingSettings
    preset_name: str | None
    save_as: str | None
    tools: str = "none"
    """The tools the conversation offers: "none", "builtin" or "mcp:NAME" (app/core/generation/tools.py)."""


def thinking_hint(controls: tuple[str, ...]) -> str:
    """What the loaded model's template makes of the thinking controls, in a line."""
    if not controls:
        return "The model's template reads neither enable_thinking nor reasoning_effort; the budget still applies."
    return f"The model's template reads {' and '.join(controls)}."


def tool_format_hint(tool_format: str) -> str:
    """What the tools' tooltip adds about how the loaded model calls them."""
    if tool_format == "generic":
        return (
            ". This model's chat template shows no tools: they are described in a system message and its replies are"
            " held to llama.cpp's generic JSON format (a tool call or a response)"
        )
    return f". This model calls tools in its template's {tool_format} format" if tool_format else ""


class ConversationSettingsModal(ModalScreen[ConversationSettingsResult | None]):
    """Ctrl+S saves, Esc cancels (nothing changes)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: nothing changes"),
        Binding("ctrl+s", "save", "Save", tooltip="Save the conversation's settings"),
    ]

    def __init__(
        self,
        system_prompt: str,
        sampling: SamplingSettings,
        presets: list[Preset],
        thinking_controls: tuple[str, ...] | None = None,
        tools: str = "none",
        tool_choices: list[tuple[str, str]] | None = None,
        tool_format: str = "",
    ) -> None:
        """`thinking_controls`: what the loaded model's template reads of enable_thinking and reasoning_effort (None:
        not known); `tools`: the conversation's tool choice among `tool_choices` (label, value); `tool_format`: how
        the loaded model writes calls ("generic": its template shows no tools; "": not known)."""
        super().__init__(classes="dialog-screen")
        self.system_prompt = system_prompt
        self.thinking_controls = thinking_controls
        self.sampling = sampling
        self.tools = tools
        self.tool_format = tool_format
        self.tool_choices = tool_choices or [("none", "none")]
        if tools not in (value for _, value in self.tool_choices):  # a server no longer in config.toml
            self.tool_choices = [*self.tool_choices, (f"{tools} (not configured)", tools)]
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
                    for setting in PRESET_SAMPLING_FIELDS:
                        yield Label(setting.plain_label, classes="field-label")
                        yield self._field(setting)
                    # Beside the last sampling value: the tools the model may call (each call asks first).
                    yield Label("Tools", classes="field-label")
                    yield Select(
                        self.tool_choices,
                        value=self.tools,
                        id="tools-select",
                        allow_blank=False,
                        compact=True,
                        tooltip="The tools the model may call; each call asks you first (o once, c, a always, d deny)"
                        + tool_format_hint(self.tool_format),
                    )
                # The reasoning and the reply's shape, a value a line: their labels are long (the budget's special
                # values), and a choice is a Select whose options need their width.
                with Grid(id="reply-grid"):
                    for setting in PRESET_REPLY_FIELDS:
                        yield Label(setting.plain_label, classes="field-label")
                        yield self._field(setting)
                if self.thinking_controls is not None:
                    yield Label(thinking_hint(self.thinking_controls), id="thinking-controls", classes="field-label")
                with Horizontal(id="preset-save-row"):
                    yield Input(placeholder="save these values as a preset named…", id="preset-name", compact=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Label("Ctrl+S save · Esc cancel", classes="dialog-hint")

    def _field(self, setting: Setting[Any]) -> Input | Select[str]:
        """A preset value's field: a Select of its choices (reasoning effort, output format), else an Input."""
        value = str(getattr(self.sampling, setting.name))
        if setting.choices:
            choices = [(str(choice), str(choice)) for choice in setting.choices]
            if value not in setting.choices:  # a stored preset from elsewhere: kept, and refused on save
                choices.append((value, value))
            return Select(
                choices,
                value=value,
                id=f"sampling-{setting.name}",
                allow_blank=False,
                compact=True,
                tooltip=setting.help,
            )
        return Input(value, id=f"sampling-{setting.name}", compact=True, tooltip=setting.help)

    def _set_field(self, setting: Setting[Any], value: object) -> None:
        field = self.query_one(f"#sampling-{setting.name}")
        if isinstance(field, Select):
            try:
                field.value = str(value)
            except InvalidSelectValueError:  # a preset's value that is not a choice any more: the field keeps its own
                pass
        elif isinstance(field, Input):
            field.value = str(value)

    def _field_text(self, setting: Setting[Any]) -> str:
        field = self.query_one(f"#sampling-{setting.name}")
        if isinstance(field, Select):
            value = field.value
            return value if isinstance(value, str) else ""
        return field.value if isinstance(field, Input) else ""

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "preset-select" or not isinstance(event.value, str) or event.value not in self.presets:
            return
        sampling = SamplingSettings.from_json(self.presets[event.value].settings)
        for setting in PRESET:
            self._set_field(setting, getattr(sampling, setting.name))
        self._applied_preset = event.value

    def read_sampling(self) -> SamplingSettings:
        """The values typed or chosen, validated (ConfigError names the bad one)."""
        values = {
            setting.name: parse_field(setting, self._field_text(setting), setting.plain_label) for setting in PRESET
        }
        sampling = SamplingSettings(**values)
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
        tools = self.query_one("#tools-select", Select).value
        self.dismiss(
            ConversationSettingsResult(
                self.query_one("#system-prompt", TextArea).text,
                sampling,
                save_as or self._applied_preset,
                save_as,
                tools if isinstance(tools, str) else "none",
            )
        )

    def action_cancel(self) -> None:
        self.dismiss(None)
