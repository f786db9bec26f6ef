"""Every network reader against every misbehaviour of tests/hostile_http.py: the Hub's search, a repository's info
and listing, its model card, the Range read of a remote GGUF header, a download, and a remote engine's model list
and reply stream. Each ends in one typed error whose message is one line of at most 300 characters naming what the
server did (or the limit it broke), within the time limits the readers enforce themselves (set short here), and
the endless and bomb cases within 64 MB.

Set HOSTILE_REPORT=path to get every case's outcome, time and memory peak as JSON lines.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from app.core.config import RemoteSettings, SamplingSettings
from app.core.remote_http import RemoteError, list_models
from app.tui.remote_bridge import RemoteBridge
from engine_ext.gguf import MAX_READ_HEADER_BYTES, GGUFError
from engine_ext.protocol import Failed, Finished, Loaded
from models_catalog import download, fit, hfcache, hub, transport
from models_catalog.download import RemoteFile, TransferOptions
from models_catalog.errors import DownloadError, ModelsError
from tests.fakes import Collector
from tests.hostile_http import CASES, COMMIT, FILE_SHA256, FILE_SIZE, HostileHTTPServer
from tests.hub_server import HubServer
from tests.quiet_http import QuietHTTPServer

REPO = "evil/Repo"
# Short limits, so a drip (a byte every 0.3 s: never a second without one) is cut off in about a second (the
# defaults are 30 s without a byte, 60 s an exchange, 180 s a listing).
LIMITS = replace(transport.LIMITS, read_timeout_s=1.0, exchange_s=1.0, listing_s=2.0)
FAST = TransferOptions(chunk_size=16 * 1024, stall_timeout=0.75, max_retries=1, backoff_base=0.01, backoff_max=0.05)
MAX_PEAK = 64 * 1024 * 1024

# kind -> the request paths its hostile server misbehaves on
TARGETS = {
    "search": r"^/api/models\?",
    "repo-info": r"^/api/models/evil/Repo(\?|$)",
    "listing": r"/tree/",
    "card": r"/README\.md$",
    "range": r"/model\.gguf$",
    "download": r"/model\.gguf$",
    "remote-models": r"^/v1/models",
    "remote-chat": r"/chat/completions$",
}

# What each case's message must say (lower case), by case and, where the reader differs, by kind.
_LIMIT = r"limit|sent only|no data|took longer"
SAID: dict[str, str] = {
    "endless-body": r"more than|passed \d|longer than|checksum|hash to|not a gguf|magic",
    "drip": _LIMIT,
    "drip-headers": _LIMIT,
    "header-bomb": r"more than 100 response headers",
    "header-line": r"header line longer than 64 kib",
    "invalid-json": r"invalid json|not json|with json|hash to|not a gguf|magic",
    "json-bomb": r"more than [\d,]+ json values|of more than [\d,]+ json values",
    "401": r"401",
    "403": r"403",
    "429": r"429 too many requests.*try again later|429.*gave up",
    "429-retry-after": r"429 too many requests.*retry after 30 s",
    "500": r"500 internal server error",
    "503": r"503 service unavailable",
    "503-retry-after": r"503 service unavailable.*retry after 30 s",
    "redirect-loop": r"redirected more than 8 times|302",
    "length-lie": r"closed the connection after|short of the content-length|connection closed at byte|not json",
    "endless-pages": r"took longer than the 2 s limit to send the listing|more than 100000 files",
    "endless-tokens": r"sent more than the 4 tokens asked for",
    "traversal": r"unsafe name or id \('\.\./\.\./\.\./outside\.gguf'\)",
}
BOUNDED_MEMORY = {"endless-body", "header-bomb", "header-line", "json-bomb", "endless-pages", "endless-tokens"}


def _remote_file(server: HostileHTTPServer) -> RemoteFile:
    return RemoteFile(
        REPO,
        "model.gguf",
        FILE_SIZE,
        FILE_SHA256,
        COMMIT,
        f"{server.url}/{REPO}/resolve/{COMMIT}/model.gguf",
        FILE_SHA256,
    )


def _remote(server: HostileHTTPServer) -> RemoteSettings:
    return RemoteSettings("hostile", f"{server.url}/v1")


def _chat(server: HostileHTTPServer) -> None:
    """A reply from the hostile server through the app's RemoteBridge; RemoteError with what the app shows."""
    collector = Collector()
    bridge = RemoteBridge(collector, _remote(server), "m", connect_timeout_s=1.0, read_timeout_s=1.0)
    try:
        bridge.connect()
        collector.wait_for(Loaded, timeout=10)
        bridge.generate([("user", "hi")], SamplingSettings(temperature=0.0, max_tokens=4))
        ended = collector.wait_for((Failed, Finished), timeout=20)
        if isinstance(ended, Finished):
            raise AssertionError(f"the reply finished ({ended.stop_reason}) from a hostile server")
        raise RemoteError(ended.message)
    finally:
        bridge.close()


