"""Rich internals: a Syntax drawn one highlighted line at a time, and a copy of a console with a lock of its own.

Relies on (Rich 15.0): `Syntax._get_syntax(console, options)`, the generator behind `Syntax.__rich_console__` that
yields the code's segments, and the helpers it uses: `_get_base_style()`, `_process_code(code)` returning (whether the
code ends with a new line, the code to highlight), `_get_number_styles(console)` whose first style is the background
of the code; a word-wrapped Syntax without line numbers, line range, code width or indent guides draws each
highlighted line as `console.render_lines` draws it at the code's width (padding aside), each row followed by a new
line. And `Console._lock`, the re-entrant lock `Console.render_lines` holds for a whole render.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text


class SyntaxLineByLine(Syntax):
    """Rich's Syntax, each highlighted line of a word-wrapped block without line numbers drawn by `line_rows` (as
    Rich draws it, unless a subclass keeps the rows); any other Syntax is drawn by Rich."""

    def line_rows(
        self, console: Console, line: Text, options: ConsoleOptions, style: Style, pad: bool
    ) -> list[list[Segment]]:
        """The rows of one highlighted `line`: `console.render_lines(line, options, style=style, pad=pad)`."""
        return console.render_lines(line, options, style=style, pad=pad)

    def _get_syntax(self, console: Console, options: ConsoleOptions) -> Iterable[Segment]:
        if (
            self.line_numbers
            or self.line_range
            or not self.word_wrap
            or self.code_width is not None
            or (self.indent_guides and not options.ascii_only)
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
            for row in self.line_rows(console, line, render_options, background_style, not transparent):
                yield from row
                yield new_line


def console_with_own_lock(console: Console) -> Console:
    """A shallow copy of `console` with a lock of its own, to render on another thread: `Console.render_lines` holds
    the console's lock for the whole render, and every widget Textual draws in the meantime would wait for it."""
    copied = copy.copy(console)
    copied._lock = threading.RLock()
    return copied
