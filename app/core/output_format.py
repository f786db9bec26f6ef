"""A conversation's output format (free text, any JSON object, JSON that follows a schema file, text that follows a
GBNF grammar file) as the request fields of the local engine and of an OpenAI-compatible server. The file is read
when the reply is sent, by the engine's thread (never the UI's), bounded as every user text file is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core.app_settings_schema import OUTPUT_FORMAT
from app.core.text_files import read_text_file
from engine_ext.grammar import JSON_OBJECT_SCHEMA, MAX_GRAMMAR_CHARS

TEXT, ANY_JSON, JSON_SCHEMA, GRAMMAR = OUTPUT_FORMAT.choices


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
