"""The app's engine shared with its API server (app/core/engine_share.py): one request at a time, each under its own
settings, the app's settings and replies back after it."""

from __future__ import annotations

from app.core.engine_share import JOB_PREFIX, QUIET_PREFIX, STOPPED_IN_THE_APP, EngineShare, Setting, SharedJob
from engine_ext.params import SamplingParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    ChatMessage,
    Crashed,
    Event,
    Failed,
    Finished,
    Generate,
    GenerationStats,
    SetSpeculative,
    SetSteering,
    TokenChunk,
)

TILT = (SteeringEntry("/v/tilt.gguf", 0.5, 0, 0),)
NGRAM = SpeculativeParams(types=("ngram-simple",))
OFF = SetSpeculative(SpeculativeParams(types=()))
UNSTEERED = SetSteering(())


def generate(request_id: int) -> Generate:
    return Generate(request_id, (ChatMessage("user", "hi"),), SamplingParams(), 8)


def finished(request_id: int) -> Finished:
    return Finished(request_id, "length", GenerationStats(1, 0, 1, 1.0, 1, 1.0, 1.0, 64, 2))


class Sent:
    def __init__(self) -> None:
        self.items: list[tuple[str, object]] = []

    def setting(self, label: str, request: Setting) -> None:
        self.items.append((label, request))

    def generate(self, request: Generate) -> None:
        self.items.append(("generate", request.request_id))


def share_and_sent() -> tuple[EngineShare, Sent]:
    sent = Sent()
    return EngineShare(sent.setting, sent.generate), sent


def job(request_id: int, spec: SetSpeculative = OFF, steering: SetSteering = UNSTEERED) -> tuple[SharedJob, list]:
    told: list[Event] = []
    return SharedJob(generate(request_id), spec, steering, told.append), told


def test_a_request_starts_only_when_the_engine_is_free_and_after_its_settings_are_answered() -> None:
    share, sent = share_and_sent()
    first, told = job(7, SetSpeculative(NGRAM), SetSteering(TILT))
    share.add(first)
    share.pump(engine_free=False)  # a reply of the app's is being written
    assert sent.items == [] and not share.busy and share.waiting() == 1
    share.pump(engine_free=True)
    assert sent.items == [
        (JOB_PREFIX + "speculative", SetSpeculative(NGRAM)),
        (JOB_PREFIX + "steering", SetSteering(TILT, reset_cache=True)),  # the cache was computed under another mix
    ]
    share.answered()
    assert ("generate", 7) not in sent.items
    share.answered()
    assert sent.items[-1] == ("generate", 7)
    assert share.owns(7) and not share.owns(8)
    chunk = TokenChunk(7, "a", "", (1,), ("target",))
    assert share.event(chunk) is False
    assert share.event(finished(7)) is True and not share.busy
    assert told == [chunk, finished(7)]


def test_settings_the_worker_has_are_not_sent_again() -> None:
    share, sent = share_and_sent()
    first, _ = job(1)  # no speculation, no steering: what a fresh worker has
    share.add(first)
    share.pump(engine_free=True)
    assert sent.items == [("generate", 1)]


def test_the_apps_replies_and_settings_wait_for_the_request_and_come_back_after_it() -> None:
    share, sent = share_and_sent()
    share.applied("steering", SetSteering(TILT))  # the app's mix
    served, _ = job(3)  # the request wants none
    share.add(served)
    share.pump(engine_free=True)
    assert sent.items == [(JOB_PREFIX + "steering", SetSteering((), reset_cache=True))]
    share.answered()
    assert share.hold(generate(4)) is True  # the app's reply waits
    assert share.defer("speculative", SetSpeculative(NGRAM)) is True  # the user turned speculation on meanwhile
    share.event(finished(3))
    deferred, quiet = share.restore({"steering": SetSteering(TILT)})
    assert deferred == {"speculative": SetSpeculative(NGRAM)}  # sent as the app's own: the app hears the answer
    assert quiet == [(QUIET_PREFIX + "steering", SetSteering(TILT, reset_cache=True))]
    assert [g.request_id for g in share.take_held()] == [4]
    assert share.hold(generate(5)) is False and share.defer("steering", SetSteering(())) is False


