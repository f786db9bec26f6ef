"""The app's engine shared with its API server: requests from other programs run on the chat's worker between the
chat's replies, each under its own speculative settings and steering mix, and the chat's settings are put back
before its next reply.

One request at a time uses the engine (the worker runs one generation at a time, and a control vector acts on the
whole context): a server request starts when no reply of the app's is being written; a reply the user asks for
while a server request runs waits for it (the stats bar's "api" readout shows the request running), and a setting
the user changes meanwhile is sent once the request is done, so no request sees another's mix. Every change of mix also
forgets the prompt cache (`SetSteering.reset_cache`): what the context holds was computed under the old mix.

`EngineShare` holds the state and decides; the bridge (`app/tui/bridge.py`) owns the engine client and calls it from its
one thread, which is the only thread that touches it. No Textual here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from engine_ext.params import SpeculativeParams
from engine_ext.protocol import Crashed, Event, Failed, Finished, Generate, SetSpeculative, SetSteering

JOB_PREFIX: Final = "job:"  # a setting sent for a server request: its answer is the request's, not the app's
QUIET_PREFIX: Final = "quiet:"  # the app's setting put back after a server request: its answer is nobody's
_KINDS: Final = ("speculative", "steering")
Setting = SetSpeculative | SetSteering


STOPPED_IN_THE_APP = "stopped in the app serving this model (ctrl+k: its user's reply was waiting)"
"""What an API client is told of its request stopped by the app's user (the engine ended it as cancelled)."""


@dataclass
class SharedJob:
    """One server request for the app's engine."""

    request: Generate
    speculative: SetSpeculative
    steering: SetSteering
    sink: Callable[[Event], None]
    """Told the request's TokenChunk, Finished, Failed or Crashed events, in the bridge's thread."""
    pending: int = 0  # settings sent for it, not yet answered
    started: bool = False
    stopped: bool = False  # the user stopped the server's requests (`EngineShare.stop_all`)


class SharedEngine(Protocol):
    """What the server needs of the app's engine (the bridge)."""

    def request_id(self) -> int: ...

    def serve(self, job: SharedJob) -> None: ...

    def cancel_served(self, request_id: int) -> None: ...

    def stop_serving(self, message: str) -> None: ...


def default_setting(kind: str) -> Setting:
    """What a freshly loaded model has: no speculation, no steering."""
    return SetSpeculative(SpeculativeParams(types=())) if kind == "speculative" else SetSteering(())


def same_setting(a: Setting, b: Setting) -> bool:
    if isinstance(a, SetSteering) and isinstance(b, SetSteering):
        return a.entries == b.entries
    if isinstance(a, SetSpeculative) and isinstance(b, SetSpeculative):
        return a.params == b.params or (not a.params.types and not b.params.types)
    return False


