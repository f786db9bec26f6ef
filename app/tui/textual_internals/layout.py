"""`LaidOutOnce`: widgets that skip the second layout Textual asks for after each change of their size.

Relies on (Textual 8.2): the private `Widget._size_updated(size, virtual_size, container_size, layout=True)`, called by
the compositor after laying the screen out to set a widget's new size, which returns whether anything changed and
re-lays the screen out (through the `virtual_size` reactive) unless `layout` is False; a scrollable widget's
scrollbars are updated whatever `layout` says. `Widget.outer_size` still holds the previous size when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Size
from textual.widget import Widget

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

    def resized_at_layout(self) -> None:
        """Called when a layout gave the widget a new outer size, once it is set (Textual does not always send a
        Resize event for it)."""

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        resized = size != self.outer_size
        changed = super()._size_updated(size, virtual_size, container_size, layout=False)
        if resized:
            self.resized_at_layout()
        return changed
