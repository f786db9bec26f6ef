"""The one HTTP client stack (httpx2) of the Hub's API, downloads and remote engines: every exchange bounded in
size and time, and stoppable from another thread at once; failures as one error type (HTTPFailure).

httpx2's client builds the requests and parses the answers (h11). Under it, a guarded network backend hands
httpcore2 sockets that do what httpx2 alone does not:

- each read waits at most the stall limit (no byte for that long) and what is left of the exchange's time limit
  (a Guard's deadline), so a server dripping a byte within every read timeout cannot hold a request;
- another thread can stop the exchange at once (Guard.abort shuts its sockets down: closing a response does not
  wake a read blocked on its socket, and before the headers there is no response to close);
- response headers are bounded as http.client bounded them: a line of 64 KiB, 100 header lines (h11 adds 100 KiB
  for the whole block).

Redirects are followed here (open_response), not by httpx2, whose redirect handling reads each redirect's body
whole. Bodies are read raw (Accept-Encoding: identity, nothing decompressed) through read_body and iter_lines,
which stop at their caps. TLS uses the system's certificates (ssl.create_default_context), as http.client did.
"""

from __future__ import annotations

import email.utils
import functools
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpcore2
import httpx2

from engine_ext.params import ascii_digits

MAX_HEADER_LINE = 65536  # one response header line, its CRLF included (http.client's _MAXLINE)
MAX_HEADERS = 100  # response header lines (http.client's _MAXHEADERS)
MAX_REDIRECTS = 8
READ_CHUNK = 64 * 1024

FailureKind = Literal[
    "aborted",  # Guard.abort: another thread stopped the exchange
    "deadline",  # the Guard's time limit passed
    "stall",  # no byte for the read timeout
    "connect",  # no connection: refused, no such host, TLS, a proxy that refused
    "network",  # the connection broke (reset, an error mid-read or mid-write)
    "header-line",  # a response header line longer than MAX_HEADER_LINE
    "header-count",  # more than MAX_HEADERS response header lines
    "protocol",  # an answer that is not HTTP (or breaks it)
    "short",  # the body ended short of its Content-Length (or its chunks)
    "redirects",  # more than the redirects allowed
    "line",  # iter_lines: a line longer than its cap
    "slow-line",  # iter_lines: a line still incomplete after its time limit
]


class HTTPFailure(Exception):
    """An exchange that failed; `kind` says how, for the caller's own one-line message. `cause`: the exception
    underneath (an OSError, ssl.SSLError or h11's), when there is one."""

    def __init__(self, kind: FailureKind, detail: str = "", cause: BaseException | None = None) -> None:
        super().__init__(detail or kind)
        self.kind: FailureKind = kind
        self.detail = detail
        self.cause = cause

    @property
    def os_error(self) -> OSError | None:
        """The OSError at the root of the failure (ConnectionRefusedError, socket.gaierror, ssl.SSLError…)."""
        error: BaseException | None = self.cause
        for _ in range(8):
            if error is None or isinstance(error, OSError):
                return error
            error = error.__cause__ or error.__context__
        return None


