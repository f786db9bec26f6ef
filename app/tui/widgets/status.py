"""The header line (model, backend, engine state) and the stats bar under the transcript."""

from __future__ import annotations

from typing import Any, Final

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from engine_ext.cpu import CpuLoad
from engine_ext.untrusted_text import shown

ENGINE_STATE_STYLES = {
    "ready": "bold green",
    "generating": "bold cyan",
    "loading": "bold yellow",
    "starting": "bold yellow",
    "crashed": "bold red",
    "error": "bold red",
    "no model": "bold yellow",
}


def _short(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class AppHeader(Widget):
    """One line: the app name, the conversation title and the format its replies are held to, the loaded model, the
    backend and the engine state."""

    DEFAULT_CSS = """
    AppHeader {
        height: 1;
        dock: top;
    }
    """

    model_name: reactive[str] = reactive("")
    """The loaded model ('' while none)."""
    backend: reactive[str] = reactive("")
    """CPU, CUDA, Metal…"""
    engine_state: reactive[str] = reactive("starting")
    """starting, loading, ready, generating, crashed, error or no model."""
    conversation_title: reactive[str] = reactive("")
    """The conversation on screen."""
    output_format: reactive[str] = reactive("")
    """The format the conversation's replies are held to ("json", "json schema", "grammar"; '': free text)."""

    def validate_model_name(self, name: str) -> str:
        return shown(name)  # a GGUF's general.name, a remote server's model id

    def validate_conversation_title(self, title: str) -> str:
        return shown(title)  # an imported conversation's title

    def render(self) -> Text:
        """The whole line when it fits; otherwise the conversation title is shortened first, then the model name,
        so the engine state and backend stay (the narrow stats bar leaves them to the header)."""
        width = self.size.width
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" llmtui ", style="bold reverse")
        model = Text(self.model_name or "no model", style="bold" if self.model_name else "dim")
        state = Text(" · ")
        if self.backend:
            state.append(f"{self.backend} · ")
        state.append(self.engine_state, style=ENGINE_STATE_STYLES.get(self.engine_state, ""))
        separator = Text(" │ ", style="dim")
        title = Text(f" {self.conversation_title} ", style="bold") if self.conversation_title else Text()
        form = Text(f"[{self.output_format}]", style="bold cyan") if self.output_format else Text()
        if width:
            fixed = line.cell_len + separator.cell_len + state.cell_len + form.cell_len
            model.truncate(max(1, width - fixed), overflow="ellipsis")
            room = width - fixed - model.cell_len
            if title.cell_len > room and room < 6:  # no room for a useful part of the title
                title = Text()
            elif title.cell_len > room:
                title = Text(f" {self.conversation_title}", style="bold")
                title.truncate(room - 1, overflow="ellipsis")
                title.append(" ")
        line.append_text(title)
        line.append_text(form)
        line.append_text(separator)
        line.append_text(model)
        line.append_text(state)
        return line


# The stats bar's ever more compact forms, tried in order while its line is wider than the bar (StatsBar._text).
# A busy machine's note (see StatsBar.cpu) gets shorter along the way and outranks the token counts and the TTFT
# (it explains a slow reply). A reply that thought keeps its thinking and answer tokens ("think 312 · answer 88")
# after the prompt's count has gone, before the TTFT. Each form names what it needs to be tried ("busy": a busy
# machine's note, "thought": a reply that thought, "": always); the others change nothing and are skipped.
COMPACT_STATS: Final[tuple[tuple[dict[str, Any], str], ...]] = (
    ({"state": False}, ""),
    ({"state": False, "busy": "short"}, "busy"),
    ({"state": False, "gap": " ", "bar": 4, "busy": "short"}, ""),
    ({"state": False, "gap": " ", "bar": 4, "counts": "thought", "busy": "short"}, "thought"),
    ({"state": False, "gap": " ", "bar": 4, "counts": "thought", "ttft": False, "busy": "short"}, "thought"),
    ({"state": False, "gap": " ", "bar": 4, "counts": "none", "busy": "short"}, ""),
    ({"state": False, "gap": " ", "bar": 4, "counts": "none", "ttft": False, "busy": "tiny"}, "busy"),
)
BUSY_HELP: Final = (
    "Other programs are using {others:.1f} of the {cpus} CPUs the engine runs on, so its {threads} threads wait "
    "for their turn and replies come slower. Close other programs, or set fewer threads (F3 settings: Threads, "
    "or -t on the command line)."
)
ADAPTED_HELP: Final = (
    "Other programs are using {others:.1f} of the {cpus} CPUs the engine runs on, so it decodes on {threads} of its "
    "{max_threads} threads: more threads than free CPUs would wait for each other after every step. It goes back to "
    "{max_threads} when the CPUs are free again (a thread count set in F3 settings or with -t stays fixed)."
)


