"""Default decode threads: one per physical core useful for math, within affinity and cgroup quotas."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine_ext.cpu import CpuContention, CpuLoad, ThreadPlan, cgroup_cpu_quota, default_threads, math_cores


def fake_sysfs(root: Path, siblings: dict[int, str], p_cores: str | None = None) -> Path:
    """A /sys with each CPU's `thread_siblings_list`, and a hybrid CPU's P-core list when given."""
    for cpu, listed in siblings.items():
        topology = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(listed + "\n")
    if p_cores is not None:
        (root / "devices/cpu_core").mkdir(parents=True)
        (root / "devices/cpu_core/cpus").write_text(p_cores + "\n")
    return root


def test_one_thread_per_core_with_smt(tmp_path: Path) -> None:
    # 4 cores, 2 threads each: CPUs i and i+4 are siblings.
    sysfs = fake_sysfs(tmp_path, {i: f"{i % 4},{i % 4 + 4}" for i in range(8)})
    assert math_cores(range(8), sysfs) == 4
    assert math_cores({0, 4}, sysfs) == 1  # an affinity of one core's two threads
    assert math_cores({0, 1, 2}, sysfs) == 3


def test_hybrid_intel_leaves_efficiency_cores_out(tmp_path: Path) -> None:
    # 2 P-cores with SMT (CPUs 0-3), 4 E-cores (CPUs 4-7).
    siblings = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3", **{i: str(i) for i in range(4, 8)}}
    sysfs = fake_sysfs(tmp_path, siblings, p_cores="0-3")
    assert math_cores(range(8), sysfs) == 2
    # Allowed only E-cores, nothing is left: sysfs does not say, so the caller falls back.
    assert math_cores(range(4, 8), sysfs) is None


def test_unreadable_topology_means_unknown(tmp_path: Path) -> None:
    assert math_cores({0, 1}, tmp_path) is None


def cgroup(root: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A /sys/fs/cgroup with `cpu.max` files at the given folders, and a /proc/self/cgroup naming `own`."""
    sysfs, proc = root / "sys", root / "proc"
    for folder, value in limits.items():
        path = sysfs / "fs/cgroup" / folder.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.max").write_text(value + "\n")
    (proc / "self").mkdir(parents=True)
    (proc / "self/cgroup").write_text(f"0::{own}\n")
    return sysfs, proc


