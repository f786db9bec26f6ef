"""Calls that parse: the GBNF that holds a tool call to its tool's JSON schema, in the call format of the model's
template, with the patterns that start it lazily (llama.cpp's grammar sampler with trigger patterns, as upstream's
common/chat.cpp builds them, without their `[\\s\\S]*` ends: llama.cpp searches the whole output for a pattern, and
libstdc++'s recursive regex would run deep on a long reply): free text until the model opens a call, then the call
as the schema says. Tool choice "required" uses the same grammar from the first token (the reply is calls)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_ext.grammar import MAX_SCHEMA_CHARS, MAX_SCHEMA_COUNT, grammar_for
from engine_ext.tool_calls import HERMES, HERMES_CLOSE, HERMES_OPEN, MISTRAL, MISTRAL_OPEN, PYTHON_TAG

_CALL_RULE = "llmtui-call"
_UPPER_COUNTS = frozenset({"maxLength", "maxItems", "maxProperties"})
_ANNOTATIONS = frozenset({"description", "title", "$comment", "default", "examples", "deprecated", "readOnly"})
_TEXTS = ("description", "title", "$comment")
ANY_VALUE = {"type": ["string", "number", "boolean", "object", "array", "null"]}
_COUNTED_DEPTH = 64  # schemas nested deeper are left as they are (the converter refuses what it cannot take)


@dataclass(frozen=True)
class ToolGrammar:
    """GBNF for the calls, and the trigger patterns (empty: applies from the first token)."""

    gbnf: str
    triggers: tuple[str, ...]


def _call_schema(tool: Mapping[str, Any], arguments_key: str) -> dict[str, Any]:
    function = tool["function"]
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: function["parameters"]},
        "required": ["name", arguments_key],
    }


def fitting_tools(tools: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The tools whose calls fit the grammar's budget (their call schemas together within MAX_SCHEMA_CHARS), in
    order, and the names of those left out: a tool that does not fit is not offered, rather than every tool."""
    used = len(json.dumps({"anyOf": []}))
    kept: list[Mapping[str, Any]] = []
    left_out: list[str] = []
    for tool in tools:
        size = len(json.dumps(_call_schema(tool, "parameters"))) + 2  # "parameters": the longer arguments key
        if used + size > MAX_SCHEMA_CHARS:
            left_out.append(str(tool["function"]["name"]))
            continue
        kept.append(tool)
        used += size
    return kept, left_out


def countable(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`tools` for the calls' grammar, as upstream's converter reads schemas that llama-cpp-python's port refuses
    (Claude Code's tools have both): a schema of annotations only (a description) is any JSON value, and an upper
    count past MAX_SCHEMA_COUNT is left out (its Workflow tool takes a string of up to 524,288 characters: bounded
    by the reply's max_tokens instead of refused). The template still shows the schemas as given."""
    return [_convertible(tool, 0) for tool in tools]


def _convertible(value: Any, depth: int) -> Any:
    if depth > _COUNTED_DEPTH:
        return value
    if isinstance(value, Mapping):
        if value and value.keys() <= _ANNOTATIONS and all(isinstance(value.get(k, ""), str) for k in _TEXTS):
            return dict(ANY_VALUE)  # a property map holding "description" maps it to a schema, not a string
        return {
            k: _convertible(v, depth + 1)
            for k, v in value.items()
            if not (k in _UPPER_COUNTS and type(v) is int and v > MAX_SCHEMA_COUNT)
        }
    if isinstance(value, list):
        return [_convertible(v, depth + 1) for v in value]
    return value


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals escape as JSON strings do (" and \\ and control characters)


def tool_grammar(tools: Sequence[Mapping[str, Any]], fmt: str | None, *, required: bool) -> ToolGrammar:
    """The grammar of one or more calls of `tools` in format `fmt` (None: bare JSON, as Llama 3.x writes it);
    GrammarError when a tool's schema cannot be turned into a grammar."""
    arguments_key = "parameters" if fmt not in (HERMES, MISTRAL) else "arguments"
    schema = {"anyOf": [_call_schema(t, arguments_key) for t in tools]}
    converted = grammar_for(None, json.dumps(schema))
    assert converted is not None
    rules = re.sub(r"^root ::=", f"{_CALL_RULE} ::=", converted, count=1, flags=re.MULTILINE)
    ws = "[ \\t\\n]*"
    triggers: tuple[str, ...]
    if fmt == HERMES:
        one = f"{_gbnf_literal(HERMES_OPEN)} {ws} {_CALL_RULE} {ws} {_gbnf_literal(HERMES_CLOSE)}"
        root = f"root ::= {one} ({ws} {one})*"
        triggers = (f"({re.escape(HERMES_OPEN)})",)
    elif fmt == MISTRAL:
        root = (
            f'root ::= {_gbnf_literal(MISTRAL_OPEN)} {ws} "[" {ws} {_CALL_RULE} ({ws} "," {ws} {_CALL_RULE})* {ws} "]"'
        )
        triggers = (f"({re.escape(MISTRAL_OPEN)})",)
    else:
        root = f'root ::= ({_gbnf_literal(PYTHON_TAG)})? {ws} {_CALL_RULE} ({ws} ";" {ws} {_CALL_RULE})*'
        triggers = (
            f"({re.escape(PYTHON_TAG)})",
            '^\\s*(\\{\\s*"name"\\s*:)',  # a reply that starts as a call (the whole reply is JSON)
        )
    return ToolGrammar(f"{root}\n{rules}", () if required else triggers)
