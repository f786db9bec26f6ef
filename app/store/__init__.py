"""Durable chat history: conversations as message trees, streaming checkpoints and presets in one SQLite file."""

from __future__ import annotations

import heapq
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, cast

from app.paths import data_dir
from app.private_files import private_dir, private_file, tighten_if_exists

HISTORY_FILE_NAME: Final = "history.sqlite3"
BUSY_TIMEOUT_S: Final = 5.0
TITLE_MAX_CHARS: Final = 60
SNIPPET_RADIUS_CHARS: Final = 40
DAMAGE_SUMMARY_CHARS: Final = 160
EXPORT_FORMAT: Final = "llmtui.conversation"
EXPORT_VERSION: Final = 1

Role = Literal["system", "user", "assistant"]
MessageState = Literal["complete", "streaming", "stopped", "interrupted", "error"]
ROLES: Final[tuple[Role, ...]] = ("system", "user", "assistant")
MESSAGE_STATES: Final[tuple[MessageState, ...]] = ("complete", "streaming", "stopped", "interrupted", "error")
FINISHED_STATES: Final[tuple[MessageState, ...]] = ("complete", "stopped", "interrupted", "error")
JSONObject = dict[str, Any]

# What Markdown exports say under a reply that did not complete.
STATE_NOTES: Final[dict[str, str]] = {
    "streaming": "Reply still being written when exported.",
    "stopped": "Reply stopped.",
    "interrupted": "Reply interrupted (llmtui closed while writing it).",
    "error": "Reply failed.",
}


# ----- errors ------------------------------------------------------------------------------------------


class StoreError(Exception):
    """A chat history problem with a message a user can act on."""


class StoreUnavailable(StoreError):
    """The history file cannot be opened (permissions, disk, locked by another program)."""


class HistoryFromNewerVersion(StoreError):
    """The history file has a schema newer than this llmtui understands."""


class MigrationFailed(StoreError):
    """Upgrading the history file's schema failed (the pre-upgrade backup is kept)."""


class ConversationNotFound(StoreError):
    """No conversation has this id (it may have been purged)."""


class MessageNotFound(StoreError):
    """No message has this id, or it belongs to another conversation."""


class MessageNotStreaming(StoreError):
    """A checkpoint arrived for a reply that is no longer streaming."""


class PresetNotFound(StoreError):
    """No sampling preset has this name."""


class ImportFormatError(StoreError):
    """A file given to import is not a conversation exported by llmtui."""


# ----- records -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    """One conversation; timestamps are ISO 8601 UTC text. `damaged`: a field was unreadable, shown empty."""

    id: int
    title: str
    created_at: str
    updated_at: str
    system_prompt: str
    settings: JSONObject
    model: str
    active_leaf_id: int | None
    deleted_at: str | None
    damaged: bool = False


@dataclass(frozen=True)
class Message:
    """One message in a conversation's tree. `damaged`: its stats were unreadable and are shown empty."""

    id: int
    conversation_id: int
    parent_id: int | None
    role: Role
    content: str
    reasoning: str
    state: MessageState
    created_at: str
    updated_at: str
    model: str
    stats: JSONObject
    token_count: int | None
    damaged: bool = False

    @property
    def can_continue(self) -> bool:
        """Whether generation can pick this reply up where it ends: it was stopped, interrupted or failed, ran into
        max tokens, or the user edited its text."""
        if self.role != "assistant":
            return False
        return self.state in ("stopped", "interrupted", "error") or (
            self.state == "complete"
            and (bool(self.stats.get("edited")) or self.stats.get("stop_reason") == "max_tokens")
        )


@dataclass(frozen=True)
class Siblings:
    """The alternatives at one point of the tree, oldest first, and the position of the asked-about one."""

    messages: list[Message]
    index: int


@dataclass(frozen=True)
class SearchHit:
    """A conversation matching a search; `message_id` is None when only its title matched."""

    conversation_id: int
    title: str
    snippet: str
    message_id: int | None


@dataclass(frozen=True)
class Preset:
    """A named set of sampling settings."""

    name: str
    settings: JSONObject
    damaged: bool = False


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


# MIGRATIONS[n] takes a database from `user_version` n to n + 1, inside one transaction.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [create_initial_schema]


# ----- helpers -----------------------------------------------------------------------------------------