class StatsBar(Widget):
    """Decode speed, time to first token, prompt tokens, context used (a bar), engine state and backend.

    `extras` holds readouts later features add (speculative acceptance, steering), shown at the right.
    """

    DEFAULT_CSS = """
    StatsBar {
        height: 1;
    }
    StatsBar > .stats-bar--busy {
        color: $warning;
        text-style: bold;
    }
    """

    COMPONENT_CLASSES = {"stats-bar--bar-used", "stats-bar--bar-free", "stats-bar--label", "stats-bar--busy"}

    decode_tps: reactive[float | None] = reactive(None)
    """Tokens per second while decoding."""
    ttft_ms: reactive[float | None] = reactive(None)
    """Time to first token of the last reply."""
    prompt_tokens: reactive[int | None] = reactive(None)
    """Tokens in the last prompt."""
    generated_tokens: reactive[int | None] = reactive(None)
    """Tokens in the last reply."""
    reasoning_tokens: reactive[int | None] = reactive(None)
    """Of those, the tokens it thought (None: the reply did not think, or it is not finished)."""
    n_ctx_used: reactive[int] = reactive(0)
    """Context tokens in use."""
    n_ctx: reactive[int] = reactive(0)
    """Context size of the loaded model."""
    engine_state: reactive[str] = reactive("starting")
    """Same as the header's."""
    backend: reactive[str] = reactive("")
    """CPU, CUDA, Metal…"""
    progress: reactive[float | None] = reactive(None)
    """Model load progress 0..1 while loading."""
    extras: reactive[dict[str, str]] = reactive(dict)
    """More readouts: label → value."""
    trims: reactive[dict[str, str]] = reactive(dict)
    """Of those readouts, label → the start of its value that may be cut when nothing else gives way (a steering
    vector's name: its strength after it stays in view)."""
    spares: reactive[frozenset[str]] = reactive(frozenset)
    """Of those readouts, the ones shown elsewhere too (spec: the speculation meter above says it): left out when
    the line is too wide, so the ones after them (api: the server's port and requests) stay in view."""
    cpu: reactive[CpuLoad | None] = reactive(None)
    """Other programs' CPU use during the reply and the engine's threads: a note when they crowd the engine
    (`CpuLoad.busy`), nothing otherwise."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, classes=classes)
        self._styles: dict[str, Style] = {}  # component styles walk every ancestor: looked up once per style change
        self._line: Strip | None = None  # the drawn line, until the next refresh

    def notify_style_update(self) -> None:
        self._styles.clear()
        super().notify_style_update()

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Any:
        self._line = None
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def render_line(self, y: int) -> Strip:
        """The one line, drawn by Rich straight from `render()`'s Text: Textual's own path (Content, visual
        caches) cost about a millisecond per update, and the bar changes a few times a second while a reply
        streams, on a machine whose every core may be decoding."""
        width = self.size.width
        line = self._line
        if line is None or line.cell_length != width:
            options = self.app.console_options.update(width=max(1, width), height=1, highlight=False)
            lines = self.app.console.render_lines(self.render(), options, pad=False)
            segments = Segment.simplify(lines[0]) if lines else []  # runs of one style as one segment, as Textual
            line = Strip(segments).adjust_cell_length(width).apply_style(self.rich_style)
            self._line = line
        return line if y == 0 else Strip.blank(width, self.rich_style)

    def watch_cpu(self, cpu: CpuLoad | None) -> None:
        """The busy note's tooltip says what helps; none when not busy."""
        if cpu is None or not (cpu.busy() or cpu.adapted()):
            self.tooltip = None
        elif cpu.adapted():
            self.tooltip = ADAPTED_HELP.format(
                others=cpu.others, cpus=cpu.cpus, threads=cpu.threads, max_threads=cpu.max_threads
            )
        else:
            self.tooltip = BUSY_HELP.format(others=cpu.others, cpus=cpu.cpus, threads=cpu.threads or cpu.cpus)

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(name, partial=True)
        return style

    def set_stats(self, stats: dict[str, Any]) -> None:
        """Show a finished reply's stats (GenerationStats.to_dict())."""

        def number(key: str, kind: type[float] | type[int]) -> Any:
            value = stats.get(key)
            return None if value is None else kind(value)  # not measured (a reply that failed): shown as –

        self.decode_tps = number("decode_tps", float)
        self.ttft_ms = number("ttft_ms", float)
        self.prompt_tokens = number("prompt_tokens", int)
        self.generated_tokens = number("generated_tokens", int)
        self.reasoning_tokens = number("reasoning_tokens", int) or None  # 0: the reply did not think
        self.n_ctx_used = int(stats.get("n_ctx_used", 0))
        self.n_ctx = int(stats.get("n_ctx", self.n_ctx))

    def render(self) -> Text:
        """The line at full length, or as compact as needed to fit the width: without the engine state and backend
        (the header shows both), then with single spaces and a shorter context bar, then without the prompt and
        reply token counts (the context in use stays; a reply that thought keeps its thinking and answer tokens
        longer, at the TTFT's expense). A busy machine's note shortens along the way, and last the TTFT gives way
        to it. Still too wide, the readouts shown elsewhere too (`spares`) are left out; then a readout's name that
        may be cut (`trims`) is cut, so what follows it (a steering vector's strength) stays in view (issue 49, 17)."""
        width = self.size.width
        busy = self.cpu is not None and (self.cpu.busy() or self.cpu.adapted())
        tried = {"", *(("busy",) if busy else ()), *(("thought",) if self._thought() else ())}
        line = self._text()
        form: dict[str, Any] = {}
        for compact, needs in COMPACT_STATS:
            if not width or line.cell_len <= width:
                break
            if needs in tried:
                form = compact
                line = self._text(**form)
        if width and line.cell_len > width and self.spares & self.extras.keys():
            form = {**form, "skip": self.spares}  # (a copy: the forms are shared)
            line = self._text(**form)
        if width and line.cell_len > width and self.trims:
            line = self._text(**form, trim=line.cell_len - width)
        return line

    def _thought(self) -> bool:
        """Whether the reply shown thought (its thinking and answer tokens are told apart)."""
        return bool(self.reasoning_tokens) and self.generated_tokens is not None

    def _busy_note(self, form: str) -> str:
        """'busy: others use 1.4 of 2 CPUs · 2 threads', shorter in the 'short' and 'tiny' forms; '' when the
        machine is not busy."""
        cpu = self.cpu
        if cpu is None or not (cpu.busy() or cpu.adapted()):
            return ""
        threads = cpu.threads or cpu.cpus
        count = f"{threads} thread" if threads == 1 else f"{threads} threads"
        if cpu.adapted():  # the engine runs on fewer threads while others crowd it: '… · 1 of 2 threads'
            count = (
                f"{threads}/{cpu.max_threads} threads" if form == "tiny" else f"{threads} of {cpu.max_threads} threads"
            )
        if form == "long":
            return f"busy: others use {cpu.others:.1f} of {cpu.cpus} CPUs · {count}"
        if form == "short":
            return f"busy {cpu.others:.1f}/{cpu.cpus} CPUs · {count}"
        return f"busy {cpu.others:.1f}/{cpu.cpus} · {count}"

    def _text(
        self,
        *,
        state: bool = True,
        gap: str = "  ",
        bar: int = 10,
        counts: str = "all",
        ttft: bool = True,
        busy: str = "long",
        trim: int = 0,
        skip: frozenset[str] = frozenset(),
    ) -> Text:
        label = self._style("stats-bar--label")
        line = Text(no_wrap=True, overflow="ellipsis")
        if self.progress is not None:
            line.append(f" loading {self.progress * 100:3.0f}% ", style="bold")
        line.append(" ")
        line.append(f"{self.decode_tps:.1f}" if self.decode_tps is not None else "–", style="bold")
        line.append(" tok/s", style=label)
        if ttft:
            line.append(f"{gap}TTFT ", style=label)
            ms = " ms" if gap == "  " else "ms"
            line.append(f"{self.ttft_ms:.0f}{ms}" if self.ttft_ms is not None else "–")
        if counts == "all":  # "thought": the thinking and answer tokens only; "none": no counts
            line.append(f"{gap}prompt ", style=label)
            line.append(f"{self.prompt_tokens}" if self.prompt_tokens is not None else "–")
        if self._thought() and counts != "none":
            thought = self.reasoning_tokens or 0
            line.append(f"{gap}think ", style=label)
            line.append(str(thought))
            line.append(" · answer ", style=label)
            line.append(str(max(0, (self.generated_tokens or 0) - thought)))
        elif self.generated_tokens is not None and counts == "all":
            line.append(f"{gap}reply ", style=label)
            line.append(str(self.generated_tokens))
        line.append(f"{gap}ctx ", style=label)
        fraction = min(1.0, self.n_ctx_used / self.n_ctx) if self.n_ctx else 0.0
        used = round(fraction * bar)
        line.append("█" * used, style=self._style("stats-bar--bar-used"))
        line.append("░" * (bar - used), style=self._style("stats-bar--bar-free"))
        line.append(f" {_short(self.n_ctx_used)}/{_short(self.n_ctx)}" if self.n_ctx else " –")
        for name, value in self.extras.items():
            if name in skip:
                continue
            cut = self.trims.get(name, "")
            if trim > 0 and len(cut) > 2 and value.startswith(cut):  # its name shortened, what follows it kept
                keep = max(1, len(cut) - trim - 1)
                value = f"{cut[:keep]}…{value[len(cut) :]}"
                trim -= len(cut) - keep - 1
            line.append(f"{gap}{name} ", style=label)
            line.append(value)
        note = self._busy_note(busy)
        if note:
            line.append(gap)
            line.append(note, style=self._style("stats-bar--busy"))
        if state:
            line.append(gap)
            line.append(self.engine_state, style=ENGINE_STATE_STYLES.get(self.engine_state, ""))
            if self.backend:
                line.append(f" · {self.backend}", style=label)
        return line
