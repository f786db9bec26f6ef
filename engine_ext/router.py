"""Events of parallel requests, each to its own consumer: one thread reads the engine client, a queue per request."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from engine_ext.client import EngineClient
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.protocol import Busy, Crashed, Event, Failed, Finished, Generate

READ_TIMEOUT_S = 0.2  # how often the reader thread looks at its stop flag while the engine is quiet


def request_id_of(event: Event) -> int | None:
    return getattr(event, "request_id", None)


def ends_request(event: Event) -> bool:
    return isinstance(event, Finished | Failed | Busy | Crashed)


class RequestRouter:
    """Owns the reading side of an EngineClient: each submitted request's events go to its queue; every other
    event (and those of requests not submitted here) goes to `on_other`. A Crashed event goes to every request
    and ends the reader (a restarted engine gets a new router). `close()` stops the reader (idempotent)."""

    def __init__(self, client: EngineClient, on_other: Callable[[Event], None] | None = None) -> None:
        self.client = client
        self.on_other = on_other
        self._queues: dict[int, queue.Queue[Event]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="llmtui-engine-router", daemon=True)
        self._thread.start()

    def submit(
        self,
        request: Generate,
        steering: tuple[SteeringEntry, ...] = (),
        speculative: SpeculativeParams | None = None,
    ) -> int:
        """Submit a parallel request; read its events with `events(request_id)`."""
        if request.request_id <= 0:
            from dataclasses import replace

            request = replace(request, request_id=self.client.new_request_id())
        with self._lock:  # registered before it is sent: its first event cannot come before its queue
            self._queues[request.request_id] = queue.Queue()
        try:
            self.client.submit(request, steering, speculative)
        except Exception:
            with self._lock:
                self._queues.pop(request.request_id, None)
            raise
        return request.request_id

    def events(self, request_id: int, timeout: float) -> Iterator[Event]:
        """The request's events until its last (Finished, Failed, Busy or Crashed). Raises TimeoutError when none
        comes for `timeout` seconds (the request is then cancelled)."""
        with self._lock:
            events = self._queues[request_id]
        try:
            while True:
                try:
                    event = events.get(timeout=timeout)
                except queue.Empty:
                    self.cancel(request_id)
                    raise TimeoutError(f"no event for request {request_id} in {timeout} s") from None
                yield event
                if ends_request(event):
                    return
        finally:
            with self._lock:
                self._queues.pop(request_id, None)

    def cancel(self, request_id: int) -> None:
        """Stop a request within one decode step (its Finished says "cancelled"); nothing if it already ended."""
        if not self.client.alive:
            return
        self.client.cancel(request_id)

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _read(self) -> None:
        while not self._stop.is_set():
            event = self.client.next_event(timeout=READ_TIMEOUT_S)
            if event is None:
                continue
            if isinstance(event, Crashed):
                with self._lock:
                    targets = list(self._queues.values())
                for events in targets:
                    events.put(event)
                if self.on_other is not None:
                    self.on_other(event)
                return
            request_id = request_id_of(event)
            with self._lock:
                target = self._queues.get(request_id) if request_id is not None else None
            if target is not None:
                target.put(event)
            elif self.on_other is not None:
                self.on_other(event)
