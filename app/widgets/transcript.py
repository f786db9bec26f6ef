"""The transcript: each finished message one static widget drawn from cached lines; the streaming reply's finished
blocks frozen into cached lines and only its tail re-rendered, at most once a frame."""

from __future__ import annotations

import copy
import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from markdown_it import MarkdownIt
from pygments.lexer import Lexer
from pygments.lexers import find_lexer_class, get_all_lexers
from pygments.plugin import find_plugin_lexers
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markdown import CodeBlock as RichCodeBlock
from rich.markdown import Markdown as RichMarkdown
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax, SyntaxTheme
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scrollbar import ScrollBar
from textual.strip import Strip
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Static

from app.messages import DraftSpan, add_span
from app.store import Message as StoredMessage
from engine_ext.protocol import REJECTED_PREFIX

PAGE_SIZE: Final = 16  # messages mounted at a time; older ones are mounted when the user scrolls up to them
_CODE_BLOCK: Final = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_RENDERED_TOKEN: Final = re.compile(r"\w+|[^\w\s]")
_SPACE_RUN: Final = re.compile(r" +")
_LIST_ITEM: Final = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)", re.MULTILINE)
LIST_MARKER_CHARS: Final = 12  # enough of a line to tell whether it starts a list item (up to 9 digits, ". ")
WORD_LOOKAHEAD: Final = 160  # source characters a rendered word may be ahead of the last one (markup, link targets)
MARK_LOOKAHEAD: Final = 4  # the same for a lone punctuation mark, kept short so it cannot skip words
CHAR_LOOKAHEAD: Final = 16  # the same for a character of a word found only with markup inside it

DraftSpans = tuple[DraftSpan, ...]
"""(start, end, drafter) character ranges of a message's text that came from accepted draft tokens."""
NGRAM_DRAFT, MODEL_DRAFT, REJECTED_DRAFT = 1, 2, 3
"""How draft text is coloured: drafted by an n-gram drafter (or by a drafter not known), by a model, or the target's
token where a draft was rejected."""


def draft_kind(drafter: str) -> int:
    """The colour of text from `drafter`: MODEL_DRAFT for draft-simple, -mtp, -eagle3, -dflash, -dspark,
    REJECTED_DRAFT for the target's token where a draft was rejected (`rejected_by`), else NGRAM_DRAFT ("" is a span
    stored before llmtui kept the drafter)."""
    if drafter.startswith(REJECTED_PREFIX):
        return REJECTED_DRAFT
    return MODEL_DRAFT if drafter.startswith("draft-") else NGRAM_DRAFT

EMPTY_HINT: Final = (
    "Type a message below and press Enter.  Shift+Enter or Ctrl+J adds a line · F1 lists every key · "
    "ctrl+p finds any action."
)

STATE_LABELS: Final[dict[str, str]] = {
    "stopped": "stopped",
    "interrupted": "interrupted",
    "error": "failed",
    "streaming": "writing…",
}

