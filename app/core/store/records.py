"""The chat history's records, errors and constants, and how rows and JSON columns become records."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from engine_ext.image_input import size_text
from engine_ext.untrusted_text import one_line

HISTORY_FILE_NAME: Final = "history.sqlite3"
TITLE_MAX_CHARS: Final = 60
FAILURE_MAX_CHARS: Final = 200
"""How much of why a reply failed is kept on its one line (the transcript's, the exports')."""

Role = Literal["system", "user", "assistant"]
MessageState = Literal["complete", "streaming", "stopped", "interrupted", "error"]
ROLES: Final[tuple[Role, ...]] = ("system", "user", "assistant")
MESSAGE_STATES: Final[tuple[MessageState, ...]] = ("complete", "streaming", "stopped", "interrupted", "error")
FINISHED_STATES: Final[tuple[MessageState, ...]] = ("complete", "stopped", "interrupted", "error")
JSONObject = dict[str, Any]


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
class StoredImage:
    """An image a message refers to: its content hash (the file's name in the image folder), the name it was
    attached under, and what its header said when it was checked (format, pixels, bytes)."""

    sha256: str
    name: str
    format: str
    width: int
    height: int
    size: int

    def describe(self) -> str:
        """ "PNG 640×480, 81 KB", as engine_ext.image_input.CheckedImage says it."""
        return f"{self.format} {self.width}×{self.height}, {size_text(self.size)}"

    def to_json(self) -> JSONObject:
        return {
            "sha256": self.sha256,
            "name": self.name,
            "format": self.format,
            "width": self.width,
            "height": self.height,
            "size": self.size,
        }


_SHA256_HEX = frozenset("0123456789abcdef")
IMAGE_FIELDS: Final[dict[str, type]] = {
    "sha256": str,
    "name": str,
    "format": str,
    "width": int,
    "height": int,
    "size": int,
}


def image_from_json(item: object) -> StoredImage | None:
    """A StoredImage from its JSON form, None when it is not one (a damaged row or a hand-made export): the hash
    must be 64 lower-case hex digits, as it names a file."""
    if not isinstance(item, dict):
        return None
    for name, kind in IMAGE_FIELDS.items():
        value = item.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    sha256 = item["sha256"]
    if len(sha256) != 64 or not set(sha256) <= _SHA256_HEX:
        return None
    return StoredImage(sha256, item["name"], item["format"], item["width"], item["height"], item["size"])


def load_images(text: str | None) -> tuple[tuple[StoredImage, ...], bool]:
    """A message's images column, and whether it was damaged (what could not be read is left out)."""
    if not text:
        return (), False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return (), True
    items = value if isinstance(value, list) else []
    images = tuple(image for image in map(image_from_json, items) if image is not None)
    return images, len(images) != len(items) or not isinstance(value, list)


def dump_images(images: tuple[StoredImage, ...]) -> str:
    return json.dumps([image.to_json() for image in images], ensure_ascii=False) if images else ""


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
    images: tuple[StoredImage, ...] = ()
    """The images sent with it (a user message), in order; their files are in the store's image folder."""

    @property
    def failure(self) -> str:
        """Why a failed reply failed, on one line (its stats' "error", as the engine said it); "" for any other."""
        error = self.stats.get("error") if self.state == "error" else None
        return one_line(error, FAILURE_MAX_CHARS) if isinstance(error, str) and error.strip() else ""

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


# ----- rows and JSON columns -----------------------------------------------------------------------------


def title_from_message(text: str) -> str:
    """A conversation title from a message: its first non-blank line, at most 60 characters."""
    for line in text.splitlines():
        words = " ".join(line.split())
        if words:
            if len(words) <= TITLE_MAX_CHARS:
                return words
            return words[: TITLE_MAX_CHARS - 1].rstrip(" ,;:-") + "…"
    return ""


def load_json_object(text: str | None) -> tuple[JSONObject, bool]:
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


def dump_settings(settings: JSONObject) -> str:
    """Settings as JSON text; they must be plain JSON (ValueError/TypeError otherwise)."""
    return json.dumps(settings, ensure_ascii=False, sort_keys=True, allow_nan=False)


def dump_stats(stats: JSONObject) -> str:
    """Stats as JSON text; never fails (odd values become strings) so a finished reply is always saved."""
    return json.dumps(stats, ensure_ascii=False, sort_keys=True, default=str)


def conversation_from_row(row: sqlite3.Row) -> Conversation:
    settings, damaged = load_json_object(row["settings"])
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


def message_from_row(row: sqlite3.Row) -> Message:
    stats, damaged = load_json_object(row["stats"])
    images, images_damaged = load_images(row["images"]) if "images" in row.keys() else ((), False)
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
        damaged=damaged or images_damaged,
        images=images,
    )


def damaged_placeholder(conversation_id: int) -> Conversation:
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