class Guard:
    """The time limit and the stop switch of one exchange (its connections, request, redirects, headers, body).

    `limit_s`: the whole exchange, from now (None: no limit; set_limit changes it, e.g. to None once the headers
    of a stream came). `header_limit_s`: once the first byte of an answer comes, the rest of its headers within
    this long (a server may think before it answers, but not drip its headers). `stall_s`: a tighter stall limit
    than the request's read timeout, which a reader may set while the exchange runs."""

    def __init__(self, limit_s: float | None = None, *, header_limit_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.aborted = False
        self.answered = False  # a byte of an answer came
        self.header_limit_s = header_limit_s
        self.stall_s: float | None = None
        self.limit_s: float | None = None
        self.deadline: float | None = None
        self.set_limit(limit_s)

    def set_limit(self, seconds: float | None) -> None:
        self.limit_s = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def abort(self) -> None:
        """Stop the exchange from any thread: a read blocked on its socket returns at once (HTTPFailure aborted)."""
        with self._lock:
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def _watch(self, sock: Any) -> None:
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.append(sock)
            aborted = self.aborted
        if aborted:
            _shutdown(sock)

    def _timeout(self, asked: float | None) -> tuple[float | None, bool]:
        """(the timeout for one blocking step, whether it is the deadline's); HTTPFailure when none is left."""
        if self.aborted:
            raise HTTPFailure("aborted")
        timeout = asked if self.stall_s is None else min(self.stall_s, asked or self.stall_s)
        if self.deadline is None:
            return timeout, False
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._deadline_failure()
        return (left, True) if timeout is None or left < timeout else (timeout, False)

    def _deadline_failure(self) -> HTTPFailure:
        return HTTPFailure("deadline", f"took longer than the {self.limit_s or 0:g} s limit")

    def _answer_started(self) -> None:
        if not self.answered:
            self.answered = True
            if self.header_limit_s is not None:
                self.set_limit(self.header_limit_s)


def _shutdown(sock: socket.socket) -> None:
    try:
        # socket.socket's own shutdown, also for an SSLSocket: its override would drop the TLS state a reader in
        # another thread is using.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class _HeaderScan:
    """Counts the lines of a response's header block as its bytes arrive; HTTPFailure past the bounds."""

    def __init__(self) -> None:
        self.line = 0  # bytes of the line in progress
        self.lines = 0  # header lines after the status line
        self.status_seen = False
        self.done = False

    def feed(self, data: bytes) -> None:
        start = 0
        while not self.done:
            newline = data.find(b"\n", start)
            length = self.line + (len(data) if newline < 0 else newline + 1) - start
            if length > MAX_HEADER_LINE:
                raise HTTPFailure("header-line", f"a response header line longer than {MAX_HEADER_LINE // 1024} KiB")
            if newline < 0:
                self.line = length
                return
            self.line, start = 0, newline + 1
            if not self.status_seen:
                self.status_seen = True
            elif length <= 2:  # the blank line: the body follows
                self.done = True
            else:
                self.lines += 1
                if self.lines > MAX_HEADERS:
                    raise HTTPFailure("header-count", f"more than {MAX_HEADERS} response headers")


class _GuardedStream(httpcore2.NetworkStream):
    """A connection's socket under its exchange's Guard."""

    def __init__(self, inner: httpcore2.NetworkStream, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard
        self._scan: _HeaderScan | None = None
        guard._watch(inner.get_extra_info("socket"))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        guard = self._guard
        wait, is_deadline = guard._timeout(timeout)
        try:
            data = self._inner.read(max_bytes, wait)
        except httpcore2.ReadTimeout as exc:
            if guard.aborted:
                raise HTTPFailure("aborted") from None
            if is_deadline:
                raise guard._deadline_failure() from None
            raise HTTPFailure("stall", f"no data for {wait or 0:g} s", exc) from None
        except httpcore2.ReadError as exc:
            raise HTTPFailure("aborted" if guard.aborted else "network", str(exc), exc) from None
        if guard.aborted:
            raise HTTPFailure("aborted")
        if data and self._scan is not None and not self._scan.done:
            guard._answer_started()
            self._scan.feed(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        wait, is_deadline = self._guard._timeout(timeout)
        self._scan = _HeaderScan()  # a request goes out: its answer's headers come next
        try:
            self._inner.write(buffer, wait)
        except httpcore2.WriteTimeout:
            raise self._guard._deadline_failure() if is_deadline else HTTPFailure("stall", "writing") from None
        except httpcore2.WriteError as exc:
            raise HTTPFailure("aborted" if self._guard.aborted else "network", str(exc), exc) from None

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        wait, _ = self._guard._timeout(timeout)
        try:
            inner = self._inner.start_tls(ssl_context, server_hostname, wait)
        except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
            raise _connect_failure(self._guard, exc) from None
        return _GuardedStream(inner, self._guard)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _connect_failure(guard: Guard, exc: Exception) -> HTTPFailure:
    if guard.aborted:
        return HTTPFailure("aborted")
    if isinstance(exc, httpcore2.ConnectTimeout) and guard.expired:
        return guard._deadline_failure()
    return HTTPFailure("connect", str(exc) or type(exc).__name__, exc)


class _GuardedBackend(httpcore2.NetworkBackend):
    """httpcore2's own sockets, each under the exchange's Guard."""

    def __init__(self, guard: Guard) -> None:
        self._inner = httpcore2.SyncBackend()
        self._guard = guard

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        wait, _ = self._guard._timeout(timeout)
        try:
            inner = self._inner.connect_tcp(host, port, wait, local_address, socket_options)
        except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
            raise _connect_failure(self._guard, exc) from None
        return _GuardedStream(inner, self._guard)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _Body(httpx2.SyncByteStream):
    """A response body from httpcore2, its protocol errors as HTTPFailure."""

    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpcore2.RemoteProtocolError as exc:  # closed before its Content-Length, broken chunks
            raise HTTPFailure("short", str(exc), exc) from None
        except httpcore2.ProtocolError as exc:
            raise HTTPFailure("protocol", str(exc), exc) from None

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class _GuardedTransport(httpx2.BaseTransport):
    """httpx2's transport over httpcore2's pool (or proxy) with the guarded backend; what httpx2.HTTPTransport
    does, but it takes no network backend."""

    def __init__(self, guard: Guard, proxy: str | None) -> None:
        backend = _GuardedBackend(guard)
        self._pool: httpcore2.ConnectionPool
        if proxy:
            self._pool = httpcore2.HTTPProxy(proxy_url=proxy, ssl_context=_ssl_context(), network_backend=backend)
        else:
            self._pool = httpcore2.ConnectionPool(ssl_context=_ssl_context(), network_backend=backend)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        assert isinstance(request.stream, httpx2.SyncByteStream)
        url = httpcore2.URL(
            scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port, target=request.url.raw_path
        )
        core = httpcore2.Request(
            request.method, url, headers=request.headers.raw, content=request.stream, extensions=request.extensions
        )
        try:
            response = self._pool.handle_request(core)
        except httpcore2.ProxyError as exc:
            raise HTTPFailure("connect", f"the proxy refused: {exc}", exc) from None
        except (httpcore2.ProtocolError, httpcore2.UnsupportedProtocol) as exc:
            raise HTTPFailure("protocol", str(exc) or type(exc).__name__, exc) from None
        assert isinstance(response.stream, Iterable)
        return httpx2.Response(
            response.status, headers=response.headers, stream=_Body(response.stream), extensions=response.extensions
        )

    def close(self) -> None:
        self._pool.close()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def environment_proxy(url: str) -> str | None:
    """The proxy for `url` from HTTP(S)_PROXY and NO_PROXY (as urllib reads them); loopback never goes through one."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host in ("localhost", "127.0.0.1", "::1") or urllib.request.proxy_bypass(host):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    return (proxy if "://" in proxy else "http://" + proxy) if proxy else None


@dataclass
class HTTPResponse:
    """An open answer: status, headers, its final URL, its body read with read_body/iter_lines/chunks; close() it.
    Another thread stops it with `guard.abort()`."""

    response: httpx2.Response
    client: httpx2.Client
    guard: Guard
    _chunks: Iterator[bytes] | None = None

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def reason(self) -> str:
        return self.response.reason_phrase

    @property
    def url(self) -> str:
        return str(self.response.url)

    def header(self, name: str) -> str | None:
        return self.response.headers.get(name)

    def chunks(self) -> Iterator[bytes]:
        """The raw body as it arrives (one iterator per response)."""
        if self._chunks is None:
            self._chunks = self.response.iter_raw()
        return self._chunks

    def close(self) -> None:
        try:
            self.response.close()
        finally:
            self.client.close()


def open_response(
    method: str,
    url: str,
    *,
    guard: Guard,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    read_timeout_s: float,
    connect_timeout_s: float | None = None,
    proxy: str | None = None,
    max_redirects: int = MAX_REDIRECTS,
) -> HTTPResponse:
    """Send a request and return its answer with the body unread, following up to `max_redirects` redirects (0: a
    redirect is the answer) without reading their bodies; Authorization never leaves the original origin.

    `read_timeout_s`: no byte for this long is a stall. `proxy`: a proxy URL (see environment_proxy). HTTPFailure
    for every failure."""
    sent = {"Accept-Encoding": "identity", **(headers or {})}
    connect = read_timeout_s if connect_timeout_s is None else connect_timeout_s
    client = httpx2.Client(
        transport=_GuardedTransport(guard, proxy),
        timeout=httpx2.Timeout(read_timeout_s, connect=connect, pool=None),
        follow_redirects=False,
        trust_env=False,
    )
    try:
        request = client.build_request(method, url, headers=sent, content=content)
        for _ in range(max_redirects + 1):
            client.cookies.clear()  # none kept between requests, as http.client kept none
            response = client.send(request, stream=True)
            if response.next_request is None or max_redirects == 0:
                return HTTPResponse(response, client, guard)
            request = response.next_request
            response.close()
    except httpx2.InvalidURL as exc:
        client.close()
        raise HTTPFailure("protocol", f"invalid URL ({exc})", exc) from None
    except BaseException:
        client.close()
        raise
    client.close()
    raise HTTPFailure("redirects", f"more than {max_redirects} redirects")


def read_body(response: HTTPResponse, limit: int) -> tuple[bytes, bool, HTTPFailure | None]:
    """(up to `limit` bytes of the body, whether more followed, the HTTPFailure "short" when it ended short of its
    Content-Length). Other failures are raised."""
    parts: list[bytes] = []
    size = 0
    try:
        for chunk in response.chunks():
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(parts)[:limit], True, None
    except HTTPFailure as failure:
        if failure.kind != "short":
            raise
        return b"".join(parts), False, failure
    return b"".join(parts), False, None


def iter_lines(chunks: Iterator[bytes], max_line: int, line_time_s: float) -> Iterator[bytes]:
    """The lines of a body (each with its newline; the last may lack one; a body cut short of its Content-Length
    ends there). HTTPFailure "line" for a line longer
    than `max_line`, "slow-line" for one still incomplete `line_time_s` after its first byte (a drip): neither is
    read to its end."""
    pending = bytearray()
    started = 0.0
    while True:
        newline = pending.find(b"\n")
        if newline > max_line or (newline < 0 and len(pending) > max_line):
            raise HTTPFailure("line", f"a line longer than {max_line // 1024} KiB")
        if newline >= 0:
            line = bytes(pending[: newline + 1])
            del pending[: newline + 1]
            started = time.monotonic()
            yield line
            continue
        if pending and time.monotonic() - started > line_time_s:
            raise HTTPFailure("slow-line", f"longer than {line_time_s:g} s for one line")
        try:
            chunk = next(chunks, None)
        except HTTPFailure as failure:
            if failure.kind != "short":
                raise
            chunk = None  # cut short of its Content-Length: the lines end where the body did
        if chunk is None:
            if pending:
                yield bytes(pending)
            return
        if not pending:
            started = time.monotonic()
        pending += chunk


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def json_items(body: bytes | str) -> int:
    """An upper bound on the values JSON text parses into (every value but the first follows a comma or opens a
    container), counted before parsing: a few bytes of JSON can become a few hundred bytes of objects each."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    data = _JSON_STRING.sub(b'""', data)  # commas and brackets inside strings are text, not values
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


# A JSON string literal, matched in linear time (possessive: no backtracking on a long or unterminated string).
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if ascii_digits(value):
        return float(min(int(value[:12]), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(value[:100])
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


# ----- an async client for SDKs that take one (MCP's streamable HTTP) --------------------------------------------


class BodyTooLarge(httpx2.StreamError):
    """A response body past its cap (a StreamError: the MCP SDK answers the request with a parse error)."""


class _CappedBody(httpx2.AsyncByteStream):
    """A response body that fails once it passes `max_bytes`, or, whole, holds more than `max_items` JSON values
    (json_items); an event stream is left to its reader's own cap per event."""

    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int, max_items: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._max_items = max_items

    async def __aiter__(self) -> Any:
        body = bytearray()
        async for chunk in self._inner:
            body += chunk
            if len(body) > self._max_bytes:
                raise BodyTooLarge(f"the response body passed {format_size(self._max_bytes)}")
        if json_items(bytes(body)) > self._max_items:
            raise BodyTooLarge(f"the response body holds more than {self._max_items} JSON values")
        yield bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedAsyncTransport(httpx2.AsyncBaseTransport):
    def __init__(self, max_bytes: int, max_items: int, proxy: str | None) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=_ssl_context(), proxy=proxy)
        self._max_bytes = max_bytes
        self._max_items = max_items

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        capped = _CappedBody(response.stream, self._max_bytes, self._max_items)
        return httpx2.Response(
            response.status_code, headers=response.headers, stream=capped, extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_async_client(
    url: str,
    headers: Mapping[str, str],
    *,
    max_body_bytes: int,
    max_items: int,
    timeout_s: float,
    read_timeout_s: float,
) -> httpx2.AsyncClient:
    """An httpx2 AsyncClient whose response bodies (but event streams) stop at `max_body_bytes` and `max_items`
    JSON values (BodyTooLarge) before anyone parses them; for an SDK that takes a client (MCP's streamable HTTP)."""
    return httpx2.AsyncClient(
        headers=dict(headers),
        timeout=httpx2.Timeout(timeout_s, read=read_timeout_s),
        transport=_CappedAsyncTransport(max_body_bytes, max_items, environment_proxy(url)),
    )
