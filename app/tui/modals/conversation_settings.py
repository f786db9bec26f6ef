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
    changes: tuple[str, ...] = ()
    """What the save changed, a phrase each ("Temperature 0.8 → 0.5"), for the toast that says it was saved."""


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


def tools_note(tools: str, tool_format: str) -> str:
    """The line under the Tools choice: how the loaded model will call the chosen tools ("" when none are chosen
    or the format is not known)."""
    if tools == "none" or not tool_format:
        return ""
    if tool_format == "generic":
        return (
            "This model's chat template has no tools: llama.cpp's generic tool format is used (the tools described in"
            " a system message, each reply a JSON tool call or response)."
        )
    return f"This model calls tools in its template's {tool_format} format."


def tools_format_clash(tools: str, output_format: str, tool_format: str) -> str:
    """Why tools and an output format other than text cannot be saved together ("" when they can): the app's engine
    (its `tool_format` known) holds a reply with tools to their own format, so it refuses both at send."""
    if tools == "none" or output_format == "text" or not tool_format:
        return ""
    return (
        f"Tools and output format {output_format} cannot go together: a reply with tools keeps to the tool call "
        "format. Choose Tools none or output format text."
    )


TOOL_LABEL_CELLS = 58
"""The most cells a tool choice's label takes, so the choice stays one line at 80 columns (a long read_file folder
is cut from the left)."""


def fitted_label(label: str, cells: int = TOOL_LABEL_CELLS) -> str:
    """`label` in at most `cells` characters: a long folder inside it loses its start ("…/end/of/the/folder")."""
    if len(label) <= cells:
        return label
    start = label.find("/")
    if start < 0:
        return label[: cells - 1] + "…"
    head = label[:start]
    keep = cells - len(head) - 1
    if keep < 8:
        return label[: cells - 1] + "…"
    return head + "…" + label[len(label) - keep :]


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
                # The tools the model may call (each call asks first), a line of their own: a choice names a folder.
                with Horizontal(id="tools-row"):
                    yield Label("Tools ", classes="field-label")
                    yield Select(
                        [(fitted_label(label), value) for label, value in self.tool_choices],
                        value=self.tools,
                        id="tools-select",
                        allow_blank=False,
                        compact=True,
                        tooltip="The tools the model may call; each call asks you first (o once, c, a always, d deny)"
                        + tool_format_hint(self.tool_format),
                    )
                yield Label(tools_note(self.tools, self.tool_format), id="tools-note", classes="field-label")
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

    def on_mount(self) -> None:
        """The first field has the focus: typing at once goes into the system prompt."""
        self.query_one("#system-prompt", TextArea).focus()
        self.query_one("#tools-note", Label).display = bool(tools_note(self.tools, self.tool_format))

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "tools-select":
            note = tools_note(event.value if isinstance(event.value, str) else "none", self.tool_format)
            label = self.query_one("#tools-note", Label)
            label.update(note)
            label.display = bool(note)
            return
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
        chosen = self.query_one("#tools-select", Select).value
        tools = chosen if isinstance(chosen, str) else "none"
        if clash := tools_format_clash(tools, sampling.output_format, self.tool_format):
            self.notify(clash, severity="error")
            self.query_one("#tools-select", Select).focus()
            return
        system_prompt = self.query_one("#system-prompt", TextArea).text
        changes = [
            f"{setting.plain_label} {before} → {after}"
            for setting in PRESET
            if (before := getattr(self.sampling, setting.name)) != (after := getattr(sampling, setting.name))
        ]
        if system_prompt != self.system_prompt:
            changes.insert(0, "system prompt edited")
        if tools != self.tools:
            labels = dict((value, label) for label, value in self.tool_choices)
            changes.append(f"Tools {labels.get(self.tools, self.tools)} → {labels.get(tools, tools)}")
        self.dismiss(
            ConversationSettingsResult(
                system_prompt, sampling, save_as or self._applied_preset, save_as, tools, tuple(changes)
            )
        )

    def action_cancel(self) -> None:
        self.dismiss(None)
