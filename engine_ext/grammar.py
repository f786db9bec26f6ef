"""Output that follows a grammar: GBNF text (llama.cpp's grammar format) or a JSON schema, converted to GBNF by
llama-cpp-python's converter (llama_cpp.llama_grammar.json_schema_to_gbnf, the port of llama.cpp's
json-schema-to-grammar) with its repetitions written by schema_repetition (llama.cpp's {m,n}, as upstream's converter
writes them), for llama.cpp's grammar sampler at the head of the native chain (sampling.py), which measures every
grammar first (grammar_bounds.py).

Runs in the worker: the converter lives in llama_cpp, which the UI process never imports. Both inputs come from
users and API clients: bounded in size, and every failure is one EngineError line before generation starts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass

from engine_ext.grammar_bounds import MAX_REPEAT, GrammarError
from engine_ext.untrusted_text import one_line

__all__ = ["GrammarError", "grammar_for", "reply_grammar"]

MAX_GRAMMAR_CHARS = 256 * 1024
MAX_SCHEMA_CHARS = 64 * 1024  # the converter's work grows with the schema: a bound a hand-written schema never meets
# llama.cpp's grammar parser recurses once per nested group: 20,000 nested "(" overflow the worker's stack (a crash,
# measured); 5,000 parse. A grammar written by hand or by the converter nests a few levels.
MAX_GRAMMAR_NESTING = 1000
# A schema's counts (maxLength, maxItems, a pattern's {m,n}) up to this: past llama.cpp's MAX_REPEAT they are written
# in blocks (REPEAT_BLOCK items, and the rest as fewer than a block or a block and the rest again).
MAX_SCHEMA_COUNT = 100_000
REPEAT_BLOCK = 1000
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's response_format json_object: any JSON object


PORT_CHAR_RULE = re.compile(r'^char ::= \[\^"\\\\\] ', re.MULTILINE)  # llama-cpp-python 0.3.36's `char ::= [^"\\] `
JSON_CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] '  # upstream's (common/json-schema-to-grammar.cpp)

NATIVE_LOG_ENV = "LLMTUI_ENGINE_LOG"  # set by the worker: the file its native output goes to


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
    from llama_cpp import llama_grammar

    # The port writes x{0,N} as N nested optional groups (a crash past ~20,000, refused past 2,000, gigabytes of
    # text for 10^9): every repetition it writes is ours instead (the one function it calls, 0.3.36).
    llama_grammar._build_repetition = schema_repetition
    try:
        gbnf = str(llama_grammar.json_schema_to_gbnf(json.dumps(schema)))
    except GrammarError:
        raise
    except RecursionError:
        raise GrammarError("the JSON schema nests or refers to itself too deeply") from None
    except Exception as e:  # the converter raises what it meets (KeyError for a missing $ref, ValueError, …)
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {detail}") from None
    # The port's string character takes control characters, which JSON refuses (a random model wrote "\x0e" into a
    # string): upstream's json-schema-to-grammar excludes them, as here.
    return PORT_CHAR_RULE.sub(lambda _: JSON_CHAR_RULE, gbnf)


def schema_repetition(
    item: str, low: object, high: object, separator_rule: str | None = None, item_rule_is_literal: bool = False
) -> str:
    """GBNF for `item` repeated `low` to `high` times (None: no bound), with `separator_rule` between the items, as
    upstream's converter writes it (llama.cpp's own x{m,n}): the replacement of llama-cpp-python's _build_repetition,
    called with counts straight from the schema (minLength, maxItems, a pattern's {m,n}). Counts past MAX_REPEAT
    (llama.cpp's limit) are written in blocks of REPEAT_BLOCK that it reads exactly; past MAX_SCHEMA_COUNT refused."""
    for count in (low, high):
        if count is not None and (type(count) is not int or count < 0):
            raise GrammarError(f"the JSON schema has a count that is not a whole number of at least 0: {count!r:.40}")
    assert isinstance(low, int) and (high is None or isinstance(high, int))
    largest = max(low, high or 0)
    if largest > MAX_SCHEMA_COUNT:
        raise GrammarError(
            f"the JSON schema asks for {largest} repetitions (a length, an item count or a pattern's {{m,n}}); at "
            f"most {MAX_SCHEMA_COUNT}"
        )
    if high is not None and high < low:
        raise GrammarError(f"the JSON schema asks for at least {low} and at most {high} of something")
    if high == 0:
        return ""
    if not separator_rule:
        return _repeated(item, low, high)
    rest = _repeated(f"({separator_rule} {item})", max(low - 1, 0), None if high is None else high - 1)
    both = f"{item} {rest}".rstrip()
    return f"({both})?" if low == 0 else both


def _repeated(item: str, low: int, high: int | None) -> str:
    """`item` low to high times in counts llama.cpp takes exactly: a count past MAX_REPEAT as blocks."""
    if high == 0:
        return ""
    if (low, high) == (0, 1):
        return f"{item}?"
    if high is None:
        many = {0: f"{item}*", 1: f"{item}+"}.get(low)
        return many or f"{_exactly(item, low)} {item}*"
    if high <= MAX_REPEAT:
        return f"{item}{{{low}}}" if low == high else f"{item}{{{low},{high}}}"
    return " ".join(part for part in (_exactly(item, low), _up_to(item, high - low)) if part)


def _exactly(item: str, count: int) -> str:
    if count <= MAX_REPEAT:
        return f"{item}{{{count}}}" if count else ""
    blocks, rest = divmod(count, REPEAT_BLOCK)
    return f"({item}{{{REPEAT_BLOCK}}}){{{blocks}}}" + (f" {item}{{{rest}}}" if rest else "")


def _up_to(item: str, count: int) -> str:
    """0 to `count` items, read one way only: fewer than a block, or a block and (recursively) the rest."""
    if count <= MAX_REPEAT:
        return f"{item}{{0,{count}}}" if count else ""
    return f"({item}{{0,{REPEAT_BLOCK - 1}}} | {item}{{{REPEAT_BLOCK}}} {_up_to(item, count - REPEAT_BLOCK)})"


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


MAX_LEADING_SPACE = 8
"""The whitespace an answer held to a grammar may start with after its thinking (the forced end writes two)."""


def reply_grammar(grammar: str | None, json_schema: str | None, *, opens_reasoning: bool) -> ReplyGrammar:
    """The grammar of a reply (grammar_for); for a reply that starts inside its thinking, a lazy one: the model thinks
    freely, and from its end of thinking (`</think>`, the model's own or forced by the reasoning budget) the answer
    follows the grammar (upstream applies a lazy grammar only once its reasoning budget sampler is done)."""
    gbnf = grammar_for(grammar, json_schema)
    if gbnf is None or not opens_reasoning:
        return ReplyGrammar(gbnf)
    # The answer's leading whitespace is bounded: unbounded, a model could write blank lines until its limit (a loop
    # that upstream's JSON grammars close too, with their bounded `space`).
    lazy = f'{gbnf}\n{AFTER_THINKING_ROOT} ::= "</think>" [ \\t\\n]{{0,{MAX_LEADING_SPACE}}} root\n'
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
    reason = " ".join(reason.split()).removesuffix(" at")  # llama.cpp quotes the rest of the grammar, lines and all
    return one_line(f"{reason[:100]}{f' in: {where[:60]}' if where else ''}")
