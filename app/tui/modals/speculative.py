"""The speculative-decoding panel (F9): a type the loaded model supports, the draft model, n_max/n_min/p_min."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState, get_current_worker

from app.core.config import ConfigError, SpeculativeSettings, parse_field
from app.core.model_paths import usable_folders, user_path
from app.core.speculation_facts import KIND_TYPES, effective_settings, find_drafts, supported_types
from app.tui.modals.pick import PickModal
from app.tui.widgets.tick_box import TickBox
from engine_ext.gguf import GGUFError, format_bytes
from engine_ext.settings_schema import DRAFT_NUMBERS
from engine_ext.spec_catalog import DRAFT_FILE_LABELS
from models_catalog.drafts import DraftCandidate
from models_catalog.errors import ModelsError

NUMBER_FIELDS = DRAFT_NUMBERS  # n_max, n_min, p_min: named as in config.toml, their help as a tooltip


def missing_drafts_hint(missing: Sequence[tuple[str, str]]) -> str:
    """A few words saying which paired drafts are not downloaded and where to get them (the draft field's
    placeholder: the panel has no row to spare at 80×24)."""
    what = ", ".join(DRAFT_FILE_LABELS.get(kind, kind) for kind, _ in missing)
    return f"a draft .gguf; not downloaded: {what} (Models, F4)"


DRAFT_LABEL = "Draft model (ctrl+d lists the drafts found on this machine)"
TYPING_PAUSE_S = 0.15
"""The draft field is read (its file's header) once typing pauses this long, not on every keystroke."""


class SpeculativeModal(ModalScreen[SpeculativeSettings | None]):
    """Enter on a type or ctrl+s applies (and turns speculation on unless switched off); Esc cancels."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: nothing changes"),
        Binding("ctrl+s", "apply", "Apply", tooltip="Apply: speculation on unless switched off"),
        Binding(
            "ctrl+d",
            "pick_draft",
            "Drafts",
            tooltip="Pick a draft model: among those found on this machine that fit the model",
        ),
        Binding(
            "ctrl+b",
            "check",
            "Check",
            tooltip="Check: apply, then the same prompt greedy without and with speculation (the same text?)",
        ),
    ]

    def __init__(
        self,
        settings: SpeculativeSettings,
        model_path: str | None,
        model_name: str = "",
        sidecars: Sequence[DraftCandidate] = (),
        missing: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.settings = settings
        self.model_path = model_path
        self.model_name = model_name
        self.sidecars = tuple(sidecars)
        """The drafts the model brings along: with no draft file named, the type's own is used."""
        self.missing = tuple(missing)
        """(kind, repository) of the drafts the catalog pairs with the model that are not downloaded."""
        self.types: list[str] = []
        self.placeholders: dict[str, str] = {}
        """Per type shown: what an empty draft field means for it (read with the types, off the event loop)."""
        self.reading = False
        """Whether the types are being read (the model's and the draft file's headers, in a thread)."""
        self._pending_type: str | None = None
        self._typing: Timer | None = None
        self.check_after = False
        """Whether the user asked for the speculation check with these settings (ctrl+b)."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="spec-panel"):
            title = "Speculative decoding" + (f" · {self.model_name}" if self.model_name else "")
            yield Label(title, classes="dialog-title")
            # Opening the panel means wanting speculation: on unless unticked.
            yield TickBox(
                "Speculative decoding on (F8 toggles it from the chat)", True, id="spec-enabled", compact=True
            )
            yield Label("Type (the ones this model supports)", classes="field-label")
            yield OptionList(id="spec-types")
            yield Label(DRAFT_LABEL, classes="field-label", id="spec-draft-label")
            yield Input(self.settings.draft_model, placeholder="", id="spec-draft", compact=True)
            with Grid(id="spec-grid"):
                for setting in NUMBER_FIELDS:
                    value = str(getattr(self.settings, setting.name))
                    yield Label(setting.name, classes="field-label")
                    yield Input(value, id=f"spec-{setting.name}", compact=True, tooltip=setting.help)
            yield Label(
                "Enter use the type · ctrl+s apply · ctrl+b apply and check · Esc cancel", classes="dialog-hint"
            )

    def on_mount(self) -> None:
        self._fill_types(self.settings.spec_type)
        self.query_one("#spec-types", OptionList).focus()

    def _draft_placeholder(self, spec_type: str) -> str:
        """What an empty draft field means for `spec_type`: the model's own sidecar, or none (reads the model's
        header: called in the worker)."""
        chosen = effective_settings(
            self.model_path, replace(self.settings, spec_type=spec_type, draft_model=""), self.sidecars
        ).draft_model
        if chosen:
            return f"empty: {Path(chosen).name} (beside the model)"
        return missing_drafts_hint(self.missing) if self.missing else "path to a draft .gguf (optional)"

    def _fill_types(self, selected: str) -> None:
        """Read the types the model and the draft field allow in a thread (a newer read cancels an older one),
        then show them with `selected` highlighted; meanwhile the panel says it is reading."""
        draft = self.query_one("#spec-draft", Input).value
        if user_path(draft.strip()) is None:  # not a path (a NUL byte, ~ of an unknown user): no draft type from it
            draft = ""
        self._pending_type = selected
        self._show_reading(True)
        self._read_types(selected, draft)

    def _show_reading(self, reading: bool) -> None:
        self.reading = reading
        self.query_one("#spec-draft-label", Label).update(DRAFT_LABEL + (" · reading…" if reading else ""))
        options = self.query_one("#spec-types", OptionList)
        if reading and not self.types and options.option_count == 0:
            options.add_option(Option("reading the model's header…", id="spec-reading", disabled=True))

    @work(thread=True, exclusive=True, group="spec-types", exit_on_error=False)
    def _read_types(self, selected: str, draft: str) -> None:
        """The types and placeholders: GGUF headers (the model's, the draft file's) are read here, never on the
        event loop."""
        pairs = supported_types(self.model_path, draft, self.sidecars)
        placeholders = {spec_type: self._draft_placeholder(spec_type) for spec_type, _ in pairs}
        if not get_current_worker().is_cancelled:  # a newer read (the field changed again) shows its own
            self.app.call_from_thread(self._show_types, selected, pairs, placeholders)

    def _show_types(self, selected: str, pairs: list[tuple[str, str]], placeholders: dict[str, str]) -> None:
        if not self.is_attached:
            return
        typing = self._typing is not None  # a newer read is due once the typing pauses: still reading
        if self._pending_type is not None:
            selected = self._pending_type
        if not typing:
            self._pending_type = None
        self.placeholders = placeholders
        options = self.query_one("#spec-types", OptionList)
        self.types = [spec_type for spec_type, _ in pairs]
        options.clear_options()
        options.add_options([Option(f"{spec_type:13} {help_text}", id=spec_type) for spec_type, help_text in pairs])
        options.highlighted = self.types.index(selected) if selected in self.types else 0
        self.query_one("#spec-draft", Input).placeholder = placeholders.get(self.types[options.highlighted], "")
        self._show_reading(typing)

    @on(Input.Changed, "#spec-draft")
    def _draft_changed(self, event: Input.Changed) -> None:
        """Typing in the draft field: the types are read again once the typing pauses."""
        options = self.query_one("#spec-types", OptionList)
        current = self._pending_type or (
            self.types[options.highlighted] if options.highlighted is not None and self.types else "auto"
        )
        self._pending_type = current
        self._show_reading(True)
        if self._typing is not None:
            self._typing.stop()
        self._typing = self.set_timer(TYPING_PAUSE_S, lambda: self._typing_paused(current))

    def _typing_paused(self, current: str) -> None:
        self._typing = None
        self._fill_types(self._pending_type or current)

    @on(OptionList.OptionHighlighted, "#spec-types")
    def _type_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id and event.option.id in self.placeholders:
            self.query_one("#spec-draft", Input).placeholder = self.placeholders[event.option.id]

    @on(OptionList.OptionSelected, "#spec-types")
    def _type_chosen(self, event: OptionList.OptionSelected) -> None:
        self.action_apply()

    def action_pick_draft(self) -> None:
        if not self.model_path:
            self.notify("Load a model first: drafts are matched to it.", severity="warning")
            return
        self._find_drafts(self.model_path)

    @work(thread=True, exclusive=True, group="find-drafts", exit_on_error=False)
    def _find_drafts(self, model_path: str) -> None:
        """Read the headers of the library's models (slow for many) off the event loop, then offer the fitting."""
        folders = usable_folders(self.app.config.model_folders)  # type: ignore[attr-defined]
        try:
            found, _ = find_drafts(model_path, folders, same_vocabulary=True)
        except (ModelsError, GGUFError, OSError, ValueError) as error:  # the files of the library, as they are
            self.app.call_from_thread(self._drafts_not_found, f"{error}")
            return
        self.app.call_from_thread(self._offer_drafts, found)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The draft search reads every model file in the library (exit_on_error=False): an error it did not expect
        would otherwise exit the whole app; it is said in one line instead, and the panel stays."""
        if event.state != WorkerState.ERROR or event.worker.node is not self:
            return
        error = f"{type(event.worker.error).__name__}: {event.worker.error}"
        if event.worker.group == "spec-types":
            self._pending_type = None
            self._show_reading(False)
            text = " ".join(f"The model's speculative types could not be read: {error}".split())
            self.notify(text if len(text) <= 300 else text[:299] + "…", severity="error", timeout=10)
            return
        self._drafts_not_found(error)

    def _drafts_not_found(self, error: str) -> None:
        text = " ".join(f"Drafts could not be looked for: {error}".split())
        self.notify(text if len(text) <= 300 else text[:299] + "…", severity="error", timeout=10)

    def _offer_drafts(self, found: list[DraftCandidate]) -> None:
        if not found:
            self.notify(
                "No draft fits this model here: no mtp-/dflash-/dspark-/eagle3- file beside it, no paired "
                "draft in the cache, no smaller model with its vocabulary. Type a path instead.",
                severity="warning",
            )
            return
        labels = [f"{KIND_TYPES[c.kind]:13} {c.path.name}\n{'':13} {c.where} · {format_bytes(c.size)}" for c in found]

        def chosen(index: int | None) -> None:
            if index is not None:
                self.query_one("#spec-draft", Input).value = str(found[index].path)  # refills the types
                self._fill_types(KIND_TYPES[found[index].kind])
                self.query_one("#spec-types", OptionList).focus()

        self.app.push_screen(PickModal("Draft model for " + (self.model_name or "this model"), labels), chosen)

    def read_settings(self) -> SpeculativeSettings:
        """The values on screen, validated (ConfigError says which is wrong)."""
        options = self.query_one("#spec-types", OptionList)
        if options.highlighted is None or not self.types:
            raise ConfigError("pick a speculative type")
        values = {
            setting.name: parse_field(setting, self.query_one(f"#spec-{setting.name}", Input).value)
            for setting in NUMBER_FIELDS
        }
        draft_model = self.query_one("#spec-draft", Input).value.strip()
        if user_path(draft_model) is None:
            raise ConfigError(f"draft model: {draft_model!r} cannot be a path")
        settings = replace(
            self.settings,
            enabled=self.query_one(TickBox).value,
            spec_type=self.types[options.highlighted],
            draft_model=draft_model,
            **values,
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
