"""A conversation's output format (free text, any JSON object, JSON that follows a schema file, text that follows a
GBNF grammar file) as the request fields of the local engine and of an OpenAI-compatible server. The file is read
when the reply is sent, by the engine's thread (never the UI's), bounded as every user text file is. The model is
told the format too (`instructed`: a line in the system message, the schema with it), as llama-server's users do: a
grammar holds the reply to the format, but a model that does not know it is expected writes `{}` or the schema back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from app.core.app_settings_schema import OUTPUT_FORMAT
from app.core.text_files import read_text_file
from engine_ext.grammar import JSON_OBJECT_SCHEMA, MAX_GRAMMAR_CHARS
from engine_ext.protocol import ChatMessage

TEXT, ANY_JSON, JSON_SCHEMA, GRAMMAR = OUTPUT_FORMAT.choices
MAX_SCHEMA_IN_PROMPT: Final = 8000
"""A longer schema (compacted) is not written into the prompt: the model is told to follow the schema it is held to."""
FORMAT_LABELS: Final = {ANY_JSON: "json", JSON_SCHEMA: "json schema", GRAMMAR: "grammar"}
"""How the chat's header marks a conversation whose replies are held to a format (free text: not marked)."""


class OutputFormatError(ValueError):
    """The output format's file cannot be read (one line, naming the file)."""


def _file_text(output_file: str) -> str:
    path = Path(output_file).expanduser()
    try:
        return read_text_file(path, limit=4 * MAX_GRAMMAR_CHARS)  # the engine bounds it again, in characters
    except OSError as error:
        raise OutputFormatError(f"the output format's file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise OutputFormatError(f"the output format's file: {error}") from None


def output_fields(output_format: str, output_file: str) -> tuple[str | None, str | None]:
    """Generate's (grammar, json_schema) for an output format (neither for free text); the engine checks them."""
    if output_format == ANY_JSON:
        return None, JSON_OBJECT_SCHEMA
    if output_format == JSON_SCHEMA:
        return None, _file_text(output_file)
    if output_format == GRAMMAR:
        return _file_text(output_file), None
    return None, None


def response_format_fields(output_format: str, output_file: str) -> dict[str, Any]:
    """The same for an OpenAI-compatible server: `response_format` (json_object, json_schema), or llama-server's
    `grammar`."""
    if output_format == ANY_JSON:
        return {"response_format": {"type": "json_object"}}
    if output_format == JSON_SCHEMA:
        text = _file_text(output_file)
        try:
            schema = json.loads(text)
        except ValueError as error:
            raise OutputFormatError(f"the output format's schema is not JSON: {str(error)[:120]}") from None
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}}
    if output_format == GRAMMAR:
        return {"grammar": _file_text(output_file)}
    return {}


def format_instruction(output_format: str, json_schema: str | None) -> str:
    """What the model is told of the format its reply is held to ("" for free text and a grammar, which says
    nothing a model reads): any JSON object, or JSON that follows the schema (written out when short enough)."""
    if output_format == ANY_JSON:
        return "Reply with a single JSON object and nothing else: no text before or after it, no code fence."
    if output_format != JSON_SCHEMA or not json_schema:
        return ""
    try:
        compact = json.dumps(json.loads(json_schema), ensure_ascii=False, separators=(",", ":"))
    except ValueError:  # the engine refuses it, in one line
        return ""
    if len(compact) > MAX_SCHEMA_IN_PROMPT:
        return "Reply with JSON only, following the JSON schema your reply is held to: no other text."
    return f"Reply with JSON only, following this JSON schema, and nothing else:\n{compact}"


def instructed(messages: Sequence[ChatMessage], instruction: str) -> tuple[ChatMessage, ...]:
    """The messages with `instruction` at the end of the system message (one made first when there is none)."""
    if not instruction:
        return tuple(messages)
    if messages and messages[0].role == "system":
        first = messages[0]
        return (replace(first, content=f"{first.content.rstrip()}\n\n{instruction}"), *messages[1:])
    return (ChatMessage("system", instruction), *messages)