def _call(kind: str, server: HostileHTTPServer) -> Callable[[], object]:
    return {
        "search": lambda: hub.search("evil"),
        "repo-info": lambda: hub.list_repo(REPO),
        "listing": lambda: hub.list_repo(REPO),
        "card": lambda: hub.model_card(REPO),
        "range": lambda: fit.remote_info([_remote_file(server)], window=64 * 1024),
        "download": lambda: download.fetch(_remote_file(server), options=FAST),
        "remote-models": lambda: list_models(_remote(server), timeout=0.6),  # 1.8 s for the whole answer
        "remote-chat": lambda: _chat(server),
    }[kind]


@pytest.fixture(scope="module")
def report() -> Iterator[list[dict[str, object]]]:
    rows: list[dict[str, object]] = []
    yield rows
    path = os.environ.get("HOSTILE_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")


# A model card is text, not JSON: any bytes make one (undecodable ones are replaced); file bytes are not JSON.
NOT_APPLICABLE = {("card", "invalid-json"), ("card", "json-bomb"), ("range", "json-bomb"), ("download", "json-bomb")}


def _cases() -> list[tuple[str, str]]:
    cases = [(kind, case) for kind in TARGETS for case in CASES if (kind, case) not in NOT_APPLICABLE]
    return cases + [("listing", "traversal"), ("listing", "endless-pages"), ("remote-chat", "endless-tokens")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("kind", "case"), _cases(), ids=[f"{k}-{c}" for k, c in _cases()])
