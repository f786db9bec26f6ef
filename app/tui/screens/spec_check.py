"""The speculation check (ctrl+b in the speculative panel, or the command palette): one prompt, greedy, decoded
plainly and then with the user's speculative settings, side by side, with the verdict: the same text or where it
diverged, the two speeds and the acceptance.

Greedy speculative decoding must give the plain greedy text token for token (llama.cpp#25618 and mlx-lm#1423 are
reports where it did not); this lets a user see that on their own model and prompt, and what it gains.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, Static

from app.core.config import SamplingSettings, SpeculativeSettings
from app.core.speculation_facts import measurable, spread
from app.tui.screens.ab_run import ABRunScreen
from app.tui.streaming import chunk_draft_spans
from engine_ext.protocol import REJECTED_PREFIX, Finished, SpeculativeStats, TokenChunk

CHECK_SAMPLING = SamplingSettings(temperature=0.0, max_tokens=128)
DEFAULT_PROMPT = "List the numbers from 1 to 30, one per line, then repeat the list."
CONTEXT_CHARS = 24  # characters of common text shown before the point where the two sides diverge
CHECK_ROUNDS = 3  # each side runs three times, in turns: the speeds' spread is the run-to-run noise


@dataclass
class Side:
    """One run of the check: its text as it streams, and how it ended."""

    text: str = ""
    reasoning: str = ""
    draft_spans: list[tuple[int, int]] = field(default_factory=list)
    """Where `text` came from accepted draft tokens."""
    tokens: int = 0
    tokens_per_s: float = 0.0
    """The decode speed: the mean of `speeds` once the side has run."""
    speeds: list[float] = field(default_factory=list)
    """Each round's decode speed (tokens/s)."""

    def add(self, event: TokenChunk) -> None:
        base = len(self.text)
        self.draft_spans += [
            (base + start, base + end)
            for start, end, drafter in chunk_draft_spans(event)
            if not drafter.startswith(REJECTED_PREFIX)
        ]  # accepted drafts only
        self.text += event.text
        self.reasoning += event.reasoning


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where `a` and `b` differ (the shorter one's length when one is a prefix
    of the other); None when they are equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def side_text(side: Side, diverged_at: int | None, *, drafted: bool) -> Text:
    """A side as shown: reasoning dimmed, the answer with accepted draft text underlined (`drafted`) and the part
    after the divergence point in the error colour."""
    shown = Text()
    if side.reasoning:
        shown.append(side.reasoning.strip() + "\n\n", style="dim italic")
    start = len(shown)
    shown.append(side.text)
    if drafted:
        for a, b in side.draft_spans:
            shown.stylize("underline", start + a, start + b)
    if diverged_at is not None:
        if diverged_at < len(side.text):
            shown.stylize("bold red reverse", start + diverged_at)
        else:  # the other side goes on
            shown.append(" ⟂ ends here", style="bold red")
    return shown


def run_to_run_noise(*sides: Side) -> float | None:
    """How much a side's speed varies between its rounds, relative to its mean: the largest spread (max - min) /
    mean of the sides; None when a side ran once (no noise measured)."""
    spreads = [spread(side.speeds) for side in sides]
    if not spreads or None in spreads:
        return None
    return max(s for s in spreads if s is not None)


def speed_comparison(plain: Side, spec: Side, stats: SpeculativeStats | None) -> str:
    """What the speeds say, from the statistics: nothing to measure when nothing was drafted, no measurable
    difference inside the run-to-run noise, else the direction in words ("1.50× faster", "12% slower")."""
    a, b = plain.tokens_per_s, spec.tokens_per_s
    if a <= 0 or b <= 0:
        return ""
    if stats is None or stats.drafted == 0:
        return " (nothing was drafted: no speed-up to measure)"
    ratio = b / a
    noise = run_to_run_noise(plain, spec)
    if noise is not None and not measurable(ratio, noise):
        return f" (no measurable difference: runs vary by {noise:.0%})"
    direction = f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 - ratio:.0%} slower"
    measured = f", runs vary by {noise:.0%}" if noise is not None else ", one run each"
    return f" ({direction}{measured})"


def verdict(plain: Side, spec: Side, stats: SpeculativeStats | None, spec_type: str) -> tuple[bool, str]:
    """(the same text?, the line that says so, with the speeds and the acceptance)."""
    speeds = f"plain {plain.tokens_per_s:.1f} tok/s · {spec_type} {spec.tokens_per_s:.1f} tok/s"
    speeds += speed_comparison(plain, spec, stats)
    if stats is None or stats.steps == 0:
        accepted = "nothing was drafted: B decoded as A did"
    else:
        accepted = f"{stats.counts()}, {stats.mean_accepted_length:.2f} tokens per step"
    where = first_difference(plain.reasoning + plain.text, spec.reasoning + spec.text)
    if where is None:
        return True, f"✓ The same text ({spec.tokens} tokens) · {speeds} · {accepted}"
    both = plain.reasoning + plain.text
    context = both[max(0, where - CONTEXT_CHARS) : where].replace("\n", "⏎")
    return False, f"✗ DIVERGED at character {where}, after “{context}” · {speeds} · {accepted}"


