"""Plain HTTP GETs for the Hub's API and file bytes (listings, search, cards, Range-read GGUF headers, downloads):
redirects, auth, proxies, and limits on size and time.

The standard library's http.client is used instead of huggingface_hub's session so that a read timeout is
exactly "no bytes for N seconds" (stall detection), another thread can abort a transfer by shutting the socket
down (pause, cancel) without waiting for the timeout, and every exchange is bounded: huggingface_hub's client has
no timeout at all (its default httpx client is built with timeout=None), reads every body whole into memory,
follows 20 redirects and sleeps whatever Retry-After a server sends before retrying, so a hostile or broken
endpoint could hold or grow the app without end. Here:

- a whole exchange (connect, redirects, headers, and a body read with read_body/read_all) has a time limit,
  enforced by a watchdog that shuts the socket down, so a server dripping a byte a second cannot hold it;
- a body read with read_body has a size limit; read_all stops at its limit;
- response headers are bounded by http.client itself (a line of 64 KiB, 100 headers: about 6.4 MB at most);
- redirects stop after MAX_REDIRECTS, without reading the redirect's body;
- each failure is one line naming the server and what it did.
"""

from __future__ import annotations

import email.utils
import http.client
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from huggingface_hub.utils import build_hf_headers

from engine_ext.params import ascii_digits
from engine_ext.untrusted_text import one_line
from models_catalog import hfcache
from models_catalog.errors import GatedRepoError, HubError, RepoNotFound

MAX_REDIRECTS = 8
# http.client's own bounds on response headers (private names; the values have been 65536 and 100 since 3.2)
MAX_HEADER_LINE: int = getattr(http.client, "_MAXLINE", 65536)
MAX_HEADERS: int = getattr(http.client, "_MAXHEADERS", 100)
READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """How long and how much a server may take; tests shrink them (monkeypatch `transport.LIMITS`)."""

    read_timeout_s: float = 30.0  # no byte for this long: the server stalled
    exchange_s: float = 60.0  # a whole API exchange (connect, redirects, headers, body), however the bytes trickle
    max_json_bytes: int = 8 * 1024 * 1024  # one JSON answer (a search, a repository's info, one listing page)
    # Values in one JSON answer, at most (see json_items): 8 MiB of "[{},{},..." would parse into 2.8 million
    # objects (about 200 MB); a listing page of 1000 files has about 10,000.
    max_json_items: int = 500_000
    max_error_body: int = 2048  # what is read of an error answer's body for its message
    # One read_all (a Range read of a GGUF header window): a reader asking for more (a hostile header claiming a
    # string of gigabytes in a file the listing says is huge) gets an error instead of buffering it.
    max_read_bytes: int = 16 * 1024 * 1024
    listing_s: float = 180.0  # a repository's whole listing (its info and every page of its tree)
    header_s: float = 120.0  # a remote GGUF header's whole Range read (every window of it)


LIMITS = Limits()


class TransientHTTPError(HubError):
    """A failure worth retrying: connection refused/reset, timeout, 429 or 5xx. `retry_after`: what the server
    asked for (seconds), when it said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def hub_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """User agent and Authorization (HF_TOKEN or a saved login) from huggingface_hub."""
    headers = dict(build_hf_headers(token=hfcache.token(), library_name="llmtui"))
    headers["Accept-Encoding"] = "identity"
    if extra:
        headers.update(extra)
    return headers


def server_name(url: str) -> str:
    """How messages name the server behind `url`: "the Hub at https://huggingface.co", or its origin."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    endpoint = urlsplit(hfcache.endpoint())
    return f"the Hub at {origin}" if parts.netloc == endpoint.netloc else origin


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


