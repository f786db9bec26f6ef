"""Events of parallel requests, each to its own consumer: one thread reads the engine client, a queue per request."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from engine_ext.client import EngineClient
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.protocol import Busy, Crashed, Event, Failed, Finished, Generate, SlotAction, SlotDone

READ_TIMEOUT_S = 0.2  # how often the reader thread looks at its stop flag while the engine is quiet


def request_id_of(event: Event) -> int | None:
    return getattr(event, "request_id", None)


def ends_request(event: Event) -> bool:
    return isinstance(event, Finished | Failed | Busy | Crashed | SlotDone)


class RequestRouter:
    """Owns the reading side of an EngineClient: each submitted request's events go to its sink (a callable, called
    on the reader thread) or its queue (read with `events`); every other event (and those of requests not submitted
    here) goes to `on_other`. A Crashed event goes to every request and ends the reader (a restarted engine gets a
    new router). `close()` stops the reader (idempotent)."""

    def __init__(self, client: EngineClient, on_other: Callable[[Event], None] | None = None) -> None:
        self.client = client
        self.on_other = on_other
        self._queues: dict[int, queue.Queue[Event]] = {}
        self._sinks: dict[int, Callable[[Event], None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="llmtui-engine-router", daemon=True)
        self._thread.start()

    def submit(
        self,
        request: Generate,
        steering: tuple[SteeringEntry, ...] = (),
        speculative: SpeculativeParams | None = None,
        sink: Callable[[Event], None] | None = None,
    ) -> int:
        """Submit a parallel request; its events go to `sink` (on the reader thread, until its last), else to a
        queue read with `events(request_id)`."""
        if request.request_id <= 0:
            from dataclasses import replace

            request = replace(request, request_id=self.client.new_request_id())
        request_id = request.request_id
        with self._lock:  # registered before it is sent: its first event cannot come before its sink
            if sink is None:
                events: queue.Queue[Event] = queue.Queue()
                self._queues[request_id] = events
                sink = events.put
            self._sinks[request_id] = sink
        try:
            self.client.submit(request, steering, speculative)
        except Exception:
            with self._lock:
                self._queues.pop(request_id, None)
                self._sinks.pop(request_id, None)
            raise
        return request_id

    def slot_action(self, request: SlotAction, sink: Callable[[Event], None]) -> None:
        """Send a parallel sequence's slot action (its request id set); its SlotDone or Failed goes to `sink`."""
        assert request.request_id is not None
        with self._lock:
            self._sinks[request.request_id] = sink
        try:
            self.client.send(request)
        except Exception:
            with self._lock:
                self._sinks.pop(request.request_id, None)
            raise

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
                    targets = list(self._sinks.values())
                    self._sinks.clear()
                for sink in targets:
                    sink(event)
                if self.on_other is not None:
                    self.on_other(event)
                return
            request_id = request_id_of(event)
            with self._lock:
                if request_id is None:
                    target = None
                elif ends_request(event):
                    target = self._sinks.pop(request_id, None)
                else:
                    target = self._sinks.get(request_id)
            if target is not None:
                target(event)
            elif self.on_other is not None:
                self.on_other(event)
