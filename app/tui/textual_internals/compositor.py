"""A compositor that renders only the rows being updated, and the call that gives a screen one.

Relies on (Textual 8.2): the private `textual._compositor.Compositor`, its `visible_widgets` property, which
`_get_renders(crop)` reads once on its first step (before yielding anything), `_render_chops(crop, is_rendered_line)`
returning, for each row of the screen, a mapping of cut to strip; and the private `Screen._compositor`, set in
`Screen.__init__` and read for every update.

For a partial update Textual's compositor asks every widget under the updated area for the lines of its whole
visible region, then keeps only the updated rows. While a reply streams, the update is usually one or two lines
of the live reply, yet the screen, its containers, the transcript and the message (about ten widgets, forty
lines each) were all rendered for it: most of the UI's CPU time, which on a small machine is taken from the
engine's threads. This compositor narrows each widget's clip to the updated rows first, so a widget renders
only those rows (the same path Textual takes for a widget that is partly scrolled out of view), and renders
separate bands of rows (the live reply's last line and the stats bar) separately rather than everything between.
A widget that the widgets in front of it hide in those rows (a container behind its children) is not rendered at
all: Textual keeps the front-most line of each cell. In a repaint of the whole view (each follow-scroll of a
streamed reply) that skips the transcript, the reply's container and the screen's layout containers. Nor is a
widget with no cell in the update's columns (the transcript's scrollbar beside a line of the reply) rendered: the
update writes only those cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from textual._compositor import Compositor
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget


def _covers(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether the sorted, merged `spans` cover [start, end)."""
    return any(x0 <= start and end <= x1 for x0, x1 in spans)


def _add(spans: list[tuple[int, int]], start: int, end: int) -> None:
    """Add [start, end) to the sorted, merged `spans`."""
    merged: list[tuple[int, int]] = []
    for x0, x1 in spans:
        if x1 < start or end < x0:
            merged.append((x0, x1))
        else:
            start, end = min(start, x0), max(end, x1)
    merged.append((start, end))
    merged.sort()
    spans[:] = merged


class CroppedCompositor(Compositor):
    """`Compositor` whose partial updates render each widget's lines only within the updated rows."""

    def __init__(self) -> None:
        super().__init__()
        self._crop_rows: Region | None = None

    @property
    def visible_widgets(self) -> dict[Widget, tuple[Region, Region]]:
        widgets = super().visible_widgets
        crop = self._crop_rows
        if crop is None:
            return widgets
        cropped: dict[Widget, tuple[Region, Region]] = {}
        # Widgets come front to back and the front one's line wins each cell: a widget hidden in these rows by
        # the ones in front (a container behind its children) need not render at all.
        covered: list[list[tuple[int, int]]] = [[] for _ in range(crop.height)]
        for widget, (region, clip) in widgets.items():
            rows = clip.intersection(Region(clip.x, crop.y, clip.width, crop.height))
            # The update writes only cells inside the crop: a widget with none in its columns (the scrollbar
            # beside a line of the live reply) need not render.
            if not rows.area or rows.right <= crop.x or rows.x >= crop.right:
                continue
            drawn = region.intersection(rows)  # the cells it would draw in these rows
            spans = covered[drawn.y - crop.y : drawn.bottom - crop.y]
            # Hidden within the crop's columns: the cells it would show outside them are not written.
            left, right = max(drawn.x, crop.x), min(drawn.right, crop.right)
            if left >= right or all(_covers(span, left, right) for span in spans):
                continue
            for span in spans:
                _add(span, drawn.x, drawn.right)
            cropped[widget] = (region, rows)
        return cropped

    def _render_chops(self, crop: Region, is_rendered_line: Callable[[int], bool]) -> Sequence[Mapping[int, Strip]]:
        bands: list[tuple[int, int]] = []
        for y in range(crop.y, crop.bottom):
            if is_rendered_line(y):
                if bands and bands[-1][1] == y:
                    bands[-1] = (bands[-1][0], y + 1)
                else:
                    bands.append((y, y + 1))
        if len(bands) <= 1:
            return super()._render_chops(crop, is_rendered_line)
        chops: list[Mapping[int, Strip]] = []
        for start, stop in bands:
            band = super()._render_chops(Region(crop.x, start, crop.width, stop - start), is_rendered_line)
            if not chops:
                chops = list(band)
            else:
                chops[start:stop] = band[start:stop]
        return chops

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None:
            yield from super()._get_renders(crop)
            return
        self._crop_rows = crop
        try:
            renders = super()._get_renders(crop)
            first = next(iter(renders), None)  # the base class reads visible_widgets on its first step
        finally:
            self._crop_rows = None
        if first is None:
            return
        yield first
        yield from renders


def use_cropped_compositor(screen: Screen[Any]) -> None:
    """Give `screen` (just constructed) a `CroppedCompositor` in place of Textual's own."""
    screen._compositor = CroppedCompositor()