def test_a_refused_setting_fails_the_request_before_it_generates() -> None:
    share, sent = share_and_sent()
    served, told = job(9, SetSpeculative(SpeculativeParams(types=("mtp",))))
    share.add(served)
    share.pump(engine_free=True)
    assert share.refused("speculative type mtp needs MTP heads\nmore") is True
    assert told == [Failed(9, "EngineError", "speculative type mtp needs MTP heads")]
    assert ("generate", 9) not in sent.items and not share.busy


def test_cancel_drops_a_waiting_request_and_a_crash_fails_the_running_one() -> None:
    share, _ = share_and_sent()
    running, told_running = job(1)
    waiting, told_waiting = job(2)
    share.add(running)
    share.add(waiting)
    share.pump(engine_free=True)
    assert share.cancel(2) is True and told_waiting[0].error == "Cancelled"  # type: ignore[union-attr]
    assert share.cancel(1) is False  # running: the engine cancels it
    crash = Crashed("SIGSEGV", "", -11)
    share.crashed(crash)
    assert told_running == [crash] and not share.busy


def test_close_fails_what_waits() -> None:
    share, _ = share_and_sent()
    a, told_a = job(1)
    b, told_b = job(2)
    share.add(a)
    share.add(b)
    share.close("the app's server stopped")
    assert told_a == [Failed(1, "EngineError", "the app's server stopped")] and len(told_b) == 1
    assert share.waiting() == 0


def test_a_request_forgets_a_cache_the_app_read_under_another_mix_even_when_the_mixes_are_equal() -> None:
    share, sent = share_and_sent()
    share.applied("steering", SetSteering(TILT))  # a slider moved: the cache holds rows read under two mixes
    share.applied("steering", SetSteering(()))
    served, _ = job(1)  # wants no steering, as the worker has now
    share.add(served)
    share.pump(engine_free=True)
    assert sent.items[0] == (JOB_PREFIX + "steering", SetSteering((), reset_cache=True))
    share.answered()
    share.event(finished(1))
    again, _ = job(2)  # the cache is the last request's now: kept
    share.add(again)
    share.pump(engine_free=True)
    assert sent.items[-1] == ("generate", 2)


def test_a_crash_forgets_the_apps_deferred_settings_which_the_bridges_recovery_sends_itself() -> None:
    share, _ = share_and_sent()
    running, _ = job(1)
    share.add(running)
    share.pump(engine_free=True)
    assert share.defer("steering", SetSteering(TILT)) is True
    share.crashed(Crashed("SIGSEGV", "", -11))
    deferred, quiet = share.restore({"steering": SetSteering(TILT)})
    assert deferred == {}  # not sent twice as the app's own
    assert quiet == [(QUIET_PREFIX + "steering", SetSteering(TILT, reset_cache=True))]


def test_the_user_stops_the_server_requests_a_held_reply_waits_for() -> None:
    """Issue 49: ctrl+k while the chat's reply waits: the waiting requests fail, the running one is cancelled (one
    whose settings are not answered yet as soon as it is sent); the held reply can also be dropped on its own."""
    cancelled: list[int] = []
    sent = Sent()
    share = EngineShare(sent.setting, sent.generate, cancelled.append)
    running, told = job(7, SetSpeculative(NGRAM))
    waiting, waiting_told = job(8)
    share.add(running)
    share.add(waiting)
    share.pump(engine_free=True)  # 7's speculative setting is sent, not answered yet
    assert share.hold(generate(1)) and share.ahead() == 1
    share.stop_all()
    assert isinstance(waiting_told[-1], Failed) and share.waiting() == 0
    assert cancelled == []  # 7 is not in the engine yet
    share.answered()
    assert sent.items[-1] == ("generate", 7) and cancelled == [7]  # sent, then cancelled at once
    cancelled_in_engine = Finished(7, "cancelled", finished(7).stats)
    assert share.event(cancelled_in_engine) and share.ahead() == 0
    assert told[-1] == Failed(7, "Cancelled", STOPPED_IN_THE_APP)  # the API client is told it was stopped
    assert not share.drop_held(2) and share.drop_held(1) and share.take_held() == []
