"""The live speculative-decoding meter: acceptance per step as a sparkline, mean accepted length, speedup, status."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from app.speculation import sparkline
from engine_ext.protocol import SpeculativeStats

SPARK_WIDTH = 16


class SpecMeter(Widget):
    """One line under the transcript while speculation is on (F8 toggles it, F9 picks the type)."""

    DEFAULT_CSS = """
    SpecMeter {
        height: 1;
    }
    """

    COMPONENT_CLASSES = {"spec-meter--label", "spec-meter--spark", "spec-meter--status"}

    spec_type: reactive[str] = reactive("")
    """The type the user picked (auto, ngram-mod, draft-mtp…)."""
    drafters: reactive[tuple[str, ...]] = reactive(tuple)
    """The drafters the engine chained (empty until it confirms)."""
    stats: reactive[SpeculativeStats | None] = reactive(None)
    """The latest statistics (live while a reply streams, then the reply's final ones)."""

    def render(self) -> Text:
        label = self.get_component_rich_style("spec-meter--label", partial=True)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" ⚡ ", style="bold")
        line.append(self.spec_type or "speculative", style="bold")
        if self.drafters and tuple(self.drafters) != (self.spec_type,):
            line.append(f" ({'+'.join(self.drafters)})", style=label)
        stats = self.stats
        if stats is None:
            line.append("  waiting for a reply", style=label)
            return line
        width = max(4, min(SPARK_WIDTH, self.size.width // 6)) if self.size.width else SPARK_WIDTH
        line.append("  ")
        line.append(sparkline(stats.recent_acceptance, width).ljust(width, " "),
                    style=self.get_component_rich_style("spec-meter--spark", partial=True))
        line.append(f" {stats.acceptance_rate:.0%}" if stats.drafted else " –", style="bold")
        line.append(" accepted", style=label)
        line.append(f"  {stats.mean_accepted_length:.2f}", style="bold")
        line.append(" tok/step", style=label)
        if stats.speedup > 0:
            line.append(f"  ×{stats.speedup:.2f}", style="bold green" if stats.speedup >= 1 else "bold yellow")
        if stats.n_max:
            line.append(f"  n_max {stats.n_max}", style=label)
        if stats.status:
            line.append(f"  {stats.status}", style=self.get_component_rich_style("spec-meter--status", partial=True))
        return line
