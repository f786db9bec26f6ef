"""Test doubles shared by the test files: a scripted engine client the app's real bridge drives, and the app built on
it; a message collector standing in for the App; a stdlib OpenAI-compatible server. One definition here instead of
one per test file."""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.message import Message

from app.tui.messages import EngineMessage
from engine_ext.protocol import (
    Cancel,
    Finished,
    Generate,
    GenerationStats,
    Hello,
    Loaded,
    LoadModel,
    ModelInfo,
    SpeculativeStats,
    SpeculativeUpdate,
    TokenChunk,
)
from tests.quiet_http import QuietHTTPServer

if TYPE_CHECKING:
    from app.core.config import SamplingSettings
    from app.tui.app import LlmtuiApp


def scripted_model_info(
    path: str = "/models/m.gguf", *, n_threads: int = 1, description: str = "scripted", n_ctx: int = 4096
) -> ModelInfo:
    """What a scripted engine says it loaded: a one-layer llama on the CPU."""
    return ModelInfo(
        path=path,
        architecture="llama",
        description=description,
        n_params=1,
        size_bytes=1,
        n_ctx=n_ctx,
        n_ctx_train=4096,
        n_embd=1,
        n_layer=1,
        n_layer_nextn=0,
        n_vocab=1,
        is_recurrent=False,
        is_hybrid=False,
        has_chat_template=True,
        n_threads=n_threads,
        backend="CPU",
        load_ms=1.0,
    )


class ScriptedEngine:
    """Stands in for engine_ext.client.EngineClient behind the app's real EngineBridge (`client_factory`): it loads
    at once and streams each reply from a thread. Subclasses write `stream(request)` (put protocol events on
    `self.events`) and may change `model_info(request)`. Cancelled request ids collect in `self.cancelled`."""

    PID = 4242

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.events: queue.Queue[object] = queue.Queue()
        self.pid: int | None = self.PID
        self.stop = threading.Event()  # set by close(): streams end
        self.cancelled: set[int] = set()
        self.requests: list[object] = []

    def start(self) -> Hello:
        return Hello(protocol_version=1, pid=self.PID, llama_cpp_version="scripted", system_info="")

    def close(self, timeout_s: float = 5.0) -> None:
        self.stop.set()

    def wait_handles(self) -> list[object]:
        return []  # nothing to wait on: the bridge polls next_event

    def next_event(self, timeout: float | None = None) -> object | None:
        try:
            return self.events.get(timeout=timeout) if timeout else self.events.get_nowait()
        except queue.Empty:
            return None

    def send(self, request: object) -> None:
        self.requests.append(request)
        if isinstance(request, Cancel):
            self.cancelled.add(request.request_id)
        elif isinstance(request, LoadModel):
            self.events.put(Loaded(self.model_info(request)))
        elif isinstance(request, Generate):
            threading.Thread(target=self.stream, args=(request,), daemon=True).start()

    def model_info(self, request: LoadModel) -> ModelInfo:
        return scripted_model_info(request.path)

    def stream(self, request: Generate) -> None:
        raise NotImplementedError


def scripted_app(
    model: Path, client: type[ScriptedEngine], *, sampling: SamplingSettings | None = None, cpu_sampler: object = None
) -> LlmtuiApp:
    """The app on `model` (a tiny GGUF: the scripted engine loads nothing) with `client` behind its real bridge, in
    the test's own config and data dirs (tests/conftest.py). `cpu_sampler` as EngineBridge takes it (None: off)."""
    from app.core.config import SamplingSettings
    from app.tui.app import LlmtuiApp
    from app.tui.bridge import EngineBridge

    app = LlmtuiApp(str(model), default_sampling=sampling or SamplingSettings())
    extra = {} if cpu_sampler is None else {"cpu_sampler": cpu_sampler}
    app.bridge = EngineBridge(
        app,
        Path("scripted.log"),
        client_factory=client,  # type: ignore[arg-type]
        backlog=lambda: app.message_queue_size,
        **extra,
    )  # type: ignore[arg-type]
    return app


# ----- the App as a message target, and an OpenAI-compatible server -------------------------------------------

WAIT_S = 30.0