Lines = list[list[Segment]]


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order, without their fences."""
    return [match.group(1) for match in _CODE_BLOCK.finditer(markdown)]


@dataclass(frozen=True)
class BranchInfo:
    """Where a message sits among its alternatives (1-based position, total)."""

    position: int
    total: int


def draft_styles(widget: Widget, prefix: str) -> dict[int, Style]:
    """The styles of draft text by kind, from the widget's `{prefix}--draft`, `{prefix}--draft-model` and
    `{prefix}--draft-rejected` classes."""
    return {NGRAM_DRAFT: widget.get_component_rich_style(f"{prefix}--draft", partial=True),
            MODEL_DRAFT: widget.get_component_rich_style(f"{prefix}--draft-model", partial=True),
            REJECTED_DRAFT: widget.get_component_rich_style(f"{prefix}--draft-rejected", partial=True)}


def draft_spans_from_stats(stats: dict[str, Any]) -> DraftSpans:
    """The draft spans a finished reply's stats carry under "draft_spans": [start, end, drafter], or [start, end]
    as stored before llmtui kept the drafter (bad entries are skipped)."""
    raw = stats.get("draft_spans", ())
    spans: list[DraftSpan] = []
    if isinstance(raw, list | tuple):
        for item in raw:
            if not isinstance(item, list | tuple) or len(item) not in (2, 3):
                continue
            start, end, *rest = item
            drafter = rest[0] if rest else ""
            if isinstance(start, int) and isinstance(end, int) and isinstance(drafter, str) and 0 <= start < end:
                spans.append((start, end, drafter))
    return tuple(spans)


def mark_provenance(lines: Lines, source: str, spans: Sequence[DraftSpan], styles: Mapping[int, Style]) -> Lines:
    """Add the style of each span's kind of drafter (`styles`, by `draft_kind`) to the rendered characters that came
    from `spans` of the Markdown `source`.

    Rendering drops markup and re-wraps text, so each rendered word is matched to its next occurrence in the
    source (a little ahead of the previous one); characters with no match (bullets, rules) stay as they are.
    """
    if not spans or not source:
        return lines
    marked = bytearray(len(source))
    for start, end, drafter in spans:
        start, end = max(0, start), min(len(source), end)
        if start < end:
            marked[start:end] = bytes((draft_kind(drafter),)) * (end - start)
    cursor = 0
    result: Lines = []
    for line in lines:
        text = "".join(segment.text for segment in line if not segment.control)
        flags: bytearray | None = None
        for match in _RENDERED_TOKEN.finditer(text):
            token = match.group()
            lookahead = WORD_LOOKAHEAD if len(token) > 1 or token.isalnum() else MARK_LOOKAHEAD
            found = source.find(token, cursor, cursor + len(token) + lookahead)
            if found >= 0:
                cursor = found + len(token)
                if any(marked[found:cursor]):
                    if flags is None:
                        flags = bytearray(len(text))
                    flags[match.start() : match.end()] = marked[found:cursor]
                continue
            # Markup inside the word ("un**believ**able", inline HTML): match it a character at a time.
            for offset, character in enumerate(token):
                found = source.find(character, cursor, cursor + 1 + CHAR_LOOKAHEAD)
                if found < 0:
                    continue
                cursor = found + 1
                if marked[found]:
                    if flags is None:
                        flags = bytearray(len(text))
                    flags[match.start() + offset] = marked[found]
        if flags is not None:
            # Spaces between two words marked alike are marked too: one unbroken underline per drafted run.
            for gap in _SPACE_RUN.finditer(text):
                if gap.start() > 0 and gap.end() < len(text) and flags[gap.start() - 1] == flags[gap.end()] != 0:
                    flags[gap.start() : gap.end()] = bytes((flags[gap.end()],)) * (gap.end() - gap.start())
        result.append(line if flags is None else _restyle(line, flags, styles))
    return result


def _restyle(line: list[Segment], flags: bytearray, styles: Mapping[int, Style]) -> list[Segment]:
    """`line` with the style of its flag added to each character whose flag is set."""
    restyled: list[Segment] = []
    position = 0
    for segment in line:
        if segment.control:
            restyled.append(segment)
            continue
        text, base = segment.text, segment.style
        start = 0
        for index in range(1, len(text) + 1):
            if index == len(text) or flags[position + index] != flags[position + start]:
                piece = text[start:index]
                kind = flags[position + start]
                style = styles.get(kind) if kind else None
                restyled.append(Segment(piece, (base + style) if style and base else style or base))
                start = index
        position += len(text)
    return restyled


def _header(role: str, state: str, model: str, branch: BranchInfo | None) -> Text:
    header = Text()
    header.append("You" if role == "user" else "Assistant" if role == "assistant" else role.capitalize(),
                  style="bold")
    if role == "assistant" and model:
        header.append(f"  {model}", style="dim")
    label = STATE_LABELS.get(state)
    if label:
        header.append(f"  [{label}]", style="italic")
    if branch is not None and branch.total > 1:
        header.append(f"  ◀ {branch.position}/{branch.total} ▶", style="bold")
    return header


@functools.cache
def _lexer_aliases() -> dict[str, str | type[Lexer]]:
    """Every lexer alias: a built-in lexer's name, or a plugin's class. Built once: Pygments' get_lexer_by_name
    scans every installed package's entry points for plugin lexers whenever the alias is not a built-in one (about
    70 ms here), and a code fence being streamed passes through names that are none ("```pyth"), one per frame."""
    aliases: dict[str, str | type[Lexer]] = {}
    for name, names, _, _ in get_all_lexers(plugins=False):
        for alias in names:
            aliases.setdefault(alias.lower(), name)
    for plugin in find_plugin_lexers():
        for alias in plugin.aliases:
            aliases.setdefault(alias.lower(), plugin)
    return aliases


@functools.lru_cache(maxsize=64)
def _lexer(name: str) -> Lexer | None:
    """The Pygments lexer Rich's Syntax would look up for `name` (None: no such lexer, drawn as plain text)."""
    found = _lexer_aliases().get(name.lower())
    if found is None:
        return None
    lexer_class = find_lexer_class(found) if isinstance(found, str) else found
    if lexer_class is None:
        return None
    return lexer_class(stripnl=False, ensurenl=True, tabsize=4)  # Syntax's default tab_size


@functools.lru_cache(maxsize=8)
def _syntax_theme(name: str) -> SyntaxTheme:
    return Syntax.get_theme(name)


_SYNTAX_ROWS: dict[tuple[Any, ...], list[list[Segment]]] = {}
"""Rows of highlighted code lines, wrapped and styled, by everything that decides them (see _LineCachedSyntax)."""
_SYNTAX_ROWS_MAX: Final = 4096


class _LineCachedSyntax(Syntax):
    """Rich's Syntax, word-wrapped without line numbers, keeping each highlighted line's rows.

    A code block being streamed is drawn again at every frame: highlighting it all again (Pygments) is the smaller
    part; wrapping and styling every line again (Rich's per-line rendering) was most of the ~15 ms a 60-line block
    took. A line's rows depend only on its text, its highlight spans, the width and the styles, so only new or
    changed lines are rendered; the rows are those Syntax._get_syntax yields for them.
    """

    def _get_syntax(self, console: Console, options: ConsoleOptions) -> Iterable[Segment]:
        if self.line_numbers or self.line_range or not self.word_wrap or self.code_width is not None or (
            self.indent_guides and not options.ascii_only
        ):
            yield from super()._get_syntax(console, options)
            return
        transparent = self._get_base_style().transparent_background
        _, pad_right, _, pad_left = self.padding
        code_width = max(0, options.max_width - pad_left - pad_right)
        ends_on_nl, processed_code = self._process_code(self.code)
        text = self.highlight(processed_code, None)
        background_style = self._get_number_styles(console)[0]
        render_options = options.update(width=code_width, height=None, justify="left")
        new_line = Segment("\n")
        for line in text.split("\n", allow_blank=ends_on_nl):
            key = (line.plain, tuple(line.spans), line.style, code_width, background_style, transparent,
                   options.no_wrap, options.overflow)
            rows = _SYNTAX_ROWS.get(key)
            if rows is None:
                rows = console.render_lines(line, render_options, style=background_style, pad=not transparent)
                if len(_SYNTAX_ROWS) >= _SYNTAX_ROWS_MAX:
                    _SYNTAX_ROWS.clear()
                _SYNTAX_ROWS[key] = rows
            for row in rows:
                yield from row
                yield new_line


