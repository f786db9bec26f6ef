"""Default decode threads: one per physical core useful for math, within affinity and cgroup quotas."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine_ext.cpu import ThreadPlan, cgroup_cpu_quota, default_threads, math_cores


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
        "8 (one per physical core: 8 among the 16 CPUs this process may use)")
    assert ThreadPlan(2, 16, 8, 2).describe() == (
        "2 (one per physical core: 8 among the 16 CPUs this process may use; capped by a cgroup CPU quota of 2)")
    assert ThreadPlan(6, 12, None, None).describe() == (
        "6 (12 CPUs, core layout unknown: all of them up to 4, else half)")
