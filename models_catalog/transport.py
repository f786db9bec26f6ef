"""Plain HTTP GETs for file bytes (downloads, Range-read GGUF headers): redirects, auth, proxies, timeouts.

The standard library's http.client is used instead of huggingface_hub's session so that a read timeout is
exactly "no bytes for N seconds" (stall detection) and another thread can abort a transfer by shutting the
socket down (pause, cancel) without waiting for the timeout.
"""

from __future__ import annotations

import http.client
import socket
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from huggingface_hub.utils import build_hf_headers

from models_catalog import hfcache
from models_catalog.errors import GatedRepoError, HubError, RepoNotFound

MAX_REDIRECTS = 8


class TransientHTTPError(HubError):
    """A failure worth retrying: connection refused/reset, timeout, 429 or 5xx."""


def hub_headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """User agent and Authorization (HF_TOKEN or a saved login) from huggingface_hub."""
    headers = dict(build_hf_headers(token=hfcache.token(), library_name="llmtui"))
    headers["Accept-Encoding"] = "identity"
    if extra:
        headers.update(extra)
    return headers


@dataclass
class Response:
    """An open response; read it with `read()`, close it with `close()` (any thread may call `abort()`)."""

    status: int
    headers: http.client.HTTPMessage
    url: str
    _conn: http.client.HTTPConnection
    _resp: http.client.HTTPResponse

    def read(self, n: int) -> bytes:
        """Up to `n` bytes, returning as soon as some arrive (so a timeout never loses received bytes)."""
        return self._resp.read1(n)

    def read_all(self, limit: int) -> bytes:
        """The body, up to `limit` bytes."""
        return self._resp.read(limit)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def close(self) -> None:
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def abort(self) -> None:
        """Unblock a read in progress in another thread (the read then raises OSError or returns b'')."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection for `url` (through an HTTP(S)_PROXY when set) and the request target to send."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"cannot fetch {url}: only http and https URLs are supported; check HF_ENDPOINT")
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
    timeout: float = 30.0,
    method: str = "GET",
) -> Response:
    """Send a request, following redirects (the Authorization header never leaves the original host).

    Returns the final response for any status; raises TransientHTTPError for network failures.
    """
    sent = dict(headers or {})
    origin = urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS):
        conn, target = _connection(url, timeout)
        try:
            conn.request(method, target, headers=sent)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransientHTTPError(f"cannot reach {url}: {exc}; check the network (retrying)") from exc
        if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
            location = urljoin(url, resp.getheader("Location") or "")
            resp.read()
            conn.close()
            if urlsplit(location).netloc != origin:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            url = location
            continue
        return Response(resp.status, resp.headers, url, conn, resp)
    raise HubError(f"too many redirects fetching {url}")


def raise_for_status(resp: Response, repo_id: str, what: str) -> None:
    """Map an HTTP error status to a typed error; 429 and 5xx become TransientHTTPError."""
    status = resp.status
    if status < 400:
        return
    code = resp.header("X-Error-Code") or ""
    message = resp.header("X-Error-Message") or ""
    try:
        body = resp.read(2048).decode("utf-8", "replace")
    except OSError:
        body = ""
    resp.close()
    detail = message or body.strip()[:200]
    if code == "GatedRepo" or (status in (401, 403) and "gated" in (message + body).lower()):
        raise GatedRepoError(gated_message(repo_id))
    if status in (401, 403):
        raise RepoNotFound(
            f"{repo_id}: access denied fetching {what} (HTTP {status}); if the repository is private or gated, "
            "set HF_TOKEN to a token that can read it"
        )
    if status == 404:
        raise RepoNotFound(f"{repo_id}: {what} not found on {hfcache.endpoint()} (HTTP 404); check the name")
    if status == 429 or status >= 500:
        raise TransientHTTPError(f"{repo_id}: the Hub answered HTTP {status} for {what} ({detail}); retrying")
    raise HubError(f"{repo_id}: HTTP {status} fetching {what}: {detail}")


def gated_message(repo_id: str) -> str:
    hint = "set HF_TOKEN" if not hfcache.token() else "check that HF_TOKEN belongs to an account that accepted them"
    return (
        f"{repo_id} is gated: accept its terms at {hfcache.endpoint()}/{repo_id} while logged in, "
        f"then {hint} (a read token from {hfcache.endpoint()}/settings/tokens)"
    )
