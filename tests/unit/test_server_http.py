"""The API server's HTTP side and dispatcher over a scripted engine client: shapes, auth, limits, queue, cancel.

The real engine behind the same server is tested in tests/engine/test_serve.py.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.core.server_access import Access, api_key_refusal
from app.server import listen
from app.server.asgi import build_app
from app.server.backend import EngineBackend, ServerSettings
from app.server.metrics import Metrics
from app.server.requests import Limits
from engine_ext.params import SamplingParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    Failed,
    Finished,
    Generate,
    GenerationStats,
    SpeculativeSet,
    SteeringSet,
    TokenChunk,
)
from tests.serve_process import free_port
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
        self.failure: Failed | None = None  # the next request fails with this (its request id filled in)

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
        if self.failure is not None:
            self.events.append(replace(self.failure, request_id=request.request_id))
            return
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
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # as llama-server: never ""
    assert all(c["choices"][0]["delta"].get("content") != "" for c in chunks if c["choices"])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello, world"
    assert chunks[1]["choices"][0]["provenance"] == ["target"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "timings" in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3 and "timings" in chunks[-1]


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


# ----- hostile input (issue 42): every refusal is one line in OpenAI's shape, and the engine is never asked -----

HI = {"messages": [{"role": "user", "content": "hi"}]}


def refused(answer: Any, status: int, words: str) -> None:
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert words in message and "\n" not in message and len(message) <= 300, message


@pytest.mark.parametrize(
    ("headers", "status", "words"),
    [
        ({"Host": "evil.example:8080"}, 403, "Host 'evil.example:8080' is not this server's name"),  # DNS rebinding
        ({"Host": "127.0.0.1.evil.example"}, 403, "not this server's name"),
        ({"Host": "localhost:1/x"}, 403, "not this server's name"),
        ({"Origin": "https://evil.example", "Content-Type": "text/plain"}, 403, "Origin 'https://evil.example'"),
        ({"Origin": "null"}, 403, "may not call this server"),
        ({"Content-Type": "text/plain"}, 415, "must be JSON (Content-Type: application/json); not 'text/plain'"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "must be JSON"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "must be JSON"),
        ({"Content-Type": ""}, 415, "none was given"),
    ],
)
def test_cross_site_requests_are_refused_before_anything_runs(
    served: tuple[TestClient, ScriptedClient, Metrics], headers: dict[str, str], status: int, words: str
) -> None:
    """A browser's "simple request" (text/plain, a form) from any web page, and a page whose name was rebound to
    this machine (its Host is its own name): 403 or 415, one line, and no generation."""
    client, engine, metrics = served
    answer = client.post("/v1/chat/completions", content=json.dumps(HI).encode(), headers=headers)
    refused(answer, status, words)
    assert answer.json()["error"]["type"] == ("permission_error" if status == 403 else "invalid_request_error")
    assert not engine.sent and metrics.render().count("llmtui_requests_refused_total 1") == 1


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:9", "localhost", "LOCALHOST.:8080", "[::1]:8080", "[::1]", "127.0.0.2:8080"]
)
def test_loopback_names_with_any_port_are_answered(
    served: tuple[TestClient, ScriptedClient, Metrics], host: str
) -> None:
    client, _, _ = served
    ok = client.post(
        "/v1/chat/completions", json=HI, headers={"Host": host, "Content-Type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 200, ok.text


def test_allowed_hosts_and_origins_and_preflight() -> None:
    """--allowed-host adds names; --cors lets those pages call (with CORS headers and a working preflight), no
    other; a request without an Origin (not a browser) runs; a wildcard listener answers its addresses."""
    engine = ScriptedClient(["ok"])
    metrics = Metrics()
    backend = EngineBackend(engine, ServerSettings(model_id="tiny"), metrics)  # type: ignore[arg-type]
    access = Access(listen_host="0.0.0.0", allowed_hosts=("llm.lan",), cors=("http://localhost:3000/",))
    page = "http://localhost:3000"
    try:
        with TestClient(build_app(backend, metrics, access=access), base_url="http://llm.lan:8080") as client:
            assert client.post("/v1/chat/completions", json=HI).status_code == 200
            assert client.post("/v1/chat/completions", json=HI, headers={"Host": "192.168.1.20:8080"}).is_success
            refused(client.get("/v1/models", headers={"Host": "other.lan"}), 403, "--allowed-host NAME")
            preflight = client.options(
                "/v1/chat/completions",
                headers={
                    "Origin": page,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, authorization",
                },
            )
            assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == page
            answer = client.post("/v1/chat/completions", json=HI, headers={"Origin": page})
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == page
            other = client.options(
                "/v1/chat/completions",
                headers={"Origin": "http://localhost:3001", "Access-Control-Request-Method": "POST"},
            )
            refused(other, 403, "--cors ORIGIN")
    finally:
        backend.close()
    assert len(engine.sent) == 3


BIG = int("1" + "0" * 400)


@pytest.mark.parametrize(
    "body",
    [
        {**HI, "temperature": BIG},
        {**HI, "max_tokens": BIG},
        {**HI, "seed": -BIG},
        {**HI, "speculative": {"type": "ngram-simple", "n_max": BIG}},
        {**HI, "control_vectors": [{"name": "calm", "strength": BIG}]},
        {**HI, "response_format": {"type": "json_schema", "json_schema": {"schema": {"maxLength": BIG}}}},
        {**HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": BIG}}}]},
    ],
    ids=["temperature", "max_tokens", "seed", "speculative", "control_vectors", "schema", "tools"],
)
def test_integers_past_float_range_are_a_400(
    served: tuple[TestClient, ScriptedClient, Metrics], body: dict[str, Any]
) -> None:
    client, engine, _ = served
    refused(client.post("/v1/chat/completions", json=body), 400, "a number past the float range")
    assert "0000000000… (401 digits)" in client.post("/v1/chat/completions", json=body).text
    as_float = json.dumps(body).replace(str(BIG), "1e400").encode()
    headers = {"Content-Type": "application/json"}
    refused(client.post("/v1/chat/completions", content=as_float, headers=headers), 400, "float range: ")
    assert not engine.sent


def lone(text: str) -> str:
    return text.replace("X", "\ud800")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({**HI, "grammar": lone('root ::= "X"')}, "grammar holds a lone surrogate"),
        ({**HI, "tools": [{"type": "function", "function": {"name": lone("fX")}}]}, "tools[0].function.name holds"),
        (
            {**HI, "tools": [{"type": "function", "function": {"name": "f", "description": lone("X")}}]},
            "tools[0].function.description holds",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": lone("X")}]}]}, "messages[0].content"),
        ({**HI, "stop": [lone("X")]}, "stop[0] holds"),
        ({**HI, "response_format": {"type": "json_schema", "json_schema": {"schema": {lone("X"): 1}}}}, "schema.�"),
    ],
)
def test_lone_surrogates_anywhere_are_a_400(
    served: tuple[TestClient, ScriptedClient, Metrics], body: dict[str, Any], where: str
) -> None:
    client, engine, _ = served
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as "\ud800", as a hostile client sends it
    answer = client.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    refused(answer, 400, where)
    assert "lone surrogate" in answer.json()["error"]["message"]
    assert not engine.sent


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_llama_servers_400(
    served: tuple[TestClient, ScriptedClient, Metrics], stream: bool
) -> None:
    client, engine, _ = served
    message = "the prompt is 5000 tokens but the context holds 512; start a new conversation or raise it (-c)"
    engine.failure = Failed(0, "PromptTooLong", message, n_prompt_tokens=5000, n_ctx=512)
    answer = client.post("/v1/chat/completions", json={**HI, "stream": stream})
    assert answer.status_code == 400
    assert answer.json() == {
        "error": {
            "code": 400,
            "message": "the prompt is 5000 tokens but the context holds 512",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 512,
        }
    }


def test_a_non_ascii_api_key_is_refused_in_one_line() -> None:
    assert api_key_refusal("s3cret-key_~!") is None
    for key, what in (("clé", "U+00E9"), ("two words", "a space"), ("tab\tkey", "U+0009"), ("k\u200b", "U+200B")):
        why = api_key_refusal(key)
        assert why is not None and what in why and "\n" not in why


# ----- connections (raw sockets on a real listener with short limits): nothing holds the server -----


class Records(logging.Handler):
    """What reaches uvicorn's log after its one-line filter."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def listening(limits: listen.ConnectionLimits) -> Iterator[tuple[int, Records]]:
    """The server on the scripted engine, listening on a free port in a thread with `limits`."""
    engine = ScriptedClient(["Hello"])
    metrics = Metrics()
    backend = EngineBackend(engine, ServerSettings(model_id="tiny"), metrics)  # type: ignore[arg-type]
    port = free_port()
    server = listen.server(build_app(backend, metrics), "127.0.0.1", port, log_level="warning", limits=limits)
    records = Records()
    logger = logging.getLogger("uvicorn.error")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    logger.addHandler(records)
    try:
        wait_for(lambda: server.started, "the server to listen", timeout_s=10)
        yield port, records
    finally:
        logger.removeHandler(records)
        server.should_exit = True
        thread.join(10)
        backend.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def closed_by_server(sock: socket.socket, within_s: float) -> float:
    """Seconds until the server closed `sock` (reads what it sent until EOF); fails after `within_s`."""
    started = time.monotonic()
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection past {within_s} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def health(port: int) -> bytes:
    with connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return sock.recv(4096).split(b"\r\n")[0]