def open_default_store() -> Store:
    """The history store in the user data dir (`LLMTUI_DATA_DIR` overrides it)."""
    return Store(data_dir() / HISTORY_FILE_NAME)


def title_from_message(text: str) -> str:
    """A conversation title from a message: its first non-blank line, at most 60 characters."""
    for line in text.splitlines():
        words = " ".join(line.split())
        if words:
            if len(words) <= TITLE_MAX_CHARS:
                return words
            return words[: TITLE_MAX_CHARS - 1].rstrip(" ,;:-") + "…"
    return ""


def _decode_text(raw: bytes) -> str:
    """SQLite text as str; invalid UTF-8 (a damaged row) becomes U+FFFD instead of failing the query."""
    return raw.decode("utf-8", errors="replace")


def _casefold(text: str | None) -> str | None:
    return None if text is None else text.casefold()


def _load_json_object(text: str | None) -> tuple[JSONObject, bool]:
    """A JSON object column as a dict, and whether it was damaged (then the dict is empty)."""
    if not text:
        return {}, False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}, True
    if not isinstance(value, dict):
        return {}, True
    return value, False


def _dump_settings(settings: JSONObject) -> str:
    """Settings as JSON text; they must be plain JSON (ValueError/TypeError otherwise)."""
    return json.dumps(settings, ensure_ascii=False, sort_keys=True, allow_nan=False)


def _dump_stats(stats: JSONObject) -> str:
    """Stats as JSON text; never fails (odd values become strings) so a finished reply is always saved."""
    return json.dumps(stats, ensure_ascii=False, sort_keys=True, default=str)


