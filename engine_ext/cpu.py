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
from collections.abc import Iterable
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
            siblings.add((sysfs / "devices/system/cpu" / f"cpu{cpu}" / "topology/thread_siblings_list").read_text()
                         .strip())
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
        own = next((line[3:].strip() for line in (proc / "self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), "/")
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