POST_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


def test_idle_slowloris_keep_alive_and_stalled_uploads_are_closed_without_a_traceback() -> None:
    limits = listen.ConnectionLimits(header_timeout_s=0.6, body_idle_s=0.6, keep_alive_s=1)
    with listening(limits) as (port, records):
        idle = connect(port)
        assert closed_by_server(idle, 5) < 2
        slow = connect(port)  # a byte every 0.1 s: each byte is news, but the headers' deadline does not move
        started = time.monotonic()
        with pytest.raises(OSError):
            for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                slow.sendall(bytes([byte]))
                time.sleep(0.1)
        assert time.monotonic() - started < 3
        kept = connect(port)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_by_server(kept, 5) < 2.5  # the keep-alive timeout
        stalled = connect(port)
        stalled.sendall(POST_HEAD + b'{"prompt": ')
        assert closed_by_server(stalled, 5) < 2
        dropped = connect(port)  # a client that goes away mid-upload
        dropped.sendall(POST_HEAD + b'{"prompt": ')
        time.sleep(0.2)
        dropped.close()
        time.sleep(0.3)
        assert health(port) == b"HTTP/1.1 200 OK"
    assert not [line for line in records.lines if "Traceback" in line or "Exception" in line], records.lines


def test_connections_past_the_bound_close_the_oldest_idle_and_health_answers() -> None:
    limits = listen.ConnectionLimits(header_timeout_s=30, body_idle_s=30, max_connections=4)
    with listening(limits) as (port, _):
        idle = [connect(port) for _ in range(10)]
        assert health(port) == b"HTTP/1.1 200 OK"
        assert closed_by_server(idle[0], 5) < 2  # the oldest went first
        still_open = 0
        for sock in idle[-3:]:
            sock.setblocking(False)
            try:
                sock.recv(1)
            except BlockingIOError:
                still_open += 1
        assert still_open == 3
        busy = []  # mid-upload: when none is idle, a newcomer is told to come back
        for _ in range(4):
            busy.append(connect(port))
            busy[-1].sendall(POST_HEAD + b'{"prompt": ')
            time.sleep(0.1)
        with connect(port) as extra:
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 2" in answer
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["message"] == "the server has as many connections as it takes; try again shortly"
        for sock in idle + busy:
            sock.close()


