"""Conversations as files: import a JSON export, export one as Markdown and JSON. Reads and writes run in a thread
(no file I/O on the event loop); the store is used on the event loop, as everywhere."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app.core import paths
from app.core.owner_only_dirs import private_dir, write_private_bytes, write_private_text
from app.core.store import Imported, StoreError
from app.tui.controllers.host import WorkerHost

if TYPE_CHECKING:
    from app.core.store import Store


class ConversationsHost(WorkerHost, Protocol):
    """What the conversations controller needs besides: the history, and showing an imported conversation."""

    store: Store

    def show_conversation(self, conversation_id: int) -> None:
        """Open the conversation in the chat when no reply is being written there."""


def safe_file_name(title: str) -> str:
    """A conversation title as a file name: letters, digits, '.', '_' and '-' only, at most 50 characters."""
    return re.sub(r"[^\w.-]+", "-", title).strip("-")[:50] or "conversation"


def export_stem(title: str, conversation_id: int) -> str:
    """An export's file name without its suffix: the title, then the conversation's number said as such
    ("Tea-conversation-4"), unique per conversation (exporting again rewrites the same files). A bare "-4" read like
    a steering strength or a copy counter (issue 37)."""
    name = safe_file_name(title)
    return f"conversation-{conversation_id}" if name == "conversation" else f"{name}-conversation-{conversation_id}"


class ConversationsController:
    def __init__(self, host: ConversationsHost) -> None:
        self.host = host

    # ----- import -----

    def import_file(self, path: Path) -> None:
        """Read `path` in a thread, then import it here (a notice says how it went)."""
        self.host.run_worker(
            partial(self._read_import, path), name="read-import", group="import", thread=True, exit_on_error=False
        )

    def _read_import(self, path: Path) -> None:
        """In a thread: read the file and import it (its images are decoded, checked and written here too)."""
        try:
            text = path.read_text(encoding="utf-8")
            imported = self.host.store.exports.import_json(text)
        except (OSError, UnicodeDecodeError, ValueError, StoreError) as error:  # ValueError: a name the OS refuses
            self.host.call_from_thread(
                self.host.notify, f"Could not import {path}: {error}", severity="error", timeout=10
            )
            return
        self.host.call_from_thread(self._imported, path, imported)

    def _imported(self, path: Path, imported: Imported) -> None:
        self.host.show_conversation(imported.conversation_id)
        note = imported.note()
        self.host.notify(f"Imported {path.name}." + (f" {note}" if note else ""), timeout=10 if note else 3)

    # ----- export -----

    def export(self, conversation_id: int) -> tuple[Path, Path]:
        """Write the conversation as Markdown (its images as files beside it) and JSON (its images inside) into
        `<data dir>/exports`; the two paths."""
        return self._write_export(self._export_stem(conversation_id), conversation_id)

    def export_in_background(self, conversation_id: int, done: Callable[[tuple[Path, Path] | str], None]) -> None:
        """Export: the conversation looked up here (StoreError raised), the files made and written in a thread (the
        JSON reads the image files); `done` gets the two paths or what went wrong."""
        stem = self._export_stem(conversation_id)

        def write() -> None:
            try:
                result: tuple[Path, Path] | str = self._write_export(stem, conversation_id)
            except (OSError, StoreError) as error:
                result = str(error)
            self.host.call_from_thread(done, result)

        self.host.run_worker(write, name="export", group="export", thread=True, exit_on_error=False)

    def _export_stem(self, conversation_id: int) -> str:
        conversation = self.host.store.conversations.get_conversation(conversation_id)
        return export_stem(conversation.title, conversation.id)

    def _write_export(self, stem: str, conversation_id: int) -> tuple[Path, Path]:
        store = self.host.store
        folder = private_dir(paths.data_dir() / "exports")
        image_folder = f"{stem}.images"
        markdown_path, json_path = folder / f"{stem}.md", folder / f"{stem}.json"
        for image, name in store.exports.export_images(conversation_id):
            data = store.images.read_image(image)
            if data is not None:  # a missing one stays a link the Markdown's reader sees broken, as in the app
                write_private_bytes(folder / image_folder / name, data)
        write_private_text(markdown_path, store.exports.export_markdown(conversation_id, image_folder))
        write_private_text(json_path, store.exports.export_json(conversation_id))
        return markdown_path, json_path
