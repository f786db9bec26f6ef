"""Output that follows a grammar: GBNF text (llama.cpp's grammar format) or a JSON schema, converted to GBNF by
llama-cpp-python's converter (llama_cpp.llama_grammar.json_schema_to_gbnf, the port of llama.cpp's
json-schema-to-grammar), for llama.cpp's grammar sampler at the head of the native chain (sampling.py).

Runs in the worker: the converter lives in llama_cpp, which the UI process never imports. Both inputs come from
users and API clients: bounded in size, and every failure is one EngineError line before generation starts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass

from engine_ext.params import EngineError

MAX_GRAMMAR_CHARS = 256 * 1024
MAX_SCHEMA_CHARS = 64 * 1024  # the converter's work grows with the schema: a bound a hand-written schema never meets
# llama.cpp's grammar parser recurses once per nested group: 20,000 nested "(" overflow the worker's stack (a crash,
# measured); 5,000 parse. A grammar written by hand or by the converter nests a few levels.
MAX_GRAMMAR_NESTING = 1000
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's response_format json_object: any JSON object


PORT_CHAR_RULE = re.compile(r'^char ::= \[\^"\\\\\] ', re.MULTILINE)  # llama-cpp-python 0.3.36's `char ::= [^"\\] `
JSON_CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] '  # upstream's (common/json-schema-to-grammar.cpp)

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
        depth = nesting(grammar)
        if depth > MAX_GRAMMAR_NESTING:
            raise GrammarError(f"the grammar nests groups {depth} deep; at most {MAX_GRAMMAR_NESTING}")
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
        gbnf = str(json_schema_to_gbnf(json.dumps(schema)))
    except RecursionError:
        raise GrammarError("the JSON schema nests or refers to itself too deeply") from None
    except Exception as e:  # the converter raises what it meets (KeyError for a missing $ref, ValueError, …)
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {detail}") from None
    # The port's string character takes control characters, which JSON refuses (a random model wrote "\x0e" into a
    # string): upstream's json-schema-to-grammar excludes them, as here.
    return PORT_CHAR_RULE.sub(lambda _: JSON_CHAR_RULE, gbnf)


def nesting(grammar: str) -> int:
    """How deep the grammar's groups ( … ) nest, as llama.cpp's parser reads them: brackets inside "literals",
    [character classes] (both with backslash escapes) and # comments do not count."""
    depth = deepest = 0
    closing = ""  # the end of the literal or class being read ('' outside one)
    chars = iter(grammar)
    for char in chars:
        if closing:
            if char == "\\":
                next(chars, None)
            elif char == closing:
                closing = ""
        elif char in '"[':
            closing = '"' if char == '"' else "]"
        elif char == "#":
            for rest in chars:
                if rest in "\r\n":
                    break
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


AFTER_THINKING_ROOT = "llmtui-after-thinking"
THINKING_END_TRIGGER = "(</think>)"  # llama.cpp's lazy grammars start at a trigger pattern's first group


@dataclass(frozen=True)
class ReplyGrammar:
    """What the sampler's grammar is built from: GBNF (None: free text), its trigger patterns (empty: from the first
    token) and the rule it starts at."""

    gbnf: str | None
    triggers: tuple[str, ...] = ()
    root: str = "root"


def reply_grammar(grammar: str | None, json_schema: str | None, *, opens_reasoning: bool) -> ReplyGrammar:
    """The grammar of a reply (grammar_for); for a reply that starts inside its thinking, a lazy one: the model thinks
    freely, and from its end of thinking (`</think>`, the model's own or forced by the reasoning budget) the answer
    follows the grammar (upstream applies a lazy grammar only once its reasoning budget sampler is done)."""
    gbnf = grammar_for(grammar, json_schema)
    if gbnf is None or not opens_reasoning:
        return ReplyGrammar(gbnf)
    lazy = f'{gbnf}\n{AFTER_THINKING_ROOT} ::= "</think>" [ \\t\\n]* root\n'
    return ReplyGrammar(lazy, (THINKING_END_TRIGGER,), AFTER_THINKING_ROOT)


def native_log_size() -> int:
    """Where the engine log ends now (0 outside the worker): parse_error reads what llama.cpp writes after it."""
    path = os.environ.get(NATIVE_LOG_ENV)
    sys.stderr.flush()
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


def parse_error(since: int = 0) -> str:
    """Why llama.cpp refused the grammar it was given after the engine log was `since` bytes long: its parser says
    so only on stderr (llama-grammar.cpp), its left-recursion check in its log, both the engine log in the worker;
    read from what was written since (an earlier grammar's error is not this one's), in one line."""
    path = os.environ.get(NATIVE_LOG_ENV)
    if not path:
        return "see the engine log"
    sys.stderr.flush()
    try:
        with open(path, "rb") as log:
            log.seek(max(since, os.fstat(log.fileno()).st_size - 4096))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return "see the engine log"
    if "left recursion detected" in tail:
        return "a rule refers to itself before it reads any text (left recursion), which llama.cpp does not take"
    said = tail.rpartition("error parsing grammar:")[2]
    if not said:
        return "see the engine log"
    reason, _, where = said.partition("\n\n")
    where = " ".join(where.split("\nfailed to parse grammar")[0].split())
    return f"{reason.strip().removesuffix(' at')[:100]}{f' in: {where[:60]}' if where else ''}"
