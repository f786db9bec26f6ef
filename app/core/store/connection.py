"""What every part of the Store shares: the connection, the lock, write transactions, timestamps, and reading one
conversation or message by id."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from app.core.store.records import (
    Conversation,
    ConversationNotFound,
    Message,
    MessageNotFound,
    conversation_from_row,
    message_from_row,
)


class StoreBase:
    """The plumbing under `Store` and its parts (`TreeMixin`, `SearchMixin`, `PresetsMixin`, `ExportMixin`); the
    attributes are set by `Store.__init__`."""

    path: Path
    _lock: threading.RLock
    _last_timestamp: str
    _connection: sqlite3.Connection | None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise sqlite3.ProgrammingError("the chat history store is closed")
        return self._connection

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, under the lock; rolled back if the block raises."""
        with self._lock:
            connection = self._db
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise

    def _now(self) -> str:
        """The current UTC time as ISO text, strictly later than any this store handed out before."""
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        if stamp <= self._last_timestamp:
            later = datetime.fromisoformat(self._last_timestamp) + timedelta(microseconds=1)
            stamp = later.isoformat(timespec="microseconds")
        self._last_timestamp = stamp
        return stamp

    def get_conversation(self, conversation_id: int) -> Conversation:
        """One conversation, deleted or not (ConversationNotFound when purged or never existed)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return conversation_from_row(row)

    def get_message(self, message_id: int) -> Message:
        """One message (MessageNotFound when it does not exist)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise MessageNotFound(f"message {message_id} no longer exists")
        return message_from_row(row)

    def messages(self, conversation_id: int) -> list[Message]:
        """Every message of a conversation, all branches, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY created_at, id", (conversation_id,)
            ).fetchall()
        return [message_from_row(row) for row in rows]

    def _require_conversation(self, connection: sqlite3.Connection, conversation_id: int) -> sqlite3.Row:
        row = connection.execute(
            "SELECT id, title, active_leaf_id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return cast(sqlite3.Row, row)
