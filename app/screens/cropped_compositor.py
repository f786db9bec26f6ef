"""A compositor that renders only the rows being updated.

For a partial update Textual's compositor asks every widget under the updated area for the lines of its whole
visible region, then keeps only the updated rows. While a reply streams, the update is usually one or two lines
of the live reply, yet the screen, its containers, the transcript and the message (about ten widgets, forty
lines each) were all rendered for it: most of the UI's CPU time, which on a small machine is taken from the
engine's threads. This compositor narrows each widget's clip to the updated rows first, so a widget renders
only those rows (the same path Textual takes for a widget that is partly scrolled out of view).
"""

from __future__ import annotations

from collections.abc import Iterable

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget


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
        for widget, (region, clip) in widgets.items():
            rows = clip.intersection(Region(clip.x, crop.y, clip.width, crop.height))
            if rows.area:
                cropped[widget] = (region, rows)
        return cropped

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None or crop.height >= self.size.height:
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