def test_a_hostile_server_gets_one_line(
    kind: str, case: str, hf_env: Path, monkeypatch: pytest.MonkeyPatch, report: list[dict[str, object]]
) -> None:
    monkeypatch.setattr(transport, "LIMITS", LIMITS)
    with HostileHTTPServer(case, TARGETS[kind]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        call = _call(kind, server)
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises((ModelsError, GGUFError, RemoteError)) as caught:
                call()
        finally:
            seconds = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        message = str(caught.value)
        report.append(
            {
                "kind": kind,
                "case": case,
                "error": type(caught.value).__name__,
                "message": message,
                "seconds": round(seconds, 2),
                "peak_mb": round(peak / 2**20, 1),
                "sent": server.sent,
            }
        )
        assert server.faulted, "the hostile answer was never asked for"
        assert "\n" not in message and len(message) <= 300 and "Traceback" not in message, message
        assert re.search(SAID[case], message.lower()), message
        if case in BOUNDED_MEMORY:
            assert peak < MAX_PEAK, f"{peak / 2**20:.0f} MB for {message}"
        if kind == "download" and case in ("drip", "length-lie"):
            # what the server did send is kept for the next pull to resume from
            assert isinstance(caught.value, DownloadError), message
            partial = hfcache.RepoCache(hfcache.cache_dir(), REPO).partial(FILE_SHA256)
            assert partial.exists() and partial.stat().st_size > 0, message


def test_a_range_read_larger_than_its_cap_is_refused(hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing may claim a file of a terabyte and its header a string of gigabytes: one Range read still stops at
    LIMITS.max_read_bytes."""
    monkeypatch.setattr(transport, "LIMITS", replace(LIMITS, exchange_s=20.0))
    with HostileHTTPServer("endless-body", TARGETS["range"]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        reader = fit.RangeReader(replace(_remote_file(server), size=1 << 40))
        tracemalloc.start()
        try:
            with pytest.raises(ModelsError, match=r"sent more than 16 MiB for evil/Repo/model\.gguf in one read"):
                reader(0, 1 << 33)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < MAX_PEAK


@pytest.mark.timeout(60)
def test_a_download_waits_as_asked_and_resumes_after_a_drip(hub_server: HubServer) -> None:
    """503 with Retry-After, then a response dripping under min_rate: the download waits (within its backoff
    ceiling), gives the drip up keeping its bytes, resumes from them with a Range request and installs the file."""
    data = bytes(range(256)) * 256  # 64 KiB
    hub_server.add_repo("org/Slow-GGUF", {"model.gguf": data})
    hub_server.fault("org/Slow-GGUF", "model.gguf", errors_5xx=1, retry_after="1", slow_times=1, slow_bps=100)
    listing = hub.list_repo("org/Slow-GGUF")
    events: list[download.Progress] = []
    options = TransferOptions(
        chunk_size=16 * 1024,
        stall_timeout=1.0,
        max_retries=3,
        backoff_base=0.01,
        backoff_max=2.0,
        progress_interval=0.0,
    )
    started = time.monotonic()
    path = download.fetch(listing.file("model.gguf"), options=options, on_progress=events.append)
    assert path.read_bytes() == data
    assert time.monotonic() - started >= 0.9  # Retry-After: 1 was honoured (the backoff alone is 10 ms)
    said = [e.message for e in events]
    assert any("503 Service Unavailable" in m and "retry after 1 s" in m for m in said), said
    assert any("sent only" in m for m in said), said
    resumed = [r for r in hub_server.data_requests("model.gguf", settled=True) if r.range]
    assert resumed and resumed[-1].start > 0  # the drip's bytes were kept and not fetched again


# ----- header bombs: a remote GGUF header declaring more than a header can hold (issue 32, class 5) -------------

BOMB_SIZE = 16 << 30  # what the listing says the file holds


class _BombHandler(BaseHTTPRequestHandler):
    """Serves a virtual file of BOMB_SIZE bytes: `prefix`, then `pattern` again and again; Range honoured."""

    server: BombServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        start, end = (int(match[1]), int(match[2] or BOMB_SIZE - 1)) if match else (0, BOMB_SIZE - 1)
        end = min(end, BOMB_SIZE - 1)
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(end - start + 1))
        if match:
            self.send_header("Content-Range", f"bytes {start}-{end}/{BOMB_SIZE}")
        self.end_headers()
        self.server.requests += 1
        try:
            for offset in range(start, end + 1, 1 << 20):
                piece = self.server.content(offset, min(1 << 20, end + 1 - offset))
                self.wfile.write(piece)
                self.server.sent += len(piece)
        except OSError:  # the client stopped reading: what is expected
            pass


class BombServer(QuietHTTPServer):
    def __init__(self, prefix: bytes, pattern: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _BombHandler)
        self.prefix, self.pattern = prefix, pattern
        self.sent = 0
        self.requests = 0
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def content(self, offset: int, n: int) -> bytes:
        head = self.prefix[offset : offset + n]
        rest = n - len(head)
        if rest <= 0:
            return head
        start = max(0, offset - len(self.prefix)) % len(self.pattern)
        times = -(-(start + rest) // len(self.pattern))
        return head + (self.pattern * times)[start : start + rest]

    def file(self) -> RemoteFile:
        url = f"http://127.0.0.1:{self.server_address[1]}/{REPO}/resolve/{COMMIT}/bomb.gguf"
        return RemoteFile(REPO, "bomb.gguf", BOMB_SIZE, "e" * 64, COMMIT, url, "e" * 64)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def _gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv_head(key: bytes, vtype: int) -> bytes:
    return _gguf_string(key) + struct.pack("<I", vtype)


_STRING, _ARRAY, _U8, _U32, _F64 = 8, 9, 0, 4, 12
_ARCH = _kv_head(b"general.architecture", _STRING) + _gguf_string(b"llama")


def _bomb(kind: str, count: int, length: int = 1) -> tuple[bytes, bytes]:
    """(prefix, pattern) of a header bomb of `kind`, declaring `count` things (strings of `length` bytes)."""
    head = b"GGUF" + struct.pack("<I", 3)
    if kind == "token-strings":  # the campaign's bomb: tokenizer.ggml.tokens as `count` strings
        prefix = head + struct.pack("<QQ", 0, 2) + _ARCH + _kv_head(b"tokenizer.ggml.tokens", _ARRAY)
        return prefix + struct.pack("<IQ", _STRING, count), _gguf_string(b"a" * length)
    if kind in ("u8-array", "u32-array", "f64-array"):
        subtype = {"u8-array": _U8, "u32-array": _U32, "f64-array": _F64}[kind]
        prefix = head + struct.pack("<QQ", 0, 2) + _ARCH + _kv_head(b"tokenizer.ggml.scores", _ARRAY)
        return prefix + struct.pack("<IQ", subtype, count), b"\0"
    if kind == "long-string":  # one value claiming `count` bytes
        prefix = head + struct.pack("<QQ", 0, 2) + _ARCH + _kv_head(b"general.description", _STRING)
        return prefix + struct.pack("<Q", count), b"d"
    if kind == "many-keys":  # `count` entries, all with the same key after the first
        return head + struct.pack("<QQ", 0, count) + _ARCH, _kv_head(b"k", _U32) + b"\0\0\0\0"
    if kind == "many-tensors":  # `count` tensors, all with the same name
        info = _gguf_string(b"t") + struct.pack("<IQIQ", 1, 32, 0, 0)
        return head + struct.pack("<QQ", count, 1) + _ARCH, info
    raise ValueError(kind)


BOMBS: dict[str, tuple[str, int, int]] = {
    "tokens-1e9": ("token-strings", 10**9, 1),  # the campaign's: 1.95 GB read in 95 s
    "tokens-1e8": ("token-strings", 10**8, 1),
    "tokens-max-array": ("token-strings", (1 << 30), 0),
    "tokens-long-each": ("token-strings", 10**6, 1000),
    "u32-array-1e9": ("u32-array", 10**9, 0),
    "f64-array-1e8": ("f64-array", 10**8, 0),
    "u8-array-2e8": ("u8-array", 2 * 10**8, 0),
    "string-1gb": ("long-string", (1 << 30) - 1, 0),
    "string-100mb": ("long-string", 100 << 20, 0),
    "keys-999999": ("many-keys", 999_999, 0),
    "tensors-999999": ("many-tensors", 999_999, 0),
}


def _read_bomb(prefix: bytes, pattern: bytes) -> tuple[BaseException | None, float, int, int]:
    """remote_info over a bomb: (what it raised, seconds, traced memory peak, bytes the server sent)."""
    server = BombServer(prefix, pattern)
    tracemalloc.start()
    started = time.monotonic()
    raised: BaseException | None = None
    try:
        fit.remote_info([server.file()])
    except (ModelsError, GGUFError) as error:
        raised = error
    finally:
        seconds = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        server.close()
    return raised, seconds, peak, server.sent


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_remote_header_bomb_is_refused_before_it_is_read(
    name: str, hf_env: Path, report: list[dict[str, object]]
) -> None:
    kind, count, length = BOMBS[name]
    raised, seconds, peak, sent = _read_bomb(*_bomb(kind, count, length))
    report.append(
        {
            "kind": "header-bomb",
            "case": name,
            "message": str(raised),
            "seconds": round(seconds, 2),
            "peak_mb": round(peak / 2**20, 1),
            "sent": sent,
        }
    )
    assert raised is not None, f"{name}: read as a header"
    message = str(raised)
    assert "\n" not in message and len(message) <= 300, message
    assert re.search(r"does not end within|appears twice|claims|truncated", message), message
    assert sent <= MAX_READ_HEADER_BYTES + (8 << 20), f"{name}: {sent} bytes read"
    assert peak < MAX_PEAK, f"{name}: {peak / 2**20:.0f} MB"


def test_fuzzed_remote_header_bombs_stop_within_the_header_limit(hf_env: Path, report: list[dict[str, object]]) -> None:
    """Seeded fuzz of header bombs: random kinds, counts and lengths; each refused in one line within the limit."""
    rng = random.Random(32)
    kinds = ["token-strings", "u8-array", "u32-array", "f64-array", "long-string", "many-keys", "many-tensors"]
    for case in range(30):
        kind = rng.choice(kinds)
        count = rng.choice([rng.randrange(10**6, 10**7), 10**7, 10**8, 10**9, (1 << 30) - 1, 1 << 30, 2**40, 2**63])
        length = rng.choice([0, 1, 63, 4096])
        raised, seconds, peak, sent = _read_bomb(*_bomb(kind, count, length))
        report.append(
            {
                "kind": "header-bomb-fuzz",
                "case": f"{case}:{kind}:{count}:{length}",
                "message": str(raised),
                "seconds": round(seconds, 2),
                "peak_mb": round(peak / 2**20, 1),
                "sent": sent,
            }
        )
        if raised is not None:  # a bomb small enough to be a header is read as one, within the same bounds
            assert "\n" not in str(raised) and len(str(raised)) <= 300, str(raised)
        assert sent <= MAX_READ_HEADER_BYTES + (8 << 20) and peak < MAX_PEAK, (kind, count, length, sent, peak)


def test_a_remote_header_read_shares_one_time_limit(hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Range request of one header read shares LIMITS.header_s: a server answering each window slowly, but
    within its own exchange's limit, cannot stretch the whole read."""
    monkeypatch.setattr(transport, "LIMITS", replace(LIMITS, header_s=5.0))
    server = BombServer(*_bomb("token-strings", 10**6, 1))
    try:
        reader = fit.RangeReader(server.file())
        assert len(reader(0, 1024)) == 1024
        assert reader.deadline is not None
        reader.deadline -= 5.0  # as if the first windows had taken the whole limit
        with pytest.raises(ModelsError, match=r"took longer than the 5 s limit to send the header of evil/Repo"):
            reader(1024, 1024)
    finally:
        server.close()
