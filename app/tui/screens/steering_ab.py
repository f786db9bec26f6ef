"""The steering A/B view (b on the steering screen): one prompt, greedy, without and with steering side by side.

With speculation on, both sides speculate, and the view says what steering does to acceptance: a control vector
changes the target's distribution, so a draft model that is not steered (or an n-gram drafter copying unsteered
text) agrees with it less often, while MTP heads read the steered hidden states.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, Static

from app.core.config import SamplingSettings
from app.tui.screens.ab_run import ABRunScreen
from engine_ext.protocol import Finished, SpeculativeStats, TokenChunk

AB_SAMPLING = SamplingSettings(temperature=0.0, max_tokens=128)
DEFAULT_PROMPT = "How was your day?"


def side_readout(tokens_per_s: float, stats: SpeculativeStats | None) -> str:
    """A side's speed, and its acceptance when it speculated: "41.2 tok/s · 81% accepted, 3.10 tok/step"."""
    line = f"{tokens_per_s:.1f} tok/s"
    if stats is not None and stats.steps:
        line += f" · {stats.acceptance_rate:.0%} accepted, {stats.mean_accepted_length:.2f} tok/step"
    return line


def acceptance_cost(base: SpeculativeStats | None, steered: SpeculativeStats | None, spec_type: str) -> str:
    """What steering does to speculation on this prompt, in words that say the direction: acceptance and tokens per
    target step without → with, and the speed-up over plain decoding "faster" or "slower"."""
    if base is None or steered is None:
        return ""
    if not base.steps or not steered.steps:
        side = "either side" if not base.steps and not steered.steps else "A" if not base.steps else "B"
        return f"{spec_type} drafted nothing on {side}: no acceptance to compare"
    points = round((steered.acceptance_rate - base.acceptance_rate) * 100)
    change = "no change" if points == 0 else f"{abs(points)} points {'more' if points > 0 else 'fewer'}"
    line = (
        f"Steering with {spec_type}: {base.acceptance_rate:.0%} → {steered.acceptance_rate:.0%} of drafted "
        f"tokens accepted ({change}), {base.mean_accepted_length:.2f} → {steered.mean_accepted_length:.2f} "
        "tokens per step"
    )
    if base.speedup > 0 and steered.speedup > 0:
        ratio = steered.speedup / base.speedup
        direction = f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 - ratio:.0%} slower"
        line += f", speculation {direction} ({base.speedup:.2f}× → {steered.speedup:.2f}× plain)"
    return line


class SteeringABScreen(ABRunScreen):
    """Enter runs the prompt twice (greedy): A without steering, then B with the current mix; Esc closes."""

    SAMPLING = AB_SAMPLING

    def __init__(self, prompt: str = DEFAULT_PROMPT, mix: str = "") -> None:
        super().__init__(prompt)
        self.mix = mix
        self.texts = {"a": "", "b": ""}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="steering-ab"):
            yield Label("A/B: the same prompt, greedy, without and with steering", classes="dialog-title")
            yield self.prompt_input("ab-prompt", "a prompt to compare")
            with Horizontal(id="ab-sides"):
                with Vertical(classes="ab-side"):
                    yield Label("A · without steering", classes="ab-title", id="ab-a-title")
                    yield Label("", classes="ab-readout", id="ab-a-readout")
                    with VerticalScroll():
                        yield Static("", id="ab-a")
                with Vertical(classes="ab-side"):
                    yield Label(f"B · with {self.mix or 'steering'}", classes="ab-title", id="ab-b-title")
                    yield Label("", classes="ab-readout", id="ab-b-readout")
                    with VerticalScroll():
                        yield Static("", id="ab-b")
            yield Static("", id="ab-cost")
            yield Label("Enter run · Esc close", classes="dialog-hint", id="ab-hint")

    def reset(self) -> None:
        self.texts = {"a": "", "b": ""}
        self.query_one("#ab-cost", Static).display = False
        for side in "ab":
            self.query_one(f"#ab-{side}", Static).update("")
            self.query_one(f"#ab-{side}-readout", Label).display = False

    def configure(self, side: str) -> None:
        # A runs on the base model; B with the user's mix.
        self.app.steering.try_unsteered(side == "a")

    def restore(self) -> None:
        self.app.steering.try_unsteered(False)

    def add(self, side: str, event: TokenChunk) -> None:
        self.texts[side] += event.text
        self.query_one(f"#ab-{side}", Static).update(self.texts[side])

    def side_finished(self, side: str, event: Finished) -> None:
        readout = side_readout(event.stats.decode_tps, self.side_stats.get(side))
        shown = self.query_one(f"#ab-{side}-readout", Label)
        shown.update(readout)
        shown.display = True

    def completed(self) -> None:
        # B ran with the user's own mix: nothing to restore.
        settings = self.app.config.speculative
        if settings.enabled:
            cost = acceptance_cost(self.side_stats.get("a"), self.side_stats.get("b"), settings.spec_type)
        else:
            cost = "Speculation is off: with it on (F8), this view shows what steering does to acceptance."
        shown = self.query_one("#ab-cost", Static)
        shown.update(cost)
        shown.display = bool(cost)
        same = self.texts["a"] == self.texts["b"]
        note = "the same text: try a higher strength · " if same else ""
        self.hint(f"{note}Enter run again · Esc close")