class _CodeBlock(RichCodeBlock):
    """Rich's code block with its lexer and theme looked up once: Rich's Syntax looks the lexer up by name at each
    render, and Pygments then scans every installed package's entry points for plugin lexers (reading their
    metadata files), about a millisecond per block that the live reply paid at every frame."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip()
        lexer = _lexer(self.lexer_name) or _lexer("text")  # Rich's Syntax falls back to the "text" lexer too
        yield _LineCachedSyntax(code, lexer or self.lexer_name, theme=_syntax_theme(self.theme), word_wrap=True,
                                padding=1)


LIVE_HIGHLIGHT_MAX_LINES = 80
"""A code block still being written that is longer than this is drawn without syntax highlighting until it is
complete: highlighting it again at every frame is Pygments lexing all of it and Rich splitting every span (a
300-line block 70 ms a frame here, 8 ms unhighlighted; 1,000 lines 227 ms against 34). Once the block is complete
it is drawn highlighted, and so is the finished reply."""


def _highlighted_live(code: str) -> bool:
    """Whether a code block still being written is drawn highlighted (see LIVE_HIGHLIGHT_MAX_LINES)."""
    return code.rstrip().count("\n") < LIVE_HIGHLIGHT_MAX_LINES


class _LiveCodeBlock(_CodeBlock):
    """A code block in the text still being written: unhighlighted past LIVE_HIGHLIGHT_MAX_LINES lines."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip()
        if _highlighted_live(code):
            yield from super().__rich_console__(console, options)
            return
        yield _LineCachedSyntax(code, _lexer("text") or "text", theme=_syntax_theme(self.theme), word_wrap=True,
                                padding=1)


class _Markdown(RichMarkdown):
    elements = {**RichMarkdown.elements, "fence": _CodeBlock, "code_block": _CodeBlock}


class _LiveMarkdown(RichMarkdown):
    elements = {**RichMarkdown.elements, "fence": _LiveCodeBlock, "code_block": _LiveCodeBlock}


_MARKDOWN_TEMPLATES = {
    (dark, live): (_LiveMarkdown if live else _Markdown)("", code_theme="monokai" if dark else "default",
                                                         hyperlinks=False)
    for dark in (True, False) for live in (True, False)
}
_MARKDOWN_PARSER = MarkdownIt().enable("strikethrough").enable("table")  # the parser RichMarkdown builds


def _markdown(text: str, *, dark: bool, live: bool = False, line_breaks: bool = False) -> RichMarkdown:
    """Rich's Markdown for `text`, parsed by one shared parser: RichMarkdown() builds a new markdown-it parser
    (compiling linkify's expressions) per instance, about 1 ms that the live reply would pay at every frame.
    `live`: the text still being written (long code blocks unhighlighted, see LIVE_HIGHLIGHT_MAX_LINES).
    `line_breaks`: each line break in a paragraph is kept (Markdown joins the lines of a paragraph): a message of
    yours is drawn with the lines you wrote or pasted, a log or a list of names as it was."""
    markdown = copy.copy(_MARKDOWN_TEMPLATES[dark, live])
    markdown.markup = text
    markdown.parsed = _MARKDOWN_PARSER.parse(text)
    if line_breaks:
        for token in markdown.parsed:
            for child in token.children or ():
                if child.type == "softbreak":
                    child.type = "hardbreak"
    return markdown


def _has_long_code(markdown: RichMarkdown) -> bool:
    """Whether the text has a code block that a live render draws unhighlighted."""
    return any(token.type in ("fence", "code_block") and not _highlighted_live(token.content)
               for token in markdown.parsed)


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


if TYPE_CHECKING:
    _WidgetBase = Widget
else:  # at run time a plain mixin: a Widget base of its own would come before the containers' and change their CSS
    _WidgetBase = object


class LaidOutOnce(_WidgetBase):
    """Mixin (before the widget class): skips the second layout Textual asks for after each change of the size.

    Textual sets a widget's new size after laying the screen out, through the `virtual_size` reactive, which asks
    for the screen to be laid out again: a second layout of everything for each growth of the streamed reply (the
    reply's body, its container and the transcript all change size). Nothing in these widgets depends on the virtual
    size, and a scrollable one's scrollbars are updated whatever `layout` says.
    """

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)


