"""The HTTP client stack (models_catalog/http_client.py): another thread stops an exchange at once, before its
headers or in its body; proxies come from the environment as urllib reads it, loopback never through one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from models_catalog.http_client import Guard, HTTPFailure, environment_proxy, iter_lines, open_response
from tests.quiet_http import QuietHTTPServer


@pytest.fixture
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """A server that accepts connections, reads the request, and says nothing (or, for /body, sends headers and one
    line, then nothing) until the test ends."""
    done = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            request = conn.recv(65536)
            if b" /body " in request:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", done
    done.set()
    listener.close()
    for conn in connections:
        conn.close()
    thread.join(timeout=5)


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def test_abort_stops_a_request_waiting_for_its_headers(silent_server: tuple[str, threading.Event]) -> None:
    url, _ = silent_server
    guard = Guard()
    thread, raised = _in_thread(lambda: open_response("GET", url + "/", guard=guard, read_timeout_s=120))
    thread.join(timeout=0.5)
    assert thread.is_alive(), "the silent server answered"
    guard.abort()
    thread.join(timeout=10)  # the read timeout is 120 s: only the abort can end it within this wait
    assert not thread.is_alive(), "the request did not stop within 10 s of the abort"
    assert isinstance(raised[0], HTTPFailure) and raised[0].kind == "aborted", raised


def test_abort_stops_a_body_read_at_once(silent_server: tuple[str, threading.Event]) -> None:
    url, _ = silent_server
    guard = Guard()
    response = open_response("GET", url + "/body", guard=guard, read_timeout_s=120)
    lines: list[bytes] = []
    thread, raised = _in_thread(lambda: lines.extend(iter_lines(response.chunks(), 1024, 120)))
    thread.join(timeout=0.5)
    assert thread.is_alive() and lines == [b"data: 1\n", b"\n"], lines
    guard.abort()
    thread.join(timeout=10)
    response.close()
    assert not thread.is_alive(), "the body read did not stop within 10 s of the abort"
    assert isinstance(raised[0], HTTPFailure) and raised[0].kind == "aborted", raised


def test_a_time_limit_ends_a_silent_exchange(silent_server: tuple[str, threading.Event]) -> None:
    url, _ = silent_server
    with pytest.raises(HTTPFailure) as caught:
        open_response("GET", url + "/", guard=Guard(0.5), read_timeout_s=120)
    assert caught.value.kind == "deadline" and "0.5 s limit" in str(caught.value)


def test_proxies_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert environment_proxy("https://huggingface.co/api/models") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain.example:8080")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    assert environment_proxy("https://huggingface.co/api/models") == "http://proxy.example:3128"
    assert environment_proxy("http://huggingface.co/x") == "http://plain.example:8080"
    assert environment_proxy("https://internal.example/x") is None
    assert environment_proxy("http://127.0.0.1:8080/v1") is None  # loopback: never through a proxy
    assert environment_proxy("http://localhost:8080/v1") is None


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy that answers itself, saying which URL it was asked for."""

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"proxied {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_request_goes_through_the_proxy_it_is_given() -> None:
    proxy = QuietHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        response = open_response(
            "GET",
            "http://models.example/api/x",
            guard=Guard(10),
            read_timeout_s=10,
            proxy=f"http://127.0.0.1:{proxy.server_address[1]}",
        )
        try:
            assert response.status == 200
            assert b"".join(response.chunks()) == b"proxied http://models.example/api/x"
        finally:
            response.close()
    finally:
        proxy.shutdown()
        proxy.server_close()
