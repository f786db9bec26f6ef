"""Decode threads that follow a busy machine.

ggml's CPU threads wait for each other after every operation, spinning (OpenMP) for the slowest. When another
program keeps a CPU busy, one of the engine's threads waits for a time slice after every operation: on a 2-CPU
machine with one busy process, `-t 2` decoded at 1.8 tok/s and `-t 1` at 58 (issue 30). `OMP_WAIT_POLICY=passive`
is no answer (a third of the speed on a quiet machine). So the worker measures, between decode steps and at most
every `SAMPLE_S`, how many CPUs' worth other programs use (engine_ext.cpu.CpuContention: /proc/stat less this
process's and its parent's CPU time) and runs on as many threads as CPUs they leave free, from 1 to the default
count (rounded: half a CPU's worth of others' use is noise): fewer at once when others crowd in, more again only
when two samples in a row leave room (a quiet machine keeps the default). `llama_set_n_threads` only sets what the
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

    def tick(self, *, force: bool = False) -> bool:
        """Between decode steps: sample the load when SAMPLE_S has passed (or `force`) and change the thread count
        if it calls for it; whether it changed."""
        now = self.clock()
        if not force and now - self._sampled_at < SAMPLE_S:
            return False
        self._sampled_at = now
        load = self.contention.sample(self.pids)
        if load is None:
            self._room = 0  # room must be measured in a row
            return False
        self.last_load = load
        target = threads_for(load, self.max_threads)
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
