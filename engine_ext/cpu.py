"""How many threads decode by default: one per physical core that is useful for math, as llama.cpp chooses.

llama.cpp's `common_cpu_get_num_math` (common/common.cpp) runs one thread per physical core: SMT siblings share a
core's execution units and its memory bandwidth, and decoding is memory-bound, so a second thread per core adds
nothing. On hybrid Intel CPUs it leaves the efficiency cores out, since ggml's threads wait for each other after
every operation and the slowest one sets the pace. llmtui also stays within what this process may use: its CPU
affinity and a cgroup CPU quota (a container started with `--cpus 2` on a 64-core host). More threads than CPUs
to run them make every one of those waits last a scheduler time slice: decoding then runs several times slower.

No library answers this: `os.cpu_count()` counts logical CPUs, `os.sched_getaffinity` ignores SMT and core types,
and psutil's physical count ignores affinity, quotas and core types.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys")
PROC = Path("/proc")


@dataclass(frozen=True)
class ThreadPlan:
    """The default thread count and what decided it (`llmtui doctor` shows it)."""

    threads: int
    usable_cpus: int  # logical CPUs this process may run on (its affinity)
    cores: int | None  # physical cores useful for math among them (None: the system does not say)
    quota: int | None  # CPUs a cgroup quota allows, rounded up (None: no quota)

    def describe(self) -> str:
        if self.cores is not None:
            why = f"one per physical core: {self.cores} among the {self.usable_cpus} CPUs this process may use"
        else:
            why = f"{self.usable_cpus} CPUs, core layout unknown: all of them up to 4, else half"
        if self.quota is not None and self.quota < (self.cores or self.usable_cpus):
            why += f"; capped by a cgroup CPU quota of {self.quota}"
        return f"{self.threads} ({why})"


def thread_plan(sysfs: Path = SYSFS, proc: Path = PROC) -> ThreadPlan:
    """The default decode threads: one per physical core useful for math, within affinity and cgroup quotas."""
    cpus = _usable_cpus()
    usable = len(cpus) if cpus is not None else (os.cpu_count() or 1)
    cores: int | None = None
    linux = sys.platform.startswith("linux")
    if linux and cpus is not None:
        cores = math_cores(cpus, sysfs)
    elif sys.platform == "darwin":
        cores = _darwin_performance_cores()
    # llama.cpp's fallback: all of a small machine's CPUs, else half (assumed two threads a core).
    threads = cores if cores is not None else (usable if usable <= 4 else usable // 2)
    quota = cgroup_cpu_quota(sysfs, proc) if linux else None
    if quota is not None:
        threads = min(threads, quota)
    return ThreadPlan(max(1, threads), usable, cores, quota)


def default_threads(sysfs: Path = SYSFS, proc: Path = PROC) -> int:
    """Threads for decoding by default (`-t` and the settings' threads override it)."""
    return thread_plan(sysfs, proc).threads


def usable_cpu_count() -> int:
    """The CPUs this process may run on (its affinity; all of them where the platform does not say)."""
    cpus = _usable_cpus()
    return len(cpus) if cpus else (os.cpu_count() or 1)


def capped_threads(requested: int) -> int:
    """An explicit thread count, at most the CPUs this process may run on: ggml's threads wait for each other after
    every operation, so a thread past the CPUs leaves the others spinning for a time slice (tens of times slower)."""
    return max(1, min(requested, usable_cpu_count()))


def math_cores(cpus: Iterable[int], sysfs: Path = SYSFS) -> int | None:
    """The physical cores among `cpus` (one per set of SMT siblings), leaving out a hybrid Intel CPU's efficiency
    cores when the kernel lists its performance cores; None when sysfs does not say."""
    cpus = set(cpus)
    performance = _read_cpu_list(sysfs / "devices" / "cpu_core" / "cpus")  # hybrid Intel: the P-cores' CPUs
    if performance:
        cpus &= performance
    siblings: set[str] = set()
    for cpu in cpus:
        try:
            siblings.add(
                (sysfs / "devices/system/cpu" / f"cpu{cpu}" / "topology/thread_siblings_list").read_text().strip()
            )
        except OSError:
            return None
    return len(siblings) or None


def cgroup_cpu_quota(sysfs: Path = SYSFS, proc: Path = PROC) -> int | None:
    """The CPUs this process's cgroup quotas let it use, rounded up; None: no quota.

    cgroup v2: the smallest `cpu.max` ("quota period", or "max") from this process's cgroup up to the root.
    cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` of the cpu controller's mount (a container's own).
    """
    root = sysfs / "fs/cgroup"
    limits: list[float] = []
    try:
        own = next(
            (line[3:].strip() for line in (proc / "self/cgroup").read_text().splitlines() if line.startswith("0::")),
            "/",
        )
    except OSError:
        own = "/"
    folder = root / own.lstrip("/")
    while True:
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            if quota != "max":
                limits.append(int(quota) / int(period))
        except (OSError, ValueError):
            pass
        if folder == root or root not in folder.parents:
            break
        folder = folder.parent
    try:
        quota_us = int((root / "cpu/cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu/cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            limits.append(quota_us / period_us)
    except (OSError, ValueError):
        pass
    return max(1, math.ceil(min(limits))) if limits else None


def _usable_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return None


def _read_cpu_list(path: Path) -> set[int]:
    """A kernel CPU list ("0-7,16-23") as a set; empty when the file is missing or unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return set()
    cpus: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return set()
    return cpus


def _darwin_performance_cores() -> int | None:
    """Apple silicon's performance cores (`hw.perflevel0.physicalcpu`), else the physical cores, as llama.cpp."""
    try:
        sysctlbyname = ctypes.CDLL(ctypes.util.find_library("c")).sysctlbyname
    except (OSError, AttributeError):
        return None
    for name in (b"hw.perflevel0.physicalcpu", b"hw.physicalcpu"):
        value = ctypes.c_int32(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if sysctlbyname(name, ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) == 0:
            return value.value if value.value > 0 else None
    return None


# ----- contention: how much of the CPUs the engine runs on other programs are using -----

PROC_STAT_MAX_BYTES = 256 * 1024  # /proc/stat's cpu lines come first (about 100 bytes each); the rest is not read
PID_STAT_MAX_BYTES = 4096  # /proc/<pid>/stat is one line of a few hundred bytes
BUSY_MIN_CPUS = 0.5  # others' use below this is noise (a terminal, a shell prompt): never called busy
BUSY_MIN_SHARE = 0.25  # ... and below this share of the engine's threads


def read_bounded(path: Path, limit: int) -> str:
    """At most `limit` bytes of a file as text (the /proc reads of `CpuContention`)."""
    with open(path, "rb") as file:
        return file.read(limit).decode("ascii", "replace")


@dataclass(frozen=True)
class CpuLoad:
    """Other programs' CPU use over the CPUs the engine may run on, since the previous sample."""

    others: float  # CPUs' worth other processes used (1.5: one and a half CPUs busy all the time)
    cpus: int  # logical CPUs counted: the engine's affinity (all the machine's where it is not known)
    threads: int = 0  # the engine's decode threads (0: not known; the bridge fills it in)
    max_threads: int = 0  # its default count, which it runs below while others crowd it (engine_ext.threads)

    def adapted(self) -> bool:
        """Whether the engine runs on fewer threads than its default because others use CPUs."""
        return 0 < self.threads < self.max_threads

    def busy(self) -> bool:
        """Whether others crowd the engine's threads: the CPUs they leave idle are fewer than the engine's threads
        (so its threads wait for a time slice, and ggml's threads wait for the slowest after every operation),
        and their use is more than `BUSY_MIN_CPUS` and more than `BUSY_MIN_SHARE` of the threads. A 2-CPU machine
        decoding on 2 threads is busy once others use 0.5 of a CPU; a 64-CPU one on 8 threads only past 56."""
        threads = self.threads or self.cpus
        return (
            self.others > BUSY_MIN_CPUS and self.others > BUSY_MIN_SHARE * threads and self.cpus - self.others < threads
        )


class CpuContention:
    """Samples how many CPUs' worth other processes use, from /proc (Linux); None wherever it cannot say.

    Each `sample(pids)` compares the busy time of the CPUs in `cpus` (/proc/stat) with the last sample's, less the
    CPU time of `pids` (the engine worker and this process: /proc/<pid>/stat utime + stime), both in the kernel's
    clock ticks. Reads are bounded and injectable (`read(path, max_bytes)`), and it never raises: no /proc (macOS),
    an unreadable or garbled file, a pid that is new since the last sample: None (the next sample has a baseline).
    """

    def __init__(
        self, cpus: Iterable[int] | None = None, *, proc: Path = PROC, read: Callable[[Path, int], str] = read_bounded
    ) -> None:
        if cpus is None:
            cpus = _usable_cpus()
        self.cpus = frozenset(cpus) if cpus is not None else None  # None: the machine's total ("cpu " line)
        self.proc = proc
        self.read = read
        self._last: tuple[int, int, dict[int, int], int] | None = None  # busy, total ticks; pids' ticks; CPUs

    def sample(self, pids: Iterable[int]) -> CpuLoad | None:
        """Others' use since the last call (None on the first call, or when /proc cannot say)."""
        try:
            now = self._read(pids)
        except Exception:  # noqa: BLE001 - a stats readout never takes the caller down
            now = None
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        (busy, total, ours, n_cpus), (last_busy, last_total, last_ours, _) = now, last
        if total <= last_total or busy < last_busy or set(ours) - set(last_ours):
            return None  # counters went back (CPUs taken offline) or a process started since: a new baseline
        ticks = sum(ours[pid] - last_ours[pid] for pid in ours)
        others = (busy - last_busy - max(0, ticks)) / (total - last_total) * n_cpus
        return CpuLoad(round(min(float(n_cpus), max(0.0, others)), 2), n_cpus)

    def _read(self, pids: Iterable[int]) -> tuple[int, int, dict[int, int], int] | None:
        text = self.read(self.proc / "stat", PROC_STAT_MAX_BYTES)
        lines = text.splitlines()
        if len(text) >= PROC_STAT_MAX_BYTES:
            lines = lines[:-1]  # cut off mid-line
        busy = total = n_cpus = 0
        for line in lines:
            name, _, values = line.partition(" ")
            if not name.startswith("cpu"):
                break  # the cpu lines come first
            counted = name == "cpu" if self.cpus is None else name != "cpu" and int(name[3:]) in self.cpus
            if not counted:
                continue
            # user nice system idle iowait irq softirq steal (guest time is already in user and nice)
            ticks = [int(value) for value in values.split()[:8]]
            if len(ticks) < 4:
                return None
            busy += sum(ticks) - sum(ticks[3:5])  # all but idle and iowait; steal counts: another VM took it
            total += sum(ticks)
            n_cpus += 1 if self.cpus is not None else 0
        if total <= 0:
            return None
        if self.cpus is None:
            n_cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        ours: dict[int, int] = {}
        for pid in set(pids):
            stat = self.read(self.proc / str(pid) / "stat", PID_STAT_MAX_BYTES)
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces and ')'
            ours[pid] = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
        return (busy, total, ours, n_cpus) if n_cpus else None