class EngineShare:
    """Server requests waiting and running on the app's engine, the chat's replies held for them, and what the
    worker has applied now."""

    def __init__(
        self,
        send_setting: Callable[[str, Setting], None],
        send: Callable[[Generate], None],
        cancel: Callable[[int], None] = lambda request_id: None,
    ) -> None:
        self._send_setting = send_setting  # label ("job:steering"), request: sent, its answer routed by the label
        self._send = send
        self._cancel = cancel  # a request sent to the engine, cancelled there (it still ends with Finished)
        self._queue: deque[SharedJob] = deque()
        self.current: SharedJob | None = None
        self.held: list[Generate] = []
        """The app's replies asked for while a server request runs: sent when it is done."""
        self.deferred: dict[str, Setting] = {}
        """The app's settings changed while a server request runs: sent when it is done."""
        self._worker: dict[str, Setting] = {}
        self._cache_mixed = False  # the app changed its mix without forgetting the cache: rows read under several

    # ----- what the worker has ----------------------------------------------------------------

    def applied(self, kind: str, request: Setting) -> None:
        """The app sent this setting (the worker has it once it answers; a refusal leaves the old one, which the
        next comparison sends again at worst)."""
        self._worker[kind] = request
        if kind == "steering" and not (isinstance(request, SetSteering) and request.reset_cache):
            self._cache_mixed = True

    def fresh_worker(self) -> None:
        """A model was loaded or the worker started again: it has the defaults."""
        self._worker.clear()
        self._cache_mixed = False
        self.deferred.clear()  # the bridge sends the app's settings again itself

    def differs(self, kind: str, want: Setting) -> bool:
        return not same_setting(self._worker.get(kind, default_setting(kind)), want)

    # ----- the app's side -----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A server request is using the engine."""
        return self.current is not None

    def hold(self, request: Generate) -> bool:
        """Keep the app's reply until the server request is done; False when none runs (send it now)."""
        if self.current is None:
            return False
        self.held.append(request)
        return True

    def ahead(self) -> int:
        """How many server requests run before a reply held now: the running one (the waiting ones go after it)."""
        return 1 if self.current is not None else 0

    def drop_held(self, request_id: int) -> bool:
        """Forget a held reply of the app's (stopped before its turn); whether it was held."""
        kept = [request for request in self.held if request.request_id != request_id]
        dropped, self.held = len(kept) != len(self.held), kept
        return dropped

    def defer(self, kind: str, request: Setting) -> bool:
        """Keep the app's setting until the server request is done; False when none runs (send it now)."""
        if self.current is None:
            return False
        self.deferred[kind] = request
        return True

    # ----- the server's side --------------------------------------------------------------------

    def add(self, job: SharedJob) -> None:
        self._queue.append(job)

    def waiting(self) -> int:
        return len(self._queue)

    def pump(self, engine_free: bool) -> None:
        """Start the next server request when the engine is free (loaded, no reply of the app's in flight)."""
        if self.current is not None or not self._queue or not engine_free:
            return
        job = self.current = self._queue.popleft()
        for kind, want in (("speculative", job.speculative), ("steering", job.steering)):
            if self.differs(kind, want) or (kind == "steering" and self._cache_mixed):
                if isinstance(want, SetSteering):
                    want = SetSteering(want.entries, reset_cache=True)
                    self._cache_mixed = False
                self._worker[kind] = want
                job.pending += 1
                self._send_setting(JOB_PREFIX + kind, want)
        if job.pending == 0:
            self._start(job)

    def _start(self, job: SharedJob) -> None:
        job.started = True
        self._send(job.request)
        if job.stopped:
            self._cancel(job.request.request_id)

    def answered(self) -> None:
        """A setting sent for the current request was applied."""
        job = self.current
        if job is None:
            return
        job.pending = max(0, job.pending - 1)
        if job.pending == 0 and not job.started:
            self._start(job)

    def refused(self, message: str) -> bool:
        """A setting sent for the current request was refused: the request fails (nothing generated). True when
        the request is done (the app's settings and replies go back)."""
        job = self.current
        if job is None:
            return False
        self._worker.clear()  # not sure what the worker kept: the next request sends all it needs
        if not job.started:
            job.sink(Failed(job.request.request_id, "EngineError", message.splitlines()[0][:300] if message else ""))
            self.current = None
            return True
        return False

    def owns(self, request_id: int | None) -> bool:
        return self.current is not None and request_id == self.current.request.request_id

    def event(self, event: Event) -> bool:
        """An event of the current request: told to its sink. True when it ended the request."""
        job = self.current
        if job is None:
            return False
        if job.stopped and isinstance(event, Finished) and event.stop_reason == "cancelled":
            # its client is told it was stopped (a 499, an error event mid-stream), not that it finished
            event = Failed(event.request_id, "Cancelled", STOPPED_IN_THE_APP)
        job.sink(event)
        if isinstance(event, Finished | Failed | Crashed):
            self.current = None
            return True
        return False

    def cancel(self, request_id: int) -> bool:
        """Drop a waiting request (True), or say it is not waiting (False: the running one is cancelled by the
        engine)."""
        for job in self._queue:
            if job.request.request_id == request_id:
                self._queue.remove(job)
                job.sink(Failed(request_id, "Cancelled", "the request was cancelled before its turn"))
                return True
        return False

    def stop_all(self) -> None:
        """The user stopped the server's requests (the app's reply waits for them): the waiting ones fail, the
        running one is cancelled in the engine (it ends with Finished, and the app's held replies go out)."""
        for waiting in list(self._queue):
            self.cancel(waiting.request.request_id)
        job = self.current
        if job is None:
            return
        job.stopped = True
        if job.started:  # else cancelled as soon as it is sent (its settings' answers come first)
            self._cancel(job.request.request_id)

    def crashed(self, crashed: Crashed) -> None:
        """The engine died: the running request fails; the waiting ones wait for the engine to come back."""
        self._worker.clear()
        self.deferred.clear()  # the bridge's recovery sends the app's settings again (it kept them)
        job, self.current = self.current, None
        if job is not None:
            job.sink(crashed)

    def close(self, message: str) -> None:
        """The server stops or the engine is gone: the waiting requests fail with `message`, and the running one
        when it has not started generating (a started one ends as the engine ends it: cancelled by its server)."""
        jobs = list(self._queue)
        self._queue.clear()
        job = self.current
        if job is not None and not job.started:
            self.current = None
            jobs.insert(0, job)
        for job in jobs:
            job.sink(Failed(job.request.request_id, "EngineError", message))

    def restore(self, chat_settings: dict[str, Setting]) -> tuple[dict[str, Setting], list[tuple[str, Setting]]]:
        """After a server request: the app's settings changed meanwhile (sent as the app's, answered to it) and the
        ones to put back quietly (the app's mix, the prompt cache forgotten)."""
        deferred, self.deferred = self.deferred, {}
        quiet: list[tuple[str, Setting]] = []
        for kind in _KINDS:
            if kind in deferred:
                continue
            want = chat_settings.get(kind, default_setting(kind))
            if self.differs(kind, want):
                if isinstance(want, SetSteering):
                    want = SetSteering(want.entries, reset_cache=True)
                    self._cache_mixed = False
                self._worker[kind] = want
                quiet.append((QUIET_PREFIX + kind, want))
        return deferred, quiet

    def take_held(self) -> list[Generate]:
        held, self.held = self.held, []
        return held
