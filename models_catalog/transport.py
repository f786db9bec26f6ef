"""The Hub's HTTP GETs (listings, search, cards, Range-read GGUF headers, downloads) on the one client stack
(models_catalog.http_client): redirects, auth, proxies, and limits on size and time, each failure one line naming
the server and what it did.

huggingface_hub's own client is not used: it has no timeout at all (its default httpx client is built with
timeout=None), reads every body whole into memory, follows 20 redirects and sleeps whatever Retry-After a server
sends before retrying, so a hostile or broken endpoint could hold or grow the app without end. Here:

- a whole exchange (connect, redirects, headers, and a body read with read_body/read_all) has a time limit (the
  exchange's Guard), so a server dripping a byte a second cannot hold it; no byte for read_timeout_s is a stall;
- a body read with read_body has a size limit; read_all stops at its limit;
- response headers are bounded (a line of 64 KiB, 100 headers);
- redirects stop after MAX_REDIRECTS, without reading the redirect's body;
- another thread stops a transfer at once (Response.abort: pause, cancel).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from huggingface_hub.utils import build_hf_headers

from engine_ext.params import ascii_digits
from engine_ext.untrusted_text import one_line
from models_catalog import hfcache
from models_catalog.errors import GatedRepoError, HubError, RepoNotFound
from models_catalog.http_client import (
    MAX_HEADER_LINE,
    MAX_HEADERS,
    MAX_REDIRECTS,
    Guard,
    HTTPFailure,
    HTTPResponse,
    environment_proxy,
    format_size,
    open_response,
    read_body,
    retry_after,
)
from models_catalog.http_client import json_items as json_items  # the hub's readers count JSON values with it


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


@dataclass
class Response:
    """An open response; read it with `read()`, `read_all()` or `read_body()`, close it with `close()` (any thread
    may call `abort()`)."""

    _http: HTTPResponse
    timeout: float = 30.0
    what: str = "the answer"  # what was asked for, as messages name it
    _limit_s: float | None = field(default=None, repr=False)  # the exchange's, while it covers the body
    _pending: bytes = field(default=b"", repr=False)  # what read() took from the body but did not return

    @property
    def status(self) -> int:
        return self._http.status

    @property
    def url(self) -> str:
        return self._http.url

    @property
    def reason(self) -> str:
        return one_line(self._http.reason, 60)  # the server's words, their controls shown

    @property
    def server(self) -> str:
        return server_name(self.url)

    def header(self, name: str) -> str | None:
        return self._http.header(name)

    def read(self, n: int) -> bytes:
        """The next bytes of the body as they arrive (at most `n`; b"" when the server closed, even short of its
        Content-Length); TransientHTTPError when it stalls or breaks."""
        if self._pending:
            data, self._pending = self._pending[:n], self._pending[n:]
            return data
        try:
            chunk = next(self._http.chunks(), b"")
        except HTTPFailure as failure:
            if failure.kind == "short":
                return b""
            if failure.kind == "stall":
                raise TransientHTTPError(f"stalled: no data for {self.timeout:g} s") from None
            raise TransientHTTPError(
                f"{self.server} broke the connection while sending {self.what} ({failure.detail[:80]}); try again"
            ) from None
        data, self._pending = chunk[:n], chunk[n:]
        return data

    def _read_up_to(self, limit: int, what: str) -> tuple[bytes, bool]:
        """(up to `limit` bytes of the body, whether more followed), within the time limit of the exchange."""
        try:
            data, more, short = read_body(self._http, limit)
        except HTTPFailure as failure:
            if failure.kind == "deadline":
                raise TransientHTTPError(
                    f"{self.server} took longer than the {self._limit_s or 0:g} s limit to send {what}; stopped reading"
                ) from None
            if failure.kind == "stall":
                raise TransientHTTPError(
                    f"{self.server} sent no data for {self.timeout:g} s while sending {what}; stopped waiting"
                ) from None
            raise TransientHTTPError(
                f"{self.server} broke the connection while sending {what} ({failure.detail[:80]}); try again"
            ) from None
        if short is not None:
            self._check_length(data, what)
        return data, more

    def _check_length(self, data: bytes, what: str) -> None:
        """A body that ended (the server closed) short of the Content-Length it announced is an error."""
        announced = (self.header("Content-Length") or "").strip()
        shown = announced[:20] if ascii_digits(announced) else "?"
        raise TransientHTTPError(
            f"{self.server} closed the connection after {len(data)} of the "
            f"{shown} bytes it announced for {what}; try again"
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
        return data

    def read_body(self, limit: int, what: str = "") -> bytes:
        """The whole body: a HubError when it passes `limit` bytes, or ends short of its Content-Length."""
        what = what or self.what
        data, more = self._read_up_to(limit, what)
        if more:
            raise HubError(f"{self.server} sent more than {format_size(limit)} for {what}; stopped reading")
        return data

    def close(self) -> None:
        self._http.close()

    def abort(self) -> None:
        """Unblock a read in progress in another thread (the read then raises TransientHTTPError)."""
        self._http.guard.abort()


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
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"cannot fetch {url[:200]}: only http and https URLs are supported; check HF_ENDPOINT")
    guard = Guard(time_limit)
    try:
        http = open_response(
            method, url, guard=guard, headers=headers, read_timeout_s=timeout, proxy=environment_proxy(url)
        )
    except HTTPFailure as failure:
        raise _request_error(url, what, failure, timeout, time_limit) from None
    if stream:
        guard.set_limit(None)
    return Response(http, timeout, what, None if stream else time_limit)


def _what(url: str) -> str:
    """How messages name what `url` fetches: "org/repo/file" for a Hub file, else its path."""
    segs = urlsplit(url).path.split("/")
    if len(segs) > 5 and segs[3] == "resolve":
        return "/".join(segs[1:3] + segs[5:])[:150]
    return (urlsplit(url).path or url)[:150]


def _request_error(url: str, what: str, failure: HTTPFailure, timeout: float, time_limit: float) -> HubError:
    """One line for a request that got no usable response."""
    server = server_name(url)
    if failure.kind == "deadline":
        return TransientHTTPError(
            f"{server} did not answer {what} within the {time_limit:g} s limit (headers too slow); stopped waiting"
        )
    if failure.kind == "header-line":
        return HubError(
            f"{server} sent a response header line longer than {MAX_HEADER_LINE // 1024} KiB "
            f"for {what}; stopped reading"
        )
    if failure.kind == "header-count":
        return HubError(f"{server} sent more than {MAX_HEADERS} response headers for {what}; stopped reading")
    if failure.kind == "redirects":
        return HubError(
            f"{server} redirected more than {MAX_REDIRECTS} times for {what} (a redirect loop?); stopped following"
        )
    if failure.kind == "stall":
        return TransientHTTPError(f"{server} sent nothing for {timeout:g} s when asked for {what}; check the network")
    cause = failure.os_error or failure.cause or failure
    detail = " ".join(str(cause).split())[:120] or type(cause).__name__
    return TransientHTTPError(f"cannot reach {server} for {what}: {detail}; check the network")


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
