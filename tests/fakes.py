"""Test doubles shared by the test files: a scripted engine client the app's real bridge drives, and the app built on
it. One definition here instead of one per test file."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine_ext.protocol import Cancel, Generate, Hello, Loaded, LoadModel, ModelInfo

if TYPE_CHECKING:
    from app.config import SamplingSettings
    from app.tui import LlmtuiApp


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
    from app.bridge import EngineBridge
    from app.config import SamplingSettings
    from app.tui import LlmtuiApp

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
