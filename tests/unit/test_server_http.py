"""The API server's HTTP side and dispatcher over a scripted engine client: shapes, auth, limits, queue, cancel.

The real engine behind the same server is tested in tests/engine/test_serve.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.server.asgi import build_app
from app.server.backend import EngineBackend, ServerSettings
from app.server.metrics import Metrics
from app.server.requests import Limits
from engine_ext.params import SamplingParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import Finished, Generate, GenerationStats, SpeculativeSet, SteeringSet, TokenChunk
from tests.waits import wait_for

KEY = "s3cret-key"


class ScriptedClient:
    """An EngineClient stand-in: each Generate answers `words` one token chunk per poll (`step_s` apart)."""

    def __init__(self, words: list[str], step_s: float = 0.0) -> None:
        self.words = words
        self.step_s = step_s
        self.events: deque[object] = deque()
        self.sent: list[Generate] = []
        self.steering: list[tuple[SteeringEntry, ...]] = []
        self.spec: list[SpeculativeParams] = []
        self.cancelled: set[int] = set()
        self.lock = threading.Lock()
        self.current: int | None = None

    def set_steering(self, entries: tuple[SteeringEntry, ...], *, reset_cache: bool = False) -> SteeringSet:
        assert reset_cache  # a prefix cached under another mix is never reused
        self.steering.append(entries)
        return SteeringSet(bool(entries), 0, 0, (), ())

    def set_speculative(self, params: SpeculativeParams) -> SpeculativeSet:
        self.spec.append(params)
        return SpeculativeSet(params.types)

    def send(self, request: Generate) -> None:
        self.sent.append(request)
        self.current = request.request_id
        with self.lock:
            words = self.words[: request.max_tokens if request.max_tokens > 0 else None]
            for word in words:
                self.events.append(TokenChunk(request.request_id, word, "", (1,), ("target",)))
            self.events.append(self._finished(request.request_id, len(words), "eos"))

    def _finished(self, request_id: int, n: int, reason: Any) -> Finished:
        stats = GenerationStats(5, 0, 5, 10.0, n, 20.0, 12.0, 512, 5 + n)
        return Finished(request_id, reason, stats)

    def cancel(self, request_id: int) -> None:
        with self.lock:
            self.cancelled.add(request_id)
            self.events.clear()
            self.events.append(self._finished(request_id, 1, "cancelled"))

    def next_event(self, timeout: float | None = None) -> object:
        if self.step_s:
            time.sleep(self.step_s)
        with self.lock:
            return self.events.popleft() if self.events else None


@pytest.fixture
def served() -> Iterator[tuple[TestClient, ScriptedClient, Metrics]]:
    engine = ScriptedClient(["Hello", ",", " world"])
    metrics = Metrics()
    settings = ServerSettings(
        model_id="tiny",
        sampling=SamplingParams(temperature=0.0),
        vectors={"calm": "/vectors/calm.gguf"},
        limits=Limits(max_body_bytes=4096),
        queue=2,
    )
    backend = EngineBackend(engine, settings, metrics)  # type: ignore[arg-type]
    with TestClient(build_app(backend, metrics, api_key=KEY), base_url="http://127.0.0.1:8080") as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client, engine, metrics
    backend.close()


def test_chat_completion_shape_usage_and_timings(served: tuple[TestClient, ScriptedClient, Metrics]) -> None:
    client, engine, _ = served
    answer = client.post("/v1/chat/completions", json={"model": "any", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert body["timings"]["predicted_n"] == 3 and body["timings"]["prompt_n"] == 5
    assert engine.sent[0].sampling.temperature == 0.0


def test_streaming_sends_chunks_then_usage_then_done(served: tuple[TestClient, ScriptedClient, Metrics]) -> None:
    client, _, _ = served
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_provenance": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello, world"
    assert chunks[1]["choices"][0]["provenance"] == ["target"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "timings" in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_steering_and_speculation_per_request_never_leak(served: tuple[TestClient, ScriptedClient, Metrics]) -> None:
    client, engine, _ = served
    hi = [{"role": "user", "content": "hi"}]
    steered = {"messages": hi, "control_vectors": [{"name": "calm", "strength": 3, "layers": [2, 4]}]}
    assert client.post("/v1/chat/completions", json=steered).status_code == 200
    speculative = {"messages": hi, "speculative": {"type": "ngram-simple", "n_max": 6}}
    assert client.post("/v1/chat/completions", json=speculative).status_code == 200
    assert engine.steering == [(SteeringEntry("/vectors/calm.gguf", 3.0, 2, 4),), ()]  # the second: no mix
    assert engine.spec[-1].types == ("ngram-simple",) and engine.spec[-1].n_max == 6
    assert engine.sent[-1].speculative


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "control_vectors": [{"name": "../etc"}]}, 400, "no control"),
        ({"messages": [{"role": "user", "content": "x"}], "speculative": {"type": "draft-mtp"}}, 400, "loaded when"),
        ({"messages": [{"role": "user", "content": "x"}], "speculative": {"type": "warp"}}, 400, "unknown spec"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, 413, "larger than"),
    ],
)
def test_requests_the_server_cannot_give(
    served: tuple[TestClient, ScriptedClient, Metrics], body: dict[str, Any], status: int, words: str
) -> None:
    client, engine, _ = served
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == status
    assert words in answer.json()["error"]["message"]
    assert not engine.sent


def test_api_key_routes_and_metrics(served: tuple[TestClient, ScriptedClient, Metrics]) -> None:
    client, _, _ = served
    assert client.get("/health", headers={"Authorization": ""}).json() == {"status": "ok"}
    for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}, {"Authorization": "Bearer " + "x" * 9}):
        answer = client.get("/v1/models", headers=headers)
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
    assert client.get("/v1/models", headers={"x-api-key": KEY}).json()["data"][0]["id"] == "tiny"
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/v1/chat/completions").status_code == 405
    bad = client.post("/v1/chat/completions", content=b'{"messages": [}', headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("the request body is not valid JSON")
    client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2})
    text = client.get("/metrics").text
    assert "llamacpp:tokens_predicted_total 2" in text and "llmtui_requests_refused_total 4" in text  # 3 keys, 1 body


def test_a_full_queue_answers_503_and_a_client_that_leaves_cancels(
    served: tuple[TestClient, ScriptedClient, Metrics],
) -> None:
    client, engine, metrics = served
    engine.words = ["w"] * 120
    engine.step_s = 0.01  # a 1.2-second reply unless cancelled
    results: list[int] = []

    def ask() -> None:
        results.append(client.post("/v1/completions", json={"prompt": "x"}).status_code)

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(results) >= 3, "three requests past the one generating and the two waiting to be refused")
    assert results[:3] == [503, 503, 503]
    busy = client.post("/v1/completions", json={"prompt": "x"})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "2"
    with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as answer:
        assert answer.status_code in (200, 503)
    for t in threads:
        t.join(30)
    assert results.count(200) == 3
    engine.words = ["w"] * 2000
    with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as answer:
        assert answer.status_code == 200
        next(answer.iter_lines())
    wait_for(lambda: engine.cancelled, "the generation of a client that left to be cancelled", timeout_s=10)
    wait_for(lambda: metrics.in_flight == 0, "the server to be idle again", timeout_s=10)
