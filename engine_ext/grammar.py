"""Output that follows a grammar: GBNF text (llama.cpp's grammar format) or a JSON schema, converted to GBNF by
llama-cpp-python's converter (llama_cpp.llama_grammar.json_schema_to_gbnf, the port of llama.cpp's
json-schema-to-grammar), for llama.cpp's grammar sampler at the head of the native chain (sampling.py).

Runs in the worker: the converter lives in llama_cpp, which the UI process never imports. Both inputs come from
users and API clients: bounded in size, and every failure is one EngineError line before generation starts.
"""

from __future__ import annotations

import json
import os
import sys

from engine_ext.params import EngineError

MAX_GRAMMAR_CHARS = 256 * 1024
MAX_SCHEMA_CHARS = 64 * 1024  # the converter's work grows with the schema: a bound a hand-written schema never meets
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's response_format json_object: any JSON object


NATIVE_LOG_ENV = "LLMTUI_ENGINE_LOG"  # set by the worker: the file its native output goes to


class GrammarError(EngineError):
    """A grammar or JSON schema that cannot constrain the output (one line)."""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def grammar_for(grammar: str | None, json_schema: str | None) -> str | None:
    """The GBNF that constrains a reply: `grammar` as given, or `json_schema` converted; None: free text."""
    if grammar is not None and json_schema is not None:
        raise GrammarError("give a grammar or a JSON schema, not both")
    if grammar is not None:
        if not grammar.strip():
            raise GrammarError("the grammar is empty")
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the grammar has {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS}")
        if "\x00" in grammar:
            raise GrammarError("the grammar holds a NUL character")
        return grammar
    if json_schema is None:
        return None
    if len(json_schema) > MAX_SCHEMA_CHARS:
        raise GrammarError(f"the JSON schema has {len(json_schema)} characters; at most {MAX_SCHEMA_CHARS}")
    try:
        schema = json.loads(json_schema, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {str(e).splitlines()[0][:160]}") from None
    if not isinstance(schema, dict | bool):
        raise GrammarError("a JSON schema is an object (or true/false)")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except RecursionError:
        raise GrammarError("the JSON schema nests or refers to itself too deeply") from None
    except Exception as e:  # the converter raises what it meets (KeyError for a missing $ref, ValueError, …)
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {detail}") from None


def parse_error() -> str:
    """Why llama.cpp's grammar parser refused the last grammar: it says so only on stderr (llama-grammar.cpp), which
    is the engine log in the worker; read from the log's tail, in one line."""
    path = os.environ.get(NATIVE_LOG_ENV)
    if not path:
        return "see the engine log"
    sys.stderr.flush()
    try:
        with open(path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return "see the engine log"
    said = tail.rpartition("error parsing grammar:")[2]
    if not said:
        return "see the engine log"
    reason, _, where = said.partition("\n\n")
    where = " ".join(where.split("\nfailed to parse grammar")[0].split())
    return f"{reason.strip().removesuffix(' at')[:100]}{f' in: {where[:60]}' if where else ''}"
