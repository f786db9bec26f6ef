"""The chat screen's images: attaching one (F12 opens a path prompt with Tab completion; a path dropped on the
terminal, pasted alone into the message box, attaches too), checked at once in a thread, and the pending ones above
the message box until the message is sent."""

from __future__ import annotations

from pathlib import Path

from textual import on, work

from app.core.store import StoredImage
from app.tui.screens.chat_base import ChatBase
from app.tui.widgets.attachments import AttachmentsBar
from app.tui.widgets.prompt_input import IMAGE_SUFFIXES, PromptInput
from engine_ext.image_input import ImageRefused
from engine_ext.untrusted_text import one_line

ATTACH_KEY = "f12"


class ChatImages(ChatBase):
    """Attaching images to the message being written."""

    def action_attach_image(self) -> None:
        """F12: ask for an image file's path (Tab completes it) and attach it."""
        if not self._model_sees_images():
            return
        from app.tui.modals.text_prompt import PathPromptModal

        def chosen(typed: str | None) -> None:
            if typed and typed.strip():
                self.attach_image_file(Path(typed.strip()).expanduser())
            self.prompt.focus()

        self.app.push_screen(
            PathPromptModal(
                "Attach an image (PNG, JPEG, GIF, BMP)", placeholder="~/Pictures/photo.png", suffixes=IMAGE_SUFFIXES
            ),
            chosen,
        )

    @on(PromptInput.ImagePathPasted)
    def _image_path_pasted(self, event: PromptInput.ImagePathPasted) -> None:
        if self._model_sees_images():
            self.attach_image_file(event.path)

    def _model_sees_images(self) -> bool:
        """Whether the loaded model can take images; if not, say so (one line) and why."""
        model = self.app.model
        if model is None:
            self.notify("No model is loaded. Press ctrl+l to pick a vision model.", severity="warning")
            return False
        if not self.app.bridge.capabilities.images:
            self.notify(
                f"{one_line(model.name, 60)} is a server's model: llmtui sends it text only.", severity="warning"
            )
            return False
        if not model.sees_images:
            self.notify(
                f"{one_line(model.name, 60)} cannot see images: it has no projector (mmproj). Put its mmproj .gguf "
                "beside it, or pick a vision model (ctrl+l).",
                severity="warning",
                timeout=10,
            )
            return False
        return True

    @work(thread=True, group="attach-image", exit_on_error=False)
    def attach_image_file(self, path: Path) -> None:
        """Read and check the file, keep it in the history's image folder (a thread), then show it pending."""
        try:
            stored = self.app.generation.attach_image(path)
        except ImageRefused as refused:
            self.app.call_from_thread(self.notify, f"Not attached: {refused}", severity="error", timeout=10)
            return
        except OSError as error:
            self.app.call_from_thread(
                self.notify, f"Not attached: could not keep {path.name} ({error})", severity="error", timeout=10
            )
            return
        self.app.call_from_thread(self._attached, stored)

    def _attached(self, image: StoredImage) -> None:
        if self.attachments.add(image):
            self.notify(f"Attached {one_line(image.name, 60)} ({image.describe()}).")
        else:
            self.notify(f"{one_line(image.name, 60)} is attached already.")

    @on(AttachmentsBar.Left)
    def _attachments_left(self) -> None:
        self.prompt.focus()
