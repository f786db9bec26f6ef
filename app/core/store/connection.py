"""The open history file every part of the Store shares: its connection, the lock that serialises threads on it,
write transactions and timestamps."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from app.core.store.records import ConversationNotFound


class Database:
    """One SQLite connection shared by the threads of one process, serialised by `lock`; transactions are explicit
    (`write`)."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._connection: sqlite3.Connection | None = connection
        self._last_timestamp = ""

    @property
    def connection(self) -> sqlite3.Connection:
        """The open connection (sqlite3.ProgrammingError once closed)."""
        if self._connection is None:
            raise sqlite3.ProgrammingError("the chat history store is closed")
        return self._connection

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, under the lock; rolled back if the block raises."""
        with self.lock:
            connection = self.connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise

    def now(self) -> str:
        """The current UTC time as ISO text, strictly later than any this store handed out before."""
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        if stamp <= self._last_timestamp:
            later = datetime.fromisoformat(self._last_timestamp) + timedelta(microseconds=1)
            stamp = later.isoformat(timespec="microseconds")
        self._last_timestamp = stamp
        return stamp

    def user_version(self) -> int:
        return int(self.connection.execute("PRAGMA user_version").fetchone()[0])

    def require_conversation(self, connection: sqlite3.Connection, conversation_id: int) -> sqlite3.Row:
        """The conversation's id, title and active leaf (ConversationNotFound when purged or never existed)."""
        row = connection.execute(
            "SELECT id, title, active_leaf_id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return cast(sqlite3.Row, row)

    def close(self) -> None:
        """Close the connection; idempotent."""
        with self.lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
