"""Markdown drawn by Rich, fast enough to draw again at every frame: one shared parser, code blocks with their lexer
and theme looked up once and each highlighted line's rows kept, long code still being written left unhighlighted."""

from __future__ import annotations

import copy
import functools
import re
from typing import Any, Final

from markdown_it import MarkdownIt
from pygments.lexer import Lexer
from pygments.lexers import find_lexer_class, get_all_lexers
from pygments.plugin import find_plugin_lexers
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock as RichCodeBlock
from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax, SyntaxTheme
from rich.text import Text

from app.tui.textual_internals.rich_render import SyntaxLineByLine
from engine_ext.untrusted_text import shown

_CODE_BLOCK: Final = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)

Lines = list[list[Segment]]
"""Rich's rendered lines: a list of segments each."""


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order, without their fences."""
    return [match.group(1) for match in _CODE_BLOCK.finditer(markdown)]


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


def load_lexer_table() -> None:
    """Build the table of lexer aliases now (a scan of every installed package's entry points), e.g. on a thread
    before the first code block is drawn."""
    _lexer_aliases()


_SYNTAX_ROWS: dict[tuple[Any, ...], list[list[Segment]]] = {}
"""Rows of highlighted code lines, wrapped and styled, by everything that decides them (see _LineCachedSyntax)."""
_SYNTAX_ROWS_MAX: Final = 4096


class _LineCachedSyntax(SyntaxLineByLine):
    """Rich's Syntax, word-wrapped without line numbers, keeping each highlighted line's rows.

    A code block being streamed is drawn again at every frame: highlighting it all again (Pygments) is the smaller
    part; wrapping and styling every line again (Rich's per-line rendering) was most of the ~15 ms a 60-line block
    took. A line's rows depend only on its text, its highlight spans, the width and the styles, so only new or
    changed lines are rendered; the rows are those Rich's Syntax draws for them.
    """

    def line_rows(
        self, console: Console, line: Text, options: ConsoleOptions, style: Style, pad: bool
    ) -> list[list[Segment]]:
        key = (
            line.plain,
            tuple(line.spans),
            line.style,
            options.max_width,
            style,
            pad,
            options.no_wrap,
            options.overflow,
        )
        rows = _SYNTAX_ROWS.get(key)
        if rows is None:
            rows = super().line_rows(console, line, options, style, pad)
            if len(_SYNTAX_ROWS) >= _SYNTAX_ROWS_MAX:
                _SYNTAX_ROWS.clear()
            _SYNTAX_ROWS[key] = rows
        return rows


class _CodeBlock(RichCodeBlock):
    """Rich's code block with its lexer and theme looked up once: Rich's Syntax looks the lexer up by name at each
    render, and Pygments then scans every installed package's entry points for plugin lexers (reading their
    metadata files), about a millisecond per block that the live reply paid at every frame."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip()
        lexer = _lexer(self.lexer_name) or _lexer("text")  # Rich's Syntax falls back to the "text" lexer too
        yield _LineCachedSyntax(
            code, lexer or self.lexer_name, theme=_syntax_theme(self.theme), word_wrap=True, padding=1
        )


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
        yield _LineCachedSyntax(
            code, _lexer("text") or "text", theme=_syntax_theme(self.theme), word_wrap=True, padding=1
        )


class _Markdown(RichMarkdown):
    elements = {**RichMarkdown.elements, "fence": _CodeBlock, "code_block": _CodeBlock}


class _LiveMarkdown(RichMarkdown):
    elements = {**RichMarkdown.elements, "fence": _LiveCodeBlock, "code_block": _LiveCodeBlock}


_MARKDOWN_TEMPLATES = {
    (dark, live): (_LiveMarkdown if live else _Markdown)(
        "", code_theme="monokai" if dark else "default", hyperlinks=False
    )
    for dark in (True, False)
    for live in (True, False)
}
_MARKDOWN_PARSER = MarkdownIt().enable("strikethrough").enable("table")  # the parser RichMarkdown builds


def markdown_renderable(text: str, *, dark: bool, live: bool = False, line_breaks: bool = False) -> RichMarkdown:
    """Rich's Markdown for `text`, parsed by one shared parser: RichMarkdown() builds a new markdown-it parser
    (compiling linkify's expressions) per instance, about 1 ms that the live reply would pay at every frame.
    `live`: the text still being written (long code blocks unhighlighted, see LIVE_HIGHLIGHT_MAX_LINES).
    Control characters are made visible first (engine_ext.untrusted_text.shown): every message the transcript
    draws, finished or live, comes through here.
    `line_breaks`: each line break in a paragraph is kept (Markdown joins the lines of a paragraph): a message of
    yours is drawn with the lines you wrote or pasted, a log or a list of names as it was."""
    text = shown(text, multiline=True)  # a message, a reply, an import: no escape sequence reaches the terminal
    markdown = copy.copy(_MARKDOWN_TEMPLATES[dark, live])
    markdown.markup = text
    markdown.parsed = _MARKDOWN_PARSER.parse(text)
    if line_breaks:
        for token in markdown.parsed:
            for child in token.children or ():
                if child.type == "softbreak":
                    child.type = "hardbreak"
    return markdown


def has_long_live_code(markdown: RichMarkdown) -> bool:
    """Whether the text has a code block that a live render draws unhighlighted."""
    return any(
        token.type in ("fence", "code_block") and not _highlighted_live(token.content) for token in markdown.parsed
    )
