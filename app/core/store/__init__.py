"""Durable chat history: conversations as message trees, streaming checkpoints and presets in one SQLite file.

The `Store` opens the file and holds one part per job, each owning its tables and queries: `store.conversations`
(a conversation's row), `store.tree` (its messages, a tree), `store.images` (the image files messages refer to),
`store.search`, `store.presets` and `store.exports` (export and import). They share the open file through
`connection.Database`; `records` holds the records and errors, `schema` the file, its schema and migrations. Every
name importers use is exported here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.core.owner_only_dirs import private_dir
from app.core.paths import data_dir
from app.core.store.connection import Database
from app.core.store.conversations import Conversations
from app.core.store.export import EXPORT_FORMAT, EXPORT_VERSION, STATE_NOTES, Exports, Imported
from app.core.store.images import Images
from app.core.store.presets import Presets
from app.core.store.records import (
    FINISHED_STATES,
    HISTORY_FILE_NAME,
    MESSAGE_STATES,
    ROLES,
    TITLE_MAX_CHARS,
    Conversation,
    ConversationNotFound,
    HistoryFromNewerVersion,
    ImportFormatError,
    JSONObject,
    Message,
    MessageNotFound,
    MessageNotStreaming,
    MessageState,
    MigrationFailed,
    Preset,
    PresetNotFound,
    Role,
    SearchHit,
    Siblings,
    StoredImage,
    StoreError,
    StoreUnavailable,
    title_from_message,
)
from app.core.store.schema import (
    BUSY_TIMEOUT_S,
    DAMAGE_SUMMARY_CHARS,
    MIGRATIONS,
    SCHEMA_V1,
    create_initial_schema,
    migrate,
    open_sound_database,
)
from app.core.store.search import SNIPPET_RADIUS_CHARS, Search
from app.core.store.tree import Tree

__all__ = [
    "BUSY_TIMEOUT_S",
    "DAMAGE_SUMMARY_CHARS",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "FINISHED_STATES",
    "HISTORY_FILE_NAME",
    "MESSAGE_STATES",
    "MIGRATIONS",
    "ROLES",
    "SCHEMA_V1",
    "SNIPPET_RADIUS_CHARS",
    "STATE_NOTES",
    "TITLE_MAX_CHARS",
    "Conversation",
    "ConversationNotFound",
    "HistoryFromNewerVersion",
    "ImportFormatError",
    "Imported",
    "JSONObject",
    "Message",
    "MessageNotFound",
    "MessageNotStreaming",
    "MessageState",
    "MigrationFailed",
    "Preset",
    "PresetNotFound",
    "Role",
    "SearchHit",
    "Siblings",
    "Store",
    "StoredImage",
    "StoreError",
    "StoreUnavailable",
    "create_initial_schema",
    "open_default_store",
    "title_from_message",
]


def open_default_store() -> Store:
    """The history store in the user data dir (`LLMTUI_DATA_DIR` overrides it)."""
    return Store(data_dir() / HISTORY_FILE_NAME)


# ----- the store ---------------------------------------------------------------------------------------


class Store:
    """The chat history in one SQLite file (WAL); safe to call from several threads of one process.

    Opening checks the file (`PRAGMA quick_check`): a damaged file is moved aside, a fresh one started and
    `startup_notice` says so. Older schemas are upgraded after a backup copy (`<file>.bak-v<old version>`).
    Replies left 'streaming' by a process that died are marked 'interrupted' (unless `recover=False`).
    """

    def __init__(self, path: Path, *, recover: bool = True) -> None:
        self.path = path
        self.startup_notice: str | None = None
        """A message for the user about something fixed while opening (a damaged file moved aside)."""
        try:
            private_dir(path.parent)
            connection, self.startup_notice = open_sound_database(path)
        except (OSError, sqlite3.Error) as error:
            raise StoreUnavailable(
                f"cannot open the chat history {path}: {error}; check that the folder is writable "
                "and that no other program holds the file"
            ) from error
        self.database = Database(path, connection)
        """The open file the parts share (its connection, lock and write transactions)."""
        self.images = Images(self.database)
        self.conversations = Conversations(self.database, self.images)
        self.tree = Tree(self.database, self.images)
        self.search = Search(self.database)
        self.presets = Presets(self.database)
        self.exports = Exports(self.database, self.conversations, self.tree, self.images)
        try:
            migrate(self.database)
            if recover:
                self.tree.recover_interrupted()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the database; idempotent."""
        self.database.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