def test_the_log_says_each_kind_of_trouble_in_one_line_and_rarely() -> None:
    limits = listen.ConnectionLimits(header_timeout_s=5)
    with listening(limits) as (port, records):
        for _ in range(30):  # 30 bad requests: uvicorn warns about each
            with connect(port) as sock:
                sock.sendall(b"NOT HTTP\x00\r\n\r\n")
                sock.recv(4096)
        logging.getLogger("uvicorn.error").error("boom", exc_info=OverflowError("int too large to convert"))
    assert records.lines.count("Invalid HTTP request received.") == 1, records.lines
    assert "boom: OverflowError: int too large to convert" in records.lines
    assert all("\n" not in line for line in records.lines)


def test_one_model_by_its_id_and_an_unknown_one_is_openais_404(
    served: tuple[TestClient, ScriptedClient, Metrics],
) -> None:
    client, _, _ = served
    answer = client.get("/v1/models/tiny")
    assert answer.status_code == 200 and answer.json()["id"] == "tiny" and answer.json()["object"] == "model"
    missing = client.get("/v1/models/gpt-5")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found" and "gpt-5" in missing.json()["error"]["message"]


def test_answers_carry_a_system_fingerprint_and_null_content_beside_calls(tmp_path: Any) -> None:
    from app.server.responses import Reply, chat_completion, system_fingerprint, tool_deltas
    from engine_ext.protocol import ToolCall

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    fingerprint = system_fingerprint(str(model))
    assert fingerprint.startswith("b") and len(fingerprint.rsplit("-", 1)[1]) == 12
    blob = tmp_path / ("ab" * 32)
    blob.write_bytes(b"GGUF")
    (tmp_path / "linked.gguf").symlink_to(blob)
    assert system_fingerprint(str(tmp_path / "linked.gguf")).endswith("-" + "ab" * 6)
    stats = GenerationStats(5, 0, 5, 1.0, 3, 1.0, 1.0, 64, 8)
    finished = Finished(1, "eos", stats, tool_calls=(ToolCall("abcd1234", "f", "{}"),))
    reply = Reply(finished=finished, fingerprint=fingerprint)
    body = chat_completion(reply, "m", False)
    assert body["system_fingerprint"] == fingerprint
    message = body["choices"][0]["message"]  # type: ignore[index]
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "f"
    assert all(delta["content"] is None for delta in tool_deltas(Reply(), finished))


