"""Bounded waits for tests: every wait has a limit and fails saying what it waited for.

`wait_until` lets a Textual app run (through its Pilot) until a condition holds; `wait_for` polls a condition from
plain (non-async) code. Neither ever waits forever: a regression fails the test with the name of what never
happened instead of hanging the run.
"""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT_S = 60.0  # generous: an engine starting on a busy machine; a regression still fails, naming what


def describe(predicate: Callable[[], object]) -> str:
    """Where a condition was written, with its source line (for a message when the caller gave no words)."""
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return f"{line} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


def _timed_out(what: str, timeout_s: float) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


async def wait_until(
    pilot: Any,
    predicate: Callable[[], object],
    what: str | Callable[[], str] = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.05,
) -> None:
    """Let the app behind `pilot` run until `predicate()` is true; fail after `timeout_s` seconds of wall time
    with a message naming `what` (called then, when it is a function: the state it saw) or the predicate's line."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise _timed_out(said or describe(predicate), timeout_s)
        await pilot.pause(interval_s)


def wait_for(
    predicate: Callable[[], object], what: str = "", timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.05
) -> None:
    """Poll `predicate()` (sleeping `interval_s` between calls; 0 polls without sleeping) until it is true; fail
    after `timeout_s` seconds with a message naming `what` (or the predicate's source line)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise _timed_out(what or describe(predicate), timeout_s)
        if interval_s:
            time.sleep(interval_s)
