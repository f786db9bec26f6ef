"""A checkbox (and a list of them) whose two states read apart at a glance, without colour too.

Textual's Checkbox draws `▐X▌` both ticked and not (only the X's colour changes), so on a monochrome terminal, or to
a reader who does not tell the colours apart, every box looks ticked. This one draws `[x]` ticked and `[ ]` not: ASCII,
one cell wide in every terminal and font. Textual's SelectionList draws the same `▐X▌` before each entry; `TickList`
draws `[x]` and `[ ]` there.
"""

from __future__ import annotations

from typing import Final, TypeVar

from rich.segment import Segment
from rich.style import Style
from textual.content import Content
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import Checkbox, SelectionList
from textual.widgets.option_list import OptionDoesNotExist

ValueT = TypeVar("ValueT")

TICKED: Final = "[x]"
UNTICKED: Final = "[ ]"


class TickBox(Checkbox):
    """A Checkbox drawn `[x] label` when ticked and `[ ] label` when not (every checkbox of the app is one)."""

    DEFAULT_CSS = """
    TickBox > .toggle--button {
        color: $text-muted;
        background: transparent;
    }
    TickBox.-on > .toggle--button {
        color: $text-success;
        background: transparent;
        text-style: bold;
    }
    """

    @property
    def box(self) -> str:
        """The box as drawn for the current value."""
        return TICKED if self.value else UNTICKED

    def render(self) -> Content:
        button = Content.styled(self.box, self.get_visual_style("toggle--button"))
        if not self.label:
            return button
        label = self.label.pad(1, 1).stylize_before(self.get_visual_style("toggle--label"))
        return Content.assemble(button, label)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return len(self.box) + (self.label.cell_length + 2 if self.label else 0)


class TickList(SelectionList[ValueT]):
    """A SelectionList whose entries start `[x]` when selected and `[ ]` when not (every such list in the app)."""

    def render_line(self, y: int) -> Strip:
        line = super().render_line(y)
        try:
            selection = self.get_option_at_index(self.scroll_offset.y + y)
        except OptionDoesNotExist:
            return line
        segments = list(line)
        if len(segments) < 4:
            return line
        # SelectionList puts its button as three segments (left side, inner, right side) before a space and the prompt.
        ticked = selection.value in self.selected
        base = segments[3].style or Style()
        meta = Style(meta={"option": self.scroll_offset.y + y})
        style = base + Style(bold=ticked) + meta
        box = TICKED if ticked else UNTICKED
        return Strip([Segment(box, style), *segments[3:]], line.cell_length)