class RenderedOnce(LaidOutOnce, Widget):
    """A widget drawing lines that are rendered once per width and then kept.

    Textual would render a plain widget's content twice (once to measure its height, once to paint it) and again
    after each refresh; these widgets change rarely, so their lines are kept until `invalidate` or a new width.
    """

    def __init__(self, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self._strips: list[Strip] = []
        self._strips_width = -1
        self._line_style: Style | None = None  # rich_style walks every ancestor: looked up once per style change

    def render_strips(self, width: int) -> list[Strip]:
        """The widget's lines at `width` (called again only after `invalidate` or a change of width)."""
        raise NotImplementedError

    def render_renderable(self, renderable: RenderableType, width: int) -> Lines:
        """Rich's lines for `renderable` at `width`."""
        options = self.app.console_options.update_width(max(1, width)).update(highlight=False)
        return self.app.console.render_lines(renderable, options, pad=False)

    def invalidate(self) -> None:
        """Render again on the next paint, and re-measure the height."""
        self._strips_width = -1
        self.refresh(layout=True)

    def _strips_for(self, width: int) -> list[Strip]:
        if width != self._strips_width:
            self._strips = self.render_strips(width)
            self._strips_width = width
        return self._strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._strips_for(width))

    def notify_style_update(self) -> None:
        self._line_style = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        # The content width from the size kept at layout: Widget.size looks the widget up in the compositor's map,
        # which Textual rebuilds for the whole screen after a scroll (several ms in a repaint of the view).
        width = self.outer_size.width - self.styles.gutter.width
        strips = self._strips_for(width)
        strip = strips[y] if 0 <= y < len(strips) else Strip.blank(width)
        if self._line_style is None:
            self._line_style = self.rich_style
        return strip.apply_style(self._line_style)


def _strips(lines: Lines, width: int) -> list[Strip]:
    return [Strip(line).adjust_cell_length(width) for line in lines]


FOLD_MIN_LINES = 40  # a message of yours longer than this many lines, or than FOLD_MIN_CHARS, is shown folded…
FOLD_MIN_CHARS = 4000
FOLD_HEAD_LINES = 12  # …to its first lines (and at most FOLD_HEAD_CHARS), until t shows it all
FOLD_HEAD_CHARS = 1500


BACKGROUND_RENDER_CHARS = 20_000
"""A message body at least this long is rendered in a thread: the event loop would otherwise stop for as long as
Rich and Pygments take (0.6-0.8 s for a 44k-character code reply here, seconds for longer ones)."""


def fold_head(text: str) -> str | None:
    """The start of a long message that is shown while it is folded; None when it is short enough to show whole.

    A pasted file or log can be hundreds of thousands of characters: drawn whole (as Markdown, with its code
    highlighted) it held the event loop for seconds, and it pushed the conversation out of view.
    """
    if len(text) <= FOLD_MIN_CHARS and text.count("\n") < FOLD_MIN_LINES:
        return None
    head = "\n".join(text[: FOLD_HEAD_CHARS * 2].split("\n", FOLD_HEAD_LINES)[:FOLD_HEAD_LINES])
    return head[:FOLD_HEAD_CHARS].rstrip()


