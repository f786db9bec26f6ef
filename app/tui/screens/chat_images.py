"""The chat screen's images: attaching one (F12 opens a path prompt with Tab completion; a path dropped on the
terminal, pasted alone into the message box, attaches too), checked at once in a thread, and the pending ones above
the message box until the message is sent."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.documents.reading import BINARY_SUFFIXES
from app.core.store import StoredImage
from app.tui.screens.chat_documents import DocumentAttacher
from app.tui.screens.chat_view import ChatView
from app.tui.widgets.prompt_input import IMAGE_SUFFIXES
from engine_ext.image_input import READ_FORMATS, ImageRefused, read_image_file
from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell

ATTACH_KEY = "f12"
READ_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
"""The images the engine decodes (READ_FORMATS), by name: F12's Tab offers them."""
NOT_OFFERED = tuple(sorted(suffix for suffix in BINARY_SUFFIXES if suffix not in READ_IMAGE_SUFFIXES))
"""Files F12's Tab does not offer: neither an image the engine reads nor a document (.webp, archives, models…)."""


def attach_problem(typed: str) -> str:
    """Why the path typed in F12 cannot be attached, in a line ('' when it can): nothing there, or an image the
    engine would refuse (the same check as attaching it). Reads the file: call it in a thread."""
    path = Path(typed.strip()).expanduser()
    try:
        if not path.exists():
            return f"Nothing at {path}: check the path (Tab completes it)."
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            return ""
        image = read_image_file(path)
    except ImageRefused as refused:
        return str(refused)
    except OSError as error:
        return f"{path.name}: {error.strerror or error}"
    if image.format not in READ_FORMATS:
        return f"{path.name}: {image.format} is not decoded by the engine's projector; convert it to PNG"
    return ""


class ImageAttacher:
    """Attaching images to the message being written (they wait in the screen's `AttachmentsBar`), and, through F12
    too, documents to the conversation (the screen's `DocumentAttacher`, chat_documents.py)."""

    def __init__(self, view: ChatView, documents: DocumentAttacher) -> None:
        self._view = view
        self._documents = documents

    @property
    def app(self) -> LlmtuiShell:
        return self._view.app

    def ask_for_image(self) -> None:
        """F12: ask for an image's or a document's path (Tab completes it) and attach it: an image goes with the
        message, a text file or a folder with the conversation."""
        from app.tui.modals.text_prompt import PathPromptModal

        def chosen(typed: str | None) -> None:
            if typed and typed.strip():
                path = Path(typed.strip()).expanduser()
                if path.suffix.lower() in IMAGE_SUFFIXES:
                    if self._model_sees_images():
                        self.attach_image_file(path)
                else:
                    self._documents.attach_document(path)
            self._view.prompt.focus()

        self.app.push_screen(
            PathPromptModal(
                f"Attach an image ({', '.join(READ_FORMATS)}) or a document: a text, Markdown, code or HTML file, or a"
                " folder",
                placeholder="~/notes",
                left_out=NOT_OFFERED,
                check=attach_problem,
            ),
            chosen,
        )

    def path_pasted(self, path: Path) -> None:
        """A path dropped on the terminal (pasted alone into the message box): attached when the model sees images."""
        if self._model_sees_images():
            self.attach_image_file(path)

    def _model_sees_images(self) -> bool:
        """Whether the loaded model can take images; if not, say so (one line) and why."""
        model = self.app.model
        if model is None:
            self._view.notify("No model is loaded. Press ctrl+l to pick a vision model.", severity="warning")
            return False
        if not self.app.bridge.capabilities.images:
            self._view.notify(
                f"{one_line(model.name, 60)} is a server's model: llmtui sends it text only.", severity="warning"
            )
            return False
        if not model.sees_images:
            self._view.notify(
                f"{one_line(model.name, 60)} cannot see images: it has no projector (mmproj). Put its mmproj .gguf "
                "beside it, or pick a vision model (ctrl+l).",
                severity="warning",
                timeout=10,
            )
            return False
        return True

    def attach_image_file(self, path: Path) -> None:
        """Read and check the file, keep it in the history's image folder (a thread), then show it pending."""
        self._view.run_worker(partial(self._attach, path), thread=True, group="attach-image", exit_on_error=False)

    def _attach(self, path: Path) -> None:
        try:
            stored = self.app.generation.attach_image(path)
        except ImageRefused as refused:
            self.app.call_from_thread(self._view.notify, f"Not attached: {refused}", severity="error", timeout=10)
            return
        except OSError as error:
            self.app.call_from_thread(
                self._view.notify, f"Not attached: could not keep {path.name} ({error})", severity="error", timeout=10
            )
            return
        self.app.call_from_thread(self._attached, stored)

    def _attached(self, image: StoredImage) -> None:
        if self._view.attachments.add(image):
            self._view.notify(f"Attached {one_line(image.name, 60)} ({image.describe()}).")
        else:
            self._view.notify(f"{one_line(image.name, 60)} is attached already.")
