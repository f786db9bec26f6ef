"""A vertical scrollbar whose lines are made once per position, and the call that gives a widget its own scrollbar.

Relies on (Textual 8.2): `ScrollBar.render()` returning a `ScrollBarRender` whose lines depend only on its
`virtual_size`, `window_size`, `position`, `thickness`, `vertical` and `style` (SCROLLBAR_FIELDS: the test checks
that its constructor takes exactly these); Textual's own path drawing those lines with the widget's visual style
under them; and the private `Widget._vertical_scrollbar` (None until made) and `App._start_widget(parent, widget)`,
which `Widget.vertical_scrollbar` uses to make and mount a widget's scrollbar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from textual.geometry import Region
from textual.scrollbar import ScrollBar
from textual.strip import Strip
from textual.widget import Widget

# What ScrollBar.render() puts in its renderable: the bar's lines change only when one of these does.
SCROLLBAR_FIELDS: Final = ("virtual_size", "window_size", "position", "thickness", "vertical", "style")


class LinesOncePerPositionScrollBar(ScrollBar):
    """A scrollbar with its lines made once per position. Textual's styles its lines one at a time through the
    widget's style cache, and a scroll moves the thumb, so each follow-scroll of a streamed reply restyled every line
    of it: a sixth to a quarter of the time a repaint of the view took."""

    def __init__(self, *, vertical: bool = True, name: str | None = None, thickness: int = 1) -> None:
        super().__init__(vertical=vertical, name=name, thickness=thickness)
        self._lines: tuple[object, list[Strip]] | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        bar = self.render()
        width, height = self.outer_size
        key = (width, height, self.visual_style, *(getattr(bar, name, None) for name in SCROLLBAR_FIELDS))
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


def use_vertical_scrollbar(widget: Widget, make: Callable[[], ScrollBar]) -> ScrollBar:
    """`widget`'s vertical scrollbar, made by `make` (and mounted hidden) the first time: what the
    `Widget.vertical_scrollbar` property does with Textual's own ScrollBar, for a widget that overrides it."""
    if widget._vertical_scrollbar is None:
        widget._vertical_scrollbar = make()
        widget._vertical_scrollbar.display = False
        widget.app._start_widget(widget, widget._vertical_scrollbar)
    return widget._vertical_scrollbar
