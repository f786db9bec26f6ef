"""`llmtui serve` with tools, over a scripted engine: tools and tool_choice reach the engine, `tool` messages and
assistant messages with tool_calls are taken, and a reply's calls come back in OpenAI's shape (whole and streamed),
with finish_reason "tool_calls" and the call's markup kept out of the content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.server.api_errors import ApiError
from app.server.asgi import build_app
from app.server.backend import EngineBackend, ServerSettings
from app.server.metrics import Metrics
from app.server.requests import Limits, parse_chat
from engine_ext.params import SamplingParams
from engine_ext.protocol import ChatMessage, Finished, ToolCall
from engine_ext.tool_calls import calls_from_json
from tests.tool_templates import WEATHER_TOOL as WEATHER
from tests.unit.test_server_http import ScriptedClient

CALL = ToolCall("abcdefghi", "get_weather", '{"city": "Paris"}')
USER = [{"role": "user", "content": "Weather in Paris?"}]


class ToolScriptedClient(ScriptedClient):
    """Replies "Let me check." and a Qwen-style call when the request offers tools."""

    def _finished(self, request_id: int, n: int, reason: Any) -> Finished:
        finished = super()._finished(request_id, n, reason)
        offered = self.sent and self.sent[-1].tools is not None and self.sent[-1].tool_choice != "none"
        return Finished(
            finished.request_id, finished.stop_reason, finished.stats, tool_calls=(CALL,) if offered else ()
        )


@pytest.fixture
def served() -> Iterator[tuple[TestClient, ToolScriptedClient]]:
    engine = ToolScriptedClient(["Let me", " check.", "<tool_", 'call>\n{"name": "get_weather"}', "\n</tool_call>"])
    metrics = Metrics()
    settings = ServerSettings(model_id="tiny", sampling=SamplingParams(), vectors={}, limits=Limits(), queue=2)
    backend = EngineBackend(engine, settings, metrics)  # type: ignore[arg-type]
    with TestClient(build_app(backend, metrics, api_key=None), base_url="http://127.0.0.1:8080") as client:
        yield client, engine
    backend.close()


def test_calls_come_back_in_openais_shape(served: tuple[TestClient, ToolScriptedClient]) -> None:
    client, engine = served
    answer = client.post("/v1/chat/completions", json={"messages": USER, "tools": [WEATHER], "tool_choice": "auto"})
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": CALL.id, "type": "function", "function": {"name": "get_weather", "arguments": CALL.arguments}}
        ],
    }
    sent = engine.sent[-1]
    assert sent.tool_choice == "auto" and json.loads(sent.tools or "")[0]["function"]["name"] == "get_weather"


def test_streamed_calls_are_deltas_with_their_index(served: tuple[TestClient, ToolScriptedClient]) -> None:
    client, _ = served
    body = {"messages": USER, "tools": [WEATHER], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    (calls,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert all(d["content"] is None for d in deltas if "tool_calls" in d)  # as OpenAI streams a call
    assert calls == [
        {
            "index": 0,
            "id": CALL.id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": CALL.arguments},
        }
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_results_and_earlier_calls_are_taken_and_bad_tool_fields_are_400() -> None:
    messages = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": CALL.id, "type": "function", "function": {"name": "get_weather", "arguments": CALL.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": CALL.id, "content": "sunny"},
    ]
    job = parse_chat({"messages": messages, "tools": [WEATHER]}, SamplingParams(), Limits(), "tiny")
    assert job.messages[1].role == "assistant" and calls_from_json(job.messages[1].tool_calls) == [CALL]
    assert job.messages[2] == ChatMessage("tool", "sunny", tool_call_id=CALL.id)
    forced = parse_chat(
        {
            "messages": USER,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        SamplingParams(),
        Limits(),
        "tiny",
    )
    assert forced.tool_choice == "required" and len(json.loads(forced.tools or "")) == 1
    for body, param in [
        ({"messages": USER, "tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"messages": USER, "tools": "all"}, "tools"),
        ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "messages"),
        ({"messages": USER, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ]:
        with pytest.raises(ApiError) as caught:
            parse_chat(body, SamplingParams(), Limits(), "tiny")
        assert caught.value.status == 400 and caught.value.param == param
