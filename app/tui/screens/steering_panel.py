"""The steering panel (F6): control vectors with strength sliders, the layer range and a per-layer heat strip.

The panel is docked in the chat screen, beside the transcript on a wide terminal and below it on a narrow one, so
the reply it steers stays in view and keeps streaming while the sliders move.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label, Static
from textual.worker import Worker, WorkerState, get_current_worker

from app.core.model_paths import user_path
from app.core.vectors import VectorInfo, available_vectors, vector_info
from engine_ext.params import MAX_STEERING_STRENGTH
from engine_ext.protocol import SteeringSet

if TYPE_CHECKING:
    from app.core.speculation_facts import ModelFacts
    from app.tui.shell import LlmtuiShell

STRENGTH_LIMIT = 2.0
"""The range of a slider whose vector's norms are not known (a unit direction on a 64-wide model)."""
FINE_STEPS, COARSE_STEPS = 40, 8
"""A slider's range divided into steps: ←/→ move by range/40 (0.05 on ±2), shift+←/→ by range/8 (0.25 on ±2)."""
HEAT_BARS = "▁▂▃▄▅▆▇█"


def snap_strength(value: float, limit: float = STRENGTH_LIMIT) -> float:
    """Clamp to [-limit, limit] and round to the grid of that range's fine step (0.05 on ±2)."""
    step = limit / FINE_STEPS
    value = max(-limit, min(limit, value))
    return round(round(value / step) * step, strength_decimals(step) + 2) + 0.0


def strength_decimals(step: float) -> int:
    """Decimals that show a strength on a slider of this fine step: 2, more for a small range."""
    return max(2, -math.floor(math.log10(step)) if step > 0 else 2)


def parse_strength(text: str) -> float | str:
    """A typed strength, or why it cannot be one (any finite number within the engine's ±1000)."""
    try:
        value = float(text.strip().replace("−", "-").lstrip("+"))
    except ValueError:
        return f"{text.strip()!r} is not a number"
    if not -MAX_STEERING_STRENGTH <= value <= MAX_STEERING_STRENGTH:  # also NaN
        return f"a strength is a number from -{MAX_STEERING_STRENGTH:g} to {MAX_STEERING_STRENGTH:g}"
    return value + 0.0


