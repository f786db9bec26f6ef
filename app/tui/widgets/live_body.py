"""The reply being streamed: `LiveMessage` (header, reasoning, body) and `LiveBody`, which freezes the reply's
finished Markdown blocks into lines rendered once and re-renders only the block being written, at most once a frame,
repainting only the lines that changed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from rich.markdown import Markdown as RichMarkdown
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Static

from app.tui.messages import DraftSpan, add_span
from app.tui.streaming import FLUSH_INTERVAL_S
from app.tui.streaming import RENDER_SHARE as STREAM_RENDER_SHARE
from app.tui.textual_internals.layout import LaidOutOnce
from app.tui.widgets.draft_provenance import DraftSpans, draft_styles, mark_provenance
from app.tui.widgets.markdown_render import Lines, has_long_live_code, markdown_renderable
from app.tui.widgets.message_view import message_header
from app.tui.widgets.rendered_once import RenderedOnce, to_strips
from engine_ext.untrusted_text import shown

_LIST_ITEM: Final = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)", re.MULTILINE)
LIST_MARKER_CHARS: Final = 12  # enough of a line to tell whether it starts a list item (up to 9 digits, ". ")


def changed_lines(old: Sequence[Strip], new: Sequence[Strip], start: int = 0) -> tuple[int, int]:
    """The rows [start, stop) where `new` differs from `old`, looking from `start` on (a row only one has counts)."""
    n_old, n_new = len(old), len(new)
    end = max(n_old, n_new)
    common = min(n_old, n_new)
    while start < common and old[start] == new[start]:
        start += 1
    if start >= end:
        return end, end
    stop = end
    if n_old == n_new:
        while stop > start and old[stop - 1] == new[stop - 1]:
            stop -= 1
    return start, stop


def freeze_point(text: str, min_chars: int) -> int:
    """Where the streamed `text` can be cut so the part before is finished Markdown: the end of the last blank
    line outside a fenced code block at or after `min_chars` (-1 when there is none)."""
    cut = -1
    in_fence = False
    position = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
        position += len(line)
        if not in_fence and not line.strip() and line.endswith("\n") and position >= min_chars:
            # Only a blank line before top-level text: the next block starts a new paragraph, heading or fence
            # (not the next item of a list: a list split in two would be drawn as two lists).
            rest = text[position : position + 1]
            # The block after it must be known to start: its first line complete or long enough to tell a list
            # item ("1. ", "- ") from text ("1999", "---"); streamed text often ends just after a blank line.
            decided = "\n" in text[position : position + LIST_MARKER_CHARS] or len(text) - position >= LIST_MARKER_CHARS
            if rest and not rest.isspace() and decided and not _LIST_ITEM.match(text, position):
                cut = position
    return cut


_CONTAINER_OPENS: Final = frozenset({"bullet_list_open", "ordered_list_open", "blockquote_open", "table_open"})


def _block_edges(markdown: RichMarkdown) -> tuple[bool, bool]:
    """Whether `markdown` starts with a container block (list, quote, table) and whether it ends with a rule."""
    top = [token for token in markdown.parsed if token.level == 0 and token.nesting >= 0]
    return bool(top) and top[0].type in _CONTAINER_OPENS, bool(top) and top[-1].type == "hr"


def _needs_separator(previous_ends_with_rule: bool, starts_with_container: bool) -> bool:
    """Whether Rich puts a blank line between two blocks when it draws them in one document: after a leaf block
    (paragraph, heading, code) when the next block is a leaf too. A list, quote or table draws its own blank line
    first (drawn alone too), and a rule ends with one."""
    return not previous_ends_with_rule and not starts_with_container


def _is_plain_paragraph(markdown: RichMarkdown, source: str) -> bool:
    """Whether `source` parsed to one paragraph whose only inline token is its text, unchanged."""
    tokens = markdown.parsed
    if len(tokens) != 3 or tokens[0].type != "paragraph_open" or "\n" in source or "\t" in source:
        return False
    children = tokens[1].children or []
    text = source.strip()
    return len(children) == 1 and children[0].type == "text" and children[0].content == text == source.rstrip()


def _line_starts(text: str, lines: Lines, known: list[int]) -> list[int] | None:
    """Where each drawn line of a plain paragraph starts in `text` (the first len(known) already known); None
    when a line is not found where word wrap would have put it."""
    starts = list(known)
    pos = starts[-1] + len("".join(s.text for s in lines[len(starts) - 1]).rstrip()) if starts else 0
    for line in lines[len(starts) :]:
        drawn = "".join(segment.text for segment in line).rstrip()
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if not drawn or not text.startswith(drawn, pos):
            return None
        starts.append(pos)
        pos += len(drawn)
    return starts


@dataclass
class FrozenSegment:
    """A finished part of the reply being streamed: its Markdown, where it starts in the reply, its lines (with the
    blank line that separates it from the segment before, when Rich draws one there)."""

    markdown: str
    start: int
    lines: Lines
    separated: bool = False
    """Whether its lines start with a blank line that separates it from the segment before."""
    ends_with_rule: bool = False


class LiveBody(RenderedOnce):
    """The answer being streamed, in one widget: finished blocks frozen into lines rendered once, then the tail.

    Each finished block is rendered once into a `FrozenSegment` as soon as the next one has started, so only the
    block being written is parsed again, at most once every `render_interval` however fast tokens come. The height is
    allocated in steps of a screenful (at least GROW_LINES), so a new line of text usually changes no size and
    only the tail's lines are repainted.
    """

    GROW_LINES: ClassVar[int] = 16
    RENDER_INTERVAL_S: ClassVar[float] = FLUSH_INTERVAL_S
    """The bridge's batching interval (app/tui/streaming.py): each batch is drawn as it comes, not batched again."""
    RENDER_SHARE: ClassVar[float] = STREAM_RENDER_SHARE
    """The most of a core re-rendering the tail may take: a tail slow to render is drawn less often."""

    COMPONENT_CLASSES = {"live-body--draft", "live-body--draft-model", "live-body--draft-rejected"}

    DEFAULT_CSS = """
    LiveBody {
        height: auto;
    }
    LiveBody > .live-body--draft {
        color: $text-accent;
        text-style: underline;
    }
    LiveBody > .live-body--draft-model {
        color: $text-success;
        text-style: underline;
    }
    LiveBody > .live-body--draft-rejected {
        color: $text-error;
        text-style: bold;
    }
    """

    def __init__(self, text: str, *, dark: bool, draft_spans: DraftSpans = (), colour_drafts: bool = False) -> None:
        super().__init__(classes="live-body")
        self.dark = dark
        self.text = text
        """The whole answer so far."""
        self.segments: list[FrozenSegment] = []
        """The frozen blocks, in order; the tail is the text after them."""
        self.draft_spans: list[DraftSpan] = list(draft_spans)
        """Where the answer came from accepted draft tokens."""
        self.colour_drafts = colour_drafts
        self._frozen_chars = 0
        self._frozen_width = -1
        self._frozen_strips: list[Strip] = []
        self._frozen_strips_segments = 0  # segments whose strips are in _frozen_strips
        self._frozen_colour = False
        self._tail_lines: Lines = []
        self._tail_unhighlighted = False  # the tail has a long code block drawn without highlighting (live)
        # The tail's lines when it is one plain paragraph: ((where the tail starts, width, dark), tail, where each
        # line starts in it, the lines)
        self._plain: tuple[tuple[int, int, bool], str, list[int], Lines] | None = None
        self._allocated = 0
        self._render_timer: Timer | None = None
        self._rendered_at = 0.0
        self._render_cost = 0.0  # seconds the last render of the tail took
        self._when_drawn: list[Callable[[], object]] = []  # to call once the pending render has run
        self._freeze()

    @property
    def tail(self) -> str:
        """The text after the frozen segments (re-rendered as it grows)."""
        return self.text[self._frozen_chars :]

    @property
    def content_height(self) -> int:
        """Lines of text drawn (the allocated height can be more)."""
        return len(self._strips) if self._strips_width >= 0 else 0

    def _freeze(self) -> None:
        """Freeze every finished block of the tail into one segment (the tail keeps the block being written)."""
        tail = self.tail
        cut = freeze_point(tail, 0)
        if cut <= 0:
            return
        segment = FrozenSegment(tail[:cut], self._frozen_chars, [])
        markdown = markdown_renderable(segment.markdown, dark=self.dark)
        starts_with_container, segment.ends_with_rule = _block_edges(markdown)
        segment.separated = bool(self.segments) and _needs_separator(
            self.segments[-1].ends_with_rule, starts_with_container
        )
        if self._frozen_width > 0:
            segment.lines = self._render_segment(segment, self._frozen_width, markdown)
        self.segments.append(segment)
        self._frozen_chars += cut

    def _render_segment(self, segment: FrozenSegment, width: int, markdown: RichMarkdown | None = None) -> Lines:
        """The segment's lines at `width` (`markdown`: the segment already parsed)."""
        if markdown is None:
            markdown = markdown_renderable(segment.markdown, dark=self.dark)
        lines = self.render_renderable(markdown, width)
        return [[], *lines] if segment.separated else lines  # the same lines as in the whole reply drawn at once

    def append(self, text: str, spans: Sequence[DraftSpan] = ()) -> None:
        """Add streamed text; `spans` (relative to `text`) came from accepted draft tokens. Drawn within a frame."""
        base = len(self.text)
        for start, end, drafter in spans:
            add_span(self.draft_spans, base + start, base + end, drafter)
        self.text += text
        if self._render_timer is None:
            delay = self._rendered_at + self.render_interval - time.monotonic()
            if delay <= 0:
                self._render_tail()  # drawn in the frame that also shows whatever else came with these tokens
            else:
                self._render_timer = self.set_timer(delay, self._render_tail, name="live-body-render")

    @property
    def render_interval(self) -> float:
        """Seconds between renders of the tail: RENDER_INTERVAL_S, longer when the last render took more than
        RENDER_SHARE of that."""
        return max(self.RENDER_INTERVAL_S, self._render_cost / self.RENDER_SHARE)

    @property
    def render_pending(self) -> bool:
        return self._render_timer is not None

    def when_drawn(self, callback: Callable[[], object]) -> None:
        """Call `callback` once the text appended so far is rendered: now, or when the pending render runs."""
        if self._render_timer is None:
            callback()
        else:
            self._when_drawn.append(callback)

    def _render_tail(self) -> None:
        """Render the tail (see _draw_tail), then call whoever waited for it."""
        self._draw_tail()
        callbacks, self._when_drawn = self._when_drawn, []
        for callback in callbacks:
            callback()

    def _draw_tail(self) -> None:
        """Freeze what is finished, render the tail again and repaint only the lines that changed."""
        self._render_timer = None
        self._rendered_at = time.monotonic()
        width = self._strips_width
        if width <= 0:
            self.refresh(layout=True)
            return
        old = self._strips
        first_changed = max(0, self.content_height - len(self._tail_lines))
        self._strips = new = self.render_strips(width)
        self._render_cost = time.monotonic() - self._rendered_at
        if self._fit():
            self.refresh(layout=True)
            return
        # Repaint only the lines that differ (usually the last one or two): a dirty region makes the compositor
        # render every widget under it, so repainting the whole tail costs a frame of the full view.
        start, stop = changed_lines(old, new, first_changed)
        if start < stop:
            self.refresh(Region(0, start, width, stop - start))

    def _fit(self) -> bool:
        """Grow (or after a freeze, shrink) the allocated height; whether it changed."""
        needed = len(self._strips)
        grow = self._screenful
        if needed + 1 > self._allocated or needed + 2 * grow < self._allocated:
            self._allocated = needed + grow
            return True
        return False

    @property
    def _screenful(self) -> int:
        """The room the reply grows by: a screenful (at least GROW_LINES), so few re-layouts of the screen."""
        return max(self.GROW_LINES, self.app.size.height)

    def reserve(self, lines: int) -> None:
        """Keep at least `lines` of room below the text, growing by a screenful if there is less. The transcript
        calls this when it scrolls to follow the text: the re-layout then comes in the frame that repaints the whole
        view for the scroll anyway, rather than in a frame of its own when the text reaches the end of its room."""
        needed = len(self._strips)
        if self._strips_width >= 0 and self._allocated - needed < lines:
            self._allocated = needed + lines + self._screenful
            self.refresh(layout=True)

    def flush(self) -> None:
        """Draw what was appended now (e.g. before the reply is frozen into a finished message)."""
        if self._render_timer is not None:
            self._render_timer.stop()
            self._render_timer = None
        self._render_tail()

    def set_colour_drafts(self, colour: bool) -> None:
        if colour != self.colour_drafts:
            self.colour_drafts = colour
            if self.draft_spans:
                self._strips_width = -1
                self.refresh()

    def plain_lines(self, width: int) -> Lines | None:
        """The answer's lines at `width` without draft colouring (None when not rendered at that width, or when a
        long code block in the text still being written was drawn unhighlighted)."""
        if width != self._frozen_width or self._tail_unhighlighted:
            return None
        lines: Lines = [line for segment in self.segments for line in segment.lines]
        return lines + self._tail_lines

    def render_strips(self, width: int) -> list[Strip]:
        colour = self.colour_drafts and bool(self.draft_spans)
        styles: dict[int, Style] = {}
        if colour:
            styles = draft_styles(self, "live-body")
        if width != self._frozen_width:
            self._frozen_width = width
            for segment in self.segments:
                segment.lines = self._render_segment(segment, width)
            self._frozen_strips, self._frozen_strips_segments = [], 0
        if colour != self._frozen_colour:
            self._frozen_colour = colour
            self._frozen_strips, self._frozen_strips_segments = [], 0
        self._freeze()
        # Frozen segments become strips once; only the tail's are made again.
        for segment in self.segments[self._frozen_strips_segments :]:
            lines = self._coloured(segment.lines, segment.markdown, segment.start, styles) if colour else segment.lines
            self._frozen_strips.extend(to_strips(lines, width))
        self._frozen_strips_segments = len(self.segments)
        tail = self.tail
        self._tail_lines = []
        self._tail_unhighlighted = False
        if tail.strip():
            markdown = markdown_renderable(tail, dark=self.dark, live=True)
            self._tail_unhighlighted = has_long_live_code(markdown)
            self._tail_lines = self._plain_lines(tail, markdown, width)
            if self.segments and _needs_separator(self.segments[-1].ends_with_rule, _block_edges(markdown)[0]):
                self._tail_lines.insert(0, [])
        lines = self._coloured(self._tail_lines, tail, self._frozen_chars, styles) if colour else self._tail_lines
        return self._frozen_strips + to_strips(lines, width)

    def _plain_lines(self, tail: str, markdown: RichMarkdown, width: int) -> Lines:
        """The tail's lines; a plain paragraph growing at its end re-renders only from its last line on.

        Most of a reply is paragraphs of plain text, and re-rendering the whole paragraph being written at every
        frame costs time proportional to its length. When the tail parses to one paragraph whose only inline
        token is its own text unchanged (no emphasis, code, link, entity, escape or line break anywhere in it),
        Rich draws it by greedy word wrap, so the lines before the last one stay as they were as text is added:
        only the text from the last line's start is rendered again (and checked to be plain on its own, as a
        line may start with "- " or "1."). Otherwise the tail is rendered whole.
        """
        previous, self._plain = self._plain, None
        if not _is_plain_paragraph(markdown, tail):
            return self.render_renderable(markdown, width)
        key = (self._frozen_chars, width, self.dark)
        lines: Lines = []
        starts: list[int] = []
        if previous is not None and previous[0] == key and tail.startswith(previous[1]) and len(previous[2]) > 1:
            keep = len(previous[2]) - 1
            start = previous[2][keep]
            suffix = markdown_renderable(tail[start:], dark=self.dark)
            if _is_plain_paragraph(suffix, tail[start:]):
                lines = previous[3][:keep] + self.render_renderable(suffix, width)
                starts = previous[2][:keep]
        located = _line_starts(tail, lines, starts) if lines else None
        if located is None:  # no earlier lines to keep (or they did not line up): the paragraph whole
            lines = self.render_renderable(markdown, width)
            located = _line_starts(tail, lines, [])
        if located is not None:
            self._plain = (key, tail, located, list(lines))
        return lines

    def _coloured(self, lines: Lines, source: str, start: int, styles: Mapping[int, Style]) -> Lines:
        end = start + len(source)
        spans = [
            (max(s, start) - start, min(e, end) - start, drafter)
            for s, e, drafter in self.draft_spans
            if s < end and e > start
        ]
        return mark_provenance(lines, source, spans, styles)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._strips_width:
            self._strips_for(width)
            self._fit()
        return self._allocated


