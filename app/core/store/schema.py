"""The history file: opening it (owner-only, checked for damage), its schema and the migrations between versions
(after a backup copy)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from app.core.owner_only_dirs import private_file, tighten_if_exists
from app.core.store.connection import Database
from app.core.store.records import HistoryFromNewerVersion, MigrationFailed

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
    # One connection shared by threads, serialised by Database.lock; transactions are explicit.
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


def open_sound_database(path: Path) -> tuple[sqlite3.Connection, str | None]:
    """The history file opened and configured, and a message for the user when it was damaged: then it is moved
    aside and a fresh one started."""
    connection = connect(path)
    try:
        damage = damage_in(connection)
    except sqlite3.Error:
        connection.close()
        raise
    notice = None
    if damage is not None:
        connection.close()
        moved_to = move_aside(path)
        notice = (
            f"Your chat history {path} was damaged ({damage}). It was moved to {moved_to} "
            "and a new, empty history was started."
        )
        connection = connect(path)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.create_function("llmtui_casefold", 1, casefold, deterministic=True)
    except sqlite3.Error:
        connection.close()
        raise
    return connection, notice


def migrate(database: Database) -> None:
    """Bring the file's schema to this version's (MIGRATIONS), after a backup copy (`<file>.bak-v<old version>`)."""
    path = database.path
    target_version = len(MIGRATIONS)
    version = database.user_version()
    if version > target_version:
        raise HistoryFromNewerVersion(
            f"the chat history {path} was written by a newer llmtui (schema v{version}, this one "
            f"knows v{target_version}); upgrade llmtui, or move the file aside to start a new history"
        )
    if version == target_version:
        return
    backup_path: Path | None = None
    has_tables = database.connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    if has_tables:
        backup_path = path.with_name(f"{path.name}.bak-v{version}")
        try:
            private_file(backup_path)  # owner-only, like the history itself
            with closing(sqlite3.connect(backup_path)) as backup:
                database.connection.backup(backup)
        except (OSError, sqlite3.Error) as error:
            raise MigrationFailed(
                f"could not back up the chat history {path} to {backup_path} before upgrading it: "
                f"{error}; free some disk space and start llmtui again"
            ) from error
    for next_version in range(version + 1, target_version + 1):
        try:
            with database.write() as connection:
                if database.user_version() >= next_version:  # another process got there first
                    continue
                MIGRATIONS[next_version - 1](connection)
                connection.execute(f"PRAGMA user_version = {next_version}")
        except sqlite3.Error as error:
            kept = f"; the file before the upgrade is kept at {backup_path}" if backup_path else ""
            raise MigrationFailed(
                f"could not upgrade the chat history {path} to schema v{next_version}: {error}{kept}"
            ) from error
