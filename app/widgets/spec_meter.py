"""The live speculative-decoding meter: acceptance per step as a sparkline, mean accepted length, speedup, status;
expanded (ctrl+o), the counts, acceptance by draft position, drafting vs verifying time and each chained drafter."""

from __future__ import annotations

from typing import Final

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from app.speculation import measurable, sparkline, speedup_text
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

    def watch_expanded(self, expanded: bool) -> None:
        self.tooltip = COUNTS_HELP if expanded else None

    def watch_stats(self) -> None:
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
        lines = [
            row(
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
            lines.append(
                row(
                    (f"{report.name:<13} ", "bold"),
                    (f"{report.drafts} drafts  ", label),
                    (f"accepted {report.accepted} of {report.proposed} proposed{share}", ""),
                    (f"  {sparkline(report.acceptance_per_position, SPARK_WIDTH)}".rstrip(), spark),
                    (f"  {report.draft_ms:.1f} ms drafting", label),
                )
            )
        return lines

    def _summary(self) -> Text:
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
        line.append(
            sparkline(stats.recent_acceptance, width).ljust(width, " "),
            style=self.get_component_rich_style("spec-meter--spark", partial=True),
        )
        line.append(f" {stats.acceptance_rate:.0%}" if stats.drafted else " –", style="bold")
        line.append(" accepted", style=label)
        line.append(f"  {stats.mean_accepted_length:.2f}", style="bold")
        line.append(" tok/step", style=label)
        if stats.speedup > 0:
            style: Style | str = label  # within the noise (or not measured): "~", not coloured as a gain or a loss
            if measurable(stats.speedup, self.noise):
                style = "bold green" if stats.speedup >= 1 else "bold yellow"
            line.append(f"  {speedup_text(stats.speedup, self.noise, 2)}", style=style)
        if stats.n_max:
            line.append(f"  n_max {stats.n_max}", style=label)
        if stats.status:
            line.append(f"  {stats.status}", style=self.get_component_rich_style("spec-meter--status", partial=True))
        return line


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
