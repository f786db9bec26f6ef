"""The "make vector" dialog (m on the steering screen): a prompt set, PCA or mean, an output name, progress."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, ProgressBar, Select
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from app.core.paths import prompt_set_folders, steering_dir
from app.core.vectors import vector_progress_text
from engine_ext.params import EngineError
from engine_ext.steering.prompt_sets import PromptSet, list_prompt_sets

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell


PROGRESS_STEPS = 1000
"""The bar's resolution: the engine's fraction of all steps, in thousandths (1000 only when the file is written)."""


def bar_steps(fraction: float) -> int:
    """The bar's progress for the engine's fraction: at most 99% (which the bar rounds to) until the work is done."""
    if fraction >= 1.0:
        return PROGRESS_STEPS
    return min(round(max(0.0, fraction) * PROGRESS_STEPS), PROGRESS_STEPS * 99 // 100)


def shown_folder(folder: Path) -> str:
    """A folder as the user would type it: under the home folder, with ~."""
    try:
        return "~/" + folder.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(folder)


def _safe_stem(text: str) -> str:
    return re.sub(r"[^\w.-]+", "-", text).strip("-.") or "vector"


class MakeVectorModal(ModalScreen[str | None]):
    """Enter on a prompt set makes the vector on the loaded model; Esc cancels (or hides it while it is made)."""

    BINDINGS = [
        Binding(
            "escape",
            "close",
            "Close",
            tooltip="Close the vector dialog: a vector being made goes on, and appears in the steering panel when done",
        )
    ]

    app: LlmtuiShell

    def __init__(self, model_stem: str) -> None:
        super().__init__(classes="dialog-screen")
        self.model_stem = model_stem
        self.sets: list[Path] = []
        """The prompt sets found (listed and read in a thread when the dialog opens)."""
        self.listing = True
        """Whether the prompt sets are still being read."""
        self.making: Path | None = None
        """The output file while the engine makes it."""
        self.progress: tuple[str, int, int, float, float] | None = None
        """The last progress reported: (phase, done, total, phase_seconds, when it came: time.monotonic())."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="make-vector"):
            yield Label("Make a control vector", classes="dialog-title", id="make-title")
            yield Label("Prompt set (positive ↔ negative pairs)", classes="field-label")
            yield OptionList(Option("Reading the prompt sets…", id="make-reading", disabled=True), id="make-sets")
            yield Label(
                f"Your own sets: {shown_folder(prompt_set_folders()[0])}/*.json",
                id="make-folder",
                classes="field-label",
                markup=False,  # a folder's brackets are not markup
            )
            with Horizontal(id="make-options"):
                yield Label("Method ", classes="field-label")
                yield Select(
                    [("PCA (like llama-cvector-generator)", "pca"), ("mean difference", "mean")],
                    value="pca",
                    allow_blank=False,
                    compact=True,
                    id="make-method",
                )
                yield Label(" Name ", classes="field-label")
                yield Input(placeholder="default: model-set", compact=True, id="make-name")
            yield ProgressBar(total=None, show_eta=False, id="make-progress")
            yield Label("", id="make-status")
            yield Label("Enter make · Esc close", classes="dialog-hint")

    @staticmethod
    def _describe(path: Path) -> str:
        try:
            prompt_set = PromptSet.load(path)
        except EngineError as error:
            return f"{path.stem}: {error}"
        return (
            f"{prompt_set.name:20} {prompt_set.positive_label} ↔ {prompt_set.negative_label} "
            f"({len(prompt_set.pairs)} pairs)"
        )

    def on_mount(self) -> None:
        self.query_one("#make-progress").display = False
        self.set_interval(1.0, self.show_status)  # the estimate counts down between the engine's reports
        self.query_one(OptionList).focus()
        self._read_sets()

    @work(thread=True, exclusive=True, group="prompt-sets", exit_on_error=False)
    def _read_sets(self) -> None:
        """List the prompt-set folders and read each set (its labels and pairs) off the event loop."""
        sets = list_prompt_sets(prompt_set_folders())
        labels = [self._describe(path) for path in sets]
        self.app.call_from_thread(self._show_sets, sets, labels)

    def _show_sets(self, sets: list[Path], labels: list[str]) -> None:
        self.sets, self.listing = sets, False
        if not self.is_attached:
            return
        options = self.query_one("#make-sets", OptionList)
        options.clear_options()
        options.add_options([Option(label, id=str(path)) for path, label in zip(sets, labels, strict=True)])
        if sets:
            options.action_first()  # as an option list made with its options starts

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The prompt sets are read with exit_on_error=False: an error no reader expected is said in one line."""
        if event.state == WorkerState.ERROR and event.worker.node is self:
            self.listing = False
            text = " ".join(
                f"The prompt sets could not be read: {type(event.worker.error).__name__}: {event.worker.error}".split()
            )
            self.notify(text if len(text) <= 300 else text[:299] + "…", severity="error", timeout=10)

    def output_path(self, prompt_set: Path) -> Path:
        name = self.query_one("#make-name", Input).value.strip()
        stem = _safe_stem(Path(name).stem if name else f"{self.model_stem}-{prompt_set.stem}")
        return steering_dir() / f"{stem}.gguf"

    @on(OptionList.OptionSelected, "#make-sets")
    def _set_chosen(self, event: OptionList.OptionSelected) -> None:
        self.start(Path(str(event.option.id)))

    @on(Input.Submitted, "#make-name")
    def _name_submitted(self, event: Input.Submitted) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            self.start(self.sets[options.highlighted])

    def start(self, prompt_set: Path) -> None:
        """Ask the engine to make the vector (it reports progress through the app)."""
        if self.making is not None:
            self.notify("A vector is being made; wait for it to finish.")
            return
        if self.app.model is None:
            self.notify("Load a model first (ctrl+l): a vector is made for one model.", severity="warning")
            return
        method = self.query_one("#make-method", Select).value
        output = self.output_path(prompt_set)
        self.making = output
        self.query_one("#make-progress").display = True
        self.query_one("#make-status", Label).update(f"Making {output.name} with {method}…")
        self.app.steering.make_vector(str(prompt_set), str(output), str(method))

    def show_progress(self, phase: str, done: int, total: int, phase_seconds: float, fraction: float) -> None:
        """The bar shows the fraction of every step of every phase (full only once the file is written); the line
        says which phase, which step and that phase's ETA."""
        bar = self.query_one("#make-progress", ProgressBar)
        bar.update(total=PROGRESS_STEPS, progress=bar_steps(fraction))
        if self.making is not None:
            self.query_one("#make-title", Label).update(f"Making {self.making.name}")
        self.progress = (phase, done, total, phase_seconds, time.monotonic())
        self.show_status()

    def show_status(self) -> None:
        """The phase, its step and the time left in it, from the last report and the time since."""
        if self.making is None or self.progress is None:
            return
        phase, done, total, phase_seconds, reported = self.progress
        text = vector_progress_text(phase, done, total, phase_seconds, time.monotonic() - reported)
        self.query_one("#make-status", Label).update(text[:1].upper() + text[1:])

    def finished(self, path: str, pairs: int, seconds: float) -> None:
        self.making = self.progress = None
        self.dismiss(path)

    def failed(self, error: str) -> None:
        self.making = self.progress = None
        self.query_one("#make-title", Label).update("Make a control vector")
        self.query_one("#make-progress").display = False
        self.query_one("#make-status", Label).update(f"Could not make the vector: {error}")

    def action_close(self) -> None:
        self.dismiss(None)
