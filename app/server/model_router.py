"""`llmtui serve` without -m: every local model served by its name (llama-server's router mode). The first request
that names a model loads it in a worker process of its own, with a dispatcher of its own (`EngineBackend` or
`ParallelBackend`, made by the caller's `ModelStarter`); its requests wait meanwhile while the other models answer.
Past `models_max` models, the least recently used idle one is unloaded; a model idle for `idle_unload_s` too; a
pinned one never. Before a load, memory is checked (`models_catalog.fit`: F4's figure, at the context the model
loads with) and idle models are unloaded until the new one fits. A model that fails to load, or whose worker
crashes, fails its own requests only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.server.api_errors import ApiError
from app.server.backend import ServedModel, ServerSettings, Ticket
from app.server.metrics import Metrics
from app.server.requests import Job
from engine_ext.gguf import format_bytes
from engine_ext.params import SpeculativeParams
from engine_ext.protocol import Finished, SlotDone
from engine_ext.untrusted_text import one_line
from models_catalog import fit

_ROOM_POLL_S = 0.25  # how often a load waiting for a busy model to go idle looks again


@dataclass(frozen=True)
class RoutedModel:
    """A model the router can load: its id, the other names a request may give it, its file and memory need."""

    id: str
    path: Path
    aliases: tuple[str, ...] = ()
    need_bytes: int | None = None  # models_catalog.fit's figure (None: not known, not counted)
    pinned: bool = False  # never unloaded for another model or for being idle


@dataclass(frozen=True)
class RouterLimits:
    """How many models stay loaded and for how long (`serve --models-max`, `--idle-unload`)."""

    models_max: int = 4
    idle_unload_s: float = 0.0  # 0: never for idleness
    room_wait_s: float = 60.0  # how long a load waits for busy models to finish before it says why it cannot
    memory: fit.MachineMemory | None = None  # None: loads are not checked against memory


class ModelBackend(Protocol):
    """What the router needs of a loaded model's dispatcher."""

    settings: ServerSettings

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class StartedModel:
    """A loaded model: its dispatcher, and how to end both it and its worker."""

    backend: ModelBackend
    close: Callable[[], None]


class ModelStarter(Protocol):
    """How a model's settings are made and how it is loaded (the CLI's flags and the model's preset)."""

    def settings(self, model: RoutedModel) -> ServerSettings: ...

    def check(self, model: RoutedModel) -> int | None:
        """ApiError when the model's files cannot load (read before any other model is unloaded for it); else its
        memory need as it will load (`models_catalog.fit`'s figure at its context), None: `model.need_bytes`."""

    def job(self, model: RoutedModel, job: Job) -> Job:
        """`job` with the model's own defaults where the request left a field unset (its preset's reasoning)."""

    def start(self, model: RoutedModel, metrics: Metrics, progress: Callable[[float], None]) -> StartedModel: ...


class _ModelMetrics(Metrics):
    """One model's counters: its queue is its own (the router reads whether it is busy); the rest are the server's."""

    def __init__(self, server: Metrics, on_queue: Callable[[], None]) -> None:
        super().__init__()
        self._server = server
        self._on_queue = on_queue

    def refused(self) -> None:
        self._server.refused()

    def failed(self) -> None:
        self._server.failed()

    def finished(self, done: Finished) -> None:
        self._server.finished(done)

    def queue(self, processing: int, deferred: int) -> None:
        super().queue(processing, deferred)
        self._on_queue()


@dataclass
class _WaitingTicket(Ticket):
    """A request for a model that is loading: once loaded, the model's own ticket runs it and its events come here."""

    inner: Ticket | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        if self.inner is not None:
            self.inner.cancel()


@dataclass
class _Place:
    """A model's place in the router: unloaded, loading or loaded, and the requests waiting for its load."""

    model: RoutedModel
    metrics: _ModelMetrics
    status: str = "unloaded"
    progress: float = 0.0
    error: str = ""
    started: StartedModel | None = None
    waiting: list[_WaitingTicket] = field(default_factory=list)
    last_used: float = 0.0
    need: int | None = None  # its memory need as it loads (None: not known, not counted)
    has_room: bool = False  # its load was given room: from then on it counts against the limits, loaded or not

    def busy(self) -> bool:
        return bool(self.waiting) or self.metrics.in_flight > 0


