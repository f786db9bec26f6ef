"""Remote engines: any OpenAI-compatible server (llama-server, vLLM, SGLang…) behind the engine bridge's interface.

`RemoteBridge` posts the same `app.messages` messages as `EngineBridge` (ModelLoaded, TokensArrived,
GenerationStatsUpdated, GenerationFinished, GenerationFailed…), so the chat screen, the history store and the
stats bar work unchanged.

Why plain streaming HTTP (http.client) and not the `openai` SDK: Esc must stop a reply at once, even while the
server is silent (processing a long prompt). That needs the socket shut down from the UI thread, which an SDK
stream only allows between chunks. The fields llmtui reads beyond the OpenAI schema (llama-server's `timings` with
`draft_n`/`draft_n_accepted`, `reasoning_content`) are plain JSON the SDK keeps in untyped extras, and the SSE
format takes a few lines to parse. So: no new dependency, and cancel and error handling fully under our control.
"""

from __future__ import annotations

import http.client
import itertools
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from textual.message import Message

from app.bridge import MessageTarget
from app.config import EngineSettings, RemoteSettings, SamplingSettings
from app.messages import (
    EngineRequestFailed,
    GenerationFailed,
    GenerationFinished,
    GenerationStatsUpdated,
    ModelLoaded,
    ModelLoadFailed,
    ModelLoadStarted,
    ModelSummary,
    SpeculativeConfigured,
    TokensArrived,
)
from app.streaming import FLUSH_INTERVAL_S, STATS_INTERVAL_S
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.untrusted_text import one_line, shown, valid_text
from models_catalog.transport import MAX_HEADER_LINE, MAX_HEADERS, Watchdog, format_size, json_items, retry_after

REMOTE_PREFIX: Final = "remote:"
CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 600.0  # a slow server may think this long about a long prompt before the first token
MAX_ERROR_BODY: Final = 64 * 1024
# What a server may send before llmtui stops reading and says so: a JSON answer (a model list) and one line or one
# event of a reply's stream. A hostile or broken server sending an endless body or line grew the app to 4 GB.
MAX_JSON_BODY: Final = 8 * 1024 * 1024
MAX_SSE_LINE: Final = 1024 * 1024
MAX_SSE_EVENT: Final = 4 * 1024 * 1024
READ_CHUNK: Final = 64 * 1024
# A server dripping bytes never trips a socket timeout (each byte comes in time), so time is bounded too: a model
# list within 3 connect timeouts, a reply's headers within the read timeout, and one stream line (which a real
# server writes at once) within SSE_LINE_TIME_S of its first byte. A watchdog shuts the socket down when the time
# is up, so even a read blocked inside http.client (a header line dripping in) returns.
SSE_LINE_TIME_S: Final = 30.0
# A reply's headers, once their first byte came (the server may think up to the read timeout before it answers),
# within this long however slowly they drip, as a stream line is.
HEADER_TIME_S: Final = SSE_LINE_TIME_S
# A reply is stopped (its text kept) past these, whatever was asked: tokens when neither max_tokens nor the server's
# context says (a server streaming one-token chunks without end grew the reply without bound), and characters of
# text and reasoning together in any case (a chunk may hold a megabyte).
MAX_REPLY_TOKENS: Final = 131_072
MAX_REPLY_CHARS: Final = 8 * 1024 * 1024
# Values in one JSON answer or stream event, counted before parsing (models_catalog.transport.json_items): within
# the byte limits, "[{},{},..." would still parse into millions of objects (hundreds of MB).
MAX_JSON_ITEMS: Final = 500_000
TOKEN_SLACK: Final = 16  # chunks a server may send past max_tokens (some send a token or two per chunk)
MAX_EVENT_ITEMS: Final = 50_000
STOP_REASONS: Final = {"stop": "eos", "length": "max_tokens", "eos": "eos"}

# Request ids far from the local bridge's (which count from 1), so a late event of one engine is never taken for
# the other's reply after a switch.
_request_ids = itertools.count(1 << 30)


class RemoteError(Exception):
    """Something went wrong talking to a remote engine; the message is one line a user can act on."""