class VectorSlider(Widget, can_focus=True):
    """One control vector and its strength; the slider's range follows the vector (`VectorInfo.slider_range`), a
    typed strength may go past it. A change applies at the next token."""

    BINDINGS = [
        Binding("left", "nudge(-1)", "Weaker", show=False, tooltip="Weaker: a fortieth of the range (0.05 on ±2)"),
        Binding("right", "nudge(1)", "Stronger", show=False, tooltip="Stronger: a fortieth of the range"),
        Binding("shift+left", "nudge(-5)", "Weaker ×5", show=False, tooltip="Weaker ×5: an eighth of the range"),
        Binding("shift+right", "nudge(5)", "Stronger ×5", show=False, tooltip="Stronger ×5: an eighth of the range"),
        Binding(
            "enter",
            "type_strength",
            "Type",
            show=False,
            tooltip="Type a strength: past the slider's range too (any number within ±1000)",
        ),
        Binding("0", "reset", "Reset", show=False, tooltip="Reset: back to 0 (off)"),
    ]

    COMPONENT_CLASSES = {"vector-slider--track", "vector-slider--knob", "vector-slider--label"}

    DEFAULT_CSS = """
    VectorSlider {
        height: 2;
    }
    """

    strength: reactive[float] = reactive(0.0)
    """The strength applied (0: this vector is off)."""

    class Changed(Message):
        """The user moved the slider."""

        def __init__(self, slider: VectorSlider, strength: float) -> None:
            super().__init__()
            self.slider = slider
            self.strength = strength

        @property
        def control(self) -> VectorSlider:
            return self.slider

    def __init__(self, vector: VectorInfo, strength: float = 0.0, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.vector = vector
        self.range = vector.slider_range
        """How far the slider goes each way (a typed strength may go further)."""
        self.fine_step = self.range / FINE_STEPS
        # A remembered strength is kept as it is, past the range too (it may have been typed).
        self.set_reactive(VectorSlider.strength, float(strength) + 0.0)

    def watch_strength(self, old: float, new: float) -> None:
        if old != new:
            self.post_message(self.Changed(self, new))

    def action_nudge(self, steps: int) -> None:
        """Move by `steps` fine steps within the range; a typed strength past it only moves back toward it."""
        limit = max(self.range, abs(self.strength))
        value = max(-limit, min(limit, self.strength + steps * self.fine_step))
        snapped = round(round(value / self.fine_step) * self.fine_step, strength_decimals(self.fine_step) + 2)
        self.strength = max(-limit, min(limit, snapped)) + 0.0

    def action_reset(self) -> None:
        self.strength = 0.0

    def action_type_strength(self) -> None:
        """Enter: a small input for a strength, past the slider's range too (up to the engine's ±1000)."""
        from app.tui.modals.text_prompt import TextPromptModal

        def typed(text: str | None) -> None:
            if text is None or not text.strip():
                return
            value = parse_strength(text)
            if isinstance(value, str):
                self.notify(f"Strength not changed: {value}.", severity="error", timeout=8)
                return
            self.strength = value

        self.app.push_screen(
            TextPromptModal(
                f"Strength of {self.vector.name} (the slider spans ±{self.range:g}; "
                f"any number within ±{MAX_STEERING_STRENGTH:g})",
                self.strength_text().lstrip("+"),
                "e.g. 4 or -12.5",
            ),
            typed,
        )

    def strength_text(self) -> str:
        return f"{self.strength:+.{strength_decimals(self.fine_step)}f}"

    def render(self) -> Text:
        """Two lines: ▸ name, strength and range; then negative ━━━┼━━●━ positive."""
        label = self.get_component_rich_style("vector-slider--label", partial=True)
        width = self.size.width or 60
        value = self.strength_text()
        span = f" ±{self.range:g}"
        name_width = max(4, width - 2 - len(value) - len(span) - 1)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("▸ " if self.has_focus else "  ", style="bold")
        line.append(f"{self.vector.name[:name_width]:{name_width}} ", style="bold" if self.strength else label)
        line.append(value, style="bold" if self.strength else label)
        line.append(span + "\n", style=label)
        negative, positive = self.vector.negative[:10], self.vector.positive[:10]
        track = max(9, width - 4 - len(negative) - len(positive) - 1)
        track -= 1 - track % 2  # odd: the middle cell is 0
        beyond = abs(self.strength) > self.range
        shown = max(-self.range, min(self.range, self.strength))
        knob = round((shown + self.range) / (2 * self.range) * (track - 1))
        line.append(f"  {negative} ", style=label)
        track_style = self.get_component_rich_style("vector-slider--track", partial=True)
        knob_style = self.get_component_rich_style("vector-slider--knob", partial=True)
        for cell in range(track):
            if cell == knob:  # past the range: an arrow at the end the strength went beyond
                line.append(("▶" if self.strength > 0 else "◀") if beyond else "●", style=knob_style)
            elif cell == track // 2:
                line.append("┼", style=track_style)
            else:
                line.append("━", style=track_style)
        line.append(f" {positive}", style=label)
        return line


def heat_full_scale(mix: Sequence[tuple[VectorInfo, float]]) -> float:
    """The applied norm that fills a heat-strip cell: a slider at the end of its own range, on its strongest layer
    (range × the vector's largest per-layer norm), the largest of the sliders in use (strength ≠ 0); a unit
    direction at ±2 (`STRENGTH_LIMIT`) when none is."""
    ends = [
        vector.slider_range * max((n for n in vector.norms if math.isfinite(n) and n > 0), default=1.0)
        for vector, strength in mix
        if strength != 0
    ]
    return max(ends, default=STRENGTH_LIMIT)


class HeatStrip(Widget):
    """One cell per layer: the norm of the applied direction there; · for layers the architecture does not steer."""

    DEFAULT_CSS = """
    HeatStrip {
        height: 1;
    }
    """

    COMPONENT_CLASSES = {"heat-strip--label", "heat-strip--off"}

    n_layer: reactive[int] = reactive(0)
    """Layers of the model (the strip shows 1..n_layer-1)."""
    layer_norms: reactive[tuple[float, ...]] = reactive(tuple)
    """Applied norm per layer 1..n_layer-1 (empty: nothing applied)."""
    steered: reactive[tuple[int, ...]] = reactive(tuple)
    """The layers control vectors act on for this architecture."""
    full: reactive[float] = reactive(STRENGTH_LIMIT)
    """The applied norm that fills a cell (`heat_full_scale`: a slider at its range's end)."""

    def render(self) -> Text:
        label = self.get_component_rich_style("heat-strip--label", partial=True)
        off = self.get_component_rich_style("heat-strip--off", partial=True)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("layers ", style=label)
        n = max(0, self.n_layer - 1)
        if n == 0:
            line.append("–", style=label)
            return line
        # A slider at its range's end fills its strongest layer's cell; mixes past that scale to their peak.
        peak = max(max(self.layer_norms, default=0.0), self.full)
        steered = set(self.steered)
        line.append("1 ", style=label)
        for layer in range(1, n + 1):
            norm = self.layer_norms[layer - 1] if layer - 1 < len(self.layer_norms) else 0.0
            if layer not in steered:
                line.append("·", style=off)
            elif norm <= 0 or not math.isfinite(norm):
                line.append("░", style=off)
            else:
                level = norm / peak
                style = "bold red" if level > 0.75 else "yellow" if level > 0.4 else "green"
                line.append(HEAT_BARS[min(7, int(level * 7.999))], style=style)
        line.append(f" {n}", style=label)
        return line


def describe_applied(applied: SteeringSet | None) -> str:
    if applied is None:
        return "Steering: not applied yet."
    if not applied.steered_layers:
        return "This model's architecture ignores control vectors (llama.cpp has no hook in its graph)."
    if not applied.active:
        return "Steering off: the base model."
    return f"Applied on layers {applied.layer_start}–{applied.layer_end}."


def range_words(start: int, end: int) -> str:
    """A typed layer range in words: 0 is the default end (the first steerable layer, the last)."""
    return f"{start or 'the first'} to {end or 'the last'}"


class SteeringPanel(Vertical, can_focus=True):
    """Steer the loaded model; changes apply at the next token, even while a reply is being written. F6 opens and
    closes the panel, beside the transcript (wide terminal) or below it (narrow), so the reply stays in view. ↑/↓
    reach the layer range too, typed, then applied with Enter once valid (0: the default)."""

    BINDINGS = [
        Binding("escape", "close", "Close", tooltip="Close the panel: the steering stays applied"),
        # Tab leaves the panel for the message box in one key, rather than walking into the layer fields (↑/↓
        # reach those), where typed letters vanish and digits would change the range.
        Binding(
            "tab,shift+tab",
            "to_message_box",
            "Message",
            tooltip="To the message box: the panel stays open; Tab there comes back",
        ),
        Binding("m", "make", "Make vector", tooltip="Make a control vector: from a prompt set, on the loaded model"),
        Binding("b", "ab", "A/B", tooltip="A/B: the same prompt without and with steering, side by side"),
        Binding("a", "add", "Add file", tooltip="Add a control-vector file: by path (Tab completes it)"),
        Binding("c", "clear", "Clear", tooltip="Clear: every strength to 0"),
        Binding("up", "move(-1)", "Up", show=False, tooltip="Up: the previous vector, or the layer range"),
        Binding("down", "move(1)", "Down", show=False, tooltip="Down: the next vector, or the layer range"),
    ]

    app: LlmtuiShell

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.listing = False
        """Whether the vectors are being read (in a thread) for the list."""
        self._focus_first_slider = True
        """A listing after opening focuses the first slider (the panel opens on the vectors)."""

    def compose(self) -> ComposeResult:
        yield Label("Steering", classes="steering-title", id="steering-title")
        yield VerticalScroll(id="steering-vectors")
        with Horizontal(id="steering-range"):
            yield Label("Layers ", classes="field-label")
            yield Input(id="steering-layer-start", compact=True, type="integer")
            yield Label(" to ", classes="field-label")
            yield Input(id="steering-layer-end", compact=True, type="integer")
            yield Label(" (0: all)", classes="field-label")
        yield HeatStrip(id="steering-heat")
        yield Label("", id="steering-status")
        yield Label(  # Esc, m, b, a and c are in the footer; one line at 80 columns
            "←/→ strength (shift ×5) · Enter type · 0 reset · ↑/↓ move · Tab message box", id="steering-hint"
        )

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    async def open(self) -> None:
        """Show the panel on the vectors (read in a thread), with what the engine applies."""
        self.add_class("-open")
        self._focus_first_slider = True
        settings = self.app.config.steering
        self.query_one("#steering-layer-start", Input).value = str(settings.layer_start)
        self.query_one("#steering-layer-end", Input).value = str(settings.layer_end)
        await self.refresh_vectors()
        self.show_applied(self.app.steering.applied)
        if self.app.steering.applied is None:
            self.app.steering.request_applied()  # the answer says which layers steer
        sliders = self.sliders
        if sliders:
            sliders[0].focus()
        else:
            self.focus()  # m, a, b and c reach the panel until (or if no) sliders show

    class Closed(Message):
        """The panel was closed (the chat gives the prompt its keys back)."""

    def close(self) -> None:
        """Hide the panel (the steering stays applied) and remember the mix."""
        self.app.steering.remember()
        self.remove_class("-open")
        self.post_message(self.Closed())

    def action_close(self) -> None:
        self.close()

    def on_unmount(self) -> None:
        """Quitting with the panel open keeps the mix, as closing it does."""
        if self.is_open:
            self.app.steering.remember()

    def on_focus(self) -> None:
        """Focus reaching the panel itself (Tab from the message box) goes on to the vectors: ←/→ act at once."""
        sliders = self.sliders
        if sliders and not self.listing:
            sliders[0].focus()

    def action_to_message_box(self) -> None:
        """Tab: the chat's message box, with the panel left open (the message goes out steered)."""
        prompt = next(iter(self.screen.query("#prompt")), None)
        if prompt is not None and prompt.focusable:
            prompt.focus()

    def action_move(self, step: int) -> None:
        """↑/↓: the previous or next slider or layer field of the panel (it wraps around)."""
        focusable = [w for w in self.query("VectorSlider, #steering-range Input") if w.focusable]
        if not focusable:
            return
        current = self.screen.focused
        index = focusable.index(current) if current in focusable else -1
        focusable[(index + step) % len(focusable)].focus()

    @property
    def sliders(self) -> list[VectorSlider]:
        return list(self.query(VectorSlider))

    async def refresh_vectors(self, focus_path: str | None = None) -> None:
        """List the vectors usable with the loaded model, with the remembered strengths. The files (the steering
        folder, the vectors' and the model's headers) are read in a thread; the list shows when they are."""
        app = self.app
        model = app.model
        title = "Steering"
        if model is not None:
            title += f" · {model.name}"
        self.query_one("#steering-title", Label).update(title)
        current = self.screen.focused
        focused = focus_path or (current.vector.path if isinstance(current, VectorSlider) else None)
        box = self.query_one("#steering-vectors", VerticalScroll)
        self.listing = True
        if not box.children:
            await box.mount(Static("Reading the control vectors…", classes="steering-note", id="steering-reading"))
        self._read_vectors(app.config.steering.vectors, focused)

    @work(thread=True, exclusive=True, group="steering-vectors", exit_on_error=False)
    def _read_vectors(self, remembered: tuple[str, ...], focused: str | None) -> None:
        facts = self.app.models.facts()
        vectors, hidden = available_vectors(remembered, facts.n_embd if facts else 0)
        if not get_current_worker().is_cancelled:  # a newer listing shows its own
            self.app.call_from_thread(self._show_vectors, facts, vectors, hidden, focused)  # type: ignore[arg-type]

    async def _show_vectors(
        self, facts: ModelFacts | None, vectors: list[VectorInfo], hidden: int, focused: str | None
    ) -> None:
        if not self.is_attached:
            return
        self.listing = False
        settings = self.app.config.steering
        strengths = dict(zip(settings.vectors, settings.strengths, strict=False))
        current = self.screen.focused
        if isinstance(current, VectorSlider):
            focused = focused or current.vector.path
        box = self.query_one("#steering-vectors", VerticalScroll)
        await box.remove_children()
        widgets: list[Widget] = [VectorSlider(v, strengths.get(v.path, 0.0)) for v in vectors]
        if not vectors:
            widgets.append(
                Static(
                    "No control vectors for this model yet: m makes one from a prompt set "
                    "(happy↔sad, formal↔casual, …), a adds a .gguf file.",
                    classes="steering-note",
                )
            )
        if hidden:
            widgets.append(Static(f"{hidden} vector file(s) for other models are not shown.", classes="steering-note"))
        await box.mount_all(widgets)
        heat = self.query_one(HeatStrip)
        heat.n_layer = facts.n_layer if facts else 0
        self._scale_heat()
        sliders = self.sliders
        if not self.is_open:
            return
        focus = self.screen.focused
        inside = focus is not None and (focus is self or self in focus.ancestors)
        target = next((slider for slider in sliders if slider.vector.path == focused), None)
        if target is None and sliders:
            # The panel itself holding the focus (no vector until now) would leave ←/→ and Enter doing nothing.
            on_panel = focus is self or (self._focus_first_slider and not isinstance(focus, VectorSlider))
            target = sliders[0] if not inside or on_panel else None
        if target is not None:
            target.focus()
        self._focus_first_slider = False

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The readers run with exit_on_error=False (a file they did not expect must not exit the app): their error
        is said in one line, and the screen stays."""
        if event.state != WorkerState.ERROR or event.worker.node is not self:
            return
        if event.worker.group == "steering-vectors":
            self.listing = False
        what = (
            "The control vectors could not be listed"
            if event.worker.group == "steering-vectors"
            else ("The control vector could not be read")
        )
        text = " ".join(f"{what}: {type(event.worker.error).__name__}: {event.worker.error}".split())
        self.notify(text if len(text) <= 300 else text[:299] + "…", severity="error", timeout=10)

    def show_applied(self, applied: SteeringSet | None) -> None:
        """Show what the engine applies now (called on every SteeringSet)."""
        heat = self.query_one(HeatStrip)
        self._scale_heat()
        if applied is not None:
            heat.layer_norms = applied.layer_norms if applied.active else ()
            heat.steered = applied.steered_layers
        self.query_one("#steering-status", Label).update(describe_applied(applied))

    def _scale_heat(self) -> None:
        """The heat strip fills a cell where a slider in use reaches its own range's end (`heat_full_scale`)."""
        self.query_one(HeatStrip).full = heat_full_scale([(s.vector, s.strength) for s in self.sliders])

    @on(VectorSlider.Changed)
    def _strength_changed(self, event: VectorSlider.Changed) -> None:
        self.app.steering.set_strength(event.slider.vector.path, event.strength)
        self._scale_heat()

    def layer_range(self) -> tuple[int, int] | str:
        """The range typed in the layer fields, or why it cannot be applied (a field empty or half typed, from after
        to, past the model's last layer)."""
        texts = [self.query_one(f"#steering-layer-{end}", Input).value.strip() for end in ("start", "end")]
        try:
            start, end = (int(text) for text in texts)
        except ValueError:
            return "both layer fields need a number (0: the default)"
        last = self.query_one(HeatStrip).n_layer - 1
        if start < 0 or end < 0 or (end and end < start):
            return "the range needs 0 ≤ from ≤ to (0: the default)"
        if last > 0 and max(start, end) > last:
            return f"this model's layers are 1 to {last}"
        return start, end

    @on(Input.Changed, "#steering-range Input")
    def _range_typed(self) -> None:
        """A range being typed is not applied (a stray digit would steer one layer): Enter applies it when valid."""
        typed = self.layer_range()
        settings = self.app.config.steering
        if typed == (settings.layer_start, settings.layer_end):
            self.show_applied(self.app.steering.applied)
            return
        status = self.query_one("#steering-status", Label)
        if isinstance(typed, str):
            status.update(f"Layers not applied: {typed}.")
        else:
            status.update(f"Layers {range_words(*typed)}: Enter applies them.")

    @on(Input.Submitted, "#steering-range Input")
    def _range_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        typed = self.layer_range()
        if isinstance(typed, str):
            self.query_one("#steering-status", Label).update(f"Layers not applied: {typed}.")
            return
        settings = self.app.config.steering
        if typed != (settings.layer_start, settings.layer_end):
            self.query_one("#steering-status", Label).update(f"Applying layers {range_words(*typed)}…")
            self.app.steering.set_range(*typed)

    def action_make(self) -> None:
        self.app.action_make_vector()

    def action_ab(self) -> None:
        self.app.action_steering_ab()

    def action_add(self) -> None:
        from app.tui.modals.text_prompt import PathPromptModal

        def add(text: str | None) -> None:
            if text and text.strip():
                self._add_vector(text.strip())

        self.app.push_screen(
            PathPromptModal(
                "Add a control vector (llama.cpp's .gguf format)",
                "",
                "path to a control-vector .gguf (Tab completes)",
                suffixes=(".gguf",),
            ),
            add,
        )

    @work(thread=True, exclusive=True, group="steering-add", exit_on_error=False)
    def _add_vector(self, text: str) -> None:
        """Resolve the typed path and read the vector's header here, off the event loop; `_vector_read` decides."""
        typed = user_path(text)
        try:
            path = str(typed.resolve()) if typed is not None else ""
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop
            path = ""
        if not path:
            self.app.call_from_thread(
                self.notify, f"{text!r} cannot be a path to a control vector.", severity="error", timeout=10
            )
            return
        info = vector_info(path)
        facts = self.app.models.facts()
        self.app.call_from_thread(self._vector_read, path, info, facts)  # type: ignore[arg-type]

    async def _vector_read(self, path: str, info: VectorInfo | str, facts: ModelFacts | None) -> None:
        if isinstance(info, str):
            self.notify(f"Cannot use {path}: {info}", severity="error", timeout=10)
            return
        if facts is not None and info.n_embd != facts.n_embd:
            self.notify(
                f"{info.name} was made for a model with {info.n_embd} embedding values; this one has {facts.n_embd}.",
                severity="error",
                timeout=10,
            )
            return
        self.app.steering.set_strength(path, 0.0)
        if self.is_attached:
            await self.refresh_vectors(focus_path=path)  # the new vector's slider: ←/→ and Enter act on it at once

    def action_clear(self) -> None:
        for slider in self.sliders:
            slider.strength = 0.0
