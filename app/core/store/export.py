"""Export a conversation (Markdown, JSON) and import a JSON export, checked field by field."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, cast

from app.core.store.connection import Database
from app.core.store.conversations import Conversations
from app.core.store.images import FILE_SUFFIXES, Images
from app.core.store.records import (
    MESSAGE_STATES,
    ROLES,
    ImportFormatError,
    JSONObject,
    Message,
    StoredImage,
    dump_images,
    dump_settings,
    dump_stats,
    image_from_json,
)
from app.core.store.tree import Tree, parents_first
from app.core.tools.loop import CallRecord, stored_calls
from engine_ext.image_input import MAX_IMAGE_BYTES, CheckedImage, ImageRefused, check_image
from engine_ext.untrusted_text import one_line

EXPORT_FORMAT: Final = "llmtui.conversation"
EXPORT_VERSION: Final = 1
MAX_IMPORTED_INTEGER: Final = (1 << 63) - 1
"""The largest whole number an import may hold anywhere (SQLite's, whose integers are signed 64-bit)."""
IMPORTED_SETTINGS: Final = ("sampling", "preset")
"""What an import keeps of a conversation's settings, with "tools" when it is "none"; the rest (tools turned on, keys
of other versions) is left out."""
IMPORTED_FILE_SETTINGS: Final = ("output_file",)
"""Sampling settings that name a local file: never imported (the output format falls back to free text)."""

# What Markdown exports say under a reply that did not complete.
STATE_NOTES: Final[dict[str, str]] = {
    "streaming": "Reply still being written when exported.",
    "stopped": "Reply stopped.",
    "interrupted": "Reply interrupted (llmtui closed while writing it).",
    "error": "Reply failed.",
}


def tool_call_markdown(record: CallRecord) -> str:
    """A reply's tool call, folded: the tool, where it came from, its arguments and its result (fenced as text)."""
    outcome = "denied" if not record.allowed else "failed" if record.failed else "result"
    fence = "`" * max(3, max((len(run) for run in record.result.split("\n") if set(run) == {"`"}), default=0) + 1)
    return (
        f"<details>\n<summary>Tool {record.call.name} ({record.source or 'not offered'}): {outcome}</summary>\n\n"
        f"Arguments: `{record.call.arguments}`\n\n{fence}text\n{record.result}\n{fence}\n\n</details>"
    )


def markdown_text(text: str) -> str:
    """One line of plain text inside Markdown emphasis: its Markdown and HTML characters escaped."""
    return "".join("\\" + c if c in "\\`*_[]<>#|~" else c for c in text)


def image_file_name(image: StoredImage) -> str:
    """The name an exported image file takes beside the Markdown (its hash's start and its format's suffix)."""
    return f"{image.sha256[:16]}.{FILE_SUFFIXES.get(image.format, 'img')}"


def image_markdown(image: StoredImage, folder: str) -> str:
    """A message's image in the Markdown export: a link to its file in `folder`, with its name and size."""
    alt = one_line(image.name, 80).replace("[", "(").replace("]", ")")
    return f"![{alt}]({folder}/{image_file_name(image)}) *{alt}: {image.describe()}*"


@dataclass(frozen=True)
class Imported:
    """An imported conversation, and the settings left out of it (each "sampling.output_file", "tools"…)."""

    conversation_id: int
    left_out: tuple[str, ...] = ()

    def note(self) -> str:
        """One line on what was left out ("" when nothing was)."""
        if not self.left_out:
            return ""
        return one_line(
            f"Its settings {', '.join(self.left_out)} were left out: an imported conversation never names this "
            "computer's files or turns on its tools."
        )


class Exports:
    """Exporting a conversation and importing an export as a new conversation (`Store.exports`)."""

    def __init__(self, database: Database, conversations: Conversations, tree: Tree, images: Images) -> None:
        self._database = database
        self._conversations = conversations
        self._tree = tree
        self._images = images

    def export_images(self, conversation_id: int) -> list[tuple[StoredImage, str]]:
        """The images of the active branch (each once) and their file names in an export's image folder."""
        seen: dict[str, StoredImage] = {}
        for message in self._tree.active_path(conversation_id):
            for image in message.images:
                seen.setdefault(image.sha256, image)
        return [(image, image_file_name(image)) for image in seen.values()]

    def export_markdown(self, conversation_id: int, image_folder: str = "images") -> str:
        """The active branch as Markdown: title, system prompt, a heading per message, reasoning folded, images as
        links into `image_folder` (relative to the Markdown file; `export_images` says what to copy there)."""
        with self._database.lock:
            conversation = self._conversations.get_conversation(conversation_id)
            path = self._tree.active_path(conversation_id)
        parts = [f"# {conversation.title or 'Untitled conversation'}"]
        if conversation.system_prompt.strip():
            parts += ["## System prompt", conversation.system_prompt.strip("\n").rstrip()]
        for message in path:
            parts.append(f"## {message.role.capitalize()}")
            if message.reasoning.strip():
                reasoning = message.reasoning.strip("\n").rstrip()
                parts.append(f"<details>\n<summary>Reasoning</summary>\n\n{reasoning}\n\n</details>")
            parts += [image_markdown(image, image_folder) for image in message.images]
            if message.content.strip():
                parts.append(message.content.strip("\n").rstrip())
            parts += [tool_call_markdown(record) for record, _ in stored_calls(message.stats)]
            if isinstance(repeats := message.stats.get("repeats"), str) and repeats.strip():
                parts.append(f"*{markdown_text(one_line(repeats, 200))}*")
            if message.failure:
                parts.append(f"*Reply failed: {markdown_text(message.failure)}*")
            elif message.state in STATE_NOTES:
                parts.append(f"*{STATE_NOTES[message.state]}*")
            if note := features_note(message.stats):
                parts.append(f"*{note}*")
        return "\n\n".join(parts) + "\n"

    def export_json(self, conversation_id: int) -> str:
        """The whole conversation (every branch, state, stats, timestamp) as JSON, its images in it (base64, each
        once; one whose file is missing or damaged is left out); ids are positions in the export's message list, so
        exporting an imported export gives the same bytes. Reads the image files: call it off the UI thread."""
        with self._database.lock:
            conversation = self._conversations.get_conversation(conversation_id)
            messages = parents_first(self._tree.messages(conversation_id))
        local_ids = {message.id: index for index, message in enumerate(messages)}
        images: dict[str, str] = {}
        for message in messages:
            for image in message.images:
                if image.sha256 not in images and (data := self._images.read_image(image)) is not None:
                    images[image.sha256] = base64.b64encode(data).decode("ascii")
        document: JSONObject = {
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
                | _images_field(message)
                for message in messages
            ],
        }
        if images:
            document["images"] = images
        return json.dumps(document, ensure_ascii=False, indent=2, sort_keys=True) + "\n"

    def import_json(self, text: str) -> Imported:
        """Create a new conversation from `export_json` output, keeping its timestamps; its id, and the settings left
        out (IMPORTED_SETTINGS: never a local file's name, never tools).

        A reply exported mid-stream is imported as 'interrupted' (nothing will finish it).
        """
        document = _parse_export(text)
        header = document["conversation"]
        header["settings"], left_out = imported_settings(header["settings"])
        for image in document["images"].values():  # kept first: a message refers to them once it is in
            self._images.keep_image(image, "")
        with self._database.write() as connection:
            cursor = connection.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    header["title"],
                    header["created_at"],
                    header["updated_at"],
                    header["system_prompt"],
                    dump_settings(header["settings"]),
                    header["model"],
                ),
            )
            conversation_id = cast(int, cursor.lastrowid)
            db_ids: dict[int, int] = {}
            for item in document["messages"]:
                cursor = connection.execute(
                    "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, state,"
                    " created_at, updated_at, model, stats, token_count, images)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                        dump_stats(item["stats"]),
                        item["token_count"],
                        dump_images(item["images"]),
                    ),
                )
                db_ids[item["id"]] = cast(int, cursor.lastrowid)
                self._images.written(item["images"])
            leaf = header["active_leaf"]
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (None if leaf is None else db_ids[leaf], conversation_id),
            )
        return Imported(conversation_id, left_out)


