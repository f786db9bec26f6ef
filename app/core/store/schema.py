"""The history file: opening it (owner-only, checked for damage), its schema and the migrations between versions."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from app.core.owner_only_dirs import private_file, tighten_if_exists

BUSY_TIMEOUT_S: Final = 5.0
DAMAGE_SUMMARY_CHARS: Final = 160


# ----- schema and migrations ---------------------------------------------------------------------------

SCHEMA_V1: Final = (
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        model TEXT NOT NULL DEFAULT '',
        active_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
        deleted_at TEXT
    )
    """,
    """
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL DEFAULT '',
        reasoning TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT 'complete'
            CHECK (state IN ('complete', 'streaming', 'stopped', 'interrupted', 'error')),
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        stats TEXT NOT NULL DEFAULT '{}',
        token_count INTEGER
    )
    """,
    "CREATE INDEX messages_by_conversation ON messages(conversation_id, created_at)",
    "CREATE INDEX messages_by_parent ON messages(parent_id)",
    "CREATE INDEX messages_streaming ON messages(state) WHERE state = 'streaming'",
    "CREATE INDEX conversations_by_activity ON conversations(deleted_at, updated_at)",
    """
    CREATE TABLE presets (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        settings TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )
    """,
)


def create_initial_schema(connection: sqlite3.Connection) -> None:
    """Migration to version 1: conversations, messages (a tree per conversation) and presets."""
    for statement in SCHEMA_V1:
        connection.execute(statement)


def add_message_images(connection: sqlite3.Connection) -> None:
    """Migration to version 2: a message's images, a JSON list of `StoredImage` fields ('' when it has none); the
    files themselves are kept once each by content hash in the `images` folder beside the history."""
    connection.execute("ALTER TABLE messages ADD COLUMN images TEXT NOT NULL DEFAULT ''")
    connection.execute("CREATE INDEX messages_with_images ON messages(id) WHERE images != ''")


# MIGRATIONS[n] takes a database from `user_version` n to n + 1, inside one transaction.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [create_initial_schema, add_message_images]


# ----- opening the file --------------------------------------------------------------------------------


def decode_text(raw: bytes) -> str:
    """SQLite text as str; invalid UTF-8 (a damaged row) becomes U+FFFD instead of failing the query."""
    return raw.decode("utf-8", errors="replace")


def casefold(text: str | None) -> str | None:
    return None if text is None else text.casefold()


def is_damage(error: sqlite3.DatabaseError) -> bool:
    """Whether an SQLite error means the file is damaged or not a database (not busy, locked, or I/O)."""
    return getattr(error, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def connect(path: Path) -> sqlite3.Connection:
    # Owner-only: the file is created 0600 before SQLite opens it, and SQLite gives the -wal/-shm files the
    # database file's permissions on unix; ones left by an older version are tightened too.
    private_file(path)
    for suffix in ("-wal", "-shm"):
        tighten_if_exists(path.with_name(path.name + suffix))
    # One connection shared by threads, serialised by Store._lock; transactions are explicit.
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    connection.row_factory = sqlite3.Row
    connection.text_factory = decode_text
    return connection


def damage_in(connection: sqlite3.Connection) -> str | None:
    """What `PRAGMA quick_check` finds wrong with the database, or None when it is sound."""
    try:
        problems = [str(row[0]) for row in connection.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as error:
        if is_damage(error):
            return str(error)
        raise
    if problems == ["ok"]:
        return None
    summary = "; ".join(" ".join(problem.replace("*", " ").split()) for problem in problems[:3])
    return summary if len(summary) <= DAMAGE_SUMMARY_CHARS else summary[: DAMAGE_SUMMARY_CHARS - 1] + "…"


def move_aside(path: Path) -> Path:
    """Rename a damaged database (and its -wal/-shm files) to `<name>.corrupt-<timestamp>`."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while target.exists():
        counter += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.rename(target.with_name(target.name + suffix))
    return target
