"""Grammars and JSON schemas on a tiny random-weight model (issue 34's tests): the output of 100 seeded schemas parses
and validates, and hostile grammars (deep nesting, left recursion, huge alternations) are refused in one line or
decode to an end, the engine going on after each."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine_ext.client import EngineClient
from engine_ext.grammar import MAX_GRAMMAR_NESTING, nesting
from engine_ext.params import GREEDY, ContextParams, ModelParams, SamplingParams
from engine_ext.protocol import ChatMessage, Crashed, Failed, Finished, Generate, TokenChunk


@pytest.fixture(scope="module")
def engine(lone_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path_factory.mktemp("engine-log") / "engine.log")
    client.start()
    client.load(str(lone_llama), ModelParams(), ContextParams(n_ctx=2048, n_threads=1))
    yield client
    client.close()


def run(engine: EngineClient, request: Generate) -> tuple[str, Finished | Failed]:
    """The reply's text and its last event (Finished or Failed; a crash fails the test)."""
    text: list[str] = []
    for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            text.append(event.text)
        elif isinstance(event, Finished | Failed):
            return "".join(text), event
        elif isinstance(event, Crashed):
            raise AssertionError(f"the engine crashed: {event}")
    raise AssertionError("the reply ended without Finished or Failed")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A JSON schema of the kinds llama.cpp's converter takes, bounded so that a reply under it ends: strings and
    arrays a maximum length, objects no properties beyond theirs. Without numeric ranges: llama-cpp-python
    0.3.36's converter does not enforce minimum / maximum (its GBNF takes any integer)."""
    kinds = ["string", "integer", "boolean", "enum", "null", "number"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":  # ASCII: a random model writes invalid UTF-8, whose bytes the grammar counts as characters
        return {"type": "string", "pattern": f"^[a-z0-9 ]{{{rng.randint(0, 3)},{rng.randint(4, 12)}}}$"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, True, None], rng.randint(1, 4))}
    if kind == "object":
        names = rng.sample(["a", "name", "size", "tags", "ok", "id", "note"], rng.randint(1, 4))
        properties = {name: random_schema(rng, depth + 1) for name in names}
        required = [name for name in names if rng.random() < 0.7]
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    return {"type": kind}


@pytest.mark.parametrize("seed", range(100))
def test_the_output_of_a_seeded_schema_parses_and_validates(engine: EngineClient, seed: int) -> None:
    rng = random.Random(seed)
    schema = {"type": "object", "properties": {"value": random_schema(rng)}, "required": ["value"]}
    schema["additionalProperties"] = False
    # Sampled, not greedy: a random model's greedy choice repeats itself; the seed keeps the reply the same each run.
    sampling = SamplingParams(temperature=1.0, seed=seed)
    request = Generate(
        0, (ChatMessage("user", "Answer in JSON."),), sampling=sampling, max_tokens=600, json_schema=json.dumps(schema)
    )
    text, last = run(engine, request)
    assert isinstance(last, Finished) and last.stop_reason == "eos", (text, last)  # the grammar ended the reply
    jsonschema.validate(json.loads(text), schema)


DEEP = "root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000  # crashed the worker (stack overflow in the parser)


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        (DEEP, f"nests groups 20000 deep; at most {MAX_GRAMMAR_NESTING}"),
        ('root ::= ( "yes" ', "the grammar does not parse: expecting ')'"),
        ('root ::= root "a" | "a"', "left recursion"),  # after a parse error: its message, not the one before
    ],
)
def test_hostile_grammars_are_refused_in_one_line_and_the_engine_goes_on(
    engine: EngineClient, grammar: str, words: str
) -> None:
    _, last = run(engine, Generate(0, (ChatMessage("user", "hi"),), sampling=GREEDY, grammar=grammar))
    assert isinstance(last, Failed) and last.error == "GrammarError", last
    assert words in last.message and "\n" not in last.message
    text, after = run(engine, Generate(0, (ChatMessage("user", "hi"),), sampling=GREEDY, grammar='root ::= "ok"'))
    assert isinstance(after, Finished) and text == "ok"


def test_a_huge_alternation_at_the_size_bound_decodes_to_its_end(engine: EngineClient) -> None:
    words = [f"w{i}" for i in range(20_000)]  # about 200 KB: under the size bound, 20,000 stacks to match
    grammar = "root ::= " + " | ".join(f'"{word}"' for word in words)
    text, last = run(engine, Generate(0, (ChatMessage("user", "hi"),), sampling=GREEDY, max_tokens=16, grammar=grammar))
    assert isinstance(last, Finished) and last.stop_reason == "eos" and text in set(words)


def test_nesting_counts_groups_only() -> None:
    assert nesting('root ::= (("a") "(((" [(] # (((\n (x))') == 2
    assert nesting('r ::= "\\"(" [\\]] (a)') == 1
    assert nesting("root ::= " + "(" * 7 + '"a"' + ")" * 7) == 7


@pytest.mark.parametrize("seed", range(20))
def test_a_schemas_strings_hold_no_control_characters(engine: EngineClient, seed: int) -> None:
    """JSON refuses raw control characters in strings; llama-cpp-python's converter let them through (engine_ext's
    grammar_for puts upstream's character rule back)."""
    schema = {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 2, "maxItems": 2}
    sampling = SamplingParams(temperature=1.0, seed=seed)
    request = Generate(0, (ChatMessage("user", "Two strings."),), sampling=sampling, json_schema=json.dumps(schema))
    text, last = run(engine, request)
    assert isinstance(last, Finished) and last.stop_reason == "eos", (text, last)
    assert len(json.loads(text)) == 2  # json.loads refuses a raw control character in a string
