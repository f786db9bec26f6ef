"""The local engine for the UI: a reader thread that passes the worker's events (EngineClient) to the App, each in one
`EngineMessage` under its protocol name."""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from pathlib import Path
from typing import Final

from app.core.config import EngineSettings, SamplingSettings
from app.core.engine import (
    Engine,
    EngineCapabilities,
    EngineEvent,
    LoadStarted,
    ModelSummary,
    ReplyHeld,
    Starting,
)
from app.core.engine_share import JOB_PREFIX, QUIET_PREFIX, EngineShare, Setting, SharedJob
from app.core.output_format import OutputFormatError, format_instruction, instructed, output_fields
from app.tui.bridge_recovery import engine_crashed
from app.tui.messages import EngineMessage, MessageTarget
from app.tui.streaming import ReplyInFlight, TokenBatches
from engine_ext.client import EngineClient, EngineCrashedError
from engine_ext.cpu import CpuContention, CpuLoad
from engine_ext.params import DiskCacheParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    Cancel,
    ChatMessage,
    Crashed,
    EndThinking,
    Event,
    Failed,
    Finished,
    Generate,
    GenerationStats,
    Loaded,
    LoadModel,
    LoadProgress,
    MakeControlVector,
    ModelInfo,
    PromptEvaluated,
    PromptProgress,
    Request,
    SetSpeculative,
    SetSteering,
    SpeculativeSet,
    SpeculativeUpdate,
    SteeringSet,
    ThreadsChanged,
    TokenChunk,
    VectorMade,
    VectorProgress,
)
from engine_ext.settings_schema import effort_or_none
from engine_ext.untrusted_text import shown

POLL_S: Final = 0.05
CPU_SAMPLE_S: Final = 1.0  # other programs' CPU use (a busy machine's note) at most once a second
MAX_EVENTS_PER_READ: Final = 512
NOTHING_GENERATED: Final = GenerationStats(0, 0, 0, 0.0, 0, 0.0, 0.0, 0, 0)
"""The stats of a reply stopped before it reached the engine (held behind the API server's requests)."""


