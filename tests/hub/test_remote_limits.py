"""A hostile or broken OpenAI-compatible server cannot make the app read without end: an endless model list, a
dripping one, an endless stream line or event each end in one line saying what the server did."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from app.config import RemoteSettings, SamplingSettings
from app.messages import GenerationFailed, ModelLoaded
from app.remote import MAX_SSE_LINE, RemoteBridge, RemoteError, list_models
from tests.fakes import Collector
from tests.quiet_http import QuietHTTPServer


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
            while not self.server.stopping.is_set():
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
        if self.server.behaviour == "endless-line":
            self._send_endless(b"data: " + b"x" * 65536)
        else:  # endless-event: short lines, one event that never ends
            self._send_endless(b"data: " + b"y" * 1000 + b"\n")


class HostileServer(QuietHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: str) -> None:
        super().__init__(("127.0.0.1", 0), Hostile)
        self.behaviour = behaviour
        self.stopping = threading.Event()
        self.sent = 0

    @property
    def remote(self) -> RemoteSettings:
        return RemoteSettings("hostile", f"http://127.0.0.1:{self.server_address[1]}/v1")


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
        collector.wait_for(ModelLoaded, timeout=15)
        bridge.generate([("user", "hi")], SamplingSettings(temperature=0.0, max_tokens=4))
        failed = collector.wait_for(GenerationFailed, timeout=30)
        assert said in failed.error and "\n" not in failed.error and len(failed.error) <= 300
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
