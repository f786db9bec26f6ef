"""A hostile or broken OpenAI-compatible server cannot make the app read without end: an endless model list, a
dripping one, an endless stream line or event each end in one line saying what the server did."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from app.core import remote_engine as remote_engine_module
from app.core.config import RemoteSettings, SamplingSettings
from app.core.remote_http import MAX_SSE_LINE, RemoteError, list_models
from app.tui.remote_bridge import RemoteBridge
from engine_ext.protocol import Failed, Finished, Loaded, TokenChunk
from tests.fakes import Collector
from tests.quiet_http import QuietHTTPServer


def event(content: str = "", finish: str | None = None, raw: str | None = None) -> bytes:
    """One server-sent event of a chat stream: a delta with `content` (or the `raw` data)."""
    data = (
        raw if raw is not None else json.dumps({"choices": [{"delta": {"content": content}, "finish_reason": finish}]})
    )
    return f"data: {data}\n\n".encode()


# Streams that never end (issue 32, class 4): (what is sent again and again, the pause between)
STREAMS: dict[str, tuple[bytes, float]] = {
    "empty-deltas": (event(""), 0.01),
    "pings": (b": ping\n\n", 0.01),
    "blank-lines": (b"\n", 0.001),
    "not-objects": (event(raw="1"), 0.01),
    "role-only": (event(raw='{"choices":[{"delta":{"role":"assistant"}}]}'), 0.01),
    "one-token": (event("x"), 0.0),
}


class Hostile(BaseHTTPRequestHandler):
    """GET /v1/models and POST /v1/chat/completions misbehave as `server.behaviour` says."""

    server: HostileServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send_endless(self, piece: bytes, pause_s: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if self.command == "POST" else "application/json")
        self.end_headers()
        try:
            self.wfile.write(self.server.script)
            self.wfile.flush()
            if not piece:  # silence, the connection open
                self.server.stopping.wait(60)
            while piece and not self.server.stopping.is_set():
                self.wfile.write(piece)
                self.wfile.flush()
                self.server.sent += len(piece)
                if pause_s:
                    time.sleep(pause_s)
        except OSError:  # the client stopped reading and closed: what is expected
            pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        behaviour = self.server.behaviour
        if behaviour == "endless-models":
            self._send_endless(b'{"data": [' + b'{"id": "m"}, ' * 4096)
        elif behaviour == "drip-models":
            self._send_endless(b" ", pause_s=0.2)
        else:  # a good model list, so a chat can be tried
            body = b'{"data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        behaviour = self.server.behaviour
        if behaviour == "drip-headers":  # the status line and headers a byte at a time, every 0.2 s
            self._drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Padding: " + b"p" * 200, 0.2)
        elif behaviour == "scripted":  # the body the test wrote, then silence until the client gives up
            self._send_endless(b"")
        elif behaviour in STREAMS:
            self._send_endless(*STREAMS[behaviour])
        elif behaviour == "endless-line":
            self._send_endless(b"data: " + b"x" * 65536)
        else:  # endless-event: short lines, one event that never ends
            self._send_endless(b"data: " + b"y" * 1000 + b"\n")

    def _drip(self, data: bytes, pause_s: float) -> None:
        try:
            for byte in data:
                if self.server.stopping.wait(pause_s):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                self.server.sent += 1
        except OSError:
            pass


class HostileServer(QuietHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: str) -> None:
        super().__init__(("127.0.0.1", 0), Hostile)
        self.behaviour = behaviour
        self.stopping = threading.Event()
        self.sent = 0
        self.script = b""  # what a stream starts with

    @property
    def remote(self) -> RemoteSettings:
        return RemoteSettings("hostile", f"http://127.0.0.1:{self.server_address[1]}/v1", stall_timeout_s=1.0)


@pytest.fixture
def hostile() -> Iterator[type[HostileServer]]:
    servers: list[HostileServer] = []

    def make(behaviour: str) -> HostileServer:
        server = HostileServer(behaviour)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in servers:
        server.stopping.set()
        server.shutdown()
        server.server_close()


def test_an_endless_model_list_is_cut_off(hostile: type[HostileServer]) -> None:
    server = hostile("endless-models")
    started = time.monotonic()
    with pytest.raises(RemoteError, match="passed 8 MiB; llmtui stopped reading"):
        list_models(server.remote, timeout=5)
    assert time.monotonic() - started < 10
    assert server.sent < 64 * 1024 * 1024


def test_a_dripping_model_list_is_cut_off_by_time(hostile: type[HostileServer]) -> None:
    server = hostile("drip-models")
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"took longer than the 3 s limit to send its answer to GET /v1/models"):
        list_models(server.remote, timeout=1)  # each byte comes within the socket timeout; the whole never does
    assert time.monotonic() - started < 6


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [("endless-line", f"longer than {MAX_SSE_LINE // 1024} KiB"), ("endless-event", "stream event longer than")],
)
def test_an_endless_stream_fails_the_reply_in_one_line(hostile: type[HostileServer], behaviour: str, said: str) -> None:
    server = hostile(behaviour)
    collector = Collector()
    bridge = RemoteBridge(collector, server.remote, "m", connect_timeout_s=5.0, read_timeout_s=10.0)
    try:
        bridge.connect()
        collector.wait_for(Loaded, timeout=15)
        bridge.generate([("user", "hi")], SamplingSettings(temperature=0.0, max_tokens=4))
        failed = collector.wait_for(Failed, timeout=30)
        assert said in failed.message and "\n" not in failed.message and len(failed.message) <= 300
        assert server.sent < 64 * 1024 * 1024
    finally:
        bridge.close()


def test_json_values_are_counted_outside_strings_only() -> None:
    """A reply whose text holds 50,000 brackets or commas is one string value, not 50,000 (B's reproducer)."""
    from models_catalog.transport import json_items

    assert json_items(b'[1,2,{"a":"x,y,[z"}]') == 5
    text = '{"choices":[{"delta":{"content":"' + "[" * 50_000 + ',x\\"{"}}]}'
    assert json_items(text) == 5  # the object, the list, two objects, and the first value
    assert json_items(b"[" + b"{}," * 1000 + b"{}]") == 2003  # real values still counted (an upper bound: one more)
    assert json_items(b'"unterminated ,,,') == 4  # an unterminated string: an upper bound still


# ----- streams that never end, and text that is not UTF-8 (issue 32, class 4) ----------------------------------


def ask(
    server: HostileServer, max_tokens: int = 8, wait_s: float = 30.0, read_timeout_s: float = 10.0
) -> tuple[Any, Collector]:
    """One reply from `server`: its Finished or Failed, and everything posted."""
    collector = Collector()
    bridge = RemoteBridge(collector, server.remote, "m", connect_timeout_s=5.0, read_timeout_s=read_timeout_s)
    try:
        bridge.connect()
        collector.wait_for(Loaded, timeout=15)
        bridge.generate([("user", "hi")], SamplingSettings(temperature=0.0, max_tokens=max_tokens))
        return collector.wait_for((Finished, Failed), timeout=wait_s), collector
    finally:
        bridge.close()


def assert_one_clean_line(text: str) -> None:
    assert "\n" not in text and len(text) <= 300 and text.isprintable(), repr(text)


@pytest.mark.parametrize("behaviour", sorted(set(STREAMS) - {"one-token"}))
def test_a_stream_without_text_ends_at_the_stall_limit(hostile: type[HostileServer], behaviour: str) -> None:
    server = hostile(behaviour)
    failed, _ = ask(server)
    assert isinstance(failed, Failed), failed
    assert "sent no text for 1 s" in failed.message and "stall_timeout_s" in failed.message
    assert_one_clean_line(failed.message)


def test_silence_after_text_is_a_stall_too(hostile: type[HostileServer]) -> None:
    server = hostile("scripted")
    server.script = event("Hello") + b": ping\n\n"
    failed, collector = ask(server)
    assert isinstance(failed, Failed) and "sent no text for 1 s" in failed.message, failed
    assert collector.text() == "Hello"  # the text so far is kept


def test_endless_tokens_without_max_tokens_stop_at_the_cap(
    hostile: type[HostileServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_engine_module, "MAX_REPLY_TOKENS", 3000)
    server = hostile("one-token")
    failed, collector = ask(server, max_tokens=0)
    assert isinstance(failed, Failed), failed
    assert "more than the 3000 tokens llmtui takes in one reply" in failed.message
    assert 3000 <= len(collector.text()) <= 3000 + remote_engine_module.TOKEN_SLACK + 1


def test_endless_characters_stop_at_the_cap(hostile: type[HostileServer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_engine_module, "MAX_REPLY_CHARS", 100_000)
    server = hostile("scripted")
    server.script = event("y" * 60_000) * 3
    failed, collector = ask(server, max_tokens=0)
    assert isinstance(failed, Failed) and "M characters in one reply" in failed.message, failed
    assert len(collector.text()) == 120_000


def test_dripping_headers_are_cut_off_like_a_dripping_line(
    hostile: type[HostileServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_engine_module, "HEADER_TIME_S", 1.0)
    server = hostile("drip-headers")
    failed, _ = ask(server)
    assert isinstance(failed, Failed), failed
    assert "took longer than the 1 s limit to send the reply's headers" in failed.message
    assert server.sent < 60  # the read timeout (10 s) did not apply


def test_a_lone_surrogate_in_a_delta_becomes_a_replacement_character(hostile: type[HostileServer]) -> None:
    server = hostile("scripted")
    server.script = event(raw='{"choices":[{"delta":{"content":"a\\ud800b\\udc00"}}]}') + event("", "stop")
    server.script += b"data: [DONE]\n\n"
    finished, collector = ask(server)
    assert isinstance(finished, Finished), finished
    assert collector.text() == "a\ufffdb\ufffd"
    collector.text().encode("utf-8")


def test_run_remote_prints_a_lone_surrogate_without_a_traceback(hostile: type[HostileServer]) -> None:
    from tests.hub.test_cli_remote import llmtui

    server = hostile("scripted")
    server.script = (
        event(raw='{"choices":[{"delta":{"content":"ok\\ud800"}}]}') + event("", "stop") + b"data: [DONE]\n\n"
    )
    for extra in ([], ["--json"]):
        result = llmtui("run", "--remote", server.remote.base_url, "-p", "hi", "-n", "8", *extra)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "ok\ufffd" in (json.loads(result.stdout)["text"] if extra else result.stdout)
    stalled = hostile("pings")
    result = llmtui("run", "--remote", stalled.remote.base_url, "-p", "hi", "-n", "8", "--stall-timeout", "1")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "sent no text for 1 s" in result.stderr


def _fuzzed_stream(rng: random.Random) -> bytes:
    """A random stream: text with escapes and surrogates, empty and odd events, keep-alives, blank lines, garbage;
    it may finish, or stop and stay silent."""
    # as JSON escapes in the event's string (a raw control character would make it invalid JSON)
    texts = ["hi", "\\u001b]0;PWN\\u0007", "\\ud800", "\\udfff", "é", "\\n", "\\u009b", "\\u0000", "x" * 5000]
    parts: list[bytes] = []
    # mostly what servers send; garbage and errors (which end a reply at once) now and then
    weights = [15, 30, 15, 10, 10, 5, 8, 1, 1]
    for _ in range(rng.randint(0, 30)):
        kind = rng.choices(range(9), weights)[0]
        if kind == 0:
            parts.append(event(""))
        elif kind == 1:
            content = "".join(rng.choice(texts) for _ in range(rng.randint(1, 4)))
            parts.append(event(raw='{"choices":[{"delta":{"content":"' + content.replace('"', "") + '"}}]}'))
        elif kind == 2:
            parts.append(b": ping\n\n")
        elif kind == 3:
            parts.append(b"\n" * rng.randint(1, 5))
        elif kind == 4:
            parts.append(event(raw=rng.choice(["1", "[]", "null", '"s"', "{}", '{"choices":7}'])))
        elif kind == 5:
            parts.append(event(raw="not json " + "\x1b[2J" * rng.randint(1, 50)))
        elif kind == 6:
            parts.append(b"event: x\nid: 1\nretry: 5\n\n")
        elif kind == 7:
            parts.append(event(raw='{"choices":[{"delta":{"reasoning_content":"th\\ud800ink"}}]}'))
        else:
            parts.append(event(raw='{"error":{"message":"\x1b]0;E\x07' + "e\\n" * 200 + '"}}'))
    ending = rng.randrange(3)
    if ending == 0:
        parts.append(event("", rng.choice(["stop", "length", "\x1b[31mweird"])) + b"data: [DONE]\n\n")
    elif ending == 1:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)  # ending 2: silence (a stall)


def test_fuzzed_remote_streams_end_in_a_reply_or_one_clean_line(hostile: type[HostileServer]) -> None:
    """Seeded fuzz of reply streams: each ends (finished or failed) within the limits, its text valid UTF-8."""
    rng = random.Random(32)
    outcomes: dict[str, int] = {}
    for _ in range(40):
        server = hostile("scripted")
        server.script = _fuzzed_stream(rng)
        outcome, collector = ask(server, max_tokens=rng.choice([0, 8]), read_timeout_s=2.0)
        if isinstance(outcome, Failed):
            assert_one_clean_line(outcome.message)
        else:
            assert isinstance(outcome.stop_reason, str) and outcome.stop_reason.isprintable()
        collector.text().encode("utf-8")
        "".join(m.reasoning for m in collector.of(TokenChunk)).encode("utf-8")
        outcomes[type(outcome).__name__] = outcomes.get(type(outcome).__name__, 0) + 1
        server.stopping.set()
    assert outcomes.get("Failed", 0) and outcomes.get("Finished", 0), outcomes
