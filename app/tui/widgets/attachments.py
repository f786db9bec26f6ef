"""The images attached to the message being written, above the message box: each one's name, size and pixels; focus
it (shift+tab from the message box) and Delete (Del) removes the highlighted one."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from app.core.store import StoredImage
from engine_ext.untrusted_text import one_line


class AttachmentsBar(Static, can_focus=True):
    """The pending attachments, one line each; hidden when there are none. Esc goes back to the message box (the
    chat screen's)."""

    BINDINGS = [
        Binding("up", "move(-1)", "Previous", show=False, tooltip="Previous image"),
        Binding("down", "move(1)", "Next", show=False, tooltip="Next image"),
        Binding("delete,backspace,x", "remove", "Remove image", tooltip="Remove the highlighted image"),
    ]

    DEFAULT_CSS = """
    AttachmentsBar { height: auto; max-height: 6; padding: 0 1; }
    """

    images: reactive[tuple[StoredImage, ...]] = reactive((), always_update=True)
    """The attached images, in the order they go with the message."""
    highlighted: reactive[int] = reactive(0)
    """The attachment Delete removes (while the bar has the focus)."""

    class Changed(Message):
        """An attachment was added or removed."""

        def __init__(self, bar: AttachmentsBar) -> None:
            super().__init__()
            self.bar = bar

        @property
        def control(self) -> AttachmentsBar:
            return self.bar

    class Left(Message):
        """The last attachment was removed: the focus goes back to the message box."""

    def add(self, image: StoredImage) -> bool:
        """Attach an image (once: the same picture twice is one attachment); whether it was new."""
        if any(attached.sha256 == image.sha256 for attached in self.images):
            return False
        self.images = (*self.images, image)
        self.post_message(self.Changed(self))
        return True

    def take(self) -> tuple[StoredImage, ...]:
        """The attachments, for the message being sent; the bar is empty after."""
        images, self.images = self.images, ()
        self.highlighted = 0
        return images

    def watch_images(self, images: tuple[StoredImage, ...]) -> None:
        self.display = bool(images)
        self.highlighted = min(self.highlighted, max(0, len(images) - 1))
        self._draw()

    def watch_highlighted(self) -> None:
        self._draw()

    def on_focus(self) -> None:
        self.call_later(self._draw)  # once Widget's own handler (after this one) has set has_focus

    def on_blur(self) -> None:
        self.call_later(self._draw)

    def _draw(self) -> None:
        text = Text()
        for index, image in enumerate(self.images):
            mark = "▶ " if self.has_focus and index == self.highlighted else "🖼 "
            line = Text(mark)
            line.append(one_line(image.name or "image", 60), style="bold")
            line.append(f"  {image.describe()}", style="dim")
            if index == 0:
                line.append("  · Delete removes" if self.has_focus else "  · shift+tab, Del removes", "dim")
            text.append_text(line)
            if index < len(self.images) - 1:
                text.append("\n")
        self.update(text)

    def action_move(self, step: int) -> None:
        if self.images:
            self.highlighted = (self.highlighted + step) % len(self.images)

    def action_remove(self) -> None:
        if not self.images:
            return
        index = self.highlighted
        self.images = self.images[:index] + self.images[index + 1 :]
        self.post_message(self.Changed(self))
        if not self.images:
            self.post_message(self.Left())
