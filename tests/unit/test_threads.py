"""The thread count that follows a busy machine (engine_ext.threads), on a fake /proc and a fake clock."""

from __future__ import annotations

from engine_ext.cpu import CpuLoad
from engine_ext.threads import SAMPLE_S, PlainBaseline, ThreadGovernor, load_level, threads_for


class FakeContention:
    """Hands out the loads a test queues, one per sample (None: /proc could not say)."""

    def __init__(self) -> None:
        self.loads: list[CpuLoad | None] = []
        self.pids: list[tuple[int, ...]] = []

    def sample(self, pids: tuple[int, ...]) -> CpuLoad | None:
        self.pids.append(tuple(pids))
        return self.loads.pop(0) if self.loads else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float = SAMPLE_S + 0.01) -> None:
        self.now += seconds


def governor(max_threads: int = 2) -> tuple[ThreadGovernor, FakeContention, Clock, list[int]]:
    contention, clock, applied = FakeContention(), Clock(), []
    gov = ThreadGovernor(max_threads, applied.append, contention, pids=(1, 2), clock=clock)  # type: ignore[arg-type]
    return gov, contention, clock, applied


def test_threads_for_the_cpus_others_leave_free() -> None:
    assert threads_for(CpuLoad(0.0, 2), 2) == 2  # quiet: the default
    assert threads_for(CpuLoad(0.2, 2), 2) == 2  # a terminal, a shell: noise
    assert threads_for(CpuLoad(0.45, 2), 2) == 2 and threads_for(CpuLoad(0.3, 4), 4) == 4
    assert threads_for(CpuLoad(0.67, 2), 2) == 1  # `yes` sharing two CPUs with two spinning threads
    assert threads_for(CpuLoad(1.0, 2), 2) == 1  # one busy process, the engine on one thread
    assert threads_for(CpuLoad(2.0, 2), 2) == 1  # never fewer than one
    assert threads_for(CpuLoad(3.0, 16), 8) == 8  # a big machine keeps its default while CPUs are free
    assert threads_for(CpuLoad(10.0, 16), 8) == 6
    assert load_level(None) == 0 and load_level(CpuLoad(0.6, 2)) == 1


def test_fewer_threads_at_once_more_only_after_two_samples_with_room() -> None:
    gov, contention, clock, applied = governor()
    assert gov.current == 2 and gov.conditions == (2, 0)
    contention.loads = [CpuLoad(1.0, 2)]
    assert gov.tick(force=True) and gov.current == 1 and applied == [1] and gov.conditions == (1, 1)
    assert contention.pids == [(1, 2)]  # the engine's own processes are not "others"
    # Within SAMPLE_S nothing is read: the decode loop calls this between every two tokens.
    assert not gov.tick() and len(contention.pids) == 1
    contention.loads = [CpuLoad(0.1, 2), CpuLoad(0.1, 2)]
    clock.step()
    assert not gov.tick() and gov.current == 1  # one sample with room is not enough (a gap in the other's work)
    clock.step()
    assert gov.tick() and gov.current == 2 and applied == [1, 2] and gov.changes == 2


def test_room_must_come_in_a_row_and_unreadable_proc_changes_nothing() -> None:
    gov, contention, clock, applied = governor()
    contention.loads = [CpuLoad(1.0, 2), CpuLoad(0.1, 2), CpuLoad(1.0, 2), CpuLoad(0.1, 2), None, CpuLoad(0.1, 2)]
    for _ in range(6):
        gov.tick()
        clock.step()
    assert applied == [1]  # room, crowded, room, unknown, room: never two in a row... until now
    contention.loads = [CpuLoad(0.0, 2)]
    gov.tick()
    assert applied == [1, 2]


def test_a_quiet_machine_never_changes_the_count() -> None:
    gov, contention, clock, applied = governor(4)
    contention.loads = [CpuLoad(0.3, 4)] * 20
    for _ in range(20):
        gov.tick()
        clock.step()
    assert applied == [] and gov.current == 4


def test_the_plain_baseline_is_per_conditions() -> None:
    baseline = PlainBaseline()
    assert baseline.get((2, 0)) == 0.0
    baseline.observe((2, 0), 10.0)
    baseline.observe((1, 1), 17.0)
    baseline.observe((2, 0), 20.0)
    assert baseline.get((2, 0)) == 12.0 and baseline.get((1, 1)) == 17.0 and baseline.get((2, 1)) == 0.0
    baseline.observe((2, 1), 0.0)  # no measurement
    assert baseline.get((2, 1)) == 0.0


def test_a_count_measured_faster_stays_against_the_load_rule_until_the_measurement_is_stale() -> None:
    """An intermittent load measured as a CPU's worth, with two threads still decoding faster than one: the
    governor tries one thread (the load rule), measures it slower, goes back to two and stays there while both
    measurements are fresh; then tries the load rule's count again."""
    from engine_ext.threads import FRESH_S

    gov, contention, clock, applied = governor()
    gov.decoding = True
    busyish = CpuLoad(1.0, 2)
    contention.loads = [CpuLoad(0.0, 2), busyish]
    gov.tick(force=True)  # a baseline

    def decode(steps: int, seconds: float = SAMPLE_S + 0.01) -> None:
        """`steps` decode steps in one sample window, then the sample."""
        for _ in range(steps - 1):
            gov.tick()
        clock.step(seconds)
        gov.tick()

    decode(30)  # two threads, 30 steps in the window: measured; the load rule then says one
    assert applied == [1] and gov.rates[(2, 1)][0] > 0
    contention.loads = [busyish] * 40
    decode(15)  # one thread measured at half the speed: back to two (after RAISE_AFTER samples with the rule's room)
    decode(30)
    assert applied == [1, 2]
    for _ in range(int(FRESH_S / (SAMPLE_S + 0.01)) - 4):
        decode(30)
    assert applied == [1, 2]  # fresh measurements keep two threads against the load rule
    for _ in range(6):
        decode(30)
    assert applied[:3] == [1, 2, 1]  # stale: the load rule's count is tried again