def imported_settings(settings: JSONObject) -> tuple[JSONObject, tuple[str, ...]]:
    """An import's conversation settings as kept (IMPORTED_SETTINGS; no sampling setting that names a file), and the
    names of those left out."""
    kept: JSONObject = {
        key: value for key, value in settings.items() if key in IMPORTED_SETTINGS or (key, value) == ("tools", "none")
    }
    left_out = [one_line(key, 40) for key in settings if key not in kept]
    sampling = kept.get("sampling")
    if isinstance(sampling, dict):
        named = [key for key in IMPORTED_FILE_SETTINGS if sampling.get(key)]
        if named:
            kept["sampling"] = {key: value for key, value in sampling.items() if key not in IMPORTED_FILE_SETTINGS}
            if sampling.get("output_format") in ("json_schema", "grammar"):  # neither works without its file
                kept["sampling"]["output_format"] = "text"
            left_out += [f"sampling.{key}" for key in named]
    return kept, tuple(left_out[:8])


def _images_field(message: Message) -> JSONObject:
    """A message's images in the JSON export (no field when it has none: exports without images stay as they were)."""
    return {"images": [image.to_json() for image in message.images]} if message.images else {}


def features_note(stats: Mapping[str, Any]) -> str:
    """One line for a reply in the Markdown export: the steering mix and the speculative settings it was written
    with (the stats' "steering" and "speculative", recorded by the controllers' `in_use`); "" when neither. An
    imported export may hold anything there: what is not as recorded is left out, the rest is said."""
    parts = []
    steering = stats.get("steering")
    steering = steering if isinstance(steering, dict) else {}
    mix = _mix_text(steering.get("vectors"))
    changes = steering.get("changes")
    steps = [  # the mix as it changed while the reply was written, from the token each steered from (issue 49, 17)
        (c["at"], _mix_text(c.get("vectors")) or "none")
        for c in (changes if isinstance(changes, list) else ())[:MAX_NOTED_CHANGES]
        if isinstance(c, dict) and _number(c.get("at")) and isinstance(c.get("vectors"), list)
    ]
    if len(steps) > 1:
        mix = "; ".join(text if not at else f"from token {at}: {text}" for at, text in steps)
    if mix:
        layers = steering.get("layers")
        ranged = isinstance(layers, list) and len(layers) == 2 and all(_number(n) for n in layers) and any(layers)
        where = f" on layers {layers[0]}–{layers[1]}" if ranged and isinstance(layers, list) else ""
        parts.append(f"Steering: {mix}{where}.")
    speculative = stats.get("speculative")
    if isinstance(speculative, dict) and isinstance(kind := speculative.get("type"), str):
        text = f"Speculative decoding: {one_line(kind, 40)}"
        drafters = speculative.get("drafters")
        if isinstance(drafters, list) and drafters != [kind] and all(isinstance(d, str) for d in drafters):
            text += f" ({one_line('+'.join(drafters), 80)})"
        for key, shown in (("n_max", "n_max {}"), ("n_min", "n_min {}"), ("p_min", "p_min {}")):
            value = speculative.get(key)
            if _number(value) and value:
                text += ", " + shown.format(value)
        if isinstance(draft := speculative.get("draft_model"), str):
            text += f", draft {one_line(draft, 80)}"
        if _number(accepted := speculative.get("accepted")):
            text += f", {accepted:.0%} of drafted tokens accepted"
        parts.append(text + ".")
    return " ".join(parts)


