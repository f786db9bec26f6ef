"""What the engine worker is doing, shared with its client in a few words of memory: the phase of work it is in
(loading the model, decoding, building a request's grammar, tokenizing, sampling…), since when, and how many
requests it has read from the pipe.

The worker marks a phase before each family of native calls (`entered` / `left`, cheap enough for every decode
step); the client reads it while a cancel waits (a worker stuck in one native call cannot read the pipe:
engine_ext.watchdog ends it) and after a native crash, where the memory outlives the worker (engine_ext.recovery
blames CPU weight repacking only for a crash in a phase where repacked weights are used).

Tests only: LLMTUI_TEST_FAULT=crash-PHASE or hang-PHASE (PHASE one of `PHASES`' keys) makes the worker crash
natively (SIGSEGV) or block in a C call that never polls (libc's sleep) when it enters that phase.
"""

from __future__ import annotations

import os
import time
from typing import Any

# key → the phase in words, as messages say it ("the engine crashed while …", "stuck in …")
PHASES: dict[str, str] = {
    "idle": "waiting for a request",
    "load": "loading the model",
    "reply": "preparing a reply",
    "tokenize": "tokenizing",
    "grammar": "building the request's grammar",
    "decode": "decoding",
    "encode": "encoding an image",
    "sample": "sampling",
    "other": "working",
}
_KEYS = tuple(PHASES)
_INDEX = {key: index for index, key in enumerate(_KEYS)}
# Phases that run llama.cpp's matrix kernels on the model's weights (repacked for AMX, CPU_REPACK…) and none else.
REPACKED_WEIGHTS_PHASES = frozenset({"load", "decode", "encode"})
# Phases of a reply: a worker that reads no Cancel in one of them for long is stuck (a load is not cancellable).
REPLY_PHASES = frozenset({"reply", "tokenize", "grammar", "decode", "encode", "sample"})
# ... among them, those whose work a request's input can make unbounded (a grammar, a sampler's stacks, Python
# between native calls): the watchdog ends a worker stuck in one of these. A decode or an image encode always ends by
# itself, its length set by the model, the machine and a batch of at most n_batch tokens, never by a request's shape:
# a Cancel sent during one is read when it ends (a long prompt on a large model on a CPU can take many seconds a
# batch, and killing the worker then would cost a reload and the whole conversation read again).
WATCHED_PHASES = REPLY_PHASES - {"decode", "encode"}


def native_phase(phase: str) -> bool:
    """Whether `phase` is one family of native calls (what a crash in it is said to have crashed in)."""
    return phase in PHASES and phase not in ("idle", "reply", "other")


FAULT_ENV = "LLMTUI_TEST_FAULT"  # tests only (engine_ext.worker has the repacking ones)
_PHASE, _SINCE, _READS = 0, 1, 2
SLOTS = 3


class EngineStatus:
    """The shared words: the phase's index, when it was entered (time.monotonic, one clock for all processes on
    Linux and macOS) and the requests read; `values` is a multiprocessing RawArray of `SLOTS` doubles."""

    def __init__(self, values: Any) -> None:
        self.values = values

    @classmethod
    def shared(cls, mp_context: Any) -> EngineStatus:
        return cls(mp_context.RawArray("d", SLOTS))

    @property
    def phase(self) -> str:
        index = int(self.values[_PHASE])
        return _KEYS[index] if 0 <= index < len(_KEYS) else "other"

    @property
    def since(self) -> float:
        return float(self.values[_SINCE])

    @property
    def reads(self) -> int:
        return int(self.values[_READS])

    def read_one(self) -> None:
        """The worker read a request from the pipe."""
        self.values[_READS] += 1


def request_read() -> None:
    """In the worker: a request was read from the pipe (a Cancel among them is acknowledged so)."""
    if _status is not None:
        _status.read_one()


_status: EngineStatus | None = None  # set in the worker process only
_fault: tuple[str, int] | None = None  # (what, phase index) of LLMTUI_TEST_FAULT, in the worker


def attach(status: EngineStatus) -> None:
    """In the worker: mark phases in `status` from now on (and read the test fault switch once)."""
    global _status, _fault
    _status = status
    what, _, phase = os.environ.get(FAULT_ENV, "").partition("-")
    _fault = (what, _INDEX[phase]) if what in ("crash", "hang") and phase in PHASES else None
    entered("idle")


def entered(phase: str) -> int:
    """Mark `phase` as the worker's (a no-op outside the worker); returns the phase it replaces, for `left`."""
    status = _status
    if status is None:
        return 0
    values = status.values
    previous = int(values[_PHASE])
    index = _INDEX[phase]
    values[_PHASE] = index
    values[_SINCE] = time.monotonic()
    if _fault is not None and _fault[1] == index:
        _injected_fault(_fault[0], phase)
    return previous


def left(previous: int) -> None:
    """Back to the phase `entered` replaced."""
    status = _status
    if status is not None:
        status.values[_PHASE] = previous
        status.values[_SINCE] = time.monotonic()


class phase:  # noqa: N801 - used as a `with` statement, like contextlib's helpers
    """`with phase("grammar"): ...`: the phase marked for the block, the previous one back after it."""

    __slots__ = ("name", "previous")

    def __init__(self, name: str) -> None:
        self.name = name
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = entered(self.name)

    def __exit__(self, *exc: object) -> None:
        left(self.previous)


def _injected_fault(what: str, phase: str) -> None:
    import ctypes

    print(
        f"--- {FAULT_ENV}={what}-{phase}: {'crashing natively' if what == 'crash' else 'hanging'} at {phase}",
        flush=True,
    )
    if what == "crash":
        ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a native fault in llama.cpp would
    libc = ctypes.CDLL(None)
    while True:
        libc.sleep(3600)  # in C, never polling the pipe, as a native call stuck in a pathological grammar
