"""The engine client's watchdog: ends a worker that is stuck in one native call, so that stopping a reply (Esc, an API
client's disconnect, Ctrl+C) always takes about a second, and, where a limit is set, a reply's single step cannot
hold the engine forever.

A worker reads a Cancel between decode steps; inside one native call (llama.cpp's grammar sampler on a pathological
pattern ran for minutes) it cannot. The worker counts the requests it reads (engine_ext.engine_status): a Cancel
still unread `CANCEL_GRACE_S` after it was sent, while the worker is in a reply's phase, means it is stuck, and the
watchdog kills the worker's process (SIGKILL). The client then reports a `Crashed` event whose `stopped` says why;
its callers restart the engine with the same model and settings and end the reply as stopped. A load is never
killed this way (it reads no pipe and is not cancellable: it ends by itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine_ext.engine_status import PHASES, WATCHED_PHASES, EngineStatus

CANCEL_GRACE_S = 0.8  # how long a Cancel may stay unread (the reply then ends within about a second)
_CANCEL_POLL_S = 0.05
_STEP_POLL_MAX_S = 1.0


def stuck_line(grace_s: float, phase: str) -> str:
    return f"the engine did not stop within {grace_s:.0f} s (stuck in {PHASES.get(phase, phase)})"


def over_limit_line(limit_s: float, phase: str) -> str:
    return f"one step of the reply ({PHASES.get(phase, phase)}) ran past the {limit_s:g} s step limit"


class Watchdog:
    """A thread while the client has a worker, asleep unless a Cancel waits to be read or a step limit is set.
    `kill(status, reason)` ends the worker whose shared status is `status` (the client's, if it is still that
    worker); `step_limit_s` (0: none) bounds the time a worker spends in one phase of a reply."""

    def __init__(self, kill: Callable[[EngineStatus, str], None], *, grace_s: float = CANCEL_GRACE_S) -> None:
        self._kill = kill
        self.grace_s = grace_s
        self.step_limit_s = 0.0
        self._status: EngineStatus | None = None
        self._cancels: list[tuple[int, float]] = []  # (the worker's read count that acknowledges it, sent when)
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, status: EngineStatus | None) -> None:
        """Watch a (new) worker through its shared status; None: no worker."""
        with self._wake:
            self._status, self._cancels = status, []
            if self._thread is None and status is not None:
                self._thread = threading.Thread(target=self._run, name="llmtui-engine-watchdog", daemon=True)
                self._thread.start()
            self._wake.notify()

    def cancel_sent(self, sent: int) -> None:
        """A Cancel went down the pipe as the worker's `sent`th request."""
        with self._wake:
            self._cancels.append((sent, time.monotonic()))
            self._wake.notify()

    def set_step_limit(self, seconds: float) -> None:
        with self._wake:
            self.step_limit_s = max(0.0, seconds)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed or self._status is None:
                    self._thread = None  # `watch` starts another for the next worker
                    return
                timeout: float | None = None
                if self._status is not None and self._cancels:
                    timeout = _CANCEL_POLL_S
                elif self._status is not None and self.step_limit_s:
                    timeout = min(_STEP_POLL_MAX_S, self.step_limit_s / 4)
                self._wake.wait(timeout)
                if self._closed:
                    self._thread = None
                    return
                status, reason = self._status, self._verdict(time.monotonic())
                if reason:
                    self._status, self._cancels = None, []  # one kill per worker; `watch` gives the next one
            if reason and status is not None:
                self._kill(status, reason)

    def _verdict(self, now: float) -> str:
        """Why the worker must end now ('' when it need not); called with the lock held."""
        status = self._status
        if status is None:
            return ""
        phase, reads = status.phase, status.reads
        self._cancels = [(sent, at) for sent, at in self._cancels if reads < sent]  # read: acknowledged
        if phase not in WATCHED_PHASES:
            # waiting for a request (it reads the Cancel at once), loading (not cancellable), a decode or an image
            # encode (it ends by itself, and the Cancel is read after it), or other work
            if phase == "idle":
                self._cancels = []
            return ""
        # the grace runs from the Cancel or from the phase's start, whichever is later: a Cancel sent during a long
        # decode gets its grace once the worker is back where it reads the pipe
        if self._cancels and now - max(self._cancels[0][1], status.since) >= self.grace_s:
            return stuck_line(max(1.0, self.grace_s), phase)
        if self.step_limit_s and now - status.since >= self.step_limit_s:
            return over_limit_line(self.step_limit_s, phase)
        return ""
