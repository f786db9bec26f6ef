"""The speculative-decoding panel (F9): a type the loaded model supports, the draft model, n_max/n_min/p_min."""

from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Checkbox, Input, Label, OptionList
from textual.widgets.option_list import Option

from app.config import ConfigError, SpeculativeSettings
from app.speculation import supported_types

NUMBER_FIELDS = (
    ("n_max", "most tokens drafted per step"),
    ("n_min", "drafts shorter than this are skipped"),
    ("p_min", "model drafts stop at a token less likely than this"),
)


class SpeculativePanel(ModalScreen[SpeculativeSettings | None]):
    """Enter on a type or ctrl+s applies (and turns speculation on unless switched off); Esc cancels.

    | Key | Action |
    | :- | :- |
    | enter | Use the highlighted type. |
    | ctrl+s | Apply. |
    | ctrl+b | Apply, then check: the same prompt with and without speculation (greedy), side by side. |
    | escape | Cancel: nothing changes. |
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "apply", "Apply"),
        Binding("ctrl+b", "check", "Check"),
    ]

    def __init__(self, settings: SpeculativeSettings, model_path: str | None, model_name: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.settings = settings
        self.model_path = model_path
        self.model_name = model_name
        self.types: list[str] = []
        self.check_after = False
        """Whether the user asked for the speculation check with these settings (ctrl+b)."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="spec-panel"):
            title = "Speculative decoding" + (f" · {self.model_name}" if self.model_name else "")
            yield Label(title, classes="dialog-title")
            # Opening the panel means wanting speculation: on unless unticked.
            yield Checkbox("Speculative decoding on (F8 toggles it from the chat)", True, id="spec-enabled",
                           compact=True)
            yield Label("Type (the ones this model supports)", classes="field-label")
            yield OptionList(id="spec-types")
            yield Label("Draft model (a small model, EAGLE3, DFlash, DSpark or mtp-*.gguf)", classes="field-label")
            yield Input(self.settings.draft_model, placeholder="path to a draft .gguf (optional)", id="spec-draft",
                        compact=True)
            with Grid(id="spec-grid"):
                for name, meaning in NUMBER_FIELDS:
                    yield Label(name, classes="field-label")
                    yield Input(str(getattr(self.settings, name)), id=f"spec-{name}", compact=True, tooltip=meaning)
            yield Label("Enter use the type · ctrl+s apply · ctrl+b apply and check · Esc cancel",
                        classes="dialog-hint")

    def on_mount(self) -> None:
        self._fill_types(self.settings.spec_type)
        self.query_one(OptionList).focus()

    def _fill_types(self, selected: str) -> None:
        options = self.query_one(OptionList)
        draft = self.query_one("#spec-draft", Input).value
        pairs = supported_types(self.model_path, draft)
        self.types = [spec_type for spec_type, _ in pairs]
        options.clear_options()
        options.add_options([Option(f"{spec_type:13} {help_text}", id=spec_type) for spec_type, help_text in pairs])
        options.highlighted = self.types.index(selected) if selected in self.types else 0

    @on(Input.Changed, "#spec-draft")
    def _draft_changed(self, event: Input.Changed) -> None:
        options = self.query_one(OptionList)
        current = self.types[options.highlighted] if options.highlighted is not None and self.types else "auto"
        self._fill_types(current)

    @on(OptionList.OptionSelected)
    def _type_chosen(self, event: OptionList.OptionSelected) -> None:
        self.action_apply()

    def read_settings(self) -> SpeculativeSettings:
        """The values on screen, validated (ConfigError says which is wrong)."""
        options = self.query_one(OptionList)
        if options.highlighted is None or not self.types:
            raise ConfigError("pick a speculative type")
        values: dict[str, int | float] = {}
        for name, _ in NUMBER_FIELDS:
            text = self.query_one(f"#spec-{name}", Input).value.strip()
            kind = type(getattr(self.settings, name))
            try:
                values[name] = kind(text)
            except ValueError:
                raise ConfigError(f"{name}: {text!r} is not a {'whole ' if kind is int else ''}number") from None
        settings = replace(
            self.settings,
            enabled=self.query_one(Checkbox).value,
            spec_type=self.types[options.highlighted],
            draft_model=self.query_one("#spec-draft", Input).value.strip(),
            **values,  # type: ignore[arg-type]
        )
        settings.validate()
        return settings

    def action_apply(self) -> None:
        try:
            settings = self.read_settings()
        except ConfigError as error:
            self.notify(str(error), severity="error")
            return
        self.dismiss(settings)

    def action_check(self) -> None:
        try:
            settings = self.read_settings()
        except ConfigError as error:
            self.notify(str(error), severity="error")
            return
        self.check_after = True
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
