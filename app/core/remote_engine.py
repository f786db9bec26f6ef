"""A remote OpenAI-compatible server (llama-server, vLLM, SGLang…) as the engine, in the engine protocol's terms.

`RemoteClient` lists the server's models (`connect`: the chosen one's `ModelInfo`, as `Loaded` carries it) and streams
a reply as the worker does: `TokenChunk`s, then `Finished` (its `ServerStats`) or `Failed`, each within the reply's
limits, with one-line errors. The app's engine (`app/tui/remote_bridge.py`) and `llmtui run|chat --remote` read the
same events. The HTTP side (model list, request, server-sent events, errors) is app/core/remote_http.py. No Textual.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from app.core.config import RemoteSettings, SamplingSettings
from app.core.output_format import OutputFormatError, format_instruction, instructed, response_format_fields
from app.core.remote_http import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    SSE_LINE_TIME_S,
    RemoteError,
    error_detail,
    failure_message,
    list_models,
    open_request,
    read_error,
    request_body,
    sse_events,
    too_slow,
)
from engine_ext.protocol import (
    UNKNOWN_TOKEN,
    ChatMessage,
    Failed,
    Finished,
    GenerationStats,
    ModelInfo,
    StopReason,
    TokenChunk,
)
from engine_ext.untrusted_text import one_line, valid_text
from models_catalog.http_client import Guard, HTTPFailure, json_items

REMOTE_PREFIX: Final = "remote:"
# A reply's headers, once their first byte came (the server may think up to the read timeout before it answers),
# within this long however slowly they drip, as a stream line is.
HEADER_TIME_S: Final = SSE_LINE_TIME_S
# A reply is stopped (its text kept) past these, whatever was asked: tokens when neither max_tokens nor the server's
# context says (a server streaming one-token chunks without end grew the reply without bound), and characters of
# text and reasoning together in any case (a chunk may hold a megabyte).
MAX_REPLY_TOKENS: Final = 131_072
MAX_REPLY_CHARS: Final = 8 * 1024 * 1024
TOKEN_SLACK: Final = 16  # chunks a server may send past max_tokens (some send a token or two per chunk)
MAX_EVENT_ITEMS: Final = 50_000
STOP_REASONS: Final = {"stop": "eos", "length": "max_tokens", "eos": "eos"}

# Request ids far from the local bridge's (which count from 1), so a late event of one engine is never taken for
# the other's reply after a switch.
_request_ids = itertools.count(1 << 30)


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


class _Cancelled(Exception):
    pass


@dataclass
class _Stream:
    """One streamed reply."""

    request_id: int
    sent_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    guard: Guard = field(default_factory=Guard)  # the request's; its abort() stops it at once
    cancelled: bool = False
    n_tokens: int = 0
    n_chars: int = 0  # of text and reasoning
    first_token_at: float | None = None
    last_token_at: float | None = None

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
        self.guard.abort()  # wakes a read blocked in the stream's thread at once, even before the headers


@dataclass(frozen=True)
class ServerStats(GenerationStats):
    """A server's reply's stats: its own timings where it reports them (llama-server), else measured here."""

    backend: str = ""
    timings_from: str = "client"  # "server": its timings; "client": measured here
    prompt_tps_reported: float | None = None
    decode_tps_reported: float | None = None
    draft_n: int | None = None  # the server's speculative decoding, when it reports it
    draft_n_accepted: int | None = None

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tps_reported or 0.0

    @property
    def decode_tps(self) -> float:
        return super().decode_tps if self.decode_tps_reported is None else self.decode_tps_reported

    def to_dict(self) -> dict[str, float | int]:
        stats: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_cached": self.prompt_tokens_cached,
            "prompt_tokens_evaluated": self.prompt_tokens_evaluated,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_tps": round(self.prompt_tps, 2),
            "generated_tokens": self.generated_tokens,
            "decode_ms": round(self.decode_ms, 3),
            "decode_tps": round(self.decode_tps, 2),
            "ttft_ms": round(self.ttft_ms, 3),
            "n_ctx": self.n_ctx,
            "n_ctx_used": self.n_ctx_used,
            "dropped_messages": 0,
            "backend": self.backend,
            "timings_from": self.timings_from,
        }
        if self.draft_n is not None and self.draft_n_accepted is not None:
            stats["draft_n"], stats["draft_n_accepted"] = self.draft_n, self.draft_n_accepted
            stats["draft_acceptance"] = round(self.draft_n_accepted / self.draft_n, 4) if self.draft_n > 0 else 0.0
        return stats


RemoteEvent = TokenChunk | Finished | Failed


class RemoteClient:
    """One OpenAI-compatible server and the model asked of it. `connect` and `generate` block the calling thread
    (the app runs them in threads); `cancel` and `close` may be called from any thread and stop a reply at once."""

    def __init__(
        self,
        remote: RemoteSettings,
        model: str = "",
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.remote = remote
        self.model = model or remote.model
        """The model asked for ('' : the first the server lists, once connected)."""
        self.n_ctx = 0
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()

    @property
    def model_path(self) -> str:
        return remote_path(self.remote.name, self.model)

    @property
    def backend(self) -> str:
        return f"remote: {self.remote.name}"

    def new_request_id(self) -> int:
        return next(_request_ids)

    def connect(self) -> ModelInfo:
        """List the server's models and choose the one asked for (or its first); RemoteError says why not."""
        started = time.monotonic()
        models = list_models(self.remote, self._connect_timeout_s)
        if not models:
            raise RemoteError(f"{self.remote.name} lists no models")
        chosen = next((m for m in models if m.id == self.model), None) if self.model else models[0]
        if chosen is None:
            names = ", ".join(m.id for m in models[:5]) + (" …" if len(models) > 5 else "")
            raise RemoteError(one_line(f"{self.remote.name} does not serve {self.model!r}; it serves {names}"))
        self.model, self.n_ctx = chosen.id, chosen.n_ctx
        return ModelInfo(
            path=self.model_path,
            architecture="remote",
            description=chosen.id,
            n_params=0,
            size_bytes=0,
            n_ctx=chosen.n_ctx,
            n_ctx_train=0,
            n_embd=0,
            n_layer=0,
            n_layer_nextn=0,
            n_vocab=0,
            is_recurrent=False,
            is_hybrid=False,
            has_chat_template=True,
            n_threads=0,
            backend=self.backend,
            load_ms=(time.monotonic() - started) * 1000,
        )

    def generate(
        self,
        request_id: int,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
    ) -> Iterator[RemoteEvent]:
        """Stream a reply: its text as `TokenChunk`s (one token a chunk: servers stream so), then `Finished` (text
        kept when stopped: "cancelled") or `Failed` with a one-line message. Messages are plain turns."""
        stream = _Stream(request_id, time.monotonic())
        with self._lock:
            self._streams[request_id] = stream
        try:
            yield from self._outcome(stream, messages, sampling, continue_reply)
        finally:
            with self._lock:
                self._streams.pop(request_id, None)

    def cancel(self, request_id: int) -> None:
        """Stop a reply: the stream is closed at once; it ends with Finished ("cancelled"), the text so far kept."""
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        """Stop every reply in flight. Idempotent."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.cancel()

    def _outcome(
        self,
        stream: _Stream,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        continue_reply: bool,
    ) -> Iterator[RemoteEvent]:
        """The reply's events, its end included whatever happens (a surprise is a one-line Failed)."""
        request_id = stream.request_id
        try:
            shape = response_format_fields(sampling.output_format, sampling.output_file)
            schema = shape.get("response_format", {}).get("json_schema", {}).get("schema")
            told = format_instruction(sampling.output_format, None if schema is None else json.dumps(schema))
            chat = instructed([m if isinstance(m, ChatMessage) else ChatMessage(*m) for m in messages], told)
            body = request_body(self.model, [(m.role, m.content) for m in chat], sampling, continue_reply)
            stop_reason, stats = yield from self._stream_reply(stream, {**body, **shape})
            # a server's own finish reasons ("content_filter"…) are passed on as it says them, made safe to show
            yield Finished(request_id, cast(StopReason, stop_reason), stats)
            return
        except OutputFormatError as error:
            message = str(error)
        except _Cancelled:
            message = ""
        except RemoteError as error:
            message = "" if stream.cancelled else str(error)
        except HTTPFailure as failure:
            if stream.cancelled:
                message = ""
            elif stream.n_tokens:
                message = (
                    f"the connection to {self.remote.name} broke mid-reply "
                    f"({one_line(failure.detail or failure.kind, 60)}); the partial reply is kept"
                )
            else:
                message = failure_message(self.remote, failure)
        except Exception as error:  # never let a reply's thread die silently; its reader hears about it
            message = one_line(f"{type(error).__name__}: {error}")
        if message:
            yield Failed(request_id, "RemoteError", message)
        else:
            yield Finished(request_id, "cancelled", self._stats(stream, {}, {}))

    def _stream_reply(
        self, stream: _Stream, body: dict[str, Any]
    ) -> Generator[TokenChunk, None, tuple[str, ServerStats]]:
        """The reply's text as it streams; returns its stop reason and stats."""
        # The answer must start within the read timeout (the server may think that long about the prompt), and its
        # headers then come within HEADER_TIME_S however slowly their bytes drip (the request's Guard); the body's
        # lines have their own limits (sse_events), and its text the stall limit.
        guard = stream.guard
        guard.header_limit_s = min(HEADER_TIME_S, self._read_timeout_s)
        guard.set_limit(self._read_timeout_s)
        if stream.cancelled:
            raise _Cancelled
        try:
            response = open_request(
                self.remote,
                "POST",
                "chat/completions",
                guard,
                body=json.dumps(body).encode(),
                connect_timeout_s=self._connect_timeout_s,
                read_timeout_s=self._read_timeout_s,
            )
        except HTTPFailure as failure:
            if stream.cancelled:
                raise _Cancelled from None
            if failure.kind == "deadline":
                what = "the reply's headers" if guard.answered else "an answer"
                raise too_slow(self.remote, what, guard.limit_s or 0.0) from None
            raise RemoteError(failure_message(self.remote, failure)) from None
        try:
            guard.set_limit(None)
            if response.status != 200:
                raise read_error(self.remote, response)
            return (yield from self._read_reply(stream, response.chunks(), body))
        finally:
            response.close()

    def _read_reply(
        self, stream: _Stream, chunks: Iterator[bytes], body: dict[str, Any]
    ) -> Generator[TokenChunk, None, tuple[str, ServerStats]]:
        """The streamed reply's text, chunk by chunk, within the reply's limits; returns its stats."""
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
            silence counts too: the stall limit becomes each read's timeout)."""
            if time.monotonic() - (stream.last_token_at or body_started) > stall_s:
                raise stalled
            if stream.last_token_at is not None:
                stream.guard.stall_s = min(stall_s, self._read_timeout_s)

        events = sse_events(chunks, self.remote.name, min(SSE_LINE_TIME_S, self._read_timeout_s), check_stall)
        while True:
            try:
                data = next(events)
            except StopIteration:
                break
            except HTTPFailure as failure:
                if failure.kind != "stall" or stream.cancelled or stream.last_token_at is None:
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
            piece, finished_with = self._chunk(stream, chunk)
            finish = finished_with or finish
            if piece is not None:
                yield piece
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
        return STOP_REASONS.get(finish or "stop", one_line(finish or "eos", 40)), self._stats(stream, usage, timings)

    def _chunk(self, stream: _Stream, chunk: dict[str, Any]) -> tuple[TokenChunk | None, str | None]:
        """One chunk's text and reasoning (None: neither), and its finish_reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None, None
        choice = choices[0]
        delta = choice.get("delta")
        piece: TokenChunk | None = None
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
                    stream.n_tokens += 1  # servers stream one token per chunk
                    if stream.first_token_at is None:
                        stream.first_token_at = now
                    stream.last_token_at = now
                piece = TokenChunk(
                    stream.request_id, content, reasoning, (UNKNOWN_TOKEN,), ("target",), (len(content),)
                )
        finish = choice.get("finish_reason")
        return piece, finish if isinstance(finish, str) else None

    def _stats(self, stream: _Stream, usage: dict[str, Any], timings: dict[str, Any]) -> ServerStats:
        """A finished reply's stats: the server's timings where it reports them (llama-server), else measured here."""
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
        draft_n, accepted = number(timings, "draft_n"), number(timings, "draft_n_accepted")
        reported = draft_n is not None and accepted is not None
        return ServerStats(
            prompt_tokens=prompt + cached,
            prompt_tokens_cached=cached,
            prompt_tokens_evaluated=prompt,
            prompt_ms=number(timings, "prompt_ms") or ttft_ms,
            generated_tokens=generated,
            decode_ms=number(timings, "predicted_ms") or decode_s * 1000,
            ttft_ms=ttft_ms,
            n_ctx=self.n_ctx,
            n_ctx_used=prompt + cached + generated,
            backend=self.backend,
            timings_from="server" if timings else "client",
            prompt_tps_reported=number(timings, "prompt_per_second") or 0.0,
            decode_tps_reported=decode_tps,
            draft_n=int(draft_n) if reported and draft_n is not None else None,
            draft_n_accepted=int(accepted) if reported and accepted is not None else None,
        )


def draft_summary(stats: dict[str, Any]) -> str | None:
    """The stats bar's readout of a server's speculative decoding ("71% 45/63"), when it reported it."""
    drafted, accepted = stats.get("draft_n"), stats.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int) or drafted <= 0:
        return None
    return f"{accepted / drafted:.0%} {accepted}/{drafted}"