def _is_damage(error: sqlite3.DatabaseError) -> bool:
    """Whether an SQLite error means the file is damaged or not a database (not busy, locked, or I/O)."""
    return getattr(error, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _connect(path: Path) -> sqlite3.Connection:
    # Owner-only: the file is created 0600 before SQLite opens it, and SQLite gives the -wal/-shm files the
    # database file's permissions on unix; ones left by an older version are tightened too.
    private_file(path)
    for suffix in ("-wal", "-shm"):
        tighten_if_exists(path.with_name(path.name + suffix))
    # One connection shared by threads, serialised by Store._lock; transactions are explicit.
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    connection.row_factory = sqlite3.Row
    connection.text_factory = _decode_text
    return connection


def _damage_in(connection: sqlite3.Connection) -> str | None:
    """What `PRAGMA quick_check` finds wrong with the database, or None when it is sound."""
    try:
        problems = [str(row[0]) for row in connection.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as error:
        if _is_damage(error):
            return str(error)
        raise
    if problems == ["ok"]:
        return None
    summary = "; ".join(" ".join(problem.replace("*", " ").split()) for problem in problems[:3])
    return summary if len(summary) <= DAMAGE_SUMMARY_CHARS else summary[: DAMAGE_SUMMARY_CHARS - 1] + "…"


def _move_aside(path: Path) -> Path:
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


def _snippet(text: str, query: str) -> str:
    """A one-line excerpt of `text` around the first case-insensitive match of `query`."""
    flat = " ".join(text.split())
    position = flat.lower().find(query.lower())
    if position < 0:
        position = 0
    start = max(0, position - SNIPPET_RADIUS_CHARS)
    end = min(len(flat), position + len(query) + SNIPPET_RADIUS_CHARS)
    return ("…" if start > 0 else "") + flat[start:end] + ("…" if end < len(flat) else "")


def _parents_first(messages: list[Message]) -> list[Message]:
    """Messages in id order, except that a parent always comes before its children."""
    by_id = {message.id: message for message in messages}
    children: dict[int, list[Message]] = {}
    ready: list[tuple[int, Message]] = []
    for message in messages:
        if message.parent_id is not None and message.parent_id in by_id:
            children.setdefault(message.parent_id, []).append(message)
        else:
            ready.append((message.id, message))
    heapq.heapify(ready)
    ordered: list[Message] = []
    while ready:
        _, message = heapq.heappop(ready)
        ordered.append(message)
        for child in children.get(message.id, []):
            heapq.heappush(ready, (child.id, child))
    return ordered


def _conversation_from_row(row: sqlite3.Row) -> Conversation:
    settings, damaged = _load_json_object(row["settings"])
    return Conversation(
        id=row["id"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        system_prompt=row["system_prompt"],
        settings=settings,
        model=row["model"],
        active_leaf_id=row["active_leaf_id"],
        deleted_at=row["deleted_at"],
        damaged=damaged,
    )


def _message_from_row(row: sqlite3.Row) -> Message:
    stats, damaged = _load_json_object(row["stats"])
    return Message(
        id=row["id"],
        conversation_id=row["conversation_id"],
        parent_id=row["parent_id"],
        role=cast(Role, row["role"]),
        content=row["content"],
        reasoning=row["reasoning"],
        state=cast(MessageState, row["state"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        model=row["model"],
        stats=stats,
        token_count=row["token_count"],
        damaged=damaged,
    )


def _damaged_placeholder(conversation_id: int) -> Conversation:
    """Stands in for a conversation whose row cannot be read at all, so the list still shows the rest."""
    return Conversation(
        id=conversation_id,
        title=f"Damaged conversation {conversation_id}",
        created_at="",
        updated_at="",
        system_prompt="",
        settings={},
        model="",
        active_leaf_id=None,
        deleted_at=None,
        damaged=True,
    )


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
        self._lock = threading.RLock()
        self._last_timestamp = ""
        self._connection: sqlite3.Connection | None = None
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
        connection = _connect(self.path)
        try:
            damage = _damage_in(connection)
        except sqlite3.Error:
            connection.close()
            raise
        if damage is None:
            return connection
        connection.close()
        moved_to = _move_aside(self.path)
        self.startup_notice = (
            f"Your chat history {self.path} was damaged ({damage}). It was moved to {moved_to} "
            "and a new, empty history was started."
        )
        return _connect(self.path)

    def _configure(self) -> None:
        connection = self._db
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.create_function("llmtui_casefold", 1, _casefold, deterministic=True)

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

    # ----- plumbing -----

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
        settings_text = _dump_settings(settings or {})
        with self._write() as connection:
            now = self._now()
            cursor = connection.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, settings_text, model),
            )
            conversation_id = cast(int, cursor.lastrowid)
        return self.get_conversation(conversation_id)

    def get_conversation(self, conversation_id: int) -> Conversation:
        """One conversation, deleted or not (ConversationNotFound when purged or never existed)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return _conversation_from_row(row)

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
                    conversations.append(_damaged_placeholder(conversation_id))
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
        settings_text = None if settings is None else _dump_settings(settings)
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
        """Remove for good the conversations deleted at least `older_than` ago; how many were removed."""
        with self._write() as connection:
            cutoff = (datetime.fromisoformat(self._now()) - older_than).isoformat(timespec="microseconds")
            cursor = connection.execute(
                "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )
            return cursor.rowcount

    def search(self, query: str) -> list[SearchHit]:
        """Conversations (not deleted) whose title or any message (any branch) contains `query`, ignoring
        case; most recently active first, one hit each, with a snippet around the first match."""
        needle = query.strip().casefold()
        if not needle:
            return []
        with self._lock:
            conversations = self._db.execute(
                "SELECT id, title FROM conversations WHERE deleted_at IS NULL ORDER BY updated_at DESC, id DESC"
            ).fetchall()
            title_matches = {row["id"] for row in conversations if needle in (_casefold(row["title"]) or "")}
            message_matches: dict[int, tuple[int, str]] = {}
            for row in self._db.execute(
                "SELECT m.conversation_id, m.id, m.content FROM messages m"
                " JOIN conversations c ON c.id = m.conversation_id"
                " WHERE c.deleted_at IS NULL AND instr(llmtui_casefold(m.content), ?) > 0"
                " ORDER BY m.created_at, m.id",
                (needle,),
            ):
                message_matches.setdefault(row["conversation_id"], (row["id"], row["content"]))
        hits: list[SearchHit] = []
        for row in conversations:
            conversation_id, title = row["id"], row["title"]
            if conversation_id in message_matches:
                message_id, content = message_matches[conversation_id]
                hits.append(SearchHit(conversation_id, title, _snippet(content, query.strip()), message_id))
            elif conversation_id in title_matches:
                hits.append(SearchHit(conversation_id, title, title, None))
        return hits

    # ----- messages -----

    def get_message(self, message_id: int) -> Message:
        """One message (MessageNotFound when it does not exist)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise MessageNotFound(f"message {message_id} no longer exists")
        return _message_from_row(row)

    def messages(self, conversation_id: int) -> list[Message]:
        """Every message of a conversation, all branches, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY created_at, id", (conversation_id,)
            ).fetchall()
        return [_message_from_row(row) for row in rows]

    def active_path(self, conversation_id: int) -> list[Message]:
        """The branch on screen: messages from the root to the conversation's active leaf."""
        with self._lock:
            conversation = self.get_conversation(conversation_id)
            messages = self.messages(conversation_id)
        by_id = {message.id: message for message in messages}
        leaf_id = conversation.active_leaf_id
        if leaf_id is None and messages:  # no leaf recorded: show the most recent branch
            leaf_id = self._most_recent_leaf(messages, None)
        path: list[Message] = []
        seen: set[int] = set()
        while leaf_id is not None and leaf_id in by_id and leaf_id not in seen:
            seen.add(leaf_id)
            path.append(by_id[leaf_id])
            leaf_id = by_id[leaf_id].parent_id
        path.reverse()
        return path

    def siblings(self, message_id: int) -> Siblings:
        """The message and its alternatives (same parent, same conversation), oldest first."""
        with self._lock:
            message = self.get_message(message_id)
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY created_at, id",
                (message.conversation_id, message.parent_id),
            ).fetchall()
        messages = [_message_from_row(row) for row in rows]
        index = next(i for i, sibling in enumerate(messages) if sibling.id == message_id)
        return Siblings(messages, index)

    def switch_branch(self, message_id: int) -> list[Message]:
        """Show the branch through `message_id`: the active leaf becomes the most recently created leaf
        below it (the message itself when it has no replies). Returns the new active path."""
        with self._write() as connection:
            message = self.get_message(message_id)
            messages = self.messages(message.conversation_id)
            leaf_id = self._most_recent_leaf(messages, message_id)
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf_id, message.conversation_id)
            )
        return self.active_path(message.conversation_id)

    @staticmethod
    def _most_recent_leaf(messages: list[Message], top_id: int | None) -> int:
        """The leaf created last in the subtree under `top_id` (None: the whole conversation)."""
        children: dict[int | None, list[Message]] = {}
        for message in messages:
            children.setdefault(message.parent_id, []).append(message)
        by_id = {message.id: message for message in messages}
        pending = list(children.get(None, [])) if top_id is None else [by_id[top_id]]
        best: Message | None = None
        seen: set[int] = set()
        while pending:
            message = pending.pop()
            if message.id in seen:
                continue
            seen.add(message.id)
            below = children.get(message.id, [])
            if below:
                pending.extend(below)
            elif best is None or (message.created_at, message.id) > (best.created_at, best.id):
                best = message
        return best.id if best is not None else cast(int, top_id)

    def add_user_message(self, conversation_id: int, content: str) -> Message:
        """Append the user's prompt after the active leaf and commit it (call before generating).

        An untitled conversation takes its title from its first user message.
        """
        with self._write() as connection:
            conversation = self._require_conversation(connection, conversation_id)
            message = self._insert_message(
                connection, conversation_id, conversation["active_leaf_id"], "user", content, "", "complete", ""
            )
            if not conversation["title"]:
                connection.execute(
                    "UPDATE conversations SET title = ? WHERE id = ?",
                    (title_from_message(content), conversation_id),
                )
        return message

    def edit_user_message(self, message_id: int, content: str) -> Message:
        """Edit-and-resend: a new user message beside `message_id` (same parent), made the active leaf.

        The original and everything below it stay reachable through `siblings` and `switch_branch`.
        """
        with self._write() as connection:
            original = self.get_message(message_id)
            if original.role != "user":
                raise ValueError(f"message {message_id} is a {original.role} message, not a user message")
            return self._insert_message(
                connection, original.conversation_id, original.parent_id, "user", content, "", "complete", ""
            )

    def begin_assistant_message(self, conversation_id: int, parent_id: int | None, model: str) -> int:
        """Start a reply under `parent_id` (state 'streaming', made the active leaf); its id.

        Regenerating is calling this again with the same parent: the earlier reply stays a sibling.
        """
        with self._write() as connection:
            self._require_conversation(connection, conversation_id)
            message = self._insert_message(
                connection, conversation_id, parent_id, "assistant", "", "", "streaming", model
            )
            connection.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
        return message.id

    def checkpoint_assistant_message(self, message_id: int, content: str, reasoning: str) -> None:
        """Save the text streamed so far (one row update; call at most every second or so)."""
        with self._write() as connection:
            cursor = connection.execute(
                "UPDATE messages SET content = ?, reasoning = ?, updated_at = ? WHERE id = ? AND state = 'streaming'",
                (content, reasoning, self._now(), message_id),
            )
            if cursor.rowcount == 0:
                self.get_message(message_id)  # MessageNotFound if it is gone
                raise MessageNotStreaming(
                    f"reply {message_id} is no longer being written (another llmtui may have marked it "
                    "interrupted); its text was not updated"
                )

    def finish_assistant_message(
        self,
        message_id: int,
        content: str,
        reasoning: str,
        state: MessageState,
        stats: JSONObject,
        token_count: int | None = None,
    ) -> None:
        """Record the reply's final text, how it ended ('complete', 'stopped', 'error'…) and its stats."""
        if state not in FINISHED_STATES:
            raise ValueError(f"a finished reply's state is one of {FINISHED_STATES}, not {state!r}")
        with self._write() as connection:
            now = self._now()
            cursor = connection.execute(
                "UPDATE messages SET content = ?, reasoning = ?, state = ?, stats = ?, token_count = ?,"
                " updated_at = ? WHERE id = ?",
                (content, reasoning, state, _dump_stats(stats), token_count, now, message_id),
            )
            if cursor.rowcount == 0:
                raise MessageNotFound(f"message {message_id} no longer exists")
            connection.execute(
                "UPDATE conversations SET updated_at = ?"
                " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                (now, message_id),
            )

    def edit_assistant_message(self, message_id: int, content: str) -> Message:
        """Change a finished reply's text in place (no new branch): fix it, or cut it and continue from there.

        Its stats say `edited`, which lets it be continued; the draft spans of speculative decoding are dropped, as
        they no longer match the text.
        """
        with self._write() as connection:
            message = self.get_message(message_id)
            if message.role != "assistant" or message.state == "streaming":
                raise ValueError(f"message {message_id} is not a finished reply")
            stats = {k: v for k, v in message.stats.items() if k != "draft_spans"} | {"edited": True}
            now = self._now()
            connection.execute(
                "UPDATE messages SET content = ?, stats = ?, updated_at = ? WHERE id = ?",
                (content, _dump_stats(stats), now, message_id),
            )
            connection.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, message.conversation_id))
        return self.get_message(message_id)

    def resume_assistant_message(self, message_id: int) -> Message:
        """Continue a reply that can be (`Message.can_continue`): it becomes 'streaming' again, keeping its text,
        and the active leaf (checkpoint and finish it as a new reply)."""
        with self._write() as connection:
            message = self.get_message(message_id)
            if not message.can_continue:
                raise MessageNotStreaming(f"message {message_id} is not a reply that can be continued")
            now = self._now()
            connection.execute(
                "UPDATE messages SET state = 'streaming', updated_at = ? WHERE id = ?", (now, message_id)
            )
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (message_id, now, message.conversation_id),
            )
        return self.get_message(message_id)

    def recover_interrupted(self) -> int:
        """Mark replies left 'streaming' by a process that died as 'interrupted', keeping their text.

        Call it only at startup: a reply another running llmtui is writing would be marked too.
        """
        with self._write() as connection:
            cursor = connection.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
            return cursor.rowcount

    def _require_conversation(self, connection: sqlite3.Connection, conversation_id: int) -> sqlite3.Row:
        row = connection.execute(
            "SELECT id, title, active_leaf_id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return cast(sqlite3.Row, row)

    def _insert_message(
        self,
        connection: sqlite3.Connection,
        conversation_id: int,
        parent_id: int | None,
        role: Role,
        content: str,
        reasoning: str,
        state: MessageState,
        model: str,
    ) -> Message:
        """Insert a message, make it the active leaf and mark the conversation active now."""
        if parent_id is not None:
            parent = connection.execute("SELECT conversation_id FROM messages WHERE id = ?", (parent_id,)).fetchone()
            if parent is None or parent[0] != conversation_id:
                raise MessageNotFound(f"message {parent_id} is not part of conversation {conversation_id}")
        now = self._now()
        cursor = connection.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, state, created_at,"
            " updated_at, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, reasoning, state, now, now, model),
        )
        message_id = cast(int, cursor.lastrowid)
        connection.execute(
            "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
            (message_id, now, conversation_id),
        )
        return self.get_message(message_id)

    # ----- presets -----

    def save_preset(self, name: str, settings: JSONObject) -> None:
        """Create or replace the sampling preset called `name`."""
        if not name.strip():
            raise StoreError("a preset needs a name")
        settings_text = _dump_settings(settings)
        with self._write() as connection:
            now = self._now()
            connection.execute(
                "INSERT INTO presets (name, settings, created_at, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at",
                (name, settings_text, now, now),
            )

    def list_presets(self) -> list[Preset]:
        """All presets by name; one with unreadable settings shows with empty settings, flagged damaged."""
        with self._lock:
            rows = self._db.execute("SELECT name, settings FROM presets ORDER BY name").fetchall()
        presets = []
        for row in rows:
            settings, damaged = _load_json_object(row["settings"])
            presets.append(Preset(row["name"], settings, damaged))
        return presets

    def delete_preset(self, name: str) -> None:
        """Remove a preset (PresetNotFound when there is none by that name)."""
        with self._write() as connection:
            if connection.execute("DELETE FROM presets WHERE name = ?", (name,)).rowcount == 0:
                raise PresetNotFound(f"there is no preset called {name!r}")

    # ----- export and import -----

    def export_markdown(self, conversation_id: int) -> str:
        """The active branch as Markdown: title, system prompt, a heading per message, reasoning folded."""
        with self._lock:
            conversation = self.get_conversation(conversation_id)
            path = self.active_path(conversation_id)
        parts = [f"# {conversation.title or 'Untitled conversation'}"]
        if conversation.system_prompt.strip():
            parts += ["## System prompt", conversation.system_prompt.strip("\n").rstrip()]
        for message in path:
            parts.append(f"## {message.role.capitalize()}")
            if message.reasoning.strip():
                reasoning = message.reasoning.strip("\n").rstrip()
                parts.append(f"<details>\n<summary>Reasoning</summary>\n\n{reasoning}\n\n</details>")
            if message.content.strip():
                parts.append(message.content.strip("\n").rstrip())
            if message.state in STATE_NOTES:
                parts.append(f"*{STATE_NOTES[message.state]}*")
        return "\n\n".join(parts) + "\n"

    def export_json(self, conversation_id: int) -> str:
        """The whole conversation (every branch, state, stats, timestamp) as JSON; ids are positions in
        the export's message list, so exporting an imported export gives the same bytes."""
        with self._lock:
            conversation = self.get_conversation(conversation_id)
            messages = _parents_first(self.messages(conversation_id))
        local_ids = {message.id: index for index, message in enumerate(messages)}
        document = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "conversation": {
                "title": conversation.title,
                "created_at": conversation.created_at,
                "updated_at": conversation.updated_at,
                "system_prompt": conversation.system_prompt,
                "settings": conversation.settings,
                "model": conversation.model,
                "active_leaf": local_ids.get(conversation.active_leaf_id)
                if conversation.active_leaf_id is not None
                else None,
            },
            "messages": [
                {
                    "id": local_ids[message.id],
                    "parent": local_ids.get(message.parent_id) if message.parent_id is not None else None,
                    "role": message.role,
                    "content": message.content,
                    "reasoning": message.reasoning,
                    "state": message.state,
                    "created_at": message.created_at,
                    "updated_at": message.updated_at,
                    "model": message.model,
                    "stats": message.stats,
                    "token_count": message.token_count,
                }
                for message in messages
            ],
        }
        return json.dumps(document, ensure_ascii=False, indent=2, sort_keys=True) + "\n"

    def import_json(self, text: str) -> int:
        """Create a new conversation from `export_json` output, keeping its timestamps; its id.

        A reply exported mid-stream is imported as 'interrupted' (nothing will finish it).
        """
        document = _parse_export(text)
        header = document["conversation"]
        with self._write() as connection:
            cursor = connection.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    header["title"],
                    header["created_at"],
                    header["updated_at"],
                    header["system_prompt"],
                    _dump_settings(header["settings"]),
                    header["model"],
                ),
            )
            conversation_id = cast(int, cursor.lastrowid)
            db_ids: dict[int, int] = {}
            for item in document["messages"]:
                cursor = connection.execute(
                    "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, state,"
                    " created_at, updated_at, model, stats, token_count)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        conversation_id,
                        None if item["parent"] is None else db_ids[item["parent"]],
                        item["role"],
                        item["content"],
                        item["reasoning"],
                        "interrupted" if item["state"] == "streaming" else item["state"],
                        item["created_at"],
                        item["updated_at"],
                        item["model"],
                        _dump_stats(item["stats"]),
                        item["token_count"],
                    ),
                )
                db_ids[item["id"]] = cast(int, cursor.lastrowid)
            leaf = header["active_leaf"]
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (None if leaf is None else db_ids[leaf], conversation_id),
            )
        return conversation_id