class EngineBridge(Engine):
    """The local engine: owns the EngineClient and a long-lived reader thread (exit event + join).

    Every call is non-blocking: it queues a command for the thread, which starts/loads the engine and reads its
    events, posting each to the App as an `EngineMessage`. Token chunks are merged in order into one chunk per
    request at most 20 a second; the reply's live figures (`ReplyStats`) come with them twice a second.
    """

    capabilities = EngineCapabilities(loads_files=True, tools=True, speculation=True, steering=True, images=True)

    def __init__(
        self,
        target: MessageTarget,
        log_path: Path,
        *,
        client_factory: Callable[[Path], EngineClient] | None = None,  # None: the real one, with the crash memory
        backlog: Callable[[], int] | None = None,
        cpu_sampler: Callable[[], CpuContention | None] | None = None,  # None: CpuContention, looked up now
    ) -> None:
        # The spawned worker gets the multiprocessing resource tracker's fd; start the tracker now, while
        # sys.stderr is still the real one (inside a Textual app it is a capture object without a file descriptor).
        resource_tracker.ensure_running()
        self._target = target
        # The real client's crash memory (a JSON file, and /proc/cpuinfo and the engine's libraries for the machine's
        # key) is read in the bridge's thread before the worker starts (`_read_crash_memory`): no file I/O on the UI
        # thread, which builds the bridge before the first frame.
        self._client = EngineClient(log_path) if client_factory is None else client_factory(log_path)
        self._crash_memory_unread = client_factory is None
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # The thread sleeps until the worker sends something, the worker exits or a command comes (a byte on
        # this pipe), not in short polls: an idle app takes no CPU, and a streaming one only what it draws.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._exit = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmtui-engine-bridge", daemon=True)
        self._ids = itertools.count(1)
        self._backlog = backlog or (lambda: 0)
        # None: not measured (tests pass a fake, or none, so the machine's load is not seen; tests/conftest.py makes
        # that the default by replacing CpuContention here)
        self._cpu = (cpu_sampler if cpu_sampler is not None else CpuContention)()
        self._cpu_sampled: tuple[int, float, CpuLoad | None] = (0, 0.0, None)  # request id, when, what it measured
        self._n_threads = 0  # the engine's decode threads now (the worker's ModelInfo, then ThreadsChanged)
        self._max_threads = 0  # ... and its default count (it runs below it while others crowd the machine)
        self._batches = TokenBatches()  # the one batching of streamed tokens (app/tui/streaming.py)
        self._generations: dict[int, ReplyInFlight] = {}
        self._asked_at: dict[int, float] = {}  # the app's replies not sent yet: when each was asked for
        self._loading: str | None = None
        self._model: tuple[str, EngineSettings, bool, int] | None = None
        self._mmproj = ""
        """The projector the model loads with (a restart loads it again); empty: none."""
        self._disk_cache = DiskCacheParams()  # the prompt cache on disk the model loads with (a restart too)
        self._control: list[str] = []  # speculative / steering / vector requests awaiting their answer
        self._extra_bufts: tuple[str, ...] = ()  # the worker's CPU extra buffer types (weight repacking)
        self._repacked = True  # the loaded model's CPU weights are in those buffer types
        self._replies_since_load = 0  # replies finished since the model loaded (a crash before EARLY_REPLIES is early)
        # The speculative and steering settings last sent for the loaded model, sent again after an automatic restart
        # before the reply that was in flight.
        self._sent_settings: dict[str, SetSpeculative | SetSteering] = {}
        # Requests of the app's API server, run on this engine between the app's replies (app/core/engine_share.py)
        self._share = EngineShare(self._send_labelled, self._send_job, lambda rid: self._send(Cancel(rid)))
        self._running = False
        self._model_path: str | None = None  # the model last asked for (reloaded by `restart`)

    # ----- called from the UI thread -----

    @property
    def model_path(self) -> str | None:
        return self._model_path

    def shared_engine(self) -> EngineBridge:
        return self

    def describe(self, info: ModelInfo) -> ModelSummary:
        return ModelSummary(
            path=info.path,
            name=shown(Path(info.path).stem or info.description),
            architecture=shown(info.architecture),
            backend=info.backend,
            n_ctx=info.n_ctx,
            n_params=info.n_params,
            size_bytes=info.size_bytes,
            load_ms=info.load_ms,
            placement=info.placement,
            n_threads=info.n_threads,
            n_embd=info.n_embd,
            thinking_controls=info.thinking_controls,
            mmproj=info.mmproj,
            tool_format=info.tool_format,
            repack=self._repacked,
        )

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def load(
        self,
        path: str,
        engine: EngineSettings,
        *,
        load_mtp: bool = False,
        n_rs_seq: int = 0,
        mmproj: str = "",
        disk_cache: DiskCacheParams = DiskCacheParams(),
    ) -> None:
        """Load a model (starting the worker first when needed); MTP heads and rollback depth for speculation, the
        projector paired with it (images), and the prompt cache on disk (`[cache]`)."""
        self._model_path = path
        self._model = (path, engine, load_mtp, n_rs_seq)
        self._mmproj = mmproj
        self._disk_cache = disk_cache
        self._submit(lambda: self._do_load(path, engine, load_mtp, n_rs_seq))

    def restart(self, engine: EngineSettings | None = None) -> None:
        """Start a fresh worker and reload the last model (after a crash), with `engine` (the saved settings) when
        given, else the settings it was loaded with."""
        self._submit(lambda: self._do_restart(engine))

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        """Queue a generation; its request id (carried by its TokenChunk… Finished or Failed); `tools`: JSON."""
        request_id = next(self._ids)
        request = Generate(
            request_id=request_id,
            messages=tuple(m if isinstance(m, ChatMessage) else ChatMessage(m[0], m[1]) for m in messages),
            sampling=sampling.sampling_params(),
            max_tokens=sampling.max_tokens,
            continue_reply=continue_reply,
            reasoning_budget=sampling.reasoning_budget,
            reasoning_effort=effort_or_none(sampling.reasoning_effort),
            tools=tools,
        )
        shape = (sampling.output_format, sampling.output_file)
        asked_at = time.monotonic()  # the time to the first token counts from here (Enter), a wait for the API too
        self._submit(lambda: self._generate_shaped(request, *shape, asked_at))
        return request_id

    def cancel(self, request_id: int) -> None:
        self._submit(lambda: self._cancel(request_id))

    def _cancel(self, request_id: int) -> None:
        """Stop a reply: one held behind the API server's requests ends at once (it never reached the engine)."""
        if self._share.drop_held(request_id):
            self._asked_at.pop(request_id, None)
            self._post(Finished(request_id, "cancelled", NOTHING_GENERATED))
            return
        self._send(Cancel(request_id))

    def stop_served(self) -> None:
        """Stop the API server's requests on this engine: the waiting ones fail, the running one is cancelled."""
        self._submit(self._share.stop_all)

    def end_thinking(self, request_id: int) -> bool:
        """Stop thinking now: the reply's thinking ends at its next token and it answers (Esc still stops it all)."""
        self._submit(lambda: self._send(EndThinking(request_id)))
        return True

    def request_id(self) -> int:
        """A new request id (for a server request: ids are unique across the app's and the server's requests)."""
        return next(self._ids)

    def serve(self, job: SharedJob) -> None:
        """Run a server request on this engine when no reply of the app's is being written; its events go to
        `job.sink` in the bridge's thread."""
        self._submit(lambda: self._share.add(job))

    def cancel_served(self, request_id: int) -> None:
        """Stop a server request: dropped if it waits, else cancelled in the engine (it still ends with Finished)."""
        self._submit(lambda: self._cancel_served(request_id))

    def stop_serving(self, message: str) -> None:
        """The server stops: its waiting requests fail with `message`."""
        self._submit(lambda: self._share.close(message))

    @property
    def serving_busy(self) -> bool:
        """A server request is using the engine (the app's next reply waits for it)."""
        return self._share.busy

    def set_speculative(self, params: SpeculativeParams) -> None:
        """Configure speculative decoding (no types: off); answered by SpeculativeSet or Failed."""
        self._submit(lambda: self._send_setting("speculative", SetSpeculative(params)))

    def set_steering(self, entries: tuple[SteeringEntry, ...]) -> None:
        """Apply a control-vector mix (empty: none), mid-generation too; answered by SteeringSet."""
        self._submit(lambda: self._send_setting("steering", SetSteering(entries)))

    def make_vector(self, prompt_set_path: str, output_path: str, method: str = "pca") -> None:
        """Make a control vector on the loaded model: VectorProgress… then VectorMade (or Failed)."""
        request = MakeControlVector(prompt_set_path, output_path, method)
        self._submit(lambda: self._send_control("vector", request))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (exit event + join) and shut the worker down; idempotent."""
        self._exit.set()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        self._client.close()
        if not self._thread.is_alive() and self._wake_w >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the thread will wake anyway) or closed

    @property
    def pid(self) -> int | None:
        return self._client.pid

    # ----- the bridge thread -----

    def _post(self, event: EngineEvent, answers: str = "") -> None:
        self._target.post_message(EngineMessage(event, self, answers))

    def _read_crash_memory(self) -> None:
        """Give the real client what crashed this CPU before (it starts the worker without those buffer types)."""
        from app.core.paths import repack_memory

        memory = repack_memory()
        self._client.memory = memory
        self._client.skip_bufts = memory.skipped()

    def _run(self) -> None:
        if self._crash_memory_unread:
            self._guard(self._read_crash_memory)
        while not self._exit.is_set():
            self._run_commands()
            if self._exit.is_set():
                break
            self._guard(self._pump_jobs)
            if not self._running:
                wait([self._wake_r])  # until a command comes
                self._drain_wake()
                continue
            # nothing to flush (None): sleep until the worker or a command says something
            timeout = self._batches.wait_s(time.monotonic())
            handles = self._client.wait_handles()
            if handles:
                ready = wait([self._wake_r, *handles], timeout)
                if self._wake_r in ready:
                    self._drain_wake()
                events = self._read(0.0) if any(handle is not self._wake_r for handle in ready) else []
            else:  # a client with nothing to wait on (a stand-in in tests and benchmarks) is polled
                events = self._read(POLL_S if timeout is None else min(timeout, POLL_S))
            for event in events:
                self._dispatch(event)
            self._flush_tokens(force=False)
            self._guard(self._pump_jobs)

    def _pump_jobs(self) -> None:
        """Start the next server request when the engine is free; fail them when it is not running."""
        if not self._running:
            if self._share.waiting():
                self._share.close("the app's engine is not running (it is starting, or stopped after a crash)")
            return
        self._share.pump(self._loading is None and not self._generations)

    def _cancel_served(self, request_id: int) -> None:
        if not self._share.cancel(request_id):
            self._send(Cancel(request_id))

    def _send_labelled(self, label: str, request: Setting) -> None:
        """A setting sent for a server request (or to put the app's back after one): answered by its label."""
        self._control.append(label)
        self._client.send(request)

    def _send_job(self, request: Generate) -> None:
        self._client.send(request)

    def _job_done(self) -> None:
        """A server request ended: the app's settings back (the ones changed meanwhile as the app's), then its
        replies that waited."""
        deferred, quiet = self._share.restore(dict(self._sent_settings))
        for label, request in quiet:
            self._send_labelled(label, request)
        for kind, setting in deferred.items():
            self._send_setting(kind, setting)
        for held in self._share.take_held():
            self._post(ReplyHeld(held.request_id, 0))
            self._do_generate(held)

    def _take_answer(self, kind: str) -> str | None:
        """The label of the oldest setting of this kind awaiting its answer (the app's, a server request's, or a
        quiet restore), removed."""
        for label in self._control:
            if label in (kind, JOB_PREFIX + kind, QUIET_PREFIX + kind):
                self._control.remove(label)
                return label
        return None

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._guard(command)

    def _guard(self, command: Callable[[], None]) -> None:
        try:
            command()
        except EngineCrashedError as error:
            engine_crashed(self, error.crashed)
        except Exception as error:  # never let the reader thread die; the UI hears about it
            self._flush_tokens(force=True)
            self._post(Failed(None, type(error).__name__, f"{type(error).__name__}: {error}"))

    def _read(self, timeout: float) -> list[Event]:
        first = self._client.next_event(timeout=timeout)
        if first is None:
            return []
        events = [first]
        while len(events) < MAX_EVENTS_PER_READ and not isinstance(events[-1], Crashed):
            event = self._client.next_event(timeout=0.0)
            if event is None:
                break
            events.append(event)
        return events

    def _send(self, request: Generate | Cancel | EndThinking | LoadModel) -> None:
        if not self._running:
            if isinstance(request, Generate):
                self._post(Failed(request.request_id, "EngineStopped", "the engine is not running; restart it first"))
            return
        self._client.send(request)

    def _start_worker(self) -> None:
        self._running = False
        self._post(Starting())
        hello = self._client.start()
        self._extra_bufts = hello.cpu_extra_bufts
        self._running = True
        self._post(hello)

    def _send_control(self, kind: str, request: Request) -> None:
        if not self._running:
            self._post(Failed(None, "EngineStopped", "the engine is not running; restart it first"), kind)
            return
        self._control.append(kind)
        self._client.send(request)

    def _send_setting(self, kind: str, request: SetSpeculative | SetSteering) -> None:
        if self._share.defer(kind, request):  # a server request runs: sent once it is done
            self._sent_settings[kind] = request
            return
        self._send_control(kind, request)
        if self._running:
            self._sent_settings[kind] = request
            self._share.applied(kind, request)

    def _answered(self, kind: str) -> None:
        if kind in self._control:
            self._control.remove(kind)

    def _do_load(self, path: str, engine: EngineSettings, load_mtp: bool = False, n_rs_seq: int = 0) -> None:
        if not self._running:
            self._start_worker()
        self._model = (path, engine, load_mtp, n_rs_seq)
        self._sent_settings.clear()
        self._share.fresh_worker()
        self._loading = path
        self._post(LoadStarted(path))
        self._send(
            LoadModel(
                path,
                replace(engine.model_params(), load_mtp=load_mtp, mmproj=self._mmproj or None),
                replace(engine.context_params(), n_rs_seq=n_rs_seq),
                self._disk_cache,
            )
        )

    def _do_restart(self, engine: EngineSettings | None = None) -> None:
        self._flush_tokens(force=True)
        self._generations.clear()
        self._client.close()
        self._running = False
        if self._model is not None:
            path, loaded_with, load_mtp, n_rs_seq = self._model
            self._do_load(path, engine or loaded_with, load_mtp, n_rs_seq)
        else:
            self._start_worker()

    def _generate_shaped(self, request: Generate, output_format: str, output_file: str, asked_at: float) -> None:
        """Send a reply with its output format's schema or grammar, read here (the bridge's thread)."""
        try:
            grammar, json_schema = output_fields(output_format, output_file)
        except OutputFormatError as error:
            self._post(Failed(request.request_id, type(error).__name__, str(error)))
            return
        self._asked_at[request.request_id] = asked_at
        messages = instructed(request.messages, format_instruction(output_format, json_schema))
        self._do_generate(replace(request, messages=messages, grammar=grammar, json_schema=json_schema))

    def _do_generate(self, request: Generate) -> None:
        rid = request.request_id
        if self._share.hold(request):  # a server request runs: this reply is sent once it is done, and says so
            self._post(ReplyHeld(rid, self._share.ahead()))
            return
        now = time.monotonic()
        asked_at = self._asked_at.pop(rid, now)
        self._generations[rid] = ReplyInFlight(rid, asked_at, request=request, held_s=now - asked_at)
        self._send(request)

    def _dispatch(self, event: Event) -> None:
        if self._share.busy and self._served(event):
            return
        if isinstance(event, TokenChunk):
            self._tokens(event)
            return
        if isinstance(event, ThreadsChanged):  # the busy note shows the count in use from the next stats update
            self._n_threads = event.threads
            return
        self._flush_tokens(force=True)
        if isinstance(event, Loaded):
            self._loading = None
            self._replies_since_load = 0
            self._n_threads = self._max_threads = event.info.n_threads
            # weights repacked for some extra buffer type (none left after a crash: not repacked)
            self._repacked = bool(self._extra_bufts) and (
                self._model[1].use_extra_bufts if self._model is not None else True
            )
        elif isinstance(event, PromptEvaluated):
            generation = self._generations.get(event.request_id)
            if generation is not None:
                generation.prompt_tokens, generation.n_ctx = event.prompt_tokens, event.n_ctx
                self._post_stats(generation, time.monotonic())
            return
        elif isinstance(event, SpeculativeSet | SteeringSet):
            kind = "speculative" if isinstance(event, SpeculativeSet) else "steering"
            label = self._take_answer(kind)
            if label == JOB_PREFIX + kind:
                self._share.answered()
                return
            if label == QUIET_PREFIX + kind:
                return
        elif isinstance(event, VectorMade):
            self._answered("vector")
        elif isinstance(event, Failed) and event.request_id is None and self._loading is None and self._control:
            # Steering changes are answered mid-generation; the others queue behind it.
            kind = "steering" if self._generations and "steering" in self._control else self._control[0]
            self._answered(kind)
            if kind.startswith(JOB_PREFIX):
                if self._share.refused(event.message):
                    self._job_done()
            elif not kind.startswith(QUIET_PREFIX):
                self._post(event, kind)
            return
        elif isinstance(event, Finished):
            generation = self._generations.pop(event.request_id, None)
            self._replies_since_load += 1
            if generation is not None and generation.held_s > 0:  # the time to the first token counts from Enter
                stats = replace(event.stats, ttft_ms=event.stats.ttft_ms + generation.held_s * 1000)
                event = replace(event, stats=stats)
        elif isinstance(event, Failed):
            if self._loading is not None and event.request_id is None:
                self._loading = None
                self._post(event, "load")
                return
            if event.request_id is not None:
                self._generations.pop(event.request_id, None)
        elif isinstance(event, Crashed):
            engine_crashed(self, event)
            return
        elif not isinstance(event, LoadProgress | PromptProgress | SpeculativeUpdate | VectorProgress):
            return  # the worker's log lines and the answers the app asks no question for
        self._post(event)

    def _served(self, event: Event) -> bool:
        """A server request's event (told to it; the app's replies that waited go out when it ends), or one the
        app must not show while it runs (the request's speculative figures). False: the app's."""
        if isinstance(event, TokenChunk | Finished | Failed | PromptProgress | PromptEvaluated):
            if not self._share.owns(event.request_id):
                return False
            if isinstance(event, TokenChunk | Finished | Failed) and self._share.event(event):
                self._job_done()
            return True
        return isinstance(event, SpeculativeUpdate)

    def _tokens(self, chunk: TokenChunk) -> None:
        now = time.monotonic()
        self._batches.add(chunk, now)
        generation = self._generations.get(chunk.request_id)
        if generation is not None:
            generation.took(chunk, now)

    def _flush_tokens(self, *, force: bool) -> None:
        now = time.monotonic()
        if not self._batches.due(now, 0 if force else self._backlog(), force=force):
            return
        for batch in self._batches.take(now):
            self._post(batch)
            generation = self._generations.get(batch.request_id)
            if generation is not None and generation.stats_due(now):
                self._post_stats(generation, now)

    def _post_stats(self, generation: ReplyInFlight, now: float) -> None:
        self._post(generation.stats(now, self._sample_cpu(generation.request_id, now)))

    def _sample_cpu(self, request_id: int, now: float) -> CpuLoad | None:
        """Other programs' CPU use during this reply (at most every CPU_SAMPLE_S; the last reading in between),
        with the engine's threads. A reply's first sample is only a baseline: the time since the previous one
        was not this reply's (the engine idle between replies leaves others more room)."""
        if self._cpu is None:
            return None
        last_id, last_at, last = self._cpu_sampled
        if last_id == request_id and now - last_at < CPU_SAMPLE_S:
            return last
        pid = self.pid
        load = self._cpu.sample([os.getpid()] if pid is None else [os.getpid(), pid])
        if load is not None and last_id == request_id:
            load = replace(load, threads=self._n_threads, max_threads=self._max_threads)
        else:
            load = None
        self._cpu_sampled = (request_id, now, load)
        return load
