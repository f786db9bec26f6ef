"""Durable chat history: conversations as message trees, streaming checkpoints and presets in one SQLite file.

The `Store` is put together from one module per job: `records` (records, errors, rows), `schema` (the file, its
schema and migrations), `base` (connection, lock, transactions), `tree` (the message tree), `search`, `presets` and
`export` (export and import). Every name importers use is re-exported here.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

from app.core.owner_only_dirs import private_dir, private_file
from app.core.paths import data_dir
from app.core.store.connection import StoreBase
from app.core.store.export import EXPORT_FORMAT, EXPORT_VERSION, STATE_NOTES, ExportMixin, Imported
from app.core.store.presets import PresetsMixin
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
    damaged_placeholder,
    dump_settings,
    title_from_message,
)
from app.core.store.schema import (
    BUSY_TIMEOUT_S,
    DAMAGE_SUMMARY_CHARS,
    MIGRATIONS,
    SCHEMA_V1,
    casefold,
    connect,
    create_initial_schema,
    damage_in,
    move_aside,
)
from app.core.store.search import SNIPPET_RADIUS_CHARS, SearchMixin
from app.core.store.tree import TreeMixin

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


class Store(ExportMixin, TreeMixin, SearchMixin, PresetsMixin, StoreBase):
    """The chat history in one SQLite file (WAL); safe to call from several threads of one process.

    Opening checks the file (`PRAGMA quick_check`): a damaged file is moved aside, a fresh one started and
    `startup_notice` says so. Older schemas are upgraded after a backup copy (`<file>.bak-v<old version>`).
    Replies left 'streaming' by a process that died are marked 'interrupted' (unless `recover=False`).
    """

    def __init__(self, path: Path, *, recover: bool = True) -> None:
        self.path = path
        self.startup_notice: str | None = None
        """A message for the user about something fixed while opening (a damaged file moved aside)."""
        self._lock = threading.RLock()
        self._pending_images = set()
        self._last_timestamp = ""
        self._connection = None
        try:
            private_dir(path.parent)
            self._connection = self._open_sound_database()
            self._configure()
        except (OSError, sqlite3.Error) as error:
            self.close()
            raise StoreUnavailable(
                f"cannot open the chat history {path}: {error}; check that the folder is writable "
                "and that no other program holds the file"
            ) from error
        try:
            self._migrate()
            if recover:
                self.recover_interrupted()
        except BaseException:
            self.close()
            raise

    # ----- opening -----

    def _open_sound_database(self) -> sqlite3.Connection:
        connection = connect(self.path)
        try:
            damage = damage_in(connection)
        except sqlite3.Error:
            connection.close()
            raise
        if damage is None:
            return connection
        connection.close()
        moved_to = move_aside(self.path)
        self.startup_notice = (
            f"Your chat history {self.path} was damaged ({damage}). It was moved to {moved_to} "
            "and a new, empty history was started."
        )
        return connect(self.path)

    def _configure(self) -> None:
        connection = self._db
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.create_function("llmtui_casefold", 1, casefold, deterministic=True)

    def _user_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        target_version = len(MIGRATIONS)
        version = self._user_version()
        if version > target_version:
            raise HistoryFromNewerVersion(
                f"the chat history {self.path} was written by a newer llmtui (schema v{version}, this one "
                f"knows v{target_version}); upgrade llmtui, or move the file aside to start a new history"
            )
        if version == target_version:
            return
        backup_path: Path | None = None
        has_tables = self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if has_tables:
            backup_path = self.path.with_name(f"{self.path.name}.bak-v{version}")
            try:
                private_file(backup_path)  # owner-only, like the history itself
                with closing(sqlite3.connect(backup_path)) as backup:
                    self._db.backup(backup)
            except (OSError, sqlite3.Error) as error:
                raise MigrationFailed(
                    f"could not back up the chat history {self.path} to {backup_path} before upgrading it: "
                    f"{error}; free some disk space and start llmtui again"
                ) from error
        for next_version in range(version + 1, target_version + 1):
            try:
                with self._write() as connection:
                    if self._user_version() >= next_version:  # another process got there first
                        continue
                    MIGRATIONS[next_version - 1](connection)
                    connection.execute(f"PRAGMA user_version = {next_version}")
            except sqlite3.Error as error:
                kept = f"; the file before the upgrade is kept at {backup_path}" if backup_path else ""
                raise MigrationFailed(
                    f"could not upgrade the chat history {self.path} to schema v{next_version}: {error}{kept}"
                ) from error

    def close(self) -> None:
        """Close the database; idempotent."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----- conversations -----

    def create_conversation(
        self, title: str = "", *, system_prompt: str = "", settings: JSONObject | None = None, model: str = ""
    ) -> Conversation:
        """A new, empty conversation. An empty title is filled from the first user message."""
        settings_text = dump_settings(settings or {})
        with self._write() as connection:
            now = self._now()
            cursor = connection.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, settings_text, model),
            )
            conversation_id = cast(int, cursor.lastrowid)
        return self.get_conversation(conversation_id)

    def list_conversations(self, *, deleted: bool = False) -> list[Conversation]:
        """Conversations, most recently active first; `deleted=True` lists the soft-deleted ones instead.

        Each is loaded on its own: one that cannot be read shows as a damaged placeholder, not an error.
        """
        condition = "deleted_at IS NOT NULL" if deleted else "deleted_at IS NULL"
        with self._lock:
            ids = [
                row[0]
                for row in self._db.execute(
                    f"SELECT id FROM conversations WHERE {condition} ORDER BY updated_at DESC, id DESC"
                )
            ]
            conversations: list[Conversation] = []
            for conversation_id in ids:
                try:
                    conversations.append(self.get_conversation(conversation_id))
                except ConversationNotFound:  # purged by another process meanwhile
                    continue
                except sqlite3.OperationalError:
                    raise
                except (sqlite3.DatabaseError, ValueError, TypeError, KeyError):
                    conversations.append(damaged_placeholder(conversation_id))
        return conversations

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Set a conversation's title (does not change its place in the list)."""
        with self._write() as connection:
            self._require_conversation(connection, conversation_id)
            connection.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def update_settings(
        self,
        conversation_id: int,
        *,
        system_prompt: str | None = None,
        settings: JSONObject | None = None,
        model: str | None = None,
    ) -> None:
        """Change a conversation's system prompt, sampling settings or model; None leaves a field as is."""
        settings_text = None if settings is None else dump_settings(settings)
        with self._write() as connection:
            self._require_conversation(connection, conversation_id)
            connection.execute(
                "UPDATE conversations SET system_prompt = coalesce(?, system_prompt),"
                " settings = coalesce(?, settings), model = coalesce(?, model) WHERE id = ?",
                (system_prompt, settings_text, model, conversation_id),
            )

    def delete_conversation(self, conversation_id: int) -> None:
        """Soft-delete: hide the conversation from the list until `undo_delete` or `purge_deleted`."""
        with self._write() as connection:
            self._require_conversation(connection, conversation_id)
            connection.execute(
                "UPDATE conversations SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                (self._now(), conversation_id),
            )

    def undo_delete(self, conversation_id: int) -> None:
        """Bring a soft-deleted conversation back."""
        with self._write() as connection:
            self._require_conversation(connection, conversation_id)
            connection.execute("UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self, older_than: timedelta) -> int:
        """Remove for good the conversations deleted at least `older_than` ago, and the image files only they
        referred to; how many conversations were removed."""
        with self._write() as connection:
            cutoff = (datetime.fromisoformat(self._now()) - older_than).isoformat(timespec="microseconds")
            cursor = connection.execute(
                "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )
            removed = cursor.rowcount
        if removed:
            self.free_unused_images()
        return removed
