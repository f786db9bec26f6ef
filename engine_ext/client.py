"""The engine client: starts the worker process and talks to it; the only way app/ reaches the engine."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, TypeVar

from engine_ext.engine_status import EngineStatus
from engine_ext.params import ContextParams, DiskCacheParams, ModelParams, SpeculativeParams, SteeringEntry
from engine_ext.private_files import private_dir
from engine_ext.protocol import (
    PROTOCOL_VERSION,
    Cancel,
    Crashed,
    Embed,
    Embedded,
    EndThinking,
    Event,
    Failed,
    Finished,
    Generate,
    Hello,
    Inspect,
    Inspected,
    Loaded,
    LoadModel,
    LoadProgress,
    MakeControlVector,
    ModelInfo,
    Request,
    SetQueueLimit,
    SetSpeculative,
    SetSteering,
    Shutdown,
    SlotAction,
    SlotDone,
    SpeculativeSet,
    SteeringSet,
    Submit,
    Unloaded,
    UnloadModel,
    VectorMade,
    VectorProgress,
)
from engine_ext.recovery import RepackMemory, blames_repacking, next_skip, retry_notice
from engine_ext.watchdog import Watchdog

LOG_TAIL_LINES = 40
_E = TypeVar("_E")


class EngineFailure(Exception):
    """The worker reported an error for a request (bad file, bad setting, …)."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.message)
        self.failed = failed


class EngineCrashedError(Exception):
    """The worker process died; `crashed` carries the exit status and the tail of its log."""

    def __init__(self, crashed: Crashed) -> None:
        super().__init__(f"{crashed.description}\n{crashed.log_tail}".rstrip())
        self.crashed = crashed
        self.advice = ""  # what could avoid it (settings to try), when the caller knows


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


