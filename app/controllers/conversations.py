"""Conversations as files: import a JSON export, export one as Markdown and JSON. Reads and writes run in a thread
(no file I/O on the event loop); the store is used on the event loop, as everywhere."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app import paths
from app.controllers.host import WorkerHost
from app.private_files import private_dir, write_private_text
from app.store import StoreError

if TYPE_CHECKING:
    from app.store import Store


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
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: a name the OS refuses
            self.host.call_from_thread(
                self.host.notify, f"Could not import {path}: {error}", severity="error", timeout=10
            )
            return
        self.host.call_from_thread(self.import_text, path, text)

    def import_text(self, path: Path, text: str) -> None:
        try:
            conversation_id = self.host.store.import_json(text)
        except StoreError as error:
            self.host.notify(f"Could not import {path}: {error}", severity="error", timeout=10)
            return
        self.host.show_conversation(conversation_id)
        self.host.notify(f"Imported {path.name}.")

    # ----- export -----

    def export(self, conversation_id: int) -> tuple[Path, Path]:
        """Write the conversation as Markdown and JSON into `<data dir>/exports`; the two paths."""
        return write_export(*self._export_texts(conversation_id))

    def export_in_background(self, conversation_id: int, done: Callable[[tuple[Path, Path] | str], None]) -> None:
        """Export: the texts from the store here (StoreError raised), the files written in a thread; `done` gets the
        two paths or what went wrong."""
        texts = self._export_texts(conversation_id)

        def write() -> None:
            try:
                result: tuple[Path, Path] | str = write_export(*texts)
            except OSError as error:
                result = str(error)
            self.host.call_from_thread(done, result)

        self.host.run_worker(write, name="export", group="export", thread=True, exit_on_error=False)

    def _export_texts(self, conversation_id: int) -> tuple[str, str, str]:
        store = self.host.store
        conversation = store.get_conversation(conversation_id)
        return (
            export_stem(conversation.title, conversation.id),
            store.export_markdown(conversation_id),
            store.export_json(conversation_id),
        )


def write_export(stem: str, markdown: str, json_text: str) -> tuple[Path, Path]:
    folder = private_dir(paths.data_dir() / "exports")
    markdown_path, json_path = folder / f"{stem}.md", folder / f"{stem}.json"
    write_private_text(markdown_path, markdown)
    write_private_text(json_path, json_text)
    return markdown_path, json_path