class SpecCheckScreen(ABRunScreen):
    """Enter runs the prompt (greedy) with plain decoding (A) and with speculation (B), in turns, three times each
    (the speeds' spread is the noise), and compares; Esc closes (stopping a run; speculation is left as it was)."""

    SAMPLING = CHECK_SAMPLING
    ROUNDS = CHECK_ROUNDS

    def __init__(self, settings: SpeculativeSettings, prompt: str = DEFAULT_PROMPT) -> None:
        super().__init__(prompt)
        self.settings = replace(settings, enabled=True)
        """The speculative settings B runs with (the user's, switched on)."""
        self.sides = {"a": Side(), "b": Side()}
        self.refused: str = ""
        """Why the engine refused B's speculative settings (B then ran without them)."""
        self.identical: bool | None = None
        """The last completed run's verdict (None: no verdict, B could not speculate)."""

    def compose(self) -> ComposeResult:
        spec_type = self.settings.spec_type
        with Vertical(classes="dialog wide", id="spec-check"):
            yield Label(
                f"Speculation check: the same prompt, greedy, without and with {spec_type}", classes="dialog-title"
            )
            yield self.prompt_input("check-prompt", "a prompt to decode both ways")
            with Horizontal(id="ab-sides"):
                with Vertical(classes="ab-side"):
                    yield Label("A · plain decoding", classes="ab-title")
                    with VerticalScroll():
                        yield Static("", id="check-a")
                with Vertical(classes="ab-side"):
                    yield Label(f"B · {spec_type}", classes="ab-title")
                    with VerticalScroll():
                        yield Static("", id="check-b")
            yield Static("", id="check-verdict")
            yield Label(
                f"Enter run (greedy, {CHECK_SAMPLING.max_tokens} tokens at most) · Esc close",
                classes="dialog-hint",
                id="check-hint",
            )

    def can_run(self) -> bool:
        if self.app.speculation.needs_reload(self.settings):
            self.notify(
                f"{self.settings.spec_type} needs the model reloaded (MTP heads / rollback): turn "
                "speculation on (F8), then run the check.",
                severity="warning",
            )
            return False
        return True

    def reset(self) -> None:
        self.sides = {"a": Side(), "b": Side()}
        self.refused, self.identical = "", None
        self.query_one("#check-verdict", Static).update("")
        for side in "ab":
            self._show(side)

    def configure(self, side: str) -> None:
        self.app.speculation.try_settings(replace(self.settings, enabled=side == "b"))

    def restore(self) -> None:
        self.app.speculation.try_settings()

    def _show(self, side: str, diverged_at: int | None = None) -> None:
        shown = side_text(self.sides[side], diverged_at, drafted=side == "b")
        self.query_one(f"#check-{side}", Static).update(shown)

    def add(self, side: str, event: TokenChunk) -> None:
        self.sides[side].add(event)
        self._show(side)

    def speculation_refused(self, error: str) -> None:
        if self.running == "b":
            self.refused = error

    def side_finished(self, side: str, event: Finished) -> None:
        record = self.sides[side]
        if self.round == 0:
            record.tokens = event.stats.generated_tokens
        record.speeds.append(event.stats.decode_tps)
        record.tokens_per_s = sum(record.speeds) / len(record.speeds)

    def completed(self) -> None:
        self.restore()
        self.conclude()

    def conclude(self) -> None:
        """Show the verdict on the two sides, and where they diverge."""
        plain, spec = self.sides["a"], self.sides["b"]
        if self.refused:
            self.identical = None
            line = f"B ran without speculation: {self.refused}"
        else:
            self.identical, line = verdict(plain, spec, self.side_stats.get("b"), self.settings.spec_type)
        where = first_difference(plain.text, spec.text)
        if where is not None and plain.reasoning == spec.reasoning:
            # Highlighted in the answer; a difference in the reasoning is told by the verdict line only.
            self._show("a", where)
            self._show("b", where)
        result = self.query_one("#check-verdict", Static)
        result.update(line)
        result.set_class(self.identical is True, "-same")
        result.set_class(self.identical is False, "-diverged")
        self.hint("B's accepted draft text is underlined · Enter run again · Esc close")
