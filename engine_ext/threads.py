"""Decode threads that follow a busy machine.

ggml's CPU threads wait for each other after every operation, spinning (OpenMP) for the slowest. When another
program keeps a CPU busy, one of the engine's threads waits for a time slice after every operation: on a 2-CPU
machine with one busy process, `-t 2` decoded at 1.8 tok/s and `-t 1` at 58 (issue 30). `OMP_WAIT_POLICY=passive`
is no answer (a third of the speed on a quiet machine). So the worker measures, between decode steps and at most
every `SAMPLE_S`, how many CPUs' worth other programs use (engine_ext.cpu.CpuContention: /proc/stat less this
process's and its parent's CPU time) and runs on as many threads as CPUs they leave free, from 1 to the default
count (rounded: half a CPU's worth of others' use is noise): fewer at once when others crowd in, more again only
when two samples in a row leave room (a quiet machine keeps the default). While plain decoding runs, the governor
also measures its speed per thread count and load level, and where that says the current count decodes faster than
the load rule's (an intermittent load that measures as a CPU's worth can leave two threads faster than one), the
current count stays until the measurement is FRESH_S old. `llama_set_n_threads` only sets what the
next graph reads, so a change costs nothing. An explicit thread count (`-t`, the settings' threads) stays fixed.

The worker measures plain decoding's speed per (threads, others' load) too (`PlainBaseline`), so speculative
decoding's speedup is always against plain decoding under the same conditions.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable

from engine_ext.cpu import CpuContention, CpuLoad

SAMPLE_S = 0.3  # how often the load is measured while decoding (/proc reads: tens of microseconds)
# Half a CPU of others' use is noise (a terminal, a shell; engine_ext.cpu's BUSY_MIN_CPUS): 1.5 free CPUs still run
# 2 threads, 1.4 run 1 (a busy process beside 2 spinning threads measures about 0.67).
HEADROOM = 0.5
RAISE_AFTER = 2  # samples in a row that must leave room for more threads before more are used
FRESH_S = 6.0  # a measured decode speed counts against the load rule this long
BETTER = 1.05  # ... when it is this much faster than the speed measured at the load rule's count


def threads_for(load: CpuLoad, max_threads: int) -> int:
    """Threads that each find a CPU free: the CPUs others leave (plus HEADROOM), from 1 to `max_threads`."""
    free = load.cpus - load.others
    return max(1, min(max_threads, math.floor(free + HEADROOM)))


def load_level(load: CpuLoad | None) -> int:
    """Others' use in whole CPUs (rounded): plain decoding's speed is compared only at the same level."""
    return round(load.others) if load is not None else 0


class ThreadGovernor:
    """Sets the engine's thread count between decode steps from the measured load (see the module's doc).

    `apply(n)` sets n threads on every context; `contention` samples others' CPU use (None: never changes);
    `pids` are this engine's own processes (their CPU time is not others'). Never raises: a /proc it cannot read
    leaves the count as it is.
    """

    def __init__(
        self,
        max_threads: int,
        apply: Callable[[int], None],
        contention: CpuContention | None = None,
        pids: Iterable[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.current = self.max_threads
        self.apply = apply
        self.contention = contention if contention is not None else CpuContention()
        self.pids = tuple(pids) if pids is not None else (os.getpid(), os.getppid())
        self.clock = clock
        self.last_load: CpuLoad | None = None
        self.changes = 0  # how many times the count changed (bumped on each change: a new measuring segment)
        self._sampled_at = -math.inf
        self._room = 0  # samples in a row that left room for more threads
        # Measured decode speed: the plain decode loop sets `decoding` (its steps are tokens, so step rates at two
        # thread counts compare). rates[(threads, load level)] = (steps per second, when measured).
        self.decoding = False
        self.rates: dict[tuple[int, int], tuple[float, float]] = {}
        self._steps = 0  # decode steps in this sample's window
        self._window_clean = False  # decoding for the whole window (at one thread count: changes come at samples)

    def tick(self, *, force: bool = False) -> bool:
        """Between decode steps: sample the load when SAMPLE_S has passed (or `force`) and change the thread count
        if it calls for it; whether it changed."""
        now = self.clock()
        if self.decoding:
            self._steps += 1
        else:
            self._window_clean = False
        if not force and now - self._sampled_at < SAMPLE_S:
            return False
        window, steps, clean = now - self._sampled_at, self._steps, self._window_clean
        self._sampled_at, self._steps, self._window_clean = now, 0, self.decoding
        load = self.contention.sample(self.pids)
        if load is None:
            self._room = 0  # room must be measured in a row
            return False
        self.last_load = load
        level = load_level(load)
        if clean and steps > 1 and 0 < window < 4 * SAMPLE_S:
            old = self.rates.get((self.current, level))
            rate = steps / window
            if old is not None and now - old[1] < FRESH_S:
                rate = 0.5 * old[0] + 0.5 * rate
            self.rates[(self.current, level)] = (rate, now)
        target = self._measured(threads_for(load, self.max_threads), level, now)
        if target > self.current:
            self._room += 1
            if self._room < RAISE_AFTER:
                return False
        self._room = 0
        if target == self.current:
            return False
        self.current = target
        self.changes += 1
        self.apply(target)
        return True

    def _measured(self, target: int, level: int, now: float) -> int:
        """The load rule's `target`, unless decoding was measured BETTER times faster at another count under this
        load level than at `target` (both within FRESH_S): then that count. An intermittent load (a test suite, a
        browser) can measure as a CPU's worth and still leave two threads faster than one; measurements go stale, so
        the load rule's count is tried again now and then."""
        at_target = self.rates.get((target, level))
        if at_target is None or now - at_target[1] >= FRESH_S:
            return target
        best, best_rate = target, at_target[0]
        for (threads, measured_level), (rate, when) in self.rates.items():
            if measured_level == level and now - when < FRESH_S and rate > best_rate * BETTER:
                best, best_rate = threads, rate
        return best

    @property
    def conditions(self) -> tuple[int, int]:
        """(threads, others' load level): what plain decoding's speed depends on besides the model."""
        return self.current, load_level(self.last_load)


class PlainBaseline:
    """Plain decoding's step time per conditions (threads, others' load level), a moving average each."""

    def __init__(self) -> None:
        self.step_ms: dict[tuple[int, int], float] = {}

    def observe(self, conditions: tuple[int, int], step_ms: float) -> None:
        if step_ms <= 0:
            return
        old = self.step_ms.get(conditions, 0.0)
        self.step_ms[conditions] = step_ms if old == 0 else 0.8 * old + 0.2 * step_ms

    def get(self, conditions: tuple[int, int]) -> float:
        """The step time under these conditions; 0 when plain decoding was not measured under them."""
        return self.step_ms.get(conditions, 0.0)


ADAPTIVE_THREADS_ENV = "LLMTUI_ADAPTIVE_THREADS"  # "off": the default thread count stays fixed (the tests set it)


def thread_governor(n_threads: int) -> ThreadGovernor | None:
    """The governor that sets the thread count from the machine's load, or None when the count is fixed: given
    explicitly (-t, the settings' threads), or LLMTUI_ADAPTIVE_THREADS=off."""
    if n_threads or os.environ.get(ADAPTIVE_THREADS_ENV, "").lower() in ("0", "off", "no", "false"):
        return None
    from engine_ext.cpu import default_threads
    from engine_ext.model import set_threads

    governor = ThreadGovernor(default_threads(), set_threads)
    governor.tick(force=True)  # a baseline: the next sample measures the time since the load
    return governor