MAX_NOTED_CHANGES = 64
"""Steering changes of one reply said in the Markdown export, at most (an import may hold any number)."""


def _mix_text(vectors: object) -> str:
    """'mood +0.38, calm -1.00' for a recorded mix; '' when it holds none as recorded."""
    return ", ".join(
        f"{one_line(v['name'], 60)} {v['strength']:+.2f}"
        for v in (vectors if isinstance(vectors, list) else ())
        if isinstance(v, dict) and isinstance(v.get("name"), str) and _number(v.get("strength"))
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ----- import validation -------------------------------------------------------------------------------


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ImportFormatError(one_line(f"this is not a conversation exported by llmtui: {problem}"))


def _not_a_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _require_bounded_numbers(document: object) -> None:
    """Every number in an import a whole number within SQLite's (±MAX_IMPORTED_INTEGER) or a finite one, named by
    where it is when it is not (JSON has no NaN or infinity; Python's reader reads "1e400" as infinity)."""
    pending: list[tuple[object, str]] = [(document, "")]
    while pending:
        value, where = pending.pop()
        if isinstance(value, dict):
            pending += [(item, f"{where}.{key}" if where else str(key)) for key, item in value.items()]
        elif isinstance(value, list):
            pending += [(item, f"{where}[{index}]") for index, item in enumerate(value)]
        elif isinstance(value, int) and not isinstance(value, bool):
            _require(
                -MAX_IMPORTED_INTEGER - 1 <= value <= MAX_IMPORTED_INTEGER,
                f"{where} is out of range (a whole number from -2^63 to 2^63-1)",
            )
        elif isinstance(value, float):
            _require(math.isfinite(value), f"{where} is not a finite number")


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
        document = json.loads(text, parse_constant=_not_a_constant)
    except (ValueError, RecursionError) as error:
        raise ImportFormatError(
            one_line(f"this is not a conversation exported by llmtui: not JSON ({error})")
        ) from None
    _require(isinstance(document, dict), "the top level should be an object")
    _require_bounded_numbers(document)
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
        dump_settings(header["settings"])
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
        _require(token_count is None or token_count >= 0, f"{where}.token_count should not be negative")
        _require_timestamp(item["created_at"], f"{where}.created_at")
        _require_timestamp(item["updated_at"], f"{where}.updated_at")
        item.setdefault("parent", None)
        item.setdefault("token_count", None)
        item["images"] = _parse_message_images(item.get("images", []), where)
        seen.add(item["id"])
    leaf = header.get("active_leaf")
    _require(leaf is None or (isinstance(leaf, int) and leaf in seen), "conversation.active_leaf is unknown")
    header.setdefault("active_leaf", None)
    document["images"] = images = _parse_images(document.get("images", {}))
    for item in messages:  # what an image is, as its checked bytes say (not as the export says)
        item["images"] = tuple(
            replace(image, format=checked.format, width=checked.width, height=checked.height, size=len(checked.data))
            if (checked := images.get(image.sha256)) is not None
            else image
            for image in item["images"]
        )
    return cast(JSONObject, document)


def _parse_message_images(value: object, where: str) -> tuple[StoredImage, ...]:
    _require(isinstance(value, list), f"{where}.images should be a list")
    assert isinstance(value, list)
    images = tuple(image_from_json(item) for item in value)
    _require(all(image is not None for image in images), f"{where}.images holds an entry that is not an image")
    return cast(tuple[StoredImage, ...], images)


def _parse_images(value: object) -> dict[str, CheckedImage]:
    """The export's image files (base64 by content hash), each checked as an attached image is (size, format,
    pixels) and against its hash."""
    _require(isinstance(value, dict), "'images' should be an object")
    assert isinstance(value, dict)
    checked: dict[str, CheckedImage] = {}
    for sha256, encoded in value.items():
        where = f"images[{str(sha256)[:16]!r}]"
        _require(isinstance(encoded, str) and len(encoded) <= (MAX_IMAGE_BYTES + 2) // 3 * 4, f"{where} is too long")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ImportFormatError(f"this is not a conversation exported by llmtui: {where} is not base64") from None
        try:
            image = check_image(data, where)
        except ImageRefused as refused:
            raise ImportFormatError(f"this export holds an image llmtui refuses: {refused}") from None
        _require(image.sha256 == sha256, f"{where} does not hold the image its hash names")
        checked[sha256] = image
    return checked