async def _forward(inner: Ticket, outer: Ticket) -> None:
    """The model's ticket's events to the ticket the HTTP handler reads, to the request's end."""
    while True:
        event = await inner.events.get()
        outer.events.put_nowait(event)
        if isinstance(event, Finished | SlotDone | ApiError):
            return


def _room(memory: fit.MachineMemory | None) -> str:
    """The memory loads are judged against, as F4's fit check counts it."""
    if memory is None:
        return "memory not checked"
    ram = f"RAM {format_bytes(memory.ram_total)}"
    return f"VRAM {format_bytes(memory.vram_total)} + {ram}" if memory.vram_total and not memory.unified else ram


def _why_held(place: _Place) -> str:
    """Why a model that holds room is not unloaded for another: pinned, busy (answering or loading) or idle."""
    if place.model.pinned:
        return "pinned"
    return "busy" if place.started is None or place.busy() else "idle"


class ModelRouter:
    """The HTTP side's backend for every local model: requests go to the model they name, loaded on demand."""

    def __init__(
        self,
        models: Sequence[RoutedModel],
        settings: ServerSettings,
        metrics: Metrics,
        starter: ModelStarter,
        limits: RouterLimits = RouterLimits(),
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.settings = settings
        """What a request that names no model is parsed with (limits, the queue's bound)."""
        self.metrics = metrics
        self.stopping = False
        self._starter = starter
        self._limits = limits
        self._log = log
        self._lock = threading.Condition()
        self._places: dict[str, _Place] = {}
        self._names: dict[str, str] = {}  # an id or an alias → the id
        for model in models:
            self._places[model.id] = _Place(model, _ModelMetrics(metrics, self._publish), need=model.need_bytes)
            for name in (model.id, *model.aliases):
                self._names.setdefault(name, model.id)
        self._ended = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="llmtui-router-idle", daemon=True)
        if limits.idle_unload_s > 0:
            self._reaper.start()

    # ----- the HTTP side ------------------------------------------------------------------------

    def settings_for(self, model: str | None) -> ServerSettings:
        """The settings of the model a request names (ApiError 400 without a name, 404 for an unknown one)."""
        if not model:
            raise ApiError(400, "model is required: this server serves several (GET /v1/models lists them)", "model")
        with self._lock:
            place = self._place(model)
            started = place.started
        return started.backend.settings if started is not None else self._starter.settings(place.model)

    def served(self) -> tuple[ServedModel, ...]:
        with self._lock:
            return tuple(
                ServedModel(
                    p.model.id,
                    p.model.aliases,
                    p.status,
                    p.progress,
                    p.error,
                    p.model.pinned,
                    p.started.backend.settings.n_ctx if p.started is not None else 0,
                )
                for p in self._places.values()
            )

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Run `job` on its model (`job.model`, an id): at once when loaded, else after its load (started here)."""
        with self._lock:
            if self.stopping:
                raise ApiError(503, "the server is shutting down")
            place = self._place(job.model)
            place.last_used = time.monotonic()
            job = self._starter.job(place.model, job)
            if place.started is not None:
                return place.started.backend.submit(job, loop)
            if len(place.waiting) > self.settings.queue:
                raise ApiError(503, f"{place.model.id} is loading and {len(place.waiting)} requests wait for it")
            ticket = _WaitingTicket(job, SpeculativeParams(), (), loop)
            place.waiting.append(ticket)
            if place.status == "unloaded":
                place.status, place.progress = "loading", 0.0
                threading.Thread(target=self._load, args=(place,), name="llmtui-router-load", daemon=True).start()
        self._publish()
        return ticket

    def unload(self, model: str) -> None:
        """POST /models/unload: end the model's worker (ApiError 400 when it is not loaded, 409 while it answers)."""
        with self._lock:
            place = self._place(model)
            if place.started is None:
                raise ApiError(400, f"{place.model.id} is not loaded", "model")
            if place.busy():
                raise ApiError(409, f"{place.model.id} is answering requests; unload it when they end", "model")
            started = self._detach(place, "asked")
        started.close()

    def stop(self) -> None:
        """The server is shutting down: every request, waiting for a load or running, ends."""
        with self._lock:
            self.stopping = True
            waiting = [t for p in self._places.values() for t in p.waiting]
            backends = [p.started.backend for p in self._places.values() if p.started is not None]
        for ticket in waiting:
            ticket.push(ApiError(503, "the server is shutting down"))
        for backend in backends:
            backend.stop()

    def close(self) -> None:
        """End every model's worker (after `stop`)."""
        self._ended.set()
        with self._lock:
            self.stopping = True
            started = [self._detach(p, "") for p in self._places.values() if p.started is not None]
        for one in started:
            one.close()

    # ----- loading and unloading ----------------------------------------------------------------

    def _place(self, name: str) -> _Place:
        model_id = self._names.get(name)
        if model_id is None:
            shown = one_line(name, 80)
            raise ApiError(404, f"the model {shown!r} does not exist here (GET /v1/models lists them)", "model")
        return self._places[model_id]

    def _load(self, place: _Place) -> None:
        model = place.model
        self.metrics.loading(model.id, 0.0)
        try:
            need = self._starter.check(model)
            if need is not None:
                place.need = need
            self._make_room(place)
            self._log(f"loading {model.id}")
            started = self._starter.start(model, place.metrics, lambda fraction: self._progress(place, fraction))
        except ApiError as error:
            self._failed(place, error)
            return
        except Exception as error:  # the load's one line, for this model's requests only
            text = one_line(str(error) or type(error).__name__, 240)
            self._failed(place, ApiError(500, f"{model.id} could not be loaded: {text}"))
            return
        finally:
            self.metrics.loading(model.id, None)
        with self._lock:
            if self.stopping:
                waiting = []
            else:
                place.started, place.status, place.progress, place.error = started, "loaded", 1.0, ""
                place.last_used = time.monotonic()
                waiting, place.waiting = place.waiting, []
                for ticket in waiting:
                    self._hand_over(ticket, started.backend)
        if self.stopping:
            started.close()
        self._log(f"loaded {model.id}")
        self._publish()

    def _progress(self, place: _Place, fraction: float) -> None:
        place.progress = fraction
        self.metrics.loading(place.model.id, fraction)

    @staticmethod
    def _hand_over(ticket: _WaitingTicket, backend: ModelBackend) -> None:
        """A request that waited for the load, submitted to the model's dispatcher; its events forwarded."""
        if ticket.cancelled.is_set():
            ticket.push(ApiError(499, "the client went away before its model was loaded"))
            return
        try:
            inner = backend.submit(ticket.job, ticket.loop)
        except ApiError as error:
            ticket.push(error)
            return
        except Exception as error:  # this request's failure is its own: the others waiting go on
            ticket.push(ApiError(500, f"the server failed: {type(error).__name__}: {one_line(str(error), 200)}"))
            return
        ticket.inner = inner
        if ticket.cancelled.is_set():
            inner.cancel()
        try:
            asyncio.run_coroutine_threadsafe(_forward(inner, ticket), ticket.loop)
        except RuntimeError:  # the handler's loop has closed: nobody is listening
            inner.cancel()

    def _failed(self, place: _Place, error: ApiError) -> None:
        with self._lock:
            place.status, place.progress, place.error, place.started = "unloaded", 0.0, error.message, None
            place.has_room = False
            self._lock.notify_all()
            waiting, place.waiting = place.waiting, []
        self._log(f"{error.message}")
        for ticket in waiting:
            ticket.push(error)
        self._publish()

    def _make_room(self, place: _Place) -> None:
        """Unload idle models until `place`'s model may load (count and memory); wait for busy or loading ones to
        finish, up to `room_wait_s`; ApiError saying why it cannot (at once when only pinned models hold the room:
        waiting would not free it)."""
        deadline = time.monotonic() + self._limits.room_wait_s
        while True:
            with self._lock:
                victims, why, may_free = self._room_for(place)
                if why is None:
                    unloaded = [self._detach(victim, f"room for {place.model.id}") for victim in victims]
                    place.has_room = True
                    break
                if not may_free or self.stopping or time.monotonic() >= deadline:
                    raise why
                self._lock.wait(_ROOM_POLL_S)
        for started in unloaded:
            started.close()

    def _room_for(self, place: _Place) -> tuple[list[_Place], ApiError | None, bool]:
        """The idle models to unload (least recently used first) so that `place`'s model may load, or why it may
        not (400 when it could never fit, 503 while other models hold the room) and whether waiting may free it
        (a model that holds it is busy or loading, and not pinned)."""
        model, limits = place.model, self._limits
        # Loaded models, and loads given room; not the loads still waiting for it (two loads each counting the other
        # would wait for each other)
        others = [p for p in self._places.values() if p is not place and (p.started is not None or p.has_room)]
        idle = sorted(
            (p for p in others if p.started is not None and not p.model.pinned and not p.busy()),
            key=lambda p: p.last_used,
        )
        memory = limits.memory if place.need is not None else None
        if memory is not None and fit.judge(place.need or 0, memory)[0] is fit.Verdict.TOO_BIG:
            why = f"{model.id} needs {format_bytes(place.need or 0)}: too big for this machine ({_room(memory)})"
            return [], ApiError(400, why), False
        victims: list[_Place] = []
        while True:
            kept = [p for p in others if p not in victims]
            used = sum(p.need or 0 for p in kept)
            too_many = len(kept) >= limits.models_max
            too_big = memory is not None and fit.judge(used + (place.need or 0), memory)[0] is fit.Verdict.TOO_BIG
            if not too_many and not too_big:
                return victims, None, False
            if not idle:
                break
            victims.append(idle.pop(0))
        held = ", ".join(f"{p.model.id} ({_why_held(p)})" for p in kept)
        if too_many:
            why = f"{model.id} waits for a model to unload: {len(kept)} are loaded (--models-max {limits.models_max})"
        else:
            need, beside = format_bytes(place.need or 0), format_bytes(used)
            why = f"{model.id} needs {need} beside the {beside} that loaded models use ({_room(memory)})"
        may_free = any(not p.model.pinned and _why_held(p) != "idle" for p in kept)
        hint = "" if may_free else "; POST /models/unload frees a pinned one"
        return [], ApiError(503, f"{why}: {held}{hint}"), may_free

    def _detach(self, place: _Place, why: str) -> StartedModel:
        """Take `place`'s loaded model out of the router (under the lock); the caller closes it."""
        started = place.started
        assert started is not None
        place.started, place.status, place.progress, place.has_room = None, "unloaded", 0.0, False
        self._lock.notify_all()
        if why:
            self._log(f"unloading {place.model.id} ({why})")
        return started

    def _reap(self) -> None:
        """Unload the models idle for `idle_unload_s` (their idle time counted from their last request's end)."""
        limit = self._limits.idle_unload_s
        while not self._ended.wait(min(1.0, max(0.05, limit / 4))):
            now = time.monotonic()
            with self._lock:
                idle = []
                for place in self._places.values():
                    if place.started is None or place.model.pinned:
                        continue
                    if place.busy():
                        place.last_used = now
                    elif now - place.last_used >= limit:
                        idle.append(self._detach(place, f"idle for {limit:g} s"))
            for started in idle:
                started.close()

    def _publish(self) -> None:
        """The server's queue figures: every model's requests running and waiting (for a load too). Not under the
        router's lock: a dispatcher calls it under its own."""
        processing = deferred = 0
        for place in list(self._places.values()):
            running, waiting = place.metrics.queue_now()
            processing += running
            deferred += waiting + len(place.waiting)
        self.metrics.queue(processing, deferred)
