"""A hostile HTTP server for tests: it answers the requests a test aims at (a path pattern) with one misbehaviour,
and everything else as a well-behaved Hugging Face hub or OpenAI-compatible server would, so each misbehaviour
can be tried against one reader at a time (a search, a listing page, a model card, a Range read, a download, a
remote model list, a remote reply stream).

Misbehaviours (CASES): an endless body, a body dripping one byte every DRIP_S, headers dripping the same way, a
header bomb (endless headers) and one endless header line, invalid JSON, a JSON bomb (valid JSON within the size
limit that would parse into millions of objects), 401/403/429/500/503 (429 and 503 with and without Retry-After),
a redirect loop, a Content-Length that promises more than is sent; and for listings, file names that leave the
snapshot and an endless listing (page after page of 1000 files, each page a little late); for a remote reply,
tokens without end.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.quiet_http import QuietHTTPServer

DRIP_S = 0.3  # one byte every this long: always within a 1 s stall timeout, never done within a short time limit
COMMIT = "c" * 40
FILE_SIZE = 4096
FILE_BYTES = b"GGUF" + bytes(FILE_SIZE - 4)
FILE_SHA256 = hashlib.sha256(FILE_BYTES).hexdigest()
RETRY_AFTER_S = 30

STATUS_CASES = {
    "401": (401, None),
    "403": (403, None),
    "429": (429, None),
    "429-retry-after": (429, RETRY_AFTER_S),
    "500": (500, None),
    "503": (503, None),
    "503-retry-after": (503, RETRY_AFTER_S),
}
CASES = (
    "endless-body",
    "drip",
    "drip-headers",
    "header-bomb",
    "header-line",
    "invalid-json",
    "json-bomb",
    *STATUS_CASES,
    "redirect-loop",
    "length-lie",
)
PAGE_PAUSE_S = 0.05  # endless-pages: each page of 1000 files comes after this long

_REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def good_tree() -> list[dict[str, Any]]:
    return [
        {
            "type": "file",
            "path": "model.gguf",
            "size": FILE_SIZE,
            "oid": "d" * 40,
            "lfs": {"oid": FILE_SHA256, "size": FILE_SIZE, "pointerSize": 134},
        }
    ]


class HostileHandler(BaseHTTPRequestHandler):
    server: HostileHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        self._answer()

    def _answer(self) -> None:
        self.server.hits += 1
        try:
            if re.search(self.server.target, self.path):
                self.server.faulted += 1
                self._hostile(self.server.case)
            else:
                self._good()
        except OSError:  # the client stopped reading and closed: what is expected
            self.close_connection = True

    # -- well-behaved answers ------------------------------------------------------------------------

    def _send(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status, _REASONS.get(status))
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _good(self) -> None:
        path = self.path.split("?")[0]
        if path == "/v1/models":
            return self._send(200, b'{"data": [{"id": "m"}]}')
        if path == "/v1/chat/completions":
            body = b'data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
            return self._send(200, body, "text/event-stream")
        if "/tree/" in path:
            return self._send(200, json.dumps(good_tree()).encode())
        if path.startswith("/api/models/"):
            return self._send(200, json.dumps({"id": "evil/Repo", "sha": COMMIT, "tags": ["gguf"]}).encode())
        if path == "/api/models":
            return self._send(200, json.dumps([{"id": "evil/Repo", "downloads": 1}]).encode())
        if path.endswith("/model.gguf"):
            return self._send(200, FILE_BYTES, "application/octet-stream")
        return self._send(404, b'{"error": "not found"}', headers={"X-Error-Code": "EntryNotFound"})

    # -- hostile answers -----------------------------------------------------------------------------

    def _piece(self) -> bytes:
        """What an endless body repeats: a listing entry, a stream line's text, or file bytes."""
        if self.command == "POST":
            return b"x" * 65536  # an SSE "line" that never ends (no newline): the data: prefix comes first
        if self.path.startswith("/api/"):
            return b'{"type": "file", "path": "a.gguf", "size": 1, "oid": "' + b"d" * 40 + b'"}, '
        return b"\0" * 65536

    def _start(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send_response(status, _REASONS.get(status))
        self.send_header("Content-Type", "text/event-stream" if self.command == "POST" else "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _endless(self, piece: bytes, pause_s: float = 0.0) -> None:
        while not self.server.stopping.is_set():
            self.wfile.write(piece)
            self.wfile.flush()
            self.server.sent += len(piece)
            if pause_s:
                time.sleep(pause_s)

    def _hostile(self, case: str) -> None:
        post = self.command == "POST"
        if case == "endless-body":
            self._start()
            self.wfile.write(b"data: " if post else b"[" if self.path.startswith("/api/") else b"")
            return self._endless(self._piece())
        if case == "drip":
            self._start()
            return self._endless(b"d" if post else b" ", DRIP_S)
        if case == "drip-headers":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            return self._endless(b"a", DRIP_S)
        if case == "header-bomb":  # endless short headers
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            i = 0
            while not self.server.stopping.is_set():
                self.wfile.write(f"X-Bomb-{i}: {'b' * 1000}\r\n".encode())
                self.server.sent += 1000
                i += 1
            return
        if case == "header-line":  # one header line that never ends
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Bomb: ")
            return self._endless(b"b" * 65536)
        if case == "invalid-json":
            if post:
                return self._send(200, b"data: {not json at all\n\n", "text/event-stream")
            if self.path.startswith("/api/") or self.path.startswith("/v1/"):
                return self._send(200, b'{"id": "evil/Repo", "sha": [not json')
            return self._send(200, b"\xff\xfe not a GGUF " * 400, "application/octet-stream")
        if case in STATUS_CASES:
            status, wait = STATUS_CASES[case]
            headers = {"Retry-After": str(wait)} if wait else {}
            return self._send(status, json.dumps({"error": f"hostile {status}"}).encode(), headers=headers)
        if case == "redirect-loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if case == "length-lie":  # promises a megabyte, sends a few bytes, closes
            self._start(headers={"Content-Length": "1048576"})
            self.wfile.write(
                b"data: {" if post else b'[{"type": "file", ' if self.path.startswith("/api/") else b"GGUF\0\0\0\0"
            )
            return
        if case == "json-bomb":
            if post:  # one stream line of a megabyte at most
                return self._send(200, b"data: [" + b"{}," * 300_000 + b"{}]\n\n", "text/event-stream")
            return self._send(200, b"[" + b"{}," * ((8 * 1024 * 1024 - 8) // 3) + b"{}]")
        if case == "endless-pages":
            page = int(re.search(r"cursor=(\d+)", self.path).group(1)) if "cursor=" in self.path else 0  # type: ignore[union-attr]
            time.sleep(PAGE_PAUSE_S)
            entries = [{"type": "file", "path": f"p{page}/f{i}.gguf", "size": 1, "oid": "d" * 40} for i in range(1000)]
            host, port = self.server.server_address[:2]
            link = f'<http://{host}:{port}{self.path.split("?")[0]}?recursive=true&cursor={page + 1}>; rel="next"'
            return self._send(200, json.dumps(entries).encode(), headers={"Link": link})
        if case == "endless-tokens":  # a reply that never ends, whatever max_tokens says
            self._start()
            return self._endless(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
        if case == "traversal":
            entries = good_tree() + [{"type": "file", "path": "../../../outside.gguf", "size": 1, "oid": "e" * 40}]
            return self._send(200, json.dumps(entries).encode())
        raise ValueError(case)


class HostileHTTPServer(QuietHTTPServer):
    """Answers requests whose path matches `target` (a regex) with `case`; others well. Use as a context manager."""

    daemon_threads = True

    def __init__(self, case: str, target: str) -> None:
        super().__init__(("127.0.0.1", 0), HostileHandler)
        self.case = case
        self.target = target
        self.stopping = threading.Event()
        self.sent = 0
        self.hits = 0
        self.faulted = 0
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> HostileHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