class MessageView(RenderedOnce, can_focus=True):
    """One finished message, drawn as a single static widget (header, folded reasoning, Markdown body).

    | Key | Action |
    | :- | :- |
    | c | Copy the message. |
    | y | Copy a code block. |
    | e | Edit a message of yours and resend it (a new branch). |
    | r | Regenerate this reply (a new branch). |
    | left / right | Previous / next branch. |
    | t | Show or hide the reasoning; on a long message of yours, show all of it or fold it again. |
    """

    BINDINGS = [
        Binding("c", "copy", "Copy"),
        Binding("y", "copy_code", "Copy code"),
        Binding("e", "edit", "Edit"),
        Binding("r", "regenerate", "Regenerate"),
        Binding("left,[", "branch(-1)", "◀ Branch"),
        Binding("right,]", "branch(1)", "Branch ▶"),
        Binding("t", "toggle_reasoning", "Reasoning"),
        Binding("t", "toggle_fold", "Show all"),
        Binding("up,k", "move(-1)", "Previous", show=False),
        Binding("down,j", "move(1)", "Next", show=False),
    ]

    COMPONENT_CLASSES = {"message-view--reasoning", "message-view--draft", "message-view--draft-model",
                         "message-view--draft-rejected"}

    DEFAULT_CSS = """
    MessageView {
        height: auto;
        padding: 0 1;
    }
    MessageView > .message-view--draft {
        color: $text-accent;
        text-style: underline;
    }
    MessageView > .message-view--draft-model {
        color: $text-success;
        text-style: underline;
    }
    MessageView > .message-view--draft-rejected {
        color: $text-error;
        text-style: bold;
    }
    """

    show_reasoning: reactive[bool] = reactive(False, layout=True)
    """Whether the reasoning is unfolded."""

    class Action(Message):
        """The user asked for something on this message: copy, copy_code, edit, regenerate, branch."""

        def __init__(self, view: MessageView, action: str, step: int = 0) -> None:
            super().__init__()
            self.view = view
            self.action = action
            self.step = step

        @property
        def control(self) -> MessageView:
            return self.view

    def __init__(self, message: StoredMessage, branch: BranchInfo | None = None, *, dark: bool = True,
                 colour_drafts: bool = False) -> None:
        super().__init__(classes=f"message -{message.role} -{message.state}")
        self.message = message
        self.branch = branch
        self.dark = dark
        self.draft_spans: DraftSpans = draft_spans_from_stats(message.stats) if message.role == "assistant" else ()
        """Where the text came from accepted draft tokens."""
        self.colour_drafts = colour_drafts
        """Whether those spans are coloured."""
        self.fold_head = fold_head(message.content) if message.role == "user" else None
        """The start of a long message of yours, shown while it is folded (None: a message shown whole)."""
        self.folded = self.fold_head is not None
        self._body_lines: Lines = []
        self._body_width = -1
        self._rendering_width = -1
        """The width a body is being rendered at in a thread (-1: none)."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "edit":  # a question (resent as a new branch) or a finished reply (changed in place)
            return self.message.role == "user" or (self.message.role == "assistant"
                                                   and self.message.state != "streaming")
        if action == "regenerate":
            return self.message.role == "assistant"
        if action == "copy_code":
            return bool(code_blocks(self.message.content))
        if action == "toggle_reasoning":
            return bool(self.message.reasoning.strip())
        if action == "toggle_fold":
            return self.fold_head is not None
        if action == "branch":
            return self.branch is not None and self.branch.total > 1
        return True

    def _reasoning_renderable(self) -> RenderableType | None:
        reasoning = self.message.reasoning.strip()
        if not reasoning:
            return None
        style = self.get_component_rich_style("message-view--reasoning", partial=True)
        if not self.show_reasoning:
            words = len(reasoning.split())
            return Text(f"▸ Reasoning ({words} words) — t to show", style=style)
        return Group(Text("▾ Reasoning — t to hide", style=style), Padding(Text(reasoning, style=style), (0, 0, 0, 2)))

    def watch_show_reasoning(self) -> None:
        self.invalidate()

    def set_colour_drafts(self, colour: bool) -> None:
        """Colour (or stop colouring) the text that came from accepted draft tokens."""
        if colour != self.colour_drafts:
            self.colour_drafts = colour
            if self.draft_spans:
                self.invalidate()

    def seed_body(self, width: int, lines: Lines) -> None:
        """Use `lines` (the streamed reply's, already rendered at `width`) as the body instead of rendering it."""
        self._body_lines = lines
        self._body_width = width

    def body_lines(self, width: int) -> Lines:
        """The body (Markdown) rendered at `width`, without draft colouring.

        A long body (BACKGROUND_RENDER_CHARS) is rendered in a thread; until it is ready, a line says so.
        """
        if width != self._body_width:
            content = self.message.content
            build = self._body_builder()
            if len(content) >= BACKGROUND_RENDER_CHARS and not self.folded:
                if self._rendering_width != width:
                    self._rendering_width = width
                    self._render_in_thread(build, width)
                note = f"drawing {len(content):,} characters…"
                return self.render_renderable(Text(note, style="dim italic"), width)
            self._body_lines = self.render_renderable(build(), width)
            self._body_width = width
        return self._body_lines

    def _body_builder(self) -> Callable[[], RenderableType]:
        """What the body draws, made when called: the Markdown is parsed there, which may be on another thread
        (the styles, read from the widget, are looked up here)."""
        content, dark = self.message.content, self.dark
        if not content.strip() and self.message.state != "complete":
            empty = Text("(no text)", style="dim italic")
            return lambda: empty
        if self.fold_head is None:
            line_breaks = self.message.role == "user"
            return lambda: _markdown(content, dark=dark, line_breaks=line_breaks)
        style = self.get_component_rich_style("message-view--reasoning", partial=True)
        if self.folded:
            head, lines = self.fold_head, content.count("\n") + 1
            note = Text(f"▸ {lines:,} lines, {len(content):,} characters in all — t to show all", style=style)
            return lambda: Group(_markdown(head, dark=dark, line_breaks=True), note)
        fold = Text("▾ t to fold", style=style)
        return lambda: Group(_markdown(content, dark=dark, line_breaks=True), fold)

    def _render_in_thread(self, build: Callable[[], RenderableType], width: int) -> None:
        app = self.app  # (Textual finds the app through a context variable that other threads do not have)
        options = app.console_options.update_width(max(1, width)).update(highlight=False)
        # The app's console, with a lock of its own: Console.render_lines holds the console's lock for the whole
        # render, and every widget Textual draws in the meantime would wait for it.
        console = copy.copy(app.console)
        console._lock = threading.RLock()

        def render() -> None:
            lines = console.render_lines(build(), options, pad=False)  # as render_renderable does
            try:
                app.call_from_thread(self._body_ready, width, lines)
            except RuntimeError:  # the app has ended
                pass

        threading.Thread(target=render, name="llmtui-render", daemon=True).start()

    def _body_ready(self, width: int, lines: Lines) -> None:
        if width != self._rendering_width or not self.is_mounted:
            return  # the width changed again (a new render is on its way), or the message is gone
        self._rendering_width = -1
        self._body_lines, self._body_width = lines, width
        transcript = self.parent
        self.invalidate()
        if isinstance(transcript, Transcript) and transcript.at_bottom:  # keep showing the end of the conversation
            transcript.call_after_refresh(transcript.scroll_end, animate=False, immediate=True)

    def render_strips(self, width: int) -> list[Strip]:
        head: list[RenderableType] = [_header(self.message.role, self.message.state, self.message.model, self.branch)]
        reasoning = self._reasoning_renderable()
        if reasoning is not None:
            head.append(reasoning)
        body = self.body_lines(width)
        if self.colour_drafts and self.draft_spans and self._body_width == width:  # (not while it is being drawn)
            styles = draft_styles(self, "message-view")
            body = mark_provenance(body, self.message.content, self.draft_spans, styles)
        return _strips(self.render_renderable(Group(*head), width) + body, width)

    def action_copy(self) -> None:
        self.post_message(self.Action(self, "copy"))

    def action_copy_code(self) -> None:
        self.post_message(self.Action(self, "copy_code"))

    def action_edit(self) -> None:
        self.post_message(self.Action(self, "edit"))

    def action_regenerate(self) -> None:
        self.post_message(self.Action(self, "regenerate"))

    def action_branch(self, step: int) -> None:
        self.post_message(self.Action(self, "branch", step))

    def action_toggle_reasoning(self) -> None:
        self.show_reasoning = not self.show_reasoning

    def action_toggle_fold(self) -> None:
        self.folded = not self.folded
        self._body_width = self._rendering_width = -1
        self.invalidate()

    def action_move(self, step: int) -> None:
        if self.parent is None:
            return
        views = [child for child in self.parent.children if child.focusable]
        index = views.index(self) + step if self in views else -1
        if 0 <= index < len(views):
            views[index].focus()
        elif step > 0:
            self.post_message(self.Action(self, "leave"))

    def on_click(self, event: events.Click) -> None:
        self.focus()


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
    RENDER_INTERVAL_S: ClassVar[float] = 1 / 20  # tokens come 15 times a second: each batch is drawn as it comes
    RENDER_SHARE: ClassVar[float] = 0.25
    """The most of a core re-rendering the tail may take: a tail that takes long to render (a long code block or
    table) is drawn less often, so the event loop stays responsive and the engine keeps its cores."""

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
        markdown = _markdown(segment.markdown, dark=self.dark)
        starts_with_container, segment.ends_with_rule = _block_edges(markdown)
        segment.separated = bool(self.segments) and _needs_separator(self.segments[-1].ends_with_rule,
                                                                    starts_with_container)
        if self._frozen_width > 0:
            segment.lines = self._render_segment(segment, self._frozen_width, markdown)
        self.segments.append(segment)
        self._frozen_chars += cut

    def _render_segment(self, segment: FrozenSegment, width: int, markdown: RichMarkdown | None = None) -> Lines:
        """The segment's lines at `width` (`markdown`: the segment already parsed)."""
        if markdown is None:
            markdown = _markdown(segment.markdown, dark=self.dark)
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
            self._frozen_strips.extend(_strips(lines, width))
        self._frozen_strips_segments = len(self.segments)
        tail = self.tail
        self._tail_lines = []
        self._tail_unhighlighted = False
        if tail.strip():
            markdown = _markdown(tail, dark=self.dark, live=True)
            self._tail_unhighlighted = _has_long_code(markdown)
            self._tail_lines = self._plain_lines(tail, markdown, width)
            if self.segments and _needs_separator(self.segments[-1].ends_with_rule, _block_edges(markdown)[0]):
                self._tail_lines.insert(0, [])
        lines = self._coloured(self._tail_lines, tail, self._frozen_chars, styles) if colour else self._tail_lines
        return self._frozen_strips + _strips(lines, width)

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
            suffix = _markdown(tail[start:], dark=self.dark)
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
        spans = [(max(s, start) - start, min(e, end) - start, drafter) for s, e, drafter in self.draft_spans
                 if s < end and e > start]
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

    def __init__(self, message_id: int, model: str, *, content: str = "", reasoning: str = "",
                 dark: bool = True, draft_spans: DraftSpans = (), colour_drafts: bool = False) -> None:
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
        yield Static(_header("assistant", "streaming", self.model, None), classes="live-header")
        yield Static("", classes="live-reasoning")
        yield self.body

    def on_mount(self) -> None:
        self._update_reasoning()

    def reading(self, done: int, total: int) -> None:
        """Say in the header how much of a long prompt is read (the reply starts once all of it is)."""
        header = _header("assistant", "", self.model, None)
        header.append(f"  [reading the prompt: {done:,} of {total:,} tokens]", style="italic")
        self.query_one(".live-header", Static).update(header)
        self._reading = True

    def write(self, text: str, reasoning: str, spans: Sequence[DraftSpan] = ()) -> None:
        """Append streamed text (drawn within a frame) and reasoning."""
        if self._reading:
            self._reading = False
            self.query_one(".live-header", Static).update(_header("assistant", "streaming", self.model, None))
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
            widget.update(Text("▾ Reasoning (click to hide)\n" + reasoning, style="dim italic"))
        else:
            words = len(reasoning.split())
            widget.update(Text(f"▸ Thinking… ({words} words; click to show)", style="dim italic"))

    def stop(self) -> None:
        """Draw the last text appended."""
        self.body.flush()


class EarlierMessages(Static, can_focus=True):
    """Stands in for the messages above those mounted; Enter or scrolling up to it loads more."""

    BINDINGS = [Binding("enter", "load", "Load earlier")]

    class LoadRequested(Message):
        """Mount the next page of earlier messages."""

    def action_load(self) -> None:
        self.post_message(self.LoadRequested())

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.LoadRequested())


