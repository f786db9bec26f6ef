"""Runs the server's jobs on the engine worker, one at a time in arrival order, each with its own steering mix and
speculative settings (applied before it starts, so no request sees another's), from a bounded queue.

The engine client is used from one thread only (the dispatcher), except `cancel`, which the client sends under its
lock: a client that disconnects or a request that is dropped stops its generation within one decode step.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from app.server.api_errors import ApiError, ContextExceeded
from app.server.metrics import Metrics
from app.server.requests import Job, Limits, SpecChoice
from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.params import EngineError, SamplingParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import Crashed, Failed, Finished, Generate, PromptEvaluated, TokenChunk
from engine_ext.spec_catalog import CATALOGUE, DRAFT_NUMBERS, SPEC_TYPE

_POLL_S = 0.05  # how often the dispatcher looks at a cancel flag while it waits for the engine
# Failures that come from what the request asked (its messages, its settings): 400, not the server's fault.
_CLIENT_ERRORS = frozenset(
    {
        "ChatTemplateError",
        "EngineError",
        "ContextError",
        "SpeculativeConfigError",
        "GrammarError",
        "NoProjector",
        "ImageRefused",
    }
)
_MODEL_FAMILY = frozenset(t.name for t in CATALOGUE if t.family != "ngram")


@dataclass(frozen=True)
class ServerSettings:
    """What the server answers with when a request does not say (the `serve` flags or the app's settings)."""

    model_id: str
    model_path: str = ""  # the loaded model's file (responses.system_fingerprint reads it; "": not known)
    sampling: SamplingParams = SamplingParams()
    speculative: SpeculativeParams = SpeculativeParams()  # as loaded: model drafters only as loaded here
    steering: tuple[SteeringEntry, ...] = ()
    vectors: Mapping[str, str] = field(default_factory=dict)  # name → file: the only vectors a request can name
    limits: Limits = Limits()
    queue: int = 16  # requests waiting beyond the one generating; past it: 503
    slots: int = 1  # requests decoded together (serve --parallel; more than 1: app.server.parallel_backend)
    slot_save_path: str = ""  # where POST /slots/{id}?action=save|restore keeps its files ("": those actions are off)
    embeddings: str = ""  # what POST /v1/embeddings and /v1/rerank serve: embed | rank ("": neither)
    n_ctx: int = 0  # the loaded model's context in tokens, as /v1/models says it (max_model_len); 0: not known


@dataclass(frozen=True)
class ServedModel:
    """A model a server serves, as GET /v1/models lists it (llama-server's router's fields)."""

    id: str
    aliases: tuple[str, ...] = ()
    status: str = "loaded"  # unloaded, loading or loaded
    progress: float = 1.0  # of its load, while loading
    error: str = ""  # why its last load failed ("": it did not)
    pinned: bool = False
    n_ctx: int = 0  # its context as loaded (/v1/models' max_model_len, what an agent sizes its history by); 0: unknown


@dataclass
class Ticket:
    """One accepted request: its job, what the engine was asked, and the events for the HTTP handler."""

    job: Job
    spec: SpeculativeParams
    steering: tuple[SteeringEntry, ...]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    request_id: int = 0

    def push(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the handler's loop has closed: nobody is listening
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


def crash_error(crashed: Crashed) -> ApiError:
    """What a request hears when the engine died under it: crashed (500), or ended by the client's watchdog (a step
    past the step limit, or a cancel it could not read: engine_ext.watchdog); restarted either way."""
    if crashed.stopped:
        return ApiError(500, f"{crashed.stopped}; the engine was restarted")
    return ApiError(500, f"the engine crashed ({crashed.description}); restarting it")


class JobServer(ABC):
    """What every dispatcher shares: the settings read per request, the counters, a job's speculative settings and
    control vectors checked against what this server can give, the Generate a ticket becomes and its request's
    events told to it, and shutting down. `Dispatcher` runs tickets one at a time; `ParallelBackend` hands them to
    the engine's slots."""

    def __init__(self, settings: ServerSettings, metrics: Metrics) -> None:
        self.settings = settings
        """Read per request: the app replaces it when it loads another model or changes its settings."""
        self.metrics = metrics
        self.stopping = False
        """The server is shutting down: requests are cancelled and a dead engine is not restarted."""

    def settings_for(self, model: str | None) -> ServerSettings:
        """The settings of a request that names `model`: this server's one model, whatever the name (a router
        answers each model's: app.server.model_router)."""
        return self.settings

    def served(self) -> tuple[ServedModel, ...]:
        """The models GET /v1/models lists: this server's one, loaded."""
        return (ServedModel(self.settings.model_id, n_ctx=self.settings.n_ctx),)

    def unload(self, model: str) -> None:
        """POST /models/unload: a server of one model keeps it (ApiError 400)."""
        raise ApiError(400, "this server serves one model (llmtui serve -m); start it without -m to unload models")

    def stop(self) -> None:
        """The server is shutting down (Ctrl+C): cancel every request, waiting or running, so their responses end
        (within about a second: the engine client's watchdog ends a worker that cannot read the cancel)."""
        self.stopping = True
        for ticket in self._live_tickets():
            ticket.cancel()

    @abstractmethod
    def _live_tickets(self) -> list[Ticket]:
        """Every ticket waiting or running."""

    def _spec_for(self, choice: SpecChoice | None) -> SpeculativeParams:
        base = self.settings.speculative
        if choice is None:
            return base
        spec = SpeculativeParams(
            types=choice.types,
            draft_model=base.draft_model,
            n_max=base.n_max if choice.n_max is None else choice.n_max,
            n_min=base.n_min if choice.n_min is None else min(choice.n_min, choice.n_max or base.n_max),
            p_min=base.p_min if choice.p_min is None else choice.p_min,
            fixed_length=base.fixed_length,
        )
        try:
            spec.validate()
        except EngineError as e:
            message = str(e)
            for setting in DRAFT_NUMBERS:  # the request's names for the settings llama.cpp's flags name
                message = message.replace(setting.flag, f"speculative.{setting.name}")
            raise ApiError(400, message.replace(SPEC_TYPE.flag, "speculative.type"), "speculative") from None
        missing = [t for t in spec.types if t in _MODEL_FAMILY and t not in base.types]
        if missing:
            raise ApiError(
                400,
                f"speculative type {missing[0]} needs its draft loaded when the server starts "
                f"(llmtui serve {SPEC_TYPE.flag} {missing[0]}); per request: the n-gram types or the server's own",
                "speculative",
            )
        return spec

    def _steering_for(self, job: Job) -> tuple[SteeringEntry, ...]:
        if job.control_vectors is None:
            return self.settings.steering
        entries = []
        for choice in job.control_vectors:
            path = self.settings.vectors.get(choice.name)
            if path is None:
                known = ", ".join(sorted(self.settings.vectors)[:12]) or "none"
                raise ApiError(400, f"no control vector named {choice.name[:60]!r} (known: {known})", "control_vectors")
            start, end = choice.layers or (0, 0)
            entries.append(SteeringEntry(path, choice.strength, start, end))
        return tuple(entries)

    def _generate(self, ticket: Ticket, request_id: int) -> Generate:
        """What the engine is asked for this ticket."""
        job = ticket.job
        return Generate(
            request_id=request_id,
            messages=job.messages,
            prompt=job.prompt,
            suffix=job.suffix,
            sampling=job.sampling,
            max_tokens=job.max_tokens,
            stop=job.stop,
            ignore_eos=job.ignore_eos,
            grammar=job.grammar,
            json_schema=job.json_schema,
            enable_thinking=job.enable_thinking,
            speculative=bool(ticket.spec.types),
            tools=job.tools,
            tool_choice=job.tool_choice,
            reasoning_effort=job.reasoning_effort,
            reasoning_budget=job.reasoning_budget,
            reasoning_budget_message=job.reasoning_budget_message,
            count_only=job.count_only,
        )

    def _event(self, ticket: Ticket, event: object) -> bool:
        """Tell the ticket an event of its request; True when the request ended."""
        if isinstance(event, TokenChunk | PromptEvaluated):
            ticket.push(event)
            return False
        if isinstance(event, Finished):
            if not ticket.job.count_only:  # a count decoded nothing
                self.metrics.finished(event)
            ticket.push(event)
        elif isinstance(event, Failed):
            self.metrics.failed()
            if event.error == "Cancelled":
                ticket.push(ApiError(499, event.message))
            elif event.n_ctx:
                message = event.message.split(";")[0][:300]
                ticket.push(ContextExceeded(400, message, n_prompt_tokens=event.n_prompt_tokens, n_ctx=event.n_ctx))
            else:
                status = 400 if event.error in _CLIENT_ERRORS else 500
                ticket.push(ApiError(status, (event.message or event.error).splitlines()[0][:300]))
        elif isinstance(event, Crashed):
            self.metrics.failed()
            ticket.push(crash_error(event))
        else:
            return False
        return True


class Dispatcher(JobServer):
    """A thread that runs tickets in arrival order, from a bounded queue, on an engine its subclass drives
    (`EngineBackend`: an engine client of its own; `app/server/shared.py`: the app's engine, between its replies)."""

    def __init__(self, settings: ServerSettings, metrics: Metrics) -> None:
        super().__init__(settings, metrics)
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._current: Ticket | None = None  # the ticket the dispatcher runs
        self._thread = threading.Thread(target=self._run, name="llmtui-serve-dispatch", daemon=True)
        self._thread.start()

    # ----- the HTTP side ------------------------------------------------------------------------

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue `job`; ApiError 400 for a speculative type or vector this server cannot give, 503 when full."""
        ticket = Ticket(job, self._spec_for(job.speculative), self._steering_for(job), loop)
        with self._lock:
            if self._waiting + self._running > self.settings.queue:  # one generating, `queue` waiting
                raise ApiError(503, f"the server is busy ({self._waiting} requests waiting); try again shortly")
            self._waiting += 1
            self._publish()
        self._queue.put(ticket)
        return ticket

    def close(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _live_tickets(self) -> list[Ticket]:
        with self._queue.mutex:
            waiting = [t for t in self._queue.queue if t is not None]
        current = self._current
        return [*waiting, current] if current is not None else waiting

    def _publish(self) -> None:
        self.metrics.queue(self._running, self._waiting)

    # ----- the dispatcher thread ----------------------------------------------------------------

    @abstractmethod
    def _serve(self, ticket: Ticket) -> None:
        """Run the ticket's job on the engine, its events told to the ticket (on the dispatcher thread)."""

    def _run(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running = 1
                self._current = ticket
                self._publish()
            try:
                if ticket.cancelled.is_set():
                    ticket.push(ApiError(499, "the client went away before its turn"))
                else:
                    self._serve(ticket)
            except Exception as e:  # the thread must go on: one request's failure is its own
                self.metrics.failed()
                ticket.push(ApiError(500, f"the server failed: {type(e).__name__}: {str(e)[:200]}"))
            finally:
                with self._lock:
                    self._running = 0
                    self._current = None
                    self._publish()


class EngineBackend(Dispatcher):
    """`llmtui serve`'s dispatcher: it owns `client` (already started, model loaded) and runs tickets in order."""

    def __init__(
        self,
        client: EngineClient,
        settings: ServerSettings,
        metrics: Metrics,
        restart: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self._restart = restart
        self._applied_spec: SpeculativeParams | None = None
        self._applied_steering: tuple[SteeringEntry, ...] | None = None
        self._ids = itertools.count(1_000_000)
        super().__init__(settings, metrics)

    def _configure(self, ticket: Ticket) -> None:
        if ticket.steering != self._applied_steering:
            self._applied_steering = None
            self.client.set_steering(ticket.steering, reset_cache=True)  # a cached prefix was steered otherwise
            self._applied_steering = ticket.steering
        if ticket.spec != self._applied_spec:
            self._applied_spec = None
            self.client.set_speculative(ticket.spec)
            self._applied_spec = ticket.spec

    def _serve(self, ticket: Ticket) -> None:
        slot, embed = ticket.job.slot, ticket.job.embed
        if slot is not None:
            self._answer(ticket, lambda: self.client.slot(slot[0], slot[1]))
            return
        if embed is not None:
            self._answer(ticket, lambda: self.client.embed(embed.texts, query=embed.query, normalize=embed.normalize))
            return
        try:
            self._configure(ticket)
        except EngineFailure as e:
            self.metrics.refused()
            ticket.push(ApiError(400, e.failed.message.splitlines()[0][:300] if e.failed.message else str(e)))
            return
        except EngineCrashedError as e:
            self._crashed(ticket, e.crashed)
            return
        ticket.request_id = request_id = next(self._ids)
        request = self._generate(ticket, request_id)
        try:
            self.client.send(request)
        except EngineCrashedError as e:
            self._crashed(ticket, e.crashed)
            return
        cancel_sent = False
        while True:
            if ticket.cancelled.is_set() and not cancel_sent:
                cancel_sent = True
                try:
                    self.client.cancel(request_id)
                except EngineCrashedError:
                    pass
            event = self.client.next_event(_POLL_S)
            if event is None:
                continue
            if isinstance(event, TokenChunk | PromptEvaluated | Finished) and event.request_id == request_id:
                if self._event(ticket, event):
                    return
            elif isinstance(event, Failed) and event.request_id in (request_id, None):
                self._event(ticket, event)
                return
            elif isinstance(event, Crashed):
                self._crashed(ticket, event)
                return

    def _answer(self, ticket: Ticket, ask: Callable[[], object]) -> None:
        """A request the engine answers at once (a slot action's SlotDone, an Embed's Embedded): its answer, or
        ApiError 400 with the engine's one line (a file refused, nothing to save, a model that does not embed)."""
        try:
            ticket.push(ask())
        except EngineFailure as e:
            self.metrics.refused()
            ticket.push(ApiError(400, (e.failed.message or e.failed.error).splitlines()[0][:300]))
        except EngineCrashedError as e:
            self._crashed(ticket, e.crashed)

    def _crashed(self, ticket: Ticket, crashed: Crashed) -> None:
        self.metrics.failed()
        self._applied_spec = self._applied_steering = None
        ticket.push(crash_error(crashed))
        if self._restart is not None and not self.stopping:
            try:
                self._restart()
            except Exception:  # the next request says what is wrong
                pass