class Watchdog:
    """Shuts a connection's socket down when its time is up, so a read blocked on a dripping server returns."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.fired = False
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn
            fired = self.fired
        if fired and conn is not None:
            _shutdown(conn)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            conn = self._conn
        if conn is not None:
            _shutdown(conn)

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._conn = None


def _shutdown(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@dataclass
class Response:
    """An open response; read it with `read()`, `read_all()` or `read_body()`, close it with `close()` (any thread
    may call `abort()`)."""

    status: int
    headers: http.client.HTTPMessage
    url: str
    _conn: http.client.HTTPConnection
    _resp: http.client.HTTPResponse
    timeout: float = 30.0
    _watchdog: Watchdog | None = None
    reason: str = ""
    what: str = "the answer"  # what was asked for, as messages name it

    @property
    def server(self) -> str:
        return server_name(self.url)

    def read(self, n: int) -> bytes:
        """Up to `n` bytes, returning as soon as some arrive (so a timeout never loses received bytes)."""
        return self._resp.read1(n)

    def _read_up_to(self, limit: int, what: str) -> tuple[bytes, bool]:
        """(up to `limit` bytes of the body, whether more followed), within the time limit of the exchange."""
        parts: list[bytes] = []
        size = 0
        try:
            while True:
                chunk = self._resp.read1(min(READ_CHUNK, limit + 1 - size))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    data = b"".join(parts)
                    return data[:limit], True
                if self._watchdog is not None and self._watchdog.fired:
                    break
        except (OSError, http.client.HTTPException) as exc:
            self._check_time(what)
            if isinstance(exc, TimeoutError):
                raise TransientHTTPError(
                    f"{self.server} sent no data for {self.timeout:g} s while sending {what}; stopped waiting"
                ) from None
            raise TransientHTTPError(
                f"{self.server} broke the connection while sending {what} ({type(exc).__name__}); try again"
            ) from None
        self._check_time(what)
        return b"".join(parts), False

    def _check_time(self, what: str) -> None:
        if self._watchdog is not None and self._watchdog.fired:
            raise TransientHTTPError(
                f"{self.server} took longer than the {self._watchdog.seconds:g} s limit to send {what}; stopped reading"
            )

    def _check_length(self, data: bytes, what: str) -> None:
        """A body that ended (the server closed) short of the Content-Length it announced is an error."""
        announced = (self.header("Content-Length") or "").strip()
        if ascii_digits(announced) and int(announced[:20]) > len(data):
            raise TransientHTTPError(
                f"{self.server} closed the connection after {len(data)} of the "
                f"{announced[:20]} bytes it announced for {what}; try again"
            )

    def read_all(self, limit: int, what: str = "") -> bytes:
        """The body, up to `limit` bytes (the rest is not read), within the exchange's time limit; an error when
        it ends short of both `limit` and its Content-Length."""
        what = what or self.what
        cap = min(limit, LIMITS.max_read_bytes)
        data, more = self._read_up_to(cap, what)
        if more and cap < limit:
            raise HubError(
                f"{self.server} sent more than {format_size(cap)} for {what} in one read; stopped "
                "reading (is the file what its listing says?)"
            )
        if not more and len(data) < limit:
            self._check_length(data, what)
        return data

    def read_body(self, limit: int, what: str = "") -> bytes:
        """The whole body: a HubError when it passes `limit` bytes, or ends short of its Content-Length."""
        what = what or self.what
        data, more = self._read_up_to(limit, what)
        if more:
            raise HubError(f"{self.server} sent more than {format_size(limit)} for {what}; stopped reading")
        self._check_length(data, what)
        return data

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def abort(self) -> None:
        """Unblock a read in progress in another thread (the read then raises OSError or returns b'')."""
        _shutdown(self._conn)


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection for `url` (through an HTTP(S)_PROXY when set) and the request target to send."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"cannot fetch {url[:200]}: only http and https URLs are supported; check HF_ENDPOINT")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    port = parts.port
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    loopback = parts.hostname in ("localhost", "127.0.0.1", "::1")
    bypass = loopback or urllib.request.proxy_bypass(parts.hostname)
    proxy = None if bypass else urllib.request.getproxies().get(parts.scheme)
    if proxy:
        p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(p.hostname or "", p.port, timeout=timeout)
            conn.set_tunnel(parts.hostname, port)
            return conn, target
        return http.client.HTTPConnection(p.hostname or "", p.port, timeout=timeout), url
    return cls(parts.hostname, port, timeout=timeout), target


def open_url(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    method: str = "GET",
    time_limit: float | None = None,
    stream: bool = False,
    what: str = "",
) -> Response:
    """Send a request, following redirects (the Authorization header never leaves the original host).

    `timeout`: no byte for this long is a stall (default LIMITS.read_timeout_s). `time_limit`: the whole exchange,
    the body read with read_all/read_body included (default LIMITS.exchange_s); with `stream` (downloads) it
    covers the headers only and the caller judges the body's progress. Returns the final response for any status;
    raises TransientHTTPError for network failures and a server that is too slow, HubError for one that breaks the
    limits of HTTP (header bombs, redirect loops).
    """
    timeout = LIMITS.read_timeout_s if timeout is None else timeout
    time_limit = LIMITS.exchange_s if time_limit is None else time_limit
    what = what or _what(url)
    sent = dict(headers or {})
    origin = urlsplit(url).netloc
    watchdog = Watchdog(time_limit)
    try:
        for _ in range(MAX_REDIRECTS + 1):
            conn, target = _connection(url, timeout)
            watchdog.watch(conn)
            try:
                conn.connect()
                watchdog.watch(conn)  # now with its socket
                conn.request(method, target, headers=sent)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _request_error(url, what, exc, timeout, watchdog) from None
            if watchdog.fired:  # the headers were cut short by the time limit: http.client returns what came
                conn.close()
                raise _request_error(url, what, TimeoutError(), timeout, watchdog)
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                location = urljoin(url, resp.getheader("Location") or "")
                conn.close()  # the redirect's body is not read: it could be endless
                if urlsplit(location).netloc != origin:
                    sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                url = location
                continue
            if stream:
                watchdog.cancel()
            response = Response(
                resp.status,
                resp.headers,
                url,
                conn,
                resp,
                timeout,
                None if stream else watchdog,
                one_line(resp.reason or "", 60),  # the server's words, their controls shown
                what,
            )
            return response
    except BaseException:
        watchdog.cancel()
        raise
    watchdog.cancel()
    raise HubError(
        f"{server_name(url)} redirected more than {MAX_REDIRECTS} times for {what} (a redirect loop?); "
        "stopped following"
    )


def _what(url: str) -> str:
    """How messages name what `url` fetches: "org/repo/file" for a Hub file, else its path."""
    segs = urlsplit(url).path.split("/")
    if len(segs) > 5 and segs[3] == "resolve":
        return "/".join(segs[1:3] + segs[5:])[:150]
    return (urlsplit(url).path or url)[:150]


def _request_error(url: str, what: str, exc: BaseException, timeout: float, watchdog: Watchdog) -> HubError:
    """One line for a request that got no usable response."""
    server = server_name(url)
    if watchdog.fired:
        return TransientHTTPError(
            f"{server} did not answer {what} within the {watchdog.seconds:g} s limit "
            "(headers too slow); stopped waiting"
        )
    if isinstance(exc, http.client.LineTooLong):
        return HubError(
            f"{server} sent a response header line longer than {MAX_HEADER_LINE // 1024} KiB "
            f"for {what}; stopped reading"
        )
    if isinstance(exc, http.client.HTTPException) and "got more than" in str(exc):
        return HubError(f"{server} sent more than {MAX_HEADERS} response headers for {what}; stopped reading")
    if isinstance(exc, TimeoutError):
        return TransientHTTPError(f"{server} sent nothing for {timeout:g} s when asked for {what}; check the network")
    detail = " ".join(str(exc).split())[:120] or type(exc).__name__
    return TransientHTTPError(f"cannot reach {server} for {what}: {detail}; check the network")


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


def _retry_hint(seconds: float | None) -> str:
    if seconds is None:
        return "try again later"
    if seconds >= 3600:
        return f"retry after {seconds / 3600:.0f} h"
    return f"retry after {seconds:.0f} s"


def raise_for_status(resp: Response, repo_id: str, what: str) -> None:
    """Map an HTTP error status to a typed error; 429 and 5xx become TransientHTTPError."""
    status = resp.status
    if status < 400:
        return
    code = (resp.header("X-Error-Code") or "")[:100]
    message = one_line(resp.header("X-Error-Message") or "", 200)  # the server's words, their controls shown
    try:
        body = resp.read_all(LIMITS.max_error_body, f"the error for {what}").decode("utf-8", "replace")
    except HubError:
        body = ""
    resp.close()
    detail = message or one_line(body, 120)
    if code == "GatedRepo" or (status in (401, 403) and "gated" in (message + body).lower()):
        raise GatedRepoError(gated_message(repo_id))
    if status in (401, 403, 404) and not repo_id:  # not about a repository (a search)
        hint = "check HF_TOKEN" if status != 404 else f"is {hfcache.endpoint()} a Hugging Face hub?"
        raise HubError(f"{resp.server} refused {what} (HTTP {status} {resp.reason}); {hint}")
    if status in (401, 403):
        raise RepoNotFound(
            f"{repo_id}: access denied fetching {what} (HTTP {status}); if the repository is private or gated, "
            "set HF_TOKEN to a token that can read it"
        )
    if status == 404:
        raise RepoNotFound(f"{repo_id}: {what} not found on {hfcache.endpoint()} (HTTP 404); check the name")
    said = f"{resp.server} returned {status} {resp.reason}".rstrip() + f" for {what}"
    if detail:
        said += f" ({detail[:80]})"
    if status == 429 or status >= 500:
        wait = retry_after(resp.header("Retry-After"))
        raise TransientHTTPError(f"{said}; {_retry_hint(wait)}", wait)
    raise HubError(f"{said}; is {hfcache.endpoint()} a Hugging Face hub?")


def gated_message(repo_id: str) -> str:
    hint = "set HF_TOKEN" if not hfcache.token() else "check that HF_TOKEN belongs to an account that accepted them"
    return (
        f"{repo_id} is gated: accept its terms at {hfcache.endpoint()}/{repo_id} while logged in, "
        f"then {hint} (a read token from {hfcache.endpoint()}/settings/tokens)"
    )