# What ScrollBar.render() puts in its renderable: the bar's lines change only when one of these does.
_SCROLLBAR_FIELDS: Final = ("virtual_size", "window_size", "position", "thickness", "vertical", "style")


class _TranscriptScrollBar(ScrollBar):
    """The transcript's vertical scrollbar, its lines made once per position. Textual's styles its lines one at a
    time through the widget's style cache, and a scroll moves the thumb, so each follow-scroll of a streamed reply
    restyled every line of it: a sixth to a quarter of the time a repaint of the view took."""

    def __init__(self, *, vertical: bool = True, name: str | None = None, thickness: int = 1) -> None:
        super().__init__(vertical=vertical, name=name, thickness=thickness)
        self._lines: tuple[object, list[Strip]] | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        bar = self.render()
        width, height = self.outer_size
        key = (width, height, self.visual_style, *(getattr(bar, name, None) for name in _SCROLLBAR_FIELDS))
        if self._lines is None or self._lines[0] != key:
            options = self.app.console_options.update_dimensions(width, height)
            lines = self.app.console.render_lines(bar, options, pad=True)
            base = self.visual_style.rich_style  # the widget's colours under the bar's, as Textual's own path has them
            self._lines = (key, [Strip(line, width).apply_style(base) for line in lines])
        strips = self._lines[1][crop.y : crop.bottom]
        filters = self.get_line_filters()
        if filters:
            background = self.background_colors[1]
            for line_filter in filters:
                strips = [strip.apply_filter(line_filter, background) for strip in strips]
        if crop.x or crop.right != width:
            strips = [strip.crop(crop.x, crop.right) for strip in strips]
        return strips


