"""The last check before the terminal: no text Textual writes holds a control character, whichever widget drew it.

Every text from outside llmtui is made safe where it becomes a widget's content (`engine_ext.untrusted_text.shown`:
the transcript's Markdown, the conversation list, the header, notifications, model names); this check is for a
widget that forgot, so that a new screen cannot let an escape sequence (a terminal status query, OSC 52, DCS) reach
the terminal. A control character is zero cells wide in Rich and Textual, so dropping it moves nothing on screen.

Relies on (Textual 8.2): `Strip.render(console)`, the one call that turns a line's segments into what the driver
writes (`LayoutUpdate`, `ChopsUpdate` and `InlineUpdate` call it for every line), and `Strip._render_cache`, None
until a strip has been rendered, where `Strip.render` keeps the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from rich.console import Console
from rich.segment import Segment
from textual.strip import Strip

from engine_ext.untrusted_text import has_controls, without_controls

TEXTUAL_RENDER: Final[Callable[[Strip, Console], str]] = Strip.render
"""Textual's own Strip.render, which the check calls."""

# textual-image's Sixel widget places its picture with cursor moves written as plain segments (Rich's
# `Control.move_to(x, y).segment.text`, no control attribute): a segment that is exactly one such move is kept.
_CURSOR_MOVE = re.compile(r"\x1b\[[0-9]{1,5};[0-9]{1,5}H")


def _unsafe(text: str) -> bool:
    return has_controls(text) and _CURSOR_MOVE.fullmatch(text) is None


def _render_without_controls(self: Strip, console: Console) -> str:
    """Strip.render, with the control characters of the strip's text left out (its styles' sequences are Textual's
    own, and stay)."""
    if self._render_cache is None and any(_unsafe(text) for text, _, control in self if not control):
        segments = [
            Segment(without_controls(text), style) if not control and _unsafe(text) else Segment(text, style, control)
            for text, style, control in self
        ]
        self._render_cache = TEXTUAL_RENDER(Strip(segments, self.cell_length), console)
    return TEXTUAL_RENDER(self, console)


def drop_controls_from_terminal_output() -> None:
    """Put the check in (once per process; an App does it when it is made)."""
    Strip.render = _render_without_controls  # type: ignore[method-assign]
