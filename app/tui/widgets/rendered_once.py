"""`RenderedOnce`: the base of widgets that draw Rich lines rendered once per width and kept until they change."""

from __future__ import annotations

from abc import abstractmethod

from rich.console import RenderableType
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from app.tui.textual_internals.layout import LaidOutOnce
from app.tui.widgets.markdown_render import Lines


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

    @abstractmethod
    def render_strips(self, width: int) -> list[Strip]:
        """The widget's lines at `width` (called again only after `invalidate` or a change of width)."""

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


def to_strips(lines: Lines, width: int) -> list[Strip]:
    """Rich's `lines` as Textual strips, each `width` cells long."""
    return [Strip(line).adjust_cell_length(width) for line in lines]
