"""Progress of making a control vector, phase by phase: what the worker sends as VectorProgress events."""

from __future__ import annotations

import time
from collections.abc import Callable

from engine_ext.protocol import VectorProgress
from engine_ext.steering.extract import PHASES, Phase


class PhaseProgress:
    """Turns `make_control_vector`'s (phase, done, total) calls, then the writing's, into VectorProgress events.

    Each event carries the seconds since its phase began (the app's ETA is that phase's measured rate) and the
    fraction of all steps: one per prompt pair, one per layer, one for the file. The fraction never goes back and
    reaches 1.0 only when the file is written.
    """

    def __init__(
        self,
        send: Callable[[VectorProgress], None],
        *,
        pairs: int,
        layers: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.send = send
        self.clock = clock
        self.totals: dict[Phase, int] = {"evaluating": max(1, pairs), "directions": max(1, layers), "writing": 1}
        self.phase: Phase | None = None
        self.phase_start = 0.0
        self.fraction = 0.0

    def __call__(self, phase: Phase, done: int, total: int) -> None:
        now = self.clock()
        if phase != self.phase:
            self.phase, self.phase_start = phase, now
        self.totals[phase] = max(1, total)
        before = sum(self.totals[p] for p in PHASES[: PHASES.index(phase)])
        steps = sum(self.totals.values())
        fraction = (before + min(max(done, 0), self.totals[phase])) / steps
        self.fraction = max(self.fraction, min(1.0, fraction))
        self.send(VectorProgress(done, total, phase, now - self.phase_start, self.fraction))