# ----- import validation -------------------------------------------------------------------------------


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ImportFormatError(f"this is not a conversation exported by llmtui: {problem}")


def _require_fields(item: Any, fields: dict[str, type | tuple[type, ...]], where: str) -> None:
    _require(isinstance(item, dict), f"{where} should be an object")
    for name, kind in fields.items():
        _require(name in item, f"{where} has no {name!r}")
        value = item[name]
        _require(isinstance(value, kind) and not isinstance(value, bool), f"{where}.{name} has the wrong type")


def _require_timestamp(value: str, where: str) -> None:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        _require(False, f"{where} is not a date and time: {value!r}")


def _parse_export(text: str) -> JSONObject:
    """An export document, checked field by field (ImportFormatError says what is wrong)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ImportFormatError(f"this is not a conversation exported by llmtui: not JSON ({error})") from error
    _require(isinstance(document, dict), "the top level should be an object")
    _require(document.get("format") == EXPORT_FORMAT, f"'format' should be {EXPORT_FORMAT!r}")
    version = document.get("version")
    _require(isinstance(version, int), "'version' is missing")
    if version > EXPORT_VERSION:
        raise ImportFormatError(
            f"this export was made by a newer llmtui (format v{version}); upgrade llmtui to import it"
        )
    text_fields: dict[str, type | tuple[type, ...]] = {
        "title": str,
        "created_at": str,
        "updated_at": str,
        "system_prompt": str,
        "settings": dict,
        "model": str,
    }
    header = document.get("conversation")
    _require_fields(header, text_fields, "conversation")
    _require_timestamp(header["created_at"], "conversation.created_at")
    _require_timestamp(header["updated_at"], "conversation.updated_at")
    try:
        _dump_settings(header["settings"])
    except (ValueError, TypeError):
        _require(False, "conversation.settings holds values that are not plain JSON")
    messages = document.get("messages")
    _require(isinstance(messages, list), "'messages' should be a list")
    message_fields: dict[str, type | tuple[type, ...]] = {
        "id": int,
        "role": str,
        "content": str,
        "reasoning": str,
        "state": str,
        "created_at": str,
        "updated_at": str,
        "model": str,
        "stats": dict,
    }
    seen: set[int] = set()
    for index, item in enumerate(messages):
        where = f"messages[{index}]"
        _require_fields(item, message_fields, where)
        _require(item["id"] not in seen, f"{where}.id repeats an earlier id")
        parent = item.get("parent")
        _require(
            parent is None or (isinstance(parent, int) and parent in seen),
            f"{where}.parent should be null or the id of an earlier message",
        )
        _require(item["role"] in ROLES, f"{where}.role should be one of {', '.join(ROLES)}")
        _require(item["state"] in MESSAGE_STATES, f"{where}.state should be one of {', '.join(MESSAGE_STATES)}")
        token_count = item.get("token_count")
        _require(
            token_count is None or (isinstance(token_count, int) and not isinstance(token_count, bool)),
            f"{where}.token_count should be null or a whole number",
        )
        _require_timestamp(item["created_at"], f"{where}.created_at")
        _require_timestamp(item["updated_at"], f"{where}.updated_at")
        item.setdefault("parent", None)
        item.setdefault("token_count", None)
        seen.add(item["id"])
    leaf = header.get("active_leaf")
    _require(leaf is None or (isinstance(leaf, int) and leaf in seen), "conversation.active_leaf is unknown")
    header.setdefault("active_leaf", None)
    return cast(JSONObject, document)