def test_cgroup_v2_quota_is_the_smallest_on_the_way_up(tmp_path: Path) -> None:
    sysfs, proc = cgroup(tmp_path, "/docker/abc", {"/docker/abc": "max 100000", "/docker": "250000 100000"})
    assert cgroup_cpu_quota(sysfs, proc) == 3  # 2.5 CPUs, rounded up
    sysfs, proc = cgroup(tmp_path / "b", "/box", {"/box": "50000 100000"})
    assert cgroup_cpu_quota(sysfs, proc) == 1
    sysfs, proc = cgroup(tmp_path / "c", "/", {"/": "max 100000"})
    assert cgroup_cpu_quota(sysfs, proc) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    cpu = tmp_path / "fs/cgroup/cpu"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("400000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path, tmp_path / "no-proc") == 4
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path, tmp_path / "no-proc") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sysfs and affinity")
def test_default_threads_within_affinity_and_quota(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    # Every allowed CPU its own core: one thread each; a quota of one CPU caps it to one.
    sysfs = fake_sysfs(tmp_path / "sys", {cpu: str(cpu) for cpu in allowed})
    assert default_threads(sysfs, tmp_path / "proc") == len(allowed)
    _, proc = cgroup(tmp_path, "/", {"/": "100000 100000"})
    assert default_threads(sysfs, proc) == 1
    # No topology to read: llama.cpp's fallback (all CPUs up to 4, else half).
    empty = tmp_path / "empty"
    expected = len(allowed) if len(allowed) <= 4 else len(allowed) // 2
    assert default_threads(empty, empty) == expected


def test_plan_says_what_decided_the_count() -> None:
    assert ThreadPlan(8, 16, 8, None).describe() == (
        "8 (one per physical core: 8 among the 16 CPUs this process may use)"
    )
    assert ThreadPlan(2, 16, 8, 2).describe() == (
        "2 (one per physical core: 8 among the 16 CPUs this process may use; capped by a cgroup CPU quota of 2)"
    )
    assert ThreadPlan(6, 12, None, None).describe() == (
        "6 (12 CPUs, core layout unknown: all of them up to 4, else half)"
    )


# ----- CpuContention: other programs' CPU use, from fake /proc contents -----


def proc_stat(per_cpu: list[tuple[int, int]]) -> str:
    """A /proc/stat whose CPUs have (busy, idle) ticks: busy split between user and system, some iowait."""
    lines = []
    for cpu, (busy, idle) in enumerate(per_cpu):
        lines.append(f"cpu{cpu} {busy - busy // 4} 0 {busy // 4} {idle} 0 0 0 0 0 0")
    total_busy, total_idle = sum(b for b, _ in per_cpu), sum(i for _, i in per_cpu)
    head = f"cpu  {total_busy - total_busy // 4} 0 {total_busy // 4} {total_idle} 0 0 0 0 0 0"
    return "\n".join([head, *lines, "intr 12345 " + "0 " * 50, "ctxt 999", "btime 1700000000"]) + "\n"


def pid_stat(pid: int, utime: int, stime: int, comm: str = "python3") -> str:
    return (
        f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 3 0 4807 "
        "1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
    )


class FakeProc:
    """/proc as a dict of path → text; a missing path raises FileNotFoundError, as the real one does."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.reads: list[tuple[str, int]] = []

    def read(self, path: Path, limit: int) -> str:
        self.reads.append((str(path), limit))
        try:
            return self.files[str(path)][:limit]
        except KeyError:
            raise FileNotFoundError(path) from None

    def set(self, per_cpu: list[tuple[int, int]], pids: dict[int, int]) -> None:
        self.files["/proc/stat"] = proc_stat(per_cpu)
        for pid, ticks in pids.items():
            self.files[f"/proc/{pid}/stat"] = pid_stat(pid, ticks - ticks // 3, ticks // 3, comm="a (b) c")


def test_others_use_is_the_busy_time_less_our_processes() -> None:
    proc = FakeProc()
    sampler = CpuContention({0, 1}, read=proc.read)
    proc.set([(1000, 1000), (1000, 1000)], {10: 500, 20: 100})
    assert sampler.sample([10, 20]) is None  # the first sample is a baseline
    # 100 ticks a CPU later: both CPUs fully busy; the engine (10) used 120 ticks, this process (20) 20.
    proc.set([(1100, 1000), (1100, 1000)], {10: 620, 20: 120})
    load = sampler.sample([10, 20])
    assert load == CpuLoad(0.6, 2)  # 200 busy - 140 ours = 60 ticks of 200: 0.6 of 2 CPUs
    # Idle but for us: nobody else.
    proc.set([(1150, 1050), (1150, 1050)], {10: 720, 20: 120})
    assert sampler.sample([10, 20]) == CpuLoad(0.0, 2)


def test_only_the_engines_cpus_count() -> None:
    proc = FakeProc()
    sampler = CpuContention({1}, read=proc.read)  # affinity: CPU 1 only
    proc.set([(10, 10), (10, 10), (10, 10)], {10: 0})
    sampler.sample([10])
    proc.set([(110, 10), (60, 60), (10, 110)], {10: 10})  # CPU 0's load is outside the engine's CPUs
    assert sampler.sample([10]) == CpuLoad(0.4, 1)


def test_the_whole_machine_where_the_affinity_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine_ext.cpu

    monkeypatch.setattr(engine_ext.cpu, "_usable_cpus", lambda: None)
    proc = FakeProc()
    sampler = CpuContention(read=proc.read)
    assert sampler.cpus is None
    proc.set([(10, 10), (10, 10), (10, 10), (10, 10)], {})
    sampler.sample([])
    proc.set([(110, 10), (110, 10), (10, 110), (10, 110)], {})
    assert sampler.sample([]) == CpuLoad(2.0, 4)


def test_steal_is_others_use_and_iowait_is_idle() -> None:
    proc = FakeProc()
    sampler = CpuContention({0}, read=proc.read)
    proc.files["/proc/stat"] = "cpu  0 0 0 1 0 0 0 0 0 0\ncpu0 0 0 0 1 0 0 0 0 0 0\n"
    sampler.sample([])
    # user 10, iowait 40, steal 30, idle 20 (guest 10 is inside user and not counted twice)
    proc.files["/proc/stat"] = "cpu  10 0 0 21 40 0 0 30 10 0\ncpu0 10 0 0 21 40 0 0 30 10 0\n"
    assert sampler.sample([]) == CpuLoad(0.4, 1)


def test_a_new_process_or_counters_going_back_make_a_new_baseline() -> None:
    proc = FakeProc()
    sampler = CpuContention({0}, read=proc.read)
    proc.set([(100, 100)], {10: 0})
    sampler.sample([10])
    proc.set([(200, 100)], {10: 50, 11: 0})  # the engine restarted as pid 11 in between
    assert sampler.sample([10, 11]) is None
    proc.set([(300, 100)], {10: 50, 11: 50})
    assert sampler.sample([10, 11]) == CpuLoad(0.5, 1)
    proc.set([(250, 100)], {10: 50, 11: 50})  # fewer busy ticks than before: not trusted
    assert sampler.sample([10, 11]) is None


def test_missing_or_garbled_proc_is_none_never_an_error() -> None:
    proc = FakeProc()
    sampler = CpuContention({0, 1}, read=proc.read)
    assert sampler.sample([1]) is None and sampler.sample([1]) is None  # no /proc at all (macOS)
    proc.set([(100, 100), (100, 100)], {})
    assert sampler.sample([]) is None  # a baseline
    assert sampler.sample([1]) is None  # /proc/1/stat missing (the process exited)
    for garbage in ("", "cpu0 x y z\n", "cpu  1 2\ncpu0 1 2\n", "\0\0\xff", "intr 1 2 3\n", "cpux 1 2 3 4\n"):
        proc.files["/proc/stat"] = garbage
        assert sampler.sample([]) is None
    proc.set([(100, 100), (100, 100)], {})
    proc.files["/proc/7/stat"] = "7 (no fields after the name)"
    assert sampler.sample([7]) is None
    # Real /proc contents again: a baseline, then a reading.
    proc.set([(100, 100), (100, 100)], {7: 0})
    assert sampler.sample([7]) is None
    proc.set([(150, 150), (150, 150)], {7: 0})
    assert sampler.sample([7]) == CpuLoad(1.0, 2)


def test_reads_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine_ext.cpu

    proc = FakeProc()
    sampler = CpuContention({0, 1}, read=proc.read)
    proc.set([(100, 100), (100, 100)], {5: 0})
    sampler.sample([5])
    assert proc.reads == [("/proc/stat", 256 * 1024), ("/proc/5/stat", 4096)]
    # A /proc/stat cut off by the bound: the line it cuts is not read as a CPU's (cpu1 would count 100 0 0 1).
    monkeypatch.setattr(engine_ext.cpu, "PROC_STAT_MAX_BYTES", 64)
    proc.files["/proc/stat"] = "cpu0 150 0 50 300 0 0 0 0 0 0".ljust(49) + "\ncpu1 100 0 0 100 0 0 0 0 0 0\n"
    assert proc.files["/proc/stat"][:64].endswith("\ncpu1 100 0 0 1")
    assert sampler._read([]) == (200, 500, {}, 1)  # cpu0 alone


@pytest.mark.parametrize(
    ("load", "busy"),
    [
        (CpuLoad(0.6, 2, 2), True),  # the 2-CPU machine: 0.6 tok/s
        (CpuLoad(0.4, 2, 2), False),  # under half a CPU: noise
        (CpuLoad(0.6, 2, 1), False),  # one thread, 1.4 CPUs idle: nothing waits
        (CpuLoad(0.9, 4, 4), False),  # a quarter or less of the threads' share
        (CpuLoad(1.2, 4, 4), True),
        (CpuLoad(20.0, 64, 8), False),  # a big machine with room to spare
        (CpuLoad(57.0, 64, 8), True),
        (CpuLoad(1.5, 2), True),  # threads not known: as many as CPUs
    ],
)
def test_busy_means_others_leave_fewer_idle_cpus_than_the_engines_threads(load: CpuLoad, busy: bool) -> None:
    assert load.busy() is busy


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc")
def test_the_real_proc_gives_a_reading() -> None:
    sampler = CpuContention()
    assert sampler.sample([os.getpid()]) is None
    sum(range(200_000))
    load = sampler.sample([os.getpid()])
    assert load is None or 0 <= load.others <= load.cpus  # None: no clock tick passed between the two
