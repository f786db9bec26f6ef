"""An image of a message in the transcript: its name and size always, and a picture of it (image_preview) once its
file is read and decoded in a thread; a file missing or damaged in the history is said so, never an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import get_current_worker

from app.core.store import StoredImage
from app.tui.widgets.image_preview import decode_preview, make_preview
from app.tui.widgets.message_view import FollowsTheEnd
from engine_ext.untrusted_text import one_line, shown

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

ImageReader = Callable[[StoredImage], "bytes | None"]
"""Reads an image's bytes from the history (`store.images.read_image`): None when its file is missing or damaged."""


def image_label(image: StoredImage, problem: str = "") -> Text:
    """ "🖼 cat.png  PNG 640×480, 81 KB", or what is wrong with its file."""
    label = Text("🖼 ", style="dim")
    label.append(one_line(image.name or "image", 60), style="bold")
    label.append(f"  {shown(image.describe())}", style="dim")
    if problem:
        label.append(f"  {problem}", style="italic")
    return label


class ImageBlock(Vertical):
    """One image sent with a message of yours."""

    DEFAULT_CSS = """
    ImageBlock { height: auto; padding: 0 1 0 2; }
    ImageBlock .image-label { height: 1; }
    ImageBlock .image-picture { height: 8; width: auto; max-width: 40; }
    """

    def __init__(self, image: StoredImage, read: ImageReader | None, *, message_id: int | None = None) -> None:
        super().__init__(classes="image-block")
        self.image = image
        self.read = read
        self.message_id = message_id
        self.state = "reading"
        """reading, shown (a picture drawn), named (name and size only) or missing (its file is missing or damaged)."""

    def compose(self) -> ComposeResult:
        yield Static(image_label(self.image), classes="image-label")

    def on_mount(self) -> None:
        if self.read is None:
            self.state = "named"
            return
        self._load(self.read)

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _load(self, read: ImageReader) -> None:
        data = read(self.image)
        picture = decode_preview(data) if data is not None else None
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._loaded, data is not None, picture)

    def _loaded(self, found: bool, picture: PILImage | None) -> None:
        if not found:
            self.state = "missing"
            self.query_one(".image-label", Static).update(
                image_label(self.image, "missing from the history: sent without it")
            )
            return
        preview = make_preview(picture) if picture is not None else None
        if preview is None:
            self.state = "named"
            return
        self.state = "shown"
        follows = self.parent if isinstance(self.parent, FollowsTheEnd) and self.parent.at_bottom else None
        self.mount(preview)
        if follows is not None and isinstance(follows, Widget):  # the picture made the conversation longer
            self.call_after_refresh(follows.scroll_end, animate=False)
