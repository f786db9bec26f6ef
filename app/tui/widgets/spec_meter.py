"""The live speculative-decoding meter: acceptance per step as a sparkline, mean accepted length, speedup, status;
expanded (ctrl+o), the counts, acceptance by draft position, drafting vs verifying time and each chained drafter."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from app.core.speculation_facts import measurable, sparkline, speedup_text
from engine_ext.protocol import SpeculativeStats

SPARK_WIDTH = 16

COUNTS_HELP: Final = (
    "proposed: the tokens the drafters proposed. drafted: those sent to the model to verify (llama.cpp's "
    "n_drafted): a draft is cut after an end-of-generation token, since nothing after it is used. accepted: the "
    "drafted tokens the model kept (the % is of the drafted ones)."
)
"""What the details' counts mean (the expanded meter's tooltip; F1 says it too)."""


class SpecMeter(Widget):
    """One line under the transcript while speculation is on (F8 toggles it, F9 picks the type); ctrl+o (or a
    click) expands it into the details, live while a reply streams."""

    DEFAULT_CSS = """
    SpecMeter {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    COMPONENT_CLASSES = {"spec-meter--label", "spec-meter--spark", "spec-meter--status"}

    spec_type: reactive[str] = reactive("")
    """The type the user picked (auto, ngram-mod, draft-mtp…)."""
    drafters: reactive[tuple[str, ...]] = reactive(tuple)
    """The drafters the engine chained (empty until it confirms)."""
    stats: reactive[SpeculativeStats | None] = reactive(None)
    """The latest statistics (live while a reply streams, then the reply's final ones)."""
    noise: reactive[float | None] = reactive(None)
    """The run-to-run spread of the speed ratio over this session's replies (None: one reply, not measured): a
    ratio inside it is marked "~" (no measurable difference)."""
    expanded: reactive[bool] = reactive(False, layout=True)
    """Whether the details are shown under the summary line."""

    def watch_expanded(self) -> None:
        self._set_tooltip()

    def _set_tooltip(self) -> None:
        # Folded, the whole status ("paused: measured 0.83× plain speed…"): a narrow line shows its first words.
        self.tooltip = COUNTS_HELP if self.expanded else (self.stats.status if self.stats else None) or None

    def watch_stats(self) -> None:
        self._set_tooltip()
        # Lay the screen out again only when the details gain or lose a line (not at every live update).
        if self.expanded and len(self.render().split()) != self.size.height:
            self.refresh(layout=True)

    async def on_click(self) -> None:
        await self.run_action("app.toggle_spec_details")

    def render(self) -> Text:
        line = self._summary()
        if self.expanded and self.stats is not None:
            return Text("\n").join([line, *self._details(self.stats)])
        return line

    def _details(self, stats: SpeculativeStats) -> list[Text]:
        """The lines under the summary: counts and speeds, acceptance by position, time, the drafters."""
        label = self.get_component_rich_style("spec-meter--label", partial=True)
        spark = self.get_component_rich_style("spec-meter--spark", partial=True)

        def row(*parts: tuple[str, Style | str]) -> Text:
            text = Text(no_wrap=True, overflow="ellipsis")
            text.append("   ")
            for part, style in parts:
                text.append(part, style=style)
            return text

        rate = f" ({stats.acceptance_rate:.0%})" if stats.drafted else ""
        speeds = f"{stats.effective_tps:.1f} tok/s"
        if stats.plain_tps > 0:
            speeds += f" vs plain {stats.plain_tps:.1f}"
        counts = row(
            ("proposed ", label),
            (str(stats.proposed), "bold"),
            ("  drafted ", label),
            (str(stats.drafted), "bold"),
            ("  accepted ", label),
            (f"{stats.accepted}{rate}", "bold"),
            ("  steps ", label),
            (str(stats.steps), "bold"),
            ("  ", ""),
            (speeds, "bold"),
        )
        lines = [
            self._fitted(
                counts,
                lambda: row(  # narrow: the speeds first, the counts shorter
                    (speeds, "bold"),
                    ("  steps ", label),
                    (str(stats.steps), "bold"),
                    ("  accepted ", label),
                    (f"{stats.accepted}/{stats.drafted}{rate}", "bold"),
                    ("  proposed ", label),
                    (str(stats.proposed), "bold"),
                ),
            )
        ]
        lines.append(row(*by_position(stats.acceptance_per_position, label, spark)))
        total = stats.draft_ms + stats.verify_ms
        if total > 0:
            lines.append(
                row(
                    ("drafting ", label),
                    (f"{stats.draft_ms:.1f} ms", "bold"),
                    (f" ({stats.draft_ms / total:.0%})", label),
                    ("  verifying ", label),
                    (f"{stats.verify_ms:.1f} ms", "bold"),
                    (f" ({stats.verify_ms / total:.0%})", label),
                )
            )
        for report in stats.drafters if len(stats.drafters) > 1 else ():
            share = f" ({report.accepted / report.proposed:.0%})" if report.proposed else ""
            bars = f"  {sparkline(report.acceptance_per_position, SPARK_WIDTH)}".rstrip()
            full = row(
                (f"{report.name:<13} ", "bold"),
                (f"{report.drafts} drafts  ", label),
                (f"accepted {report.accepted} of {report.proposed} proposed{share}", ""),
                (bars, spark),
                (f"  {report.draft_ms:.1f} ms drafting", label),
            )
            compact = partial(
                row,
                (f"{report.name:<13} ", "bold"),
                (f"{report.drafts} drafts  ", label),
                (f"accepted {report.accepted}/{report.proposed}{share}", ""),
                (f"  {report.draft_ms:.1f} ms", label),
                (bars, spark),
            )
            lines.append(self._fitted(full, compact))
        return lines

    def _fitted(self, full: Text, compact: Callable[[], Text]) -> Text:
        """`full` when it fits the meter's width, else the `compact` form: at 80 columns the lines ended in "…" before
        the status and the speeds were seen (issue 37), so the narrow forms put them first and shorten the rest."""
        width = self.size.width
        return compact() if width and full.cell_len > width else full

    def _summary(self) -> Text:
        label = self.get_component_rich_style("spec-meter--label", partial=True)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" ⚡ ", style="bold")
        line.append(self.spec_type or "speculative", style="bold")
        drafters = (
            f" ({'+'.join(self.drafters)})" if self.drafters and tuple(self.drafters) != (self.spec_type,) else ""
        )
        stats = self.stats
        if stats is None:
            line.append(drafters, style=label)
            line.append("  waiting for a reply", style=label)
            return line
        full = line.copy()
        full.append(drafters, style=label)
        width = max(4, min(SPARK_WIDTH, self.size.width // 6)) if self.size.width else SPARK_WIDTH
        full.append("  ")
        full.append_text(self._spark(stats, width))
        full.append_text(self._figures(stats, label))
        if stats.n_max:
            full.append(f"  n_max {stats.n_max}", style=label)
        if stats.status:
            full.append(f"  {stats.status}", style=self.get_component_rich_style("spec-meter--status", partial=True))

        def compact() -> Text:
            """Narrow: the status's first words ("drafting", "paused") and the figures first; the drafters last."""
            if stats.status:
                status = self.get_component_rich_style("spec-meter--status", partial=True)
                line.append(f"  {stats.status.split(':', 1)[0]}", style=status)
            line.append(" ")
            line.append_text(self._figures(stats, label))
            line.append("  ")
            line.append_text(self._spark(stats, min(width, 8)))
            if stats.n_max:
                line.append(f" n_max {stats.n_max}", style=label)
            line.append(drafters, style=label)
            return line

        return self._fitted(full, compact)

    def _spark(self, stats: SpeculativeStats, width: int) -> Text:
        """The recent steps' acceptance, `width` bars."""
        style = self.get_component_rich_style("spec-meter--spark", partial=True)
        return Text(sparkline(stats.recent_acceptance, width).ljust(width, " "), style=style)

    def _figures(self, stats: SpeculativeStats, label: Style) -> Text:
        """Acceptance, mean accepted length and the speedup (green or yellow when measurable)."""
        figures = Text()
        figures.append(f" {stats.acceptance_rate:.0%}" if stats.drafted else " –", style="bold")
        figures.append(" accepted", style=label)
        figures.append(f"  {stats.mean_accepted_length:.2f}", style="bold")
        figures.append(" tok/step", style=label)
        if stats.speedup > 0:
            style: Style | str = label  # within the noise (or not measured): "~", not coloured as a gain or a loss
            if measurable(stats.speedup, self.noise):
                style = "bold green" if stats.speedup >= 1 else "bold yellow"
            figures.append(f"  {speedup_text(stats.speedup, self.noise, 2)}", style=style)
        return figures


def by_position(rates: tuple[float, ...], label: Style, spark: Style) -> list[tuple[str, Style | str]]:
    """Acceptance by draft position: one bar per position, then the rates of the first positions and the last."""
    if not rates:
        return [("by position ", label), ("–", "")]
    parts: list[tuple[str, Style | str]] = [("by position ", label), (sparkline(rates, len(rates)), spark)]
    shown = [f"{i}: {rate:.0%}" for i, rate in enumerate(rates, 1)]
    if len(shown) > 5:
        shown = [*shown[:4], "…", shown[-1]]
    parts.append(("  " + "  ".join(shown), ""))
    return parts
