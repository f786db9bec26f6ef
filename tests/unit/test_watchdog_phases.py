"""The watchdog's verdict by phase (engine_ext/watchdog.py): a worker stuck where a request's input sets the work
(sampling under a grammar, building it) is ended once a Cancel stays unread past the grace; one in a decode or an
image encode is left to finish its batch, however long, and read the Cancel then (killing it would cost a reload and
the conversation read again); the grace runs from the phase's start when that is later than the Cancel."""

from __future__ import annotations

import time

import pytest

from engine_ext.engine_status import _INDEX, SLOTS, EngineStatus
from engine_ext.watchdog import Watchdog


def status_in(phase: str, since: float, reads: int = 0) -> EngineStatus:
    values = [0.0] * SLOTS
    values[0], values[1], values[2] = float(_INDEX[phase]), since, float(reads)
    return EngineStatus(values)


def verdict(dog: Watchdog, status: EngineStatus, cancel_at: float, now: float) -> str:
    dog._status = status
    dog._cancels = [(status.reads + 1, cancel_at)]  # unread: the worker has read fewer than it was sent
    return dog._verdict(now)


@pytest.mark.parametrize("phase", ["sample", "grammar", "tokenize", "reply"])
def test_a_worker_stuck_where_the_request_sets_the_work_is_ended(phase: str) -> None:
    dog = Watchdog(lambda status, reason: None, grace_s=0.8)
    now = time.monotonic()
    assert "did not stop" in verdict(dog, status_in(phase, since=now - 5), cancel_at=now - 1.0, now=now)
    assert verdict(dog, status_in(phase, since=now - 5), cancel_at=now - 0.5, now=now) == ""


@pytest.mark.parametrize("phase", ["decode", "encode", "load", "idle"])
def test_a_long_decode_or_encode_is_left_to_finish(phase: str) -> None:
    dog = Watchdog(lambda status, reason: None, grace_s=0.8)
    now = time.monotonic()
    assert verdict(dog, status_in(phase, since=now - 60), cancel_at=now - 30, now=now) == ""
    dog.step_limit_s = 10
    assert verdict(dog, status_in(phase, since=now - 60), cancel_at=now - 30, now=now) == ""


def test_the_grace_runs_from_the_phase_after_a_long_decode() -> None:
    """A Cancel sent during a 30 s decode: once the worker samples (where it then reads the pipe), it gets its
    grace from there, not from the Cancel."""
    dog = Watchdog(lambda status, reason: None, grace_s=0.8)
    now = time.monotonic()
    assert verdict(dog, status_in("sample", since=now - 0.1), cancel_at=now - 30, now=now) == ""
    assert "did not stop" in verdict(dog, status_in("sample", since=now - 0.9), cancel_at=now - 30, now=now)


def test_the_step_limit_bounds_sampling_not_decoding() -> None:
    dog = Watchdog(lambda status, reason: None, grace_s=0.8)
    dog.step_limit_s = 10
    now = time.monotonic()
    dog._status, dog._cancels = status_in("sample", since=now - 11), []
    assert "step limit" in dog._verdict(now)
    dog._status = status_in("decode", since=now - 11)
    assert dog._verdict(now) == ""
