"""A remote OpenAI-compatible server (llama-server, vLLM, SGLang…) as the app's engine.

`RemoteBridge` runs `app/core/remote_engine.py`'s `RemoteClient` in threads and passes its events to the App as the
local engine does: `EngineMessage`s carrying the engine protocol's events, token chunks merged by the one batching
(`app/tui/streaming.py`'s `TokenBatches`, flushed by one thread), with the reply's live figures. What a remote server
cannot do (llmtui's speculative decoding, control vectors) is refused with a `Failed` answering that request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from app.core.config import Config, EngineSettings, RemoteSettings, SamplingSettings
from app.core.engine import Engine, EngineCapabilities, EngineEvent, LoadStarted, ModelSummary
from app.core.remote_engine import RemoteClient, remote_path
from app.core.remote_http import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, RemoteError
from app.tui.messages import EngineMessage, MessageTarget
from app.tui.streaming import ReplyInFlight, TokenBatches
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.protocol import ChatMessage, Failed, Loaded, ModelInfo, SpeculativeSet, TokenChunk
from engine_ext.spec_catalog import SPEC_TYPE
from engine_ext.untrusted_text import one_line, shown


class RemoteBridge(Engine):
    """A remote OpenAI-compatible server as the app's engine. Every call returns at once."""

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
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self._target = target
        self.client = RemoteClient(remote, model, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        self._backlog = backlog or (lambda: 0)
        self._batches = TokenBatches()  # the one batching of streamed tokens (app/tui/streaming.py)
        self._replies: dict[int, ReplyInFlight] = {}
        self._lock = threading.Condition()  # the batches and the replies: the streams' threads and the flusher
        self._flusher: threading.Thread | None = None
        self._closed = False

    @property
    def remote(self) -> RemoteSettings:
        return self.client.remote

    @property
    def model(self) -> str:
        """The model in use ('' : the server's first, until connected)."""
        return self.client.model

    @property
    def model_path(self) -> str:
        return self.client.model_path

    @property
    def pid(self) -> int | None:
        return None

    def _post(self, event: EngineEvent, answers: str = "") -> None:
        if not self._closed:
            self._target.post_message(EngineMessage(event, self, answers))

    def _thread(self, target: Any, *args: Any) -> None:
        threading.Thread(target=target, args=args, name="llmtui-remote", daemon=True).start()

    # ----- the Engine interface -----

    def start(self) -> None:
        """Nothing to start: the server runs elsewhere."""

    def describe(self, info: ModelInfo) -> ModelSummary:
        return ModelSummary(
            path=info.path,
            name=shown(info.description),
            architecture="remote",
            backend=info.backend,
            n_ctx=info.n_ctx,
            n_params=0,
            size_bytes=0,
            load_ms=info.load_ms,
        )

    def load(self, path: str, engine: EngineSettings | None = None, **_options: Any) -> None:
        """Use the model `path` names ("remote:NAME/MODEL", or a bare model id): checks the server lists it."""
        prefix = remote_path(self.remote.name, "")
        self.client.model = path.removeprefix(prefix) if path.startswith(prefix) else path
        self.connect()

    def connect(self) -> None:
        """List the server's models and announce the chosen one: Loaded, or Failed (answering the load) saying why."""
        self._thread(self._connect)

    def restart(self, engine: EngineSettings | None = None) -> None:
        """Connect again (after an error); replies in flight are stopped."""
        self.client.close()
        self.connect()

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        """Stream a reply; its request id. A remote engine is offered no tools (its capabilities: its calls are not
        read back), so `tools` is None here and the messages are plain turns."""
        request_id = self.client.new_request_id()
        with self._lock:
            self._replies[request_id] = ReplyInFlight(request_id, time.monotonic())
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="llmtui-remote-flush", daemon=True)
                self._flusher.start()
        self._thread(self._stream, request_id, messages, sampling, continue_reply)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Stop a reply: the stream is closed at once; the text so far is kept (Finished, cancelled)."""
        self.client.cancel(request_id)

    def set_speculative(self, params: SpeculativeParams) -> None:
        if not params.enabled:
            self._post(SpeculativeSet(()))
            return
        self._refuse(
            "speculative",
            f"{self.remote.name} is a remote server: it does its own speculative decoding (llama-server: "
            f"--model-draft, {SPEC_TYPE.flag}), and its draft acceptance shows in the stats bar when it reports it",
        )

    def set_steering(self, entries: tuple[SteeringEntry, ...]) -> None:
        if entries:
            self._refuse("steering", f"control vectors need the local engine; {self.remote.name} is a remote server")

    def make_vector(self, prompt_set_path: str, output_path: str, method: str = "pca") -> None:
        self._refuse("vector", f"making a control vector needs a local model; {self.remote.name} is a remote server")

    def settings_saved(self, config: Config) -> None:
        """An edited endpoint (a new key, say) applies from the next request."""
        self.client.remote = next((r for r in config.remotes if r.name == self.remote.name), self.remote)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every reply in flight; nothing is posted afterwards. Idempotent."""
        self._closed = True
        self.client.close()
        with self._lock:
            self._lock.notify_all()

    # ----- threads -----

    def _refuse(self, kind: str, message: str) -> None:
        self._post(Failed(None, "NotSupported", message), kind)

    def _connect(self) -> None:
        self._post(LoadStarted(self.model_path))
        try:
            info = self.client.connect()
        except Exception as error:  # RemoteError, or a surprise: the UI hears about it either way
            message = str(error) if isinstance(error, RemoteError) else one_line(f"{type(error).__name__}: {error}")
            self._post(Failed(None, type(error).__name__, message), "load")
            return
        self._post(Loaded(info))

    def _stream(
        self,
        request_id: int,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        continue_reply: bool,
    ) -> None:
        """One reply's events: its chunks to the batches, its end (after the text) to the App."""
        for event in self.client.generate(request_id, messages, sampling, continue_reply=continue_reply):
            with self._lock:
                if isinstance(event, TokenChunk):
                    now = time.monotonic()
                    self._batches.add(event, now)
                    reply = self._replies.get(request_id)
                    if reply is not None:
                        reply.took(event, now)
                    self._lock.notify_all()
                    continue
                self._flush(force=True)
                self._replies.pop(request_id, None)
            self._post(event)

    def _flush_loop(self) -> None:
        """The flusher: posts the batches when due, as the local bridge's reader does (TokenBatches' timing)."""
        with self._lock:
            while not self._closed:
                self._lock.wait(self._batches.wait_s(time.monotonic()))
                self._flush(force=False)

    def _flush(self, *, force: bool) -> None:
        """Post the batches that are due, and the live figures of their replies that are due (the lock held)."""
        now = time.monotonic()
        if not self._batches.due(now, 0 if force else self._backlog(), force=force):
            return
        for batch in self._batches.take(now):
            self._post(batch)
            reply = self._replies.get(batch.request_id)
            if reply is not None and reply.stats_due(now):
                self._post(reply.stats(now))
