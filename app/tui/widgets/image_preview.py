"""Pictures in the transcript through textual-image: the Kitty graphics protocol or Sixel where the terminal speaks
them, coloured half blocks elsewhere. Which one is decided once, before Textual takes the terminal (textual-image
asks the terminal what it speaks when it is imported, which it cannot do once the app draws)."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Final

from engine_ext.image_input import MAX_IMAGE_PIXELS

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage
    from textual.widget import Widget

PREVIEW_ENV: Final = "LLMTUI_IMAGE_PREVIEW"
"""auto (the terminal's best, asked at start), halfcell (coloured half blocks: tests, for screens that do not depend
on the terminal), or text (no picture: the name and size only)."""
PREVIEW_PIXELS: Final = 320
"""The decoded preview's longer side: a few rows of the transcript need no more, and it keeps memory small."""

_detected: str | None = None


def preview_mode() -> str:
    mode = os.environ.get(PREVIEW_ENV, "auto").strip().lower()
    return mode if mode in ("auto", "halfcell", "text") else "auto"


def detect_terminal_graphics() -> None:
    """Ask the terminal which picture protocol it speaks (call before the app runs; a no-op unless the mode is auto)."""
    global _detected
    if preview_mode() == "auto" and _detected is None:
        import textual_image.widget  # noqa: F401 - the import asks the terminal

        _detected = "auto"


def make_preview(picture: PILImage) -> Widget | None:
    """The widget that draws a decoded preview, or None when pictures are off (text mode, or auto mode when the
    terminal was not asked before the app started: asking it now would write into the screen)."""
    mode = preview_mode()
    if mode == "text" or (mode == "auto" and _detected is None):
        return None
    if mode == "halfcell":
        from textual_image.widget import HalfcellImage

        return HalfcellImage(picture, classes="image-picture")
    from textual_image.widget import Image

    return Image(picture, classes="image-picture")


def decode_preview(data: bytes) -> PILImage | None:
    """A small RGB picture of image bytes already checked (engine_ext.image_input: size, format, pixels), decoded with
    Pillow under the same pixel bound; None when Pillow cannot read it. Call it in a thread."""
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS  # more is refused (DecompressionBombError), never decoded
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.draft("RGB", (PREVIEW_PIXELS, PREVIEW_PIXELS))  # JPEG: decoded at a reduced scale
            picture = opened.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, SyntaxError):
        return None
    picture.thumbnail((PREVIEW_PIXELS, PREVIEW_PIXELS))
    return picture