class Collector:
    """A MessageTarget standing in for the App: keeps the engine events its EngineMessages carry (with what each
    answers), thread-safely, and waits for one of a kind."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.answers: list[str] = []
        self._changed = threading.Condition()

    def post_message(self, message: Message) -> bool:
        assert isinstance(message, EngineMessage), message
        with self._changed:
            self.events.append(message.event)
            self.answers.append(message.answers)
            self._changed.notify_all()
        return True

    def wait_for(self, kind: type | tuple[type, ...], timeout: float = WAIT_S, *, answers: str | None = None) -> Any:
        """The first event of `kind` (answering `answers`, when given)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next(iter(self._of(kind, answers)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    got = [type(m).__name__ for m in self.events]
                    raise AssertionError(f"no {kind} within {timeout} s; got {got}")
                self._changed.wait(left)

    def _of(self, kind: type | tuple[type, ...], answers: str | None) -> list[Any]:
        return [
            e for e, a in zip(self.events, self.answers, strict=True) if isinstance(e, kind) and answers in (None, a)
        ]

    def of(self, kind: type | tuple[type, ...], *, answers: str | None = None) -> list[Any]:
        with self._changed:
            return self._of(kind, answers)

    def text(self) -> str:
        return "".join(m.text for m in self.of(TokenChunk))


def sse(chunks: list[dict[str, Any] | str]) -> list[bytes]:
    return [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]


def delta(content: str = "", reasoning: str = "", finish: str | None = None) -> dict[str, Any]:
    piece: dict[str, Any] = {}
    if content:
        piece["content"] = content
    if reasoning:
        piece["reasoning_content"] = reasoning
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": piece, "finish_reason": finish}]}


# A llama-server (b6000-era) stream with speculative decoding on: reasoning, text, the final chunk's timings.
LLAMA_SERVER_STREAM: list[dict[str, Any] | str] = [
    delta(reasoning="The user says hi."),
    delta(reasoning=" Answer briefly."),
    delta(content="Hello"),
    delta(content=" there"),
    delta(content="!"),
    {
        **delta(finish="stop"),
        "timings": {
            "cache_n": 3,
            "prompt_n": 11,
            "prompt_ms": 12.5,
            "prompt_per_second": 880.0,
            "predicted_n": 5,
            "predicted_ms": 40.0,
            "predicted_per_second": 125.0,
            "draft_n": 8,
            "draft_n_accepted": 6,
        },
    },
    {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 14, "completion_tokens": 5, "total_tokens": 19},
    },
    "[DONE]",
]


class FakeServer:
    """A stdlib OpenAI-compatible server whose chat answer is `behaviour`; records the requests it gets."""

    def __init__(self, behaviour: str, models: tuple[str, ...] = ("fake-model",)) -> None:
        self.behaviour = behaviour
        self.models = models
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.disconnected = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, payload: object) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                owner.requests.append((self.path, dict(self.headers), b""))
                if owner.behaviour == "401":
                    self._json(401, {"error": {"message": "Invalid API key", "type": "invalid_request_error"}})
                elif self.path == "/v1/models":
                    self._json(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": m, "object": "model", "max_model_len": 2048} for m in owner.models],
                        },
                    )
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.requests.append((self.path, dict(self.headers), body))
                if owner.behaviour == "401":
                    self._json(401, {"error": {"message": "Invalid API key", "type": "invalid_request_error"}})
                    return
                if owner.behaviour == "500":
                    self._json(500, {"error": {"message": "CUDA out of memory", "type": "server_error"}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                chunks: list[bytes] = {
                    "replay": sse(LLAMA_SERVER_STREAM),
                    "drop": sse([delta(content="Partial"), delta(content=" reply")]),
                    "stall": sse([delta(content="Thinking")]),
                    "error-event": sse([delta(content="Half"), {"error": {"message": "the model crashed"}}]),
                }[owner.behaviour]
                for chunk in chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                if owner.behaviour == "stall":  # silent until the client goes away
                    try:
                        while True:
                            time.sleep(0.05)
                            self.wfile.write(b": keep-alive\n\n")
                            self.wfile.flush()
                    except OSError:
                        owner.disconnected.set()
                self.close_connection = True

        self.server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----- engine events posted to the App as the engines post them -------------------------------------------------


def engine_message(app: LlmtuiApp, event: Any, answers: str = "") -> EngineMessage:
    """`event` as the app's engine posts it (app/tui/messages.py)."""
    return EngineMessage(event, app.bridge, answers)


def speculative_event(stats: SpeculativeStats, *, final: bool) -> SpeculativeUpdate | Finished:
    """Speculative figures as the engine says them: live (SpeculativeUpdate), or a reply's end carrying its final
    ones (Finished)."""
    if not final:
        return SpeculativeUpdate(stats)
    return Finished(stats.request_id, "eos", GenerationStats(0, 0, 0, 0.0, 0, 0.0, 0.0, 0, 0), speculative=stats)


def drafted_chunk(request_id: int, text: str, spans: tuple[tuple[int, int, str], ...] = ()) -> TokenChunk:
    """A token chunk of `text` whose accepted drafts are `spans` ((start, end, drafter)): one token per span and
    one per stretch of the target's own text between them."""
    ends: list[int] = []
    provenance: list[str] = []
    at = 0
    for start, end, drafter in spans:
        if start > at:
            ends.append(start)
            provenance.append("target")
        ends.append(end)
        provenance.append(drafter)
        at = end
    if at < len(text) or not ends:
        ends.append(len(text))
        provenance.append("target")
    return TokenChunk(request_id, text, "", tuple(range(len(ends))), tuple(provenance), tuple(ends))