class EngineClient:
    """Starts an engine worker process and exchanges protocol messages with it.

    `send()` may be called from any thread; events are read by one consumer at a time (`next_event`,
    `events`, or the blocking helpers `load`, `generate`, `inspect`).

    Every path that stops a reply goes through `cancel`: a worker that has not read the Cancel about a second later
    (stuck in one native call) is killed by the client's watchdog (engine_ext.watchdog), and its `Crashed` event
    says so in `stopped`; `step_limit_s` also bounds one step of a reply (0: no bound).
    """

    def __init__(self, log_path: Path, *, start_timeout_s: float = 120.0, memory: RepackMemory | None = None) -> None:
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.memory = memory  # which CPU extra buffer types crashed here (None: nothing remembered, e.g. in tests)
        self.skip_bufts: tuple[str, ...] = memory.skipped() if memory is not None else ()
        self._conn: Connection | None = None
        self._process: Any = None
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.hello: Hello | None = None
        self.model_info: ModelInfo | None = None
        self.crashed: Crashed | None = None
        self._status: EngineStatus | None = None  # what the worker is doing (engine_ext.engine_status)
        self._sent = 0  # requests sent to this worker (the worker counts those it read)
        self._stopped = ""  # why the watchdog ended the worker ("" : it did not)
        self._watchdog = Watchdog(self._end_stuck_worker)

    @property
    def step_limit_s(self) -> float:
        """The most seconds a worker may spend in one step of a reply before it is ended (0: no limit)."""
        return self._watchdog.step_limit_s

    @step_limit_s.setter
    def step_limit_s(self, seconds: float) -> None:
        self._watchdog.set_step_limit(seconds)

    # ----- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Hello:
        """Start a worker (a fresh one after a crash) and wait for its greeting."""
        from engine_ext.worker import worker_main

        self.close()
        self.crashed = None
        self.model_info = None
        mp = multiprocessing.get_context("spawn")
        parent, child = mp.Pipe(duplex=True)
        status = EngineStatus.shared(mp)
        process = mp.Process(
            target=worker_main,
            args=(child, str(self.log_path), self.skip_bufts, status.values),
            name="llmtui-engine",
            daemon=True,
        )
        private_dir(self.log_path.parent)
        process.start()
        child.close()  # so the pipe reports EOF when the worker dies
        self._conn, self._process = parent, process
        self._status, self._sent, self._stopped = status, 0, ""
        self._watchdog.watch(status)
        event = self.next_event(timeout=self.start_timeout_s)
        if isinstance(event, Crashed):
            raise EngineCrashedError(event)
        if not isinstance(event, Hello):
            self.close()
            raise RuntimeError(f"the engine worker did not start (got {event!r})")
        if event.protocol_version != PROTOCOL_VERSION:
            self.close()
            raise RuntimeError(
                f"engine protocol {event.protocol_version} does not match the client's {PROTOCOL_VERSION}"
            )
        self.hello = event
        return event

    def drop_crashed_repack(self, model: ModelParams, keep_off: str) -> str | None:
        """After an early native crash (while loading or in the first replies) with weights repacked: leave out the
        first CPU extra buffer type the crashed worker repacked for at the next start, remember that for this CPU
        and engine build, and return the one line to say (`keep_off`: how to turn repacking off for good). None
        when nothing is left to drop, or the crash was in a phase where repacked weights are not used (a grammar,
        the tokenizer, a sampler: engine_ext.recovery.blames_repacking) or not a crash (the watchdog's)."""
        crashed = self.crashed
        if crashed is not None and (crashed.stopped or not blames_repacking(crashed.phase)):
            return None
        extra = self.hello.cpu_extra_bufts if self.hello is not None else ()
        skip = next_skip(model, self.skip_bufts, extra)
        if skip is None:
            return None
        self.skip_bufts = skip
        if self.memory is not None:
            try:
                self.memory.remember(skip)
            except OSError:
                pass  # not remembered (a read-only or full disk): this start still recovers
        return retry_notice(extra[0], extra[1:], keep_off)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive() and self.crashed is None

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to shut down, then make sure it is gone (idempotent)."""
        conn, process = self._conn, self._process
        self._conn = self._process = None
        self._watchdog.watch(None)
        if conn is not None:
            try:
                with self._send_lock:
                    conn.send(Shutdown())
            except (OSError, ValueError):
                pass
        if process is not None:
            # A worker that has not read the Shutdown a moment later is stuck in a native call: it ends now (Ctrl+C
            # on `serve` or `run`, quitting the app), not after `timeout_s`. One that is loading gets the time.
            status, sent = self._status, self._sent + 1  # the Shutdown is the worker's last request
            process.join(min(timeout_s, self._watchdog.grace_s))
            if process.is_alive() and not (status is not None and (status.reads >= sent or status.phase == "load")):
                process.kill()
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join(timeout_s)
        if conn is not None:
            conn.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- messages ---------------------------------------------------------------------------------

    def send(self, request: Request) -> None:
        conn = self._conn
        if conn is None:
            raise EngineCrashedError(self.crashed or Crashed(None, "the engine is not running"))
        try:
            with self._send_lock:
                conn.send(request)
                self._sent += 1
                if isinstance(request, Cancel):
                    self._watchdog.cancel_sent(self._sent)
        except (OSError, ValueError) as exc:
            raise EngineCrashedError(self._crash()) from exc

    def _end_stuck_worker(self, status: EngineStatus, reason: str) -> None:
        """The watchdog's verdict (its thread): kill the worker; the reader sees it die and reports `reason`."""
        process = self._process
        if process is None or status is not self._status:  # that worker is gone already
            return
        self._stopped = reason
        process.kill()

    def wait_handles(self) -> list[Any]:
        """What to wait on (multiprocessing.connection.wait) for the next event: the pipe, and the worker's
        sentinel, ready when it exits; empty when there is no worker."""
        conn, process = self._conn, self._process
        return [conn, process.sentinel] if conn is not None and process is not None else []

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, None on timeout, or a Crashed event when the worker died."""
        conn = self._conn
        if conn is None:
            return self.crashed or Crashed(None, "the engine is not running")
        try:
            if timeout is not None and not conn.poll(timeout):
                if self._process is not None and not self._process.is_alive():
                    return self._crash()
                return None
            return conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            return self._crash()

    def _crash(self) -> Crashed:
        process = self._process
        exit_code: int | None = None
        if process is not None:
            process.join(5.0)
            exit_code = process.exitcode
        status = self._status
        crashed = Crashed(
            exit_code,
            read_log_tail(self.log_path),
            str(self.log_path),
            self.hello.gpu_devices if self.hello is not None else 0,
            status.phase if status is not None else "",
            self._stopped,
        )
        self.crashed = crashed
        self._watchdog.watch(None)
        if self._conn is not None:
            self._conn.close()
        self._conn = self._process = None
        self.model_info = None
        return crashed

    def events(self) -> Iterator[Event]:
        """Events until the worker dies (ends with a Crashed event)."""
        while True:
            event = self.next_event()
            if event is None:
                continue
            yield event
            if isinstance(event, Crashed):
                return

    # ----- blocking helpers (CLI, tests) ------------------------------------------------------------

    def new_request_id(self) -> int:
        return next(self._ids)

    def _answer(self, kind: type[_E], on_event: Callable[[Event], None] | None = None) -> _E:
        """Events until the first of `kind`; Failed and Crashed become exceptions; others go to on_event."""
        for event in self.events():
            if isinstance(event, kind):
                return event
            if isinstance(event, Failed):
                raise EngineFailure(event)
            if isinstance(event, Crashed):
                raise EngineCrashedError(event)
            if on_event is not None:
                on_event(event)
        raise AssertionError("unreachable: events() ends with Crashed")

    def load(
        self,
        path: Path | str,
        model: ModelParams = ModelParams(),
        context: ContextParams = ContextParams(),
        on_progress: Callable[[float], None] | None = None,
        disk_cache: DiskCacheParams = DiskCacheParams(),
    ) -> ModelInfo:
        def progress(event: Event) -> None:
            if isinstance(event, LoadProgress) and on_progress is not None:
                on_progress(event.fraction)

        self.send(LoadModel(str(path), model, context, disk_cache))
        info = self._answer(Loaded, progress).info
        self.model_info = info
        return info

    def slot(self, action: Literal["save", "restore", "erase"], path: str = "") -> SlotDone:
        """llama-server's slot save / restore / erase on the single sequence (SlotAction); EngineFailure when the
        engine refuses (a file that is not a state file of this model, build and settings: one line)."""
        self.send(SlotAction(action, path))
        return self._answer(SlotDone)

    def embed(self, texts: Sequence[str], *, query: str | None = None, normalize: bool = True) -> Embedded:
        """Pooled embeddings of `texts` from the loaded model (with `query`: a reranker's scores of them against it);
        EngineFailure, one line, when the model cannot (engine_ext.embedding)."""
        self.send(Embed(tuple(texts), query, normalize))
        return self._answer(Embedded)

    def unload(self) -> None:
        self.send(UnloadModel())
        self._answer(Unloaded)
        self.model_info = None

    def generate(self, request: Generate) -> Iterator[Event]:
        """Send a generation and yield its events; the last is Finished, Failed or Crashed."""
        if request.request_id <= 0:
            request = replace(request, request_id=self.new_request_id())
        self.send(request)
        for event in self.events():
            yield event
            if isinstance(event, Finished | Crashed):
                return
            if isinstance(event, Failed) and event.request_id in (request.request_id, None):
                return

    def submit(
        self,
        request: Generate,
        steering: tuple[SteeringEntry, ...] = (),
        speculative: SpeculativeParams | None = None,
    ) -> int:
        """Send a parallel request (decoded in one batch with the others running) and return its request id; its
        events carry that id (engine_ext.router hands them to its consumer). Ends with Finished, Failed, or Busy
        when the queue of waiting requests is full."""
        if request.request_id <= 0:
            request = replace(request, request_id=self.new_request_id())
        self.send(Submit(request, steering, speculative))
        return request.request_id

    def set_queue_limit(self, max_waiting: int) -> None:
        """How many parallel requests may wait for a sequence; past it the worker answers Busy."""
        self.send(SetQueueLimit(max_waiting))

    def set_speculative(self, params: SpeculativeParams) -> SpeculativeSet:
        """Configure speculative decoding for the loaded model (no types: off)."""
        self.send(SetSpeculative(params))
        return self._answer(SpeculativeSet)

    def set_steering(self, entries: tuple[SteeringEntry, ...], *, reset_cache: bool = False) -> SteeringSet:
        """Apply a control-vector mix (empty: none) and wait for the worker's confirmation; `reset_cache`: a changed
        mix also forgets the prompt cache (computed under the old mix)."""
        self.send(SetSteering(entries, reset_cache))
        return self._answer(SteeringSet)

    def send_steering(self, entries: tuple[SteeringEntry, ...]) -> None:
        """Change steering without waiting (e.g. while a generation streams); a SteeringSet event follows."""
        self.send(SetSteering(entries))

    def make_vector(
        self,
        prompt_set_path: Path | str,
        output_path: Path | str,
        method: str = "pca",
        on_progress: Callable[[VectorProgress], None] | None = None,
    ) -> VectorMade:
        """Make a control vector on the loaded model from a prompt-set file (`on_progress` hears each phase's steps)."""

        def progress(event: Event) -> None:
            if isinstance(event, VectorProgress) and on_progress is not None:
                on_progress(event)

        self.send(MakeControlVector(str(prompt_set_path), str(output_path), method))
        return self._answer(VectorMade, progress)

    def cancel(self, request_id: int) -> None:
        self.send(Cancel(request_id))

    def end_thinking(self, request_id: int) -> None:
        """Stop thinking now: the reply's end of thinking is forced at its next token, and it answers."""
        self.send(EndThinking(request_id))

    def inspect(self, path: Path | str) -> dict[str, object]:
        self.send(Inspect(str(path)))
        return self._answer(Inspected).info