class LiveMessage(LaidOutOnce, Vertical):
    """The reply being streamed: header, reasoning (folded) and the answer (a `LiveBody`)."""

    DEFAULT_CSS = """
    LiveMessage {
        height: auto;
    }
    """

    def __init__(
        self,
        message_id: int,
        model: str,
        *,
        content: str = "",
        reasoning: str = "",
        dark: bool = True,
        draft_spans: DraftSpans = (),
        colour_drafts: bool = False,
    ) -> None:
        super().__init__(classes="message -assistant -streaming")
        self.message_id = message_id
        self.model = model
        self.dark = dark
        self._reasoning = reasoning
        self.body = LiveBody(content, dark=dark, draft_spans=draft_spans, colour_drafts=colour_drafts)
        self.show_reasoning = False
        self._reading = False  # the header says how much of the prompt is read

    @property
    def text(self) -> str:
        return self.body.text

    def compose(self) -> ComposeResult:
        yield Static(message_header("assistant", "streaming", self.model, None), classes="live-header")
        yield Static("", classes="live-reasoning")
        yield self.body

    def on_mount(self) -> None:
        self._update_reasoning()

    def reading(self, done: int, total: int) -> None:
        """Say in the header how much of a long prompt is read (the reply starts once all of it is)."""
        header = message_header("assistant", "", self.model, None)
        header.append(f"  [reading the prompt: {done:,} of {total:,} tokens]", style="italic")
        self.query_one(".live-header", Static).update(header)
        self._reading = True

    def notice(self, text: str) -> None:
        """A line under the reply (it repeats itself…), shown while it streams; replaced by the next one."""
        found = self.query(".live-notice")
        if found:
            found.first(Static).update(text)
        else:
            self.mount(Static(text, classes="live-notice"))

    def waiting(self, note: str) -> None:
        """Say in the header what the reply waits for before it starts ("": nothing now, it is being written)."""
        header = message_header("assistant", "" if note else "streaming", self.model, None)
        if note:
            header.append(f"  [{note}]", style="italic")
        self.query_one(".live-header", Static).update(header)
        self._reading = bool(note)

    def write(self, text: str, reasoning: str, spans: Sequence[DraftSpan] = ()) -> None:
        """Append streamed text (drawn within a frame) and reasoning."""
        if self._reading:
            self._reading = False
            self.query_one(".live-header", Static).update(message_header("assistant", "streaming", self.model, None))
        if reasoning:
            self._reasoning += reasoning
            self._update_reasoning()
        if text:
            self.body.append(text, spans)

    def content_bottom(self) -> int:
        """The y of the end of the streamed text, relative to this widget's top (the body's virtual region is
        relative to this widget, its container)."""
        return self.body.virtual_region.y + self.body.content_height

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.has_class("live-reasoning"):
            self.show_reasoning = not self.show_reasoning
            self._update_reasoning()

    def _update_reasoning(self) -> None:
        widget = self.query_one(".live-reasoning", Static)
        reasoning = self._reasoning.strip()
        widget.display = bool(reasoning)
        if not reasoning:
            return
        if self.show_reasoning:
            widget.update(Text("▾ Reasoning (click to hide)\n" + shown(reasoning, multiline=True), style="dim italic"))
        else:
            words = len(reasoning.split())
            widget.update(Text(f"▸ Thinking… ({words} words; click to show)", style="dim italic"))

    def stop(self) -> None:
        """Draw the last text appended."""
        self.body.flush()
