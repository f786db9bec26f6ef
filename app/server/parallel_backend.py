"""`serve --parallel N`: the server's jobs decode together in the engine's parallel sequences (continuous batching,
engine_ext.parallel): each job is a Submit with its own steering mix and drafting (the n-gram types, the model drafters
but MTP), its events routed back by request id (engine_ext.router). The engine's queue holds the jobs waiting for a
sequence; past the server's bound a job is refused with 503 before it is sent, and the engine's own Busy answer is a
503 too.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from app.server.api_errors import ApiError
from app.server.backend import JobServer, ServerSettings, Ticket
from app.server.metrics import Metrics
from app.server.requests import Job
from engine_ext.client import EngineClient
from engine_ext.params import SpeculativeParams
from engine_ext.protocol import (
    Busy,
    Crashed,
    Event,
    Failed,
    PromptEvaluated,
    PromptProgress,
    SlotAction,
    SlotDone,
    TokenChunk,
)
from engine_ext.router import RequestRouter


@dataclass
class SlotTicket(Ticket):
    """A ticket whose cancel reaches the engine at once (the generation stops within one decode step)."""

    cancel_request: Callable[[int], None] | None = None
    done: bool = False

    def cancel(self) -> None:
        if self.cancelled.is_set() or self.done:
            return
        self.cancelled.set()
        if self.cancel_request is not None and self.request_id:
            self.cancel_request(self.request_id)


class ParallelBackend(JobServer):
    """Up to `settings.slots` jobs decode together on `client` (started, model loaded with n_seq_max = slots). No
    dispatcher thread: the engine schedules the jobs; the router's reader thread hands each event to its ticket."""

    def __init__(
        self,
        client: EngineClient,
        settings: ServerSettings,
        metrics: Metrics,
        restart: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(settings, metrics)
        self.client = client
        self._restart = restart
        self._lock = threading.Lock()
        self._ids = itertools.count(1_000_000)
        self._tickets: dict[int, SlotTicket] = {}
        self._processing: set[int] = set()
        metrics.slots = settings.slots
        self._router = self._start_router()

    def _start_router(self) -> RequestRouter:
        self.client.set_queue_limit(self.settings.queue)
        return RequestRouter(self.client, self._on_other)

    # ----- the HTTP side ------------------------------------------------------------------------

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Send `job` to the engine; ApiError 400 for what this server cannot give, 503 when slots and queue are
        full."""
        if job.slot is not None:
            return self._slot_action(job, loop)
        spec = self._spec_for(job.speculative)
        ticket = SlotTicket(job, spec, self._steering_for(job), loop, cancel_request=self._cancel)
        with self._lock:
            if len(self._tickets) >= self.settings.slots + self.settings.queue:
                n_waiting = len(self._tickets) - len(self._processing)
                raise ApiError(503, f"the server is busy ({n_waiting} requests waiting); try again shortly")
            ticket.request_id = request_id = next(self._ids)
            self._tickets[request_id] = ticket
            self._publish()
        request = self._generate(ticket, request_id)
        try:
            self._router.submit(request, ticket.steering, spec if spec.enabled else None, sink=self._sink(ticket))
        except Exception as e:
            self._end(ticket)
            raise ApiError(500, f"the engine is not running ({type(e).__name__}); try again shortly") from None
        return ticket

    def _slot_action(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """llama-server's slot action on one sequence (engine_ext.seq_slots): sent at once; the engine runs it when
        that sequence is not answering a request (it waits for the reply to end, as llama-server's). Its SlotDone, or
        ApiError 400 with the engine's one line."""
        assert job.slot is not None
        action, path, slot = job.slot
        ticket = SlotTicket(job, SpeculativeParams(), (), loop, cancel_request=self._cancel)
        ticket.request_id = request_id = next(self._ids)

        def deliver(event: Event) -> None:
            ticket.done = True
            if isinstance(event, SlotDone):
                ticket.push(event)
            elif isinstance(event, Failed):
                self.metrics.refused()
                ticket.push(ApiError(400, (event.message or event.error).splitlines()[0][:300]))
            else:
                self._event(ticket, event)

        try:
            self._router.slot_action(SlotAction(action, path, slot, request_id), deliver)
        except Exception as e:
            raise ApiError(500, f"the engine is not running ({type(e).__name__}); try again shortly") from None
        return ticket

    def close(self, timeout_s: float = 5.0) -> None:
        self._router.close(timeout_s)

    def _publish(self) -> None:
        self.metrics.queue(len(self._processing), len(self._tickets) - len(self._processing))

    def _cancel(self, request_id: int) -> None:
        try:
            self._router.cancel(request_id)
        except Exception:  # the engine went away: its crash ends the request
            pass

    # ----- the router's reader thread ------------------------------------------------------------

    def _sink(self, ticket: SlotTicket) -> Callable[[Event], None]:
        def deliver(event: Event) -> None:
            if isinstance(event, TokenChunk | PromptEvaluated | PromptProgress):
                if ticket.request_id not in self._processing:
                    with self._lock:
                        self._processing.add(ticket.request_id)
                        self._publish()
            if isinstance(event, Busy):
                self.metrics.refused()
                ticket.push(ApiError(503, f"the server is busy ({event.waiting} requests waiting); try again shortly"))
            elif not self._event(ticket, event):
                return
            self._end(ticket)

        return deliver

    def _live_tickets(self) -> list[Ticket]:
        with self._lock:
            return list(self._tickets.values())

    def _end(self, ticket: SlotTicket) -> None:
        ticket.done = True
        with self._lock:
            self._tickets.pop(ticket.request_id, None)
            self._processing.discard(ticket.request_id)
            self._publish()

    def _on_other(self, event: Event) -> None:
        """Events of no ticket here; a crash ends the router: the engine is restarted and a new one reads it."""
        if not isinstance(event, Crashed) or self._restart is None or self.stopping:
            return
        try:
            self._restart()
            self._router = self._start_router()
        except Exception:  # the next request says what is wrong
            pass
