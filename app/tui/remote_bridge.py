"""Remote engines: any OpenAI-compatible server (llama-server, vLLM, SGLang…) behind the engine bridge's interface.

`RemoteBridge` posts the same `app.tui.messages` messages as `EngineBridge` (ModelLoaded, TokensArrived,
GenerationStatsUpdated, GenerationFinished, GenerationFailed…), so the chat screen, the history store and the
stats bar work unchanged. The HTTP side (model list, request, server-sent events, errors) is app/core/remote_http.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from textual.message import Message

from app.core.config import Config, EngineSettings, RemoteSettings, SamplingSettings
from app.core.engine import Engine, EngineCapabilities
from app.core.output_format import OutputFormatError, response_format_fields
from app.core.remote_engine import (
    HEADER_TIME_S,
    MAX_EVENT_ITEMS,
    MAX_REPLY_CHARS,
    MAX_REPLY_TOKENS,
    STOP_REASONS,
    TOKEN_SLACK,
    _Cancelled,
    _request_ids,
    _Stream,
    remote_path,
)
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
from app.tui.messages import (
    EngineRequestFailed,
    GenerationFailed,
    GenerationFinished,
    GenerationStatsUpdated,
    MessageTarget,
    ModelLoaded,
    ModelLoadFailed,
    ModelLoadStarted,
    ModelSummary,
    SpeculativeConfigured,
    TokensArrived,
)
from app.tui.streaming import FLUSH_INTERVAL_S, STATS_INTERVAL_S
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.protocol import ChatMessage
from engine_ext.spec_catalog import SPEC_TYPE
from engine_ext.untrusted_text import one_line, shown, valid_text
from models_catalog.http_client import HTTPFailure, json_items


class RemoteBridge(Engine):
    """A remote OpenAI-compatible server as the app's engine.

    Every call returns at once; the HTTP work runs in threads that post `app.tui.messages` messages. What a remote
    server cannot do (llmtui's speculative decoding, control vectors) is refused with EngineRequestFailed.
    """

    capabilities = EngineCapabilities(loads_files=False)
    """Text only: no tools (its calls are not read back), no llmtui speculation or steering, no images."""

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

    # ----- the Engine interface -----

    def start(self) -> None:
        """Nothing to start: the server runs elsewhere."""

    def load(self, path: str, engine: EngineSettings | None = None, **_options: Any) -> None:
        """Use the model `path` names ("remote:NAME/MODEL", or a bare model id): checks the server lists it."""
        prefix = remote_path(self.remote.name, "")
        self.model = path.removeprefix(prefix) if path.startswith(prefix) else path
        self.connect()

    def connect(self) -> None:
        """List the server's models and announce the chosen one: ModelLoaded, or ModelLoadFailed saying why."""
        self._thread(self._connect)

    def restart(self, engine: EngineSettings | None = None) -> None:
        """Connect again (after an error); replies in flight are stopped."""
        for stream in self._active():
            stream.cancel()
        self.connect()

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        """Stream a reply; its request id (carried by its TokensArrived / GenerationFinished / GenerationFailed).
        A remote engine is offered no tools (its capabilities: its calls are not read back), so `tools` is None here
        and the messages are plain turns."""
        request_id = next(_request_ids)
        stream = _Stream(request_id, time.monotonic())
        with self._lock:
            self._streams[request_id] = stream
        pairs = [(m.role, m.content) if isinstance(m, ChatMessage) else m for m in messages]
        body = request_body(self.model, pairs, sampling, continue_reply)
        self._thread(self._generate, stream, body, (sampling.output_format, sampling.output_file))
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
                f"--model-draft, {SPEC_TYPE.flag}), and its draft acceptance shows in the stats bar when it reports it",
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

    def settings_saved(self, config: Config) -> None:
        """An edited endpoint (a new key, say) applies from the next request."""
        self.remote = next((r for r in config.remotes if r.name == self.remote.name), self.remote)

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

    def _generate(self, stream: _Stream, body: dict[str, Any], shape: tuple[str, str]) -> None:
        """Stream a reply; `shape`: its output format and file (read here, not on the UI thread)."""
        flusher = threading.Thread(target=self._flush_loop, args=(stream,), name="llmtui-remote-flush", daemon=True)
        flusher.start()
        outcome: tuple[str, str | dict[str, Any]] = ("failed", "the reply ended unexpectedly")
        try:
            outcome = ("finished", self._stream_reply(stream, {**body, **response_format_fields(*shape)}))
        except OutputFormatError as error:
            outcome = ("failed", str(error))
        except _Cancelled:
            outcome = ("cancelled", "")
        except RemoteError as error:
            outcome = ("cancelled", "") if stream.cancelled else ("failed", str(error))
        except HTTPFailure as failure:
            if stream.cancelled:
                outcome = ("cancelled", "")
            elif stream.n_tokens:
                outcome = (
                    "failed",
                    f"the connection to {self.remote.name} broke mid-reply "
                    f"({one_line(failure.detail or failure.kind, 60)}); the partial reply is kept",
                )
            else:
                outcome = ("failed", failure_message(self.remote, failure))
        except Exception as error:  # never let a thread die silently; the UI hears about it
            outcome = ("failed", one_line(f"{type(error).__name__}: {error}"))
        finally:
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

    def _stream_reply(self, stream: _Stream, body: dict[str, Any]) -> dict[str, Any]:
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
            return self._read_reply(stream, response.chunks(), body)
        finally:
            response.close()

    def _read_reply(self, stream: _Stream, chunks: Iterator[bytes], body: dict[str, Any]) -> dict[str, Any]:
        """The streamed reply's events taken into `stream`, within the reply's limits; its stats."""
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