class Transcript(LaidOutOnce, VerticalScroll):
    """The messages of the branch on screen. Only the last PAGE_SIZE are mounted at first (first paint stays
    fast for long conversations); follow-scroll while streaming only when the user is at the bottom."""

    DEFAULT_CSS = """
    Transcript {
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, can_focus=False)
        self.messages: list[StoredMessage] = []
        self.branches: dict[int, BranchInfo] = {}
        self.live: LiveMessage | None = None
        self._first_mounted = 0
        self._follow_pending = False
        self._live_top: tuple[object, int] | None = None  # (layout key, where the live reply's text starts)
        self._at_end = True  # whether the view showed the end of the conversation at its last scroll
        self.dark = True
        self.colour_drafts = False
        """Whether text from accepted draft tokens is coloured."""

    def on_mount(self) -> None:
        # The lexer table costs a scan of every installed package's entry points: build it off the event loop
        # once the first frame is drawn, not when the first code block is rendered.
        self.call_after_refresh(threading.Thread(target=_lexer_aliases, name="llmtui-lexers", daemon=True).start)

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        # Widget.vertical_scrollbar, with the scrollbar that makes its lines once per position.
        if self._vertical_scrollbar is None:
            self._vertical_scrollbar = _TranscriptScrollBar(vertical=True, name="vertical",
                                                            thickness=self.scrollbar_size_vertical)
            self._vertical_scrollbar.display = False
            self.app._start_widget(self, self._vertical_scrollbar)
        return self._vertical_scrollbar

    @property
    def at_bottom(self) -> bool:
        return self.scroll_y >= self.max_scroll_y - 1

    def _view(self, message: StoredMessage) -> MessageView:
        return MessageView(message, self.branches.get(message.id), dark=self.dark, colour_drafts=self.colour_drafts)

    def set_colour_drafts(self, colour: bool) -> None:
        """Colour (or stop colouring) text from accepted draft tokens, in every message shown and the live one."""
        self.colour_drafts = colour
        for view in self.query(MessageView):
            view.set_colour_drafts(colour)
        if self.live is not None:
            self.live.body.set_colour_drafts(colour)

    async def show(self, messages: list[StoredMessage], branches: dict[int, BranchInfo]) -> None:
        """Replace the transcript with `messages` (system messages are not shown)."""
        self.messages = [message for message in messages if message.role != "system"]
        self.branches = branches
        self.live = None
        self._first_mounted = max(0, len(self.messages) - PAGE_SIZE)
        with self.app.batch_update():
            await self.remove_children()
            widgets: list[Widget] = []
            if not self.messages:
                widgets.append(Static(EMPTY_HINT, classes="empty-hint"))
            if self._first_mounted:
                widgets.append(self._earlier())
            widgets.extend(self._view(message) for message in self.messages[self._first_mounted :])
            await self.mount_all(widgets)
        self.scroll_end(animate=False, immediate=True)
        # Again once the new messages are laid out: the end above was the one before (the sizes the messages
        # take are known only after the layout; Textual's second layout used to come in time to fix it).
        self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def _earlier(self) -> EarlierMessages:
        return EarlierMessages(
            f"▲ {self._first_mounted} earlier messages — scroll up or press Enter to show them",
            classes="earlier",
        )

    async def load_earlier(self) -> None:
        """Mount the previous page of messages above the ones shown, keeping the view where it is."""
        if not self._first_mounted:
            return
        start = max(0, self._first_mounted - PAGE_SIZE)
        views = [self._view(message) for message in self.messages[start : self._first_mounted]]
        self._first_mounted = start
        placeholder = self.query(EarlierMessages)
        old_height = self.virtual_size.height
        with self.app.batch_update():
            await placeholder.remove()
            await self.mount_all(views, before=0 if self.children else None)
            if self._first_mounted:
                await self.mount(self._earlier(), before=0)

        def keep_place() -> None:
            self.scroll_to(y=self.scroll_y + self.virtual_size.height - old_height, animate=False)

        self.call_after_refresh(keep_place)

    async def on_earlier_messages_load_requested(self, event: EarlierMessages.LoadRequested) -> None:
        event.stop()
        await self.load_earlier()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._at_end = self.at_bottom
        if new <= 0 and self._first_mounted and self.max_scroll_y > 0:
            self.call_later(self.load_earlier)

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        resized = size != self.outer_size
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        if resized:
            # The view got shorter (the prompt grew a line, the speculative meter appeared): a view that showed the
            # end of the conversation keeps showing it, rather than the last lines going below it. Here rather than
            # in a Resize handler: Textual does not always send the transcript one. A streamed reply is followed
            # by its own logic.
            if self.live is not None:
                if self._following():
                    self.call_after_refresh(self._follow)
            elif self._at_end:
                self.scroll_end(animate=False)  # after the refresh
        return changed

    async def append(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView:
        """Add a finished message at the end."""
        self.messages.append(message)
        if branch is not None:
            self.branches[message.id] = branch
        follow = self.at_bottom
        view = self._view(message)
        await self.query(".empty-hint").remove()
        await self.mount(view)
        if follow:
            self.scroll_end(animate=False)
        return view

    async def start_live(self, message_id: int, model: str, *, content: str = "", reasoning: str = "",
                         draft_spans: DraftSpans = ()) -> LiveMessage:
        """Mount the streaming reply at the end (replacing a frozen view of the same message, when continuing)."""
        for view in self.query(MessageView):
            if view.message.id == message_id:
                await view.remove()
        self.messages = [message for message in self.messages if message.id != message_id]
        live = LiveMessage(message_id, model, content=content, reasoning=reasoning, dark=self.dark,
                           draft_spans=draft_spans, colour_drafts=self.colour_drafts)
        self.live = live
        await self.mount(live)
        # Not scroll_end: the live reply keeps room below its text (a screenful, so that new lines seldom change
        # its size) and the end of the transcript is that empty room. Show where the text will appear.
        self._follow_pending = True
        self.call_after_refresh(self._follow, True)
        return live

    def _live_target(self, *, clamp: bool = True) -> float:
        """The scroll offset that shows the end of the streamed text at the bottom of the view (unclamped: below 0
        when the text ends above the view's bottom at offset 0)."""
        live = self.live
        if live is None:
            return self.max_scroll_y
        offset = self._live_text_top(live) + live.body.content_height + 1 - self._view_height()
        return max(0.0, min(self.max_scroll_y, offset)) if clamp else offset

    def _view_height(self) -> int:
        """The height of the scrolled view, from the sizes kept at layout: the follow logic runs at every frame, and
        Widget.region, .size and .virtual_region look the widget up in the compositor's map, which Textual
        rebuilds for the whole screen when anything was re-laid out or scrolled since."""
        return self.outer_size.height - self.styles.gutter.height - self.scrollbar_gutter.height

    def _live_text_top(self, live: LiveMessage) -> int:
        """Where the live reply's text starts in the transcript, looked up again only when the layout may have
        moved it (see `_view_height`)."""
        key = (id(live), self.virtual_size, live.outer_size, live.body.outer_size)
        if self._live_top is None or self._live_top[0] != key:
            self._live_top = (key, live.virtual_region.y + live.content_bottom() - live.body.content_height)
        return self._live_top[1]

    def write_live(self, text: str, reasoning: str, draft_spans: Sequence[DraftSpan] = ()) -> None:
        """Append to the streaming reply; `draft_spans` (relative to `text`) came from accepted draft tokens."""
        live = self.live
        if live is None:
            return
        follow = self._following()
        live.write(text, reasoning, draft_spans)
        if follow and not self._follow_pending:
            self._follow_pending = True
            self.call_after_refresh(self._follow)

    def _following(self) -> bool:
        """Whether the view shows the end of the streamed text (or is past it, in the room kept below it)."""
        step = max(1, self._view_height() // 3)
        return self.scroll_y >= self._live_target() - 1 - step

    def _follow(self, jump: bool = False) -> None:
        """Keep the end of the streamed text in view: in steps of a third of the view rather than a line at a time
        (a scroll repaints the whole view), and never further down than that (below is only empty room).

        Runs after the body has drawn the text appended so far (its render may wait up to `render_interval`) and the
        screen is laid out again: following earlier would leave the lines drawn later below the view."""
        live = self.live
        if live is not None and live.body.render_pending:
            live.body.when_drawn(lambda: self.call_after_refresh(self._follow, jump))
            return
        if live is not None and not live.outer_size:  # mounted but not laid out yet: its place is not known
            self.call_after_refresh(self._follow, jump)
            return
        self._follow_pending = False
        offset = self._live_target(clamp=False)
        target = max(0.0, min(self.max_scroll_y, offset))
        step = max(1, self._view_height() // 3)
        end = max(0.0, min(self.max_scroll_y, offset + step - 1))
        if jump or self.scroll_y < target or self.scroll_y > end:
            if live is not None:
                live.body.reserve(2 * step)
            self.scroll_to(y=end, animate=False, immediate=True)

    async def freeze_live(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView | None:
        """Replace the live reply by a static view of its final state."""
        live = self.live
        self.live = None
        if live is None:
            return None
        follow = self.at_bottom or self._following()
        live.stop()
        if branch is not None:
            self.branches[message.id] = branch
        self.messages.append(message)
        view = self._view(message)
        width = live.body.size.width
        lines = live.body.plain_lines(width) if message.content == live.text and message.content.strip() else None
        if lines is not None:
            view.seed_body(width, lines)  # the streamed reply's lines: no second render of the whole reply
        with self.app.batch_update():
            await self.mount(view, before=live)
            await live.remove()
        if follow:
            self.scroll_end(animate=False)
        return view

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def last_view(self) -> MessageView | None:
        views = self.views()
        return views[-1] if views else None