@dataclass(frozen=True)
class RemoteModel:
    """A model a remote server lists at GET /v1/models."""

    id: str
    n_ctx: int = 0  # vLLM/SGLang's max_model_len, llama-server's n_ctx_train; 0 when the server does not say


@dataclass(frozen=True)
class RemoteChoice:
    """A remote endpoint and one of its models, as the model switcher returns it."""

    remote: RemoteSettings
    model: str

    @property
    def path(self) -> str:
        """How the app names this model where it would name a file ("remote:NAME/MODEL")."""
        return remote_path(self.remote.name, self.model)


def remote_path(name: str, model: str) -> str:
    return f"{REMOTE_PREFIX}{name}/{model}"


# ----- HTTP -----


def _api_path(remote: RemoteSettings, endpoint: str) -> str:
    """The request path: the base URL's path (a bare host gets /v1, as the OpenAI SDK's base_url does) + endpoint."""
    prefix = urlsplit(remote.base_url).path.rstrip("/") or "/v1"
    return f"{prefix}/{endpoint}"


def _connection(remote: RemoteSettings, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(remote.base_url)
    host = parts.hostname or ""
    if parts.scheme == "https":
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, parts.port, timeout=timeout)


def _headers(remote: RemoteSettings) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "User-Agent": "llmtui",
    }
    key = remote.resolved_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def error_detail(body: bytes) -> str:
    """The message in an OpenAI-style error body ({"error": {"message"}}, {"error": "..."}, {"detail": ...})."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return one_line(text, 200)
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str | list):
                    return one_line(str(error[key]), 200)
        if isinstance(error, str):
            return one_line(error, 200)
    return one_line(text, 200)


def http_error_message(
    remote: RemoteSettings, status: int, reason: str, body: bytes, retry_after_header: str | None = None
) -> str:
    """One line for an HTTP error answer, with what to check (the wait a 429 or 503 asks for, when it says)."""
    detail = error_detail(body)
    message = f"{remote.name} answered {status} {one_line(reason, 60)}".rstrip()
    if detail:
        message += f": {one_line(detail, 120)}"
    if status in (401, 403):
        message += f" (check the API key: {remote.masked_key()})"
    elif status == 404:
        message += " (check the base URL, which usually ends in /v1, and the model name)"
    elif status == 429 or status >= 500:
        wait = retry_after(retry_after_header)
        if wait is not None:
            message += f"; retry after {wait:.0f} s"
        elif status == 429:
            message += "; try again later"
    return one_line(message)


def connection_error_message(remote: RemoteSettings, error: BaseException) -> str:
    where = f"{remote.name} at {remote.base_url}"
    if isinstance(error, http.client.LineTooLong):
        return one_line(
            f"{where} sent a response header line longer than {MAX_HEADER_LINE // 1024} KiB; llmtui "
            "stopped reading (is it an OpenAI-compatible server?)"
        )
    if isinstance(error, http.client.HTTPException) and "got more than" in str(error):
        return one_line(
            f"{where} sent more than {MAX_HEADERS} response headers; llmtui stopped reading (is it an "
            "OpenAI-compatible server?)"
        )
    if isinstance(error, http.client.BadStatusLine | http.client.RemoteDisconnected):
        return one_line(
            f"{where} did not answer with HTTP ({type(error).__name__}); is it an OpenAI-compatible server?"
        )
    if isinstance(error, ConnectionRefusedError):
        return f"cannot connect to {where}: connection refused (is the server running?)"
    if isinstance(error, TimeoutError | socket.timeout):
        return f"{where} did not answer in time"
    if isinstance(error, socket.gaierror):
        return f"cannot find the host of {where}: {error.strerror or error}"
    if isinstance(error, ssl.SSLError):
        return one_line(f"TLS error talking to {where}: {error.reason or error}")
    return one_line(f"cannot reach {where}: {error}")


def read_bounded(
    response: http.client.HTTPResponse, limit: int, deadline: float, what: str, *, truncate: bool = False
) -> bytes:
    """The response body, read in chunks: RemoteError once it passes `limit` bytes (with `truncate`: its first
    `limit` bytes) or time.monotonic() passes `deadline` (a server dripping a byte at a time never trips the
    socket's own timeout; a Watchdog on the connection unblocks a read waiting for one)."""
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = response.read1(READ_CHUNK) if hasattr(response, "read1") else response.read(READ_CHUNK)
        if not chunk:
            if time.monotonic() > deadline:
                raise RemoteError(f"{what} took longer than its time limit; llmtui stopped reading")
            missing = getattr(response, "length", None)  # http.client counts down the Content-Length
            if not truncate and isinstance(missing, int) and missing > 0:
                raise RemoteError(
                    f"{what} ended after {size} bytes, {missing} short of the Content-Length it "
                    "announced (the server closed the connection)"
                )
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            if truncate:
                parts.append(chunk)
                return b"".join(parts)[:limit]
            raise RemoteError(
                f"{what} passed {format_size(limit)}; llmtui stopped reading (is it an OpenAI-compatible server?)"
            )
        if time.monotonic() > deadline:
            raise RemoteError(f"{what} took longer than its time limit; llmtui stopped reading")
        parts.append(chunk)


def _too_slow(remote: RemoteSettings, what: str, seconds: float) -> RemoteError:
    return RemoteError(f"{remote.name} took longer than the {seconds:g} s limit to send {what}; llmtui stopped reading")


def _get_json(remote: RemoteSettings, endpoint: str, timeout: float) -> Any:
    connection = _connection(remote, timeout)
    what = f"{remote.name}'s answer to GET {_api_path(remote, endpoint)}"
    limit_s = 3 * timeout
    deadline = time.monotonic() + limit_s
    watchdog = Watchdog(limit_s)
    try:
        connection.connect()
        watchdog.watch(connection)
        connection.request("GET", _api_path(remote, endpoint), headers=_headers(remote))
        response = connection.getresponse()
        ok = response.status == 200
        body = read_bounded(response, MAX_JSON_BODY if ok else MAX_ERROR_BODY, deadline, what, truncate=not ok)
        if not ok:
            raise RemoteError(
                http_error_message(remote, response.status, response.reason, body, response.getheader("Retry-After"))
            )
    except (OSError, http.client.HTTPException, RemoteError) as error:
        if watchdog.fired:
            raise _too_slow(remote, f"its answer to GET {_api_path(remote, endpoint)}", limit_s) from None
        if isinstance(error, RemoteError):
            raise
        raise RemoteError(connection_error_message(remote, error)) from error
    finally:
        watchdog.cancel()
        connection.close()
    if json_items(body) > MAX_JSON_ITEMS:
        raise RemoteError(
            f"{what} holds more than {MAX_JSON_ITEMS:,} JSON values; llmtui stopped before reading "
            "them (is it an OpenAI-compatible server?)"
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:
        raise RemoteError(
            f"{remote.name} did not answer GET {_api_path(remote, endpoint)} with JSON; "
            "is it an OpenAI-compatible server?"
        ) from error


def list_models(remote: RemoteSettings, timeout: float = CONNECT_TIMEOUT_S) -> list[RemoteModel]:
    """The models the server offers (GET /v1/models); RemoteError says why not."""
    data = _get_json(remote, "models", timeout)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise RemoteError(
            f"{remote.name} did not answer GET {_api_path(remote, 'models')} with a model list; "
            "is it an OpenAI-compatible server?"
        )
    models = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        meta = item.get("meta")
        n_ctx = item.get("max_model_len") or (meta.get("n_ctx_train") if isinstance(meta, dict) else 0) or 0
        models.append(RemoteModel(item["id"], n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else 0))
    return models


def request_body(
    model: str, messages: Sequence[tuple[str, str]], sampling: SamplingSettings, continue_reply: bool
) -> dict[str, Any]:
    """The streamed /v1/chat/completions request for a conversation and its sampling settings."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": role, "content": content} for role, content in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    # Extensions llama-server, vLLM and SGLang accept (OpenAI itself would refuse them).
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.min_p > 0:
        body["min_p"] = sampling.min_p
    if sampling.repeat_penalty != 1.0:
        body["repeat_penalty"] = body["repetition_penalty"] = sampling.repeat_penalty
    if sampling.max_tokens > 0:
        body["max_tokens"] = sampling.max_tokens
    if sampling.seed >= 0:
        body["seed"] = sampling.seed
    if continue_reply:
        # The last message is the stopped reply: llama-server continues a trailing assistant message by itself;
        # vLLM and SGLang need to be told.
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return body


def _stream_lines(response: http.client.HTTPResponse, name: str, line_time_s: float) -> Iterator[bytes]:
    """The stream's lines (each with its newline; the last may lack one). A line longer than MAX_SSE_LINE, or one
    still incomplete `line_time_s` after its first byte (a drip), is a RemoteError, not read to its end."""
    pending = bytearray()
    started = 0.0
    while True:
        newline = pending.find(b"\n")
        if newline > MAX_SSE_LINE or (newline < 0 and len(pending) > MAX_SSE_LINE):
            raise RemoteError(
                f"{name} sent a stream line longer than {MAX_SSE_LINE // 1024} KiB; llmtui stopped reading"
            )
        if newline >= 0:
            line = bytes(pending[: newline + 1])
            del pending[: newline + 1]
            started = time.monotonic()
            yield line
            continue
        if pending and time.monotonic() - started > line_time_s:
            raise RemoteError(
                f"{name} took longer than {line_time_s:g} s to send one stream line (a slow drip); "
                "llmtui stopped reading"
            )
        chunk = response.read1(READ_CHUNK) if hasattr(response, "read1") else response.readline(READ_CHUNK)
        if not chunk:
            if pending:
                yield bytes(pending)
            return
        if not pending:
            started = time.monotonic()
        pending += chunk


def sse_events(
    response: http.client.HTTPResponse,
    name: str = "the server",
    line_time_s: float = SSE_LINE_TIME_S,
    on_idle: Callable[[], None] | None = None,
) -> Iterator[str]:
    """The `data` of each server-sent event, as text ("[DONE]" included); ends at the end of the stream. A line
    longer than MAX_SSE_LINE (or slower than `line_time_s`) or an event longer than MAX_SSE_EVENT is a
    RemoteError, not read to its end. `on_idle` is called for every line that brings no event data (a keep-alive
    comment, a blank line, another field); it may raise to stop a stream that brings nothing."""
    data: list[str] = []
    size = 0
    for raw in _stream_lines(response, name, line_time_s):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data, size = [], 0
            elif on_idle is not None:
                on_idle()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(line)
            if size > MAX_SSE_EVENT:
                raise RemoteError(
                    f"{name} sent a stream event longer than {MAX_SSE_EVENT // (1024 * 1024)} MiB; "
                    "llmtui stopped reading"
                )
        elif on_idle is not None:  # other fields (event:, id:, retry:) and comments (":" keep-alives)
            on_idle()
    if data:
        yield "\n".join(data)


# ----- the bridge -----


class _Cancelled(Exception):
    pass


@dataclass
class _Stream:
    """One streamed reply."""

    request_id: int
    sent_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    sock: socket.socket | None = None
    cancelled: bool = False
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    n_pending: int = 0
    n_tokens: int = 0
    n_chars: int = 0  # of text and reasoning
    first_token_at: float | None = None
    last_token_at: float | None = None
    stats_posted_at: float = 0.0

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in the stream's thread at once
            except OSError:
                pass


class RemoteBridge:
    """A remote OpenAI-compatible server as the app's engine: the calls the app makes on EngineBridge.

    Every call returns at once; the HTTP work runs in threads that post `app.messages` messages. What a remote
    server cannot do (llmtui's speculative decoding, control vectors) is refused with EngineRequestFailed.
    """

    def __init__(
        self,
        target: MessageTarget,
        remote: RemoteSettings,
        model: str = "",
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._target = target
        self.remote = remote
        self.model = model or remote.model
        """The model asked for ('' : the first the server lists, once connected)."""
        self.n_ctx = 0
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.connected = False

    @property
    def model_path(self) -> str:
        return remote_path(self.remote.name, self.model)

    @property
    def pid(self) -> int | None:
        return None

    @property
    def backend(self) -> str:
        return f"remote: {self.remote.name}"

    def _post(self, message: Message) -> None:
        if not self._closed:
            self._target.post_message(message)

    def _thread(self, target: Any, *args: Any) -> None:
        threading.Thread(target=target, args=args, name="llmtui-remote", daemon=True).start()

    # ----- what EngineBridge offers -----

    def start(self) -> None:
        """Nothing to start: the server runs elsewhere (kept so the app can treat both engines alike)."""

    def load(self, path: str, engine: EngineSettings | None = None, **_options: Any) -> None:
        """Use the model `path` names ("remote:NAME/MODEL", or a bare model id): checks the server lists it."""
        prefix = remote_path(self.remote.name, "")
        self.model = path.removeprefix(prefix) if path.startswith(prefix) else path
        self.connect()

    def connect(self) -> None:
        """List the server's models and announce the chosen one: ModelLoaded, or ModelLoadFailed saying why."""
        self._thread(self._connect)

    def restart(self) -> None:
        """Connect again (after an error); replies in flight are stopped."""
        for stream in self._active():
            stream.cancel()
        self.connect()

    def generate(
        self, messages: Sequence[tuple[str, str]], sampling: SamplingSettings, *, continue_reply: bool = False
    ) -> int:
        """Stream a reply; its request id (carried by its TokensArrived / GenerationFinished / GenerationFailed)."""
        request_id = next(_request_ids)
        stream = _Stream(request_id, time.monotonic())
        with self._lock:
            self._streams[request_id] = stream
        body = request_body(self.model, messages, sampling, continue_reply)
        self._thread(self._generate, stream, body)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Stop a reply: the stream is closed at once; the text so far is kept (GenerationFinished, cancelled)."""
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.cancel()

    def set_speculative(self, params: SpeculativeParams) -> None:
        if not params.enabled:
            self._post(SpeculativeConfigured((), ()))
            return
        self._post(
            EngineRequestFailed(
                "speculative",
                f"{self.remote.name} is a remote server: it does its own speculative decoding (llama-server: "
                "--model-draft, --spec-type), and its draft acceptance shows in the stats bar when it reports it",
            )
        )

    def set_steering(self, entries: tuple[SteeringEntry, ...]) -> None:
        if entries:
            self._post(
                EngineRequestFailed(
                    "steering", f"control vectors need the local engine; {self.remote.name} is a remote server"
                )
            )

    def make_vector(self, prompt_set_path: str, output_path: str, method: str = "pca") -> None:
        self._post(
            EngineRequestFailed(
                "vector", f"making a control vector needs a local model; {self.remote.name} is a remote server"
            )
        )

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every reply in flight; nothing is posted afterwards. Idempotent."""
        self._closed = True
        for stream in self._active():
            stream.cancel()

    # ----- threads -----

    def _active(self) -> list[_Stream]:
        with self._lock:
            return list(self._streams.values())

    def _connect(self) -> None:
        path = self.model_path
        self._post(ModelLoadStarted(path))
        started = time.monotonic()
        try:
            models = list_models(self.remote, self._connect_timeout_s)
        except Exception as error:  # RemoteError, or a surprise: the UI hears about it either way
            self.connected = False
            message = str(error) if isinstance(error, RemoteError) else one_line(f"{type(error).__name__}: {error}")
            self._post(ModelLoadFailed(path, message))
            return
        if not models:
            self._post(ModelLoadFailed(path, f"{self.remote.name} lists no models"))
            return
        chosen = next((m for m in models if m.id == self.model), None) if self.model else models[0]
        if chosen is None:
            names = ", ".join(m.id for m in models[:5]) + (" …" if len(models) > 5 else "")
            message = f"{self.remote.name} does not serve {self.model!r}; it serves {names}"
            self._post(ModelLoadFailed(path, one_line(message)))
            return
        self.model, self.n_ctx, self.connected = chosen.id, chosen.n_ctx, True
        self._post(
            ModelLoaded(
                ModelSummary(
                    path=self.model_path,
                    name=shown(chosen.id),
                    architecture="remote",
                    backend=self.backend,
                    n_ctx=chosen.n_ctx,
                    n_params=0,
                    size_bytes=0,
                    load_ms=(time.monotonic() - started) * 1000,
                )
            )
        )

    def _generate(self, stream: _Stream, body: dict[str, Any]) -> None:
        flusher = threading.Thread(target=self._flush_loop, args=(stream,), name="llmtui-remote-flush", daemon=True)
        flusher.start()
        outcome: tuple[str, str | dict[str, Any]] = ("failed", "the reply ended unexpectedly")
        connection = _connection(self.remote, self._connect_timeout_s)
        try:
            outcome = ("finished", self._stream_reply(connection, stream, body))
        except _Cancelled:
            outcome = ("cancelled", "")
        except RemoteError as error:
            outcome = ("cancelled", "") if stream.cancelled else ("failed", str(error))
        except (OSError, http.client.HTTPException) as error:
            if stream.cancelled:
                outcome = ("cancelled", "")
            elif stream.n_tokens:
                outcome = (
                    "failed",
                    f"the connection to {self.remote.name} broke mid-reply "
                    f"({type(error).__name__}); the partial reply is kept",
                )
            else:
                outcome = ("failed", connection_error_message(self.remote, error))
        except Exception as error:  # never let a thread die silently; the UI hears about it
            outcome = ("failed", one_line(f"{type(error).__name__}: {error}"))
        finally:
            connection.close()
            stream.done.set()
            flusher.join()
            self._flush(stream, final=True)
            with self._lock:
                self._streams.pop(stream.request_id, None)
        kind, detail = outcome
        if kind == "finished" and isinstance(detail, dict):
            stop_reason = str(detail.pop("stop_reason"))
            self._post(GenerationFinished(stream.request_id, stop_reason, detail, ()))
        elif kind == "cancelled":
            self._post(GenerationFinished(stream.request_id, "cancelled", self._stats(stream, {}, {}), ()))
        else:
            self._post(GenerationFailed(stream.request_id, str(detail)))

    def _stream_reply(
        self, connection: http.client.HTTPConnection, stream: _Stream, body: dict[str, Any]
    ) -> dict[str, Any]:
        connection.connect()
        assert connection.sock is not None
        connection.sock.settimeout(self._read_timeout_s)
        with stream.lock:
            stream.sock = connection.sock
            if stream.cancelled:
                raise _Cancelled
        # The answer must start within the read timeout (the server may think that long about the prompt), and its
        # headers then come within HEADER_TIME_S however slowly their bytes drip (a watchdog shuts the socket down
        # then); the body's lines have their own limits (sse_events), and its text the stall limit.
        watchdog = Watchdog(self._read_timeout_s)
        watchdog.watch(connection)
        limit_s, what = self._read_timeout_s, "an answer"
        try:
            connection.request(
                "POST",
                _api_path(self.remote, "chat/completions"),
                body=json.dumps(body).encode(),
                headers=_headers(self.remote),
            )
            if not select.select([connection.sock], [], [], self._read_timeout_s)[0]:
                raise TimeoutError
            watchdog.cancel()
            limit_s, what = min(HEADER_TIME_S, self._read_timeout_s), "the reply's headers"
            watchdog = Watchdog(limit_s)
            watchdog.watch(connection)
            response = connection.getresponse()
            if watchdog.fired:  # http.client returns the headers that came before the socket was shut down
                raise TimeoutError
            if response.status != 200:
                detail = read_bounded(response, MAX_ERROR_BODY, watchdog.deadline, "its error", truncate=True)
                raise RemoteError(
                    http_error_message(
                        self.remote, response.status, response.reason, detail, response.getheader("Retry-After")
                    )
                )
        except (OSError, http.client.HTTPException, RemoteError) as error:
            if stream.cancelled:
                raise _Cancelled from None
            if watchdog.fired:
                raise _too_slow(self.remote, what, limit_s) from None
            if isinstance(error, RemoteError):
                raise
            raise RemoteError(connection_error_message(self.remote, error)) from None
        finally:
            watchdog.cancel()
        # A server that ignores max_tokens (or streams without end) is stopped a little past what was asked for,
        # or past its context when nothing was, or past MAX_REPLY_TOKENS when neither is known.
        asked_for = body.get("max_tokens")
        asked: int = asked_for if isinstance(asked_for, int) else 0
        cap = asked if asked > 0 else self.n_ctx if self.n_ctx > 0 else MAX_REPLY_TOKENS
        why = "asked for" if asked > 0 else "its context holds" if self.n_ctx > 0 else "llmtui takes in one reply"
        most = cap + TOKEN_SLACK
        finish: str | None = None
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        done = False
        stall_s = self.remote.stall_timeout_s
        body_started = time.monotonic()
        stalled = RemoteError(
            f"{self.remote.name} sent no text for {stall_s:g} s (keep-alives or empty events only); llmtui "
            "stopped the reply (the text so far is kept; stall_timeout_s in [[remote]] or --stall-timeout waits longer)"
        )

        def check_stall() -> None:
            """No text for stall_s ends the reply: counted from the headers (a server that says nothing at all
            before its first text thinks about the prompt, within the read timeout) or from the last text (then
            silence counts too: the socket's timeout becomes the stall limit)."""
            if time.monotonic() - (stream.last_token_at or body_started) > stall_s:
                raise stalled
            if stream.last_token_at is not None and connection.sock is not None:
                connection.sock.settimeout(min(stall_s, self._read_timeout_s))

        events = sse_events(response, self.remote.name, min(SSE_LINE_TIME_S, self._read_timeout_s), check_stall)
        while True:
            try:
                data = next(events)
            except StopIteration:
                break
            except TimeoutError:
                if stream.cancelled or stream.last_token_at is None:
                    raise
                raise stalled from None
            if stream.cancelled:
                raise _Cancelled
            if data.strip() == "[DONE]":
                done = True
                break
            if json_items(data) > MAX_EVENT_ITEMS:
                raise RemoteError(
                    f"{self.remote.name} sent a stream event of more than {MAX_EVENT_ITEMS:,} JSON "
                    "values; llmtui stopped reading"
                )
            try:
                chunk = json.loads(data)
            except (ValueError, RecursionError):
                raise RemoteError(
                    f"{self.remote.name} sent a stream line that is not JSON: {one_line(data, 80)}"
                ) from None
            if not isinstance(chunk, dict):
                check_stall()
                continue
            if "error" in chunk:
                raise RemoteError(f"{self.remote.name} stopped with an error: {error_detail(data.encode())}")
            finish = self._chunk(stream, chunk) or finish
            if stream.n_tokens > most:
                raise RemoteError(
                    f"{self.remote.name} sent more than the {cap} tokens {why}; llmtui stopped the reply "
                    "(the text so far is kept)"
                )
            if stream.n_chars > MAX_REPLY_CHARS:
                raise RemoteError(
                    f"{self.remote.name} sent more than {MAX_REPLY_CHARS // (1024 * 1024)} M characters in one "
                    "reply; llmtui stopped it (the text so far is kept)"
                )
            check_stall()
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            if isinstance(chunk.get("timings"), dict):
                timings = chunk["timings"]
        if stream.cancelled:
            raise _Cancelled
        if not done and finish is None:
            if stream.n_tokens:
                raise RemoteError(
                    f"{self.remote.name} closed the stream before the reply finished; the partial reply is kept"
                )
            raise RemoteError(
                f"{self.remote.name} closed the stream without a reply (the request may be too long "
                "for its context, or it failed: see the server's log)"
            )
        stats = self._stats(stream, usage, timings)
        stats["stop_reason"] = STOP_REASONS.get(finish or "stop", one_line(finish or "eos", 40))
        return stats

    def _chunk(self, stream: _Stream, chunk: dict[str, Any]) -> str | None:
        """Take one chunk's text and reasoning; its finish_reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            # text a server sends is made valid UTF-8 before it is shown, printed or stored (JSON can carry a lone
            # surrogate, "\ud800", which no UTF-8 writer accepts)
            content = valid_text(content) if isinstance(content, str) else ""
            reasoning = valid_text(reasoning) if isinstance(reasoning, str) else ""
            if content or reasoning:
                now = time.monotonic()
                with stream.lock:
                    stream.n_chars += len(content) + len(reasoning)
                    if content:
                        stream.text.append(content)
                    if reasoning:
                        stream.reasoning.append(reasoning)
                    stream.n_pending += 1  # servers stream one token per chunk
                    stream.n_tokens += 1
                    if stream.first_token_at is None:
                        stream.first_token_at = now
                    stream.last_token_at = now
        finish = choice.get("finish_reason")
        return finish if isinstance(finish, str) else None

    def _flush_loop(self, stream: _Stream) -> None:
        while not stream.done.wait(FLUSH_INTERVAL_S):
            self._flush(stream)

    def _flush(self, stream: _Stream, *, final: bool = False) -> None:
        with stream.lock:
            if not stream.n_pending:
                return
            text, reasoning, n = "".join(stream.text), "".join(stream.reasoning), stream.n_pending
            stream.text, stream.reasoning, stream.n_pending = [], [], 0
            n_tokens, first = stream.n_tokens, stream.first_token_at
        self._post(TokensArrived(stream.request_id, text, reasoning, n))
        now = time.monotonic()
        if not final and first is not None and now - stream.stats_posted_at >= STATS_INTERVAL_S:
            stream.stats_posted_at = now
            elapsed = now - first
            rate = (n_tokens - 1) / elapsed if elapsed > 0 and n_tokens > 1 else 0.0
            self._post(GenerationStatsUpdated(stream.request_id, n_tokens, rate, (first - stream.sent_at) * 1000))

    def _stats(self, stream: _Stream, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        """A finished reply's stats, with GenerationStats' keys: the server's timings where it reports them
        (llama-server), else measured here."""
        first, last = stream.first_token_at, stream.last_token_at
        ttft_ms = (first - stream.sent_at) * 1000 if first is not None else 0.0
        decode_s = (last - first) if first is not None and last is not None else 0.0

        def number(data: dict[str, Any], key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        generated = int(number(timings, "predicted_n") or number(usage, "completion_tokens") or stream.n_tokens)
        prompt = int(number(timings, "prompt_n") or number(usage, "prompt_tokens") or 0)
        cached = int(number(timings, "cache_n") or 0)
        decode_tps = number(timings, "predicted_per_second")
        if decode_tps is None:
            decode_tps = (stream.n_tokens - 1) / decode_s if decode_s > 0 and stream.n_tokens > 1 else 0.0
        stats: dict[str, Any] = {
            "prompt_tokens": prompt + cached,
            "prompt_tokens_cached": cached,
            "prompt_tokens_evaluated": prompt,
            "prompt_ms": round(number(timings, "prompt_ms") or ttft_ms, 3),
            "prompt_tps": round(number(timings, "prompt_per_second") or 0.0, 2),
            "generated_tokens": generated,
            "decode_ms": round(number(timings, "predicted_ms") or decode_s * 1000, 3),
            "decode_tps": round(decode_tps, 2),
            "ttft_ms": round(ttft_ms, 3),
            "n_ctx": self.n_ctx,
            "n_ctx_used": prompt + cached + generated,
            "dropped_messages": 0,
            "backend": self.backend,
            "timings_from": "server" if timings else "client",
        }
        draft_n, accepted = number(timings, "draft_n"), number(timings, "draft_n_accepted")
        if draft_n is not None and accepted is not None:
            stats["draft_n"], stats["draft_n_accepted"] = int(draft_n), int(accepted)
            stats["draft_acceptance"] = round(accepted / draft_n, 4) if draft_n > 0 else 0.0
        return stats


def draft_summary(stats: dict[str, Any]) -> str | None:
    """The stats bar's readout of a server's speculative decoding ("71% 45/63"), when it reported it."""
    drafted, accepted = stats.get("draft_n"), stats.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int) or drafted <= 0:
        return None
    return f"{accepted / drafted:.0%} {accepted}/{drafted}"