def test_completions_echo_and_a_list_of_prompts_one_choice_each(
    served: tuple[TestClient, ScriptedClient, Metrics],
) -> None:
    client, engine, _ = served
    answer = client.post("/v1/completions", json={"prompt": ["A:", "B:"], "echo": True}).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert [c["text"] for c in answer["choices"]] == ["A:Hello, world", "B:Hello, world"]
    assert answer["usage"]["completion_tokens"] == 6 and [g.prompt for g in engine.sent] == ["A:", "B:"]
    with client.stream("POST", "/v1/completions", json={"prompt": ["A", "B"], "stream": True}) as streamed:
        events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert [c["index"] for c in chunks if c["finish_reason"]] == [0, 1]
    assert "".join(c["text"] for c in chunks if c["index"] == 1) == "Hello, world"
    client.post("/v1/completions", json={"prompt": "def f(", "suffix": "\n"})
    assert engine.sent[-1].suffix == "\n" and engine.sent[-1].prompt == "def f("


LLAMA_SERVER_METRICS = {  # tools/server/server-task.cpp's to_metrics(): every llamacpp:* figure and its type
    "prompt_tokens_total": "counter",
    "prompt_tokens_cached_total": "counter",
    "prompt_seconds_total": "counter",
    "tokens_predicted_total": "counter",
    "tokens_predicted_seconds_total": "counter",
    "n_decode_total": "counter",
    "n_tokens_max": "counter",
    "spec_decode_num_draft_tokens_total": "counter",
    "spec_decode_num_accepted_tokens_total": "counter",
    "spec_decode_num_drafts_total": "counter",
    "prompt_tokens_seconds": "gauge",
    "predicted_tokens_seconds": "gauge",
    "requests_processing": "gauge",
    "requests_deferred": "gauge",
    "n_busy_slots_per_decode": "gauge",
}


def test_every_llama_server_metric_is_exported_and_counts_across_engine_restarts() -> None:
    metrics = Metrics(slots=2)

    def done(cached: int, n_decode: int, total: int) -> Finished:
        stats = GenerationStats(
            10, cached, 10 - cached, 1.0, 4, 1.0, 1.0, 64, 14, n_decode=n_decode, n_decode_total=total
        )
        return Finished(1, "eos", stats)

    metrics.finished(done(0, 5, 5))
    metrics.finished(done(6, 4, 8))  # ran beside the first: 4 decodes, 3 of them new
    metrics.finished(done(6, 2, 2))  # the engine restarted: its count began again
    text = metrics.render()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("llamacpp:")}
    for name, kind in LLAMA_SERVER_METRICS.items():
        assert f"# TYPE llamacpp:{name} {kind}" in text and f"# HELP llamacpp:{name} " in text
    assert values["llamacpp:prompt_tokens_cached_total"] == 12 and values["llamacpp:prompt_tokens_total"] == 18
    assert values["llamacpp:n_decode_total"] == 10 and values["llamacpp:n_busy_slots_per_decode"] == 1.1
    assert values["llamacpp:n_tokens_max"] == 14


def test_a_stream_whose_prompt_takes_long_opens_at_once_and_keeps_alive(
    served: tuple[TestClient, ScriptedClient, Metrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents end a request after minutes of silence and send it again (Claude Code: 5): a streamed request whose
    first event is late opens its stream (Anthropic's message_start) and sends keep-alives until it comes."""
    from app.server import asgi

    client, engine, _ = served
    monkeypatch.setattr(asgi, "_SILENT_START_S", 0.05)
    monkeypatch.setattr(asgi, "_KEEPALIVE_S", 0.1)
    due = [0.0]  # no event before this time (the prompt being read)
    events = engine.next_event

    def late(timeout: float | None = None) -> object:
        if time.monotonic() < due[0]:
            time.sleep(0.02)
            return None
        return events(timeout)

    monkeypatch.setattr(engine, "next_event", late)
    ask = [{"role": "user", "content": "hi"}]
    due[0] = time.monotonic() + 1.0
    with client.stream("POST", "/v1/messages", json={"max_tokens": 8, "messages": ask, "stream": True}) as answer:
        assert answer.status_code == 200
        names = [line[7:] for line in answer.iter_lines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[1] == "ping" and "content_block_start" in names and names[-1] == "message_stop"
    due[0] = time.monotonic() + 1.0
    with client.stream("POST", "/v1/chat/completions", json={"messages": ask, "stream": True}) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert json.loads(lines[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert lines[1] == ": keep-alive"
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in lines
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == "Hello, world" and lines[-1] == "data: [DONE]"
