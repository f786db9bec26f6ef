"""Runs the test session in pytest-xdist worker processes by default (two where the machine has two cores or more:
the default run's length on a 2-core CI machine halves; more would oversubscribe the engine's own threads), so a
native crash fails one test, not the run.

Tests that load llama.cpp in the pytest process can crash it natively (a segfault, a GGML_ABORT). In the worker,
such a crash is reported by the controlling pytest process as one failed test ("worker 'gw0' crashed while
running ..."), a fresh worker takes the remaining tests, and the summary still prints.

The default applies unless the command line chose otherwise: `-n N` / `--dist` (xdist as given), `-n 0` or
`-p no:xdist` (everything in the pytest process, for debugging), `--pdb` / `--trace` / `-s` (which need the
tests in the pytest process), or `--collect-only`. Without pytest-xdist installed the tests run in-process, as
before. tests/conftest.py loads this hook; tests/engine/test_native_crash_isolation.py runs it on a crashing test.

Each worker runs on its own share of the CPUs (two workers on two cores: one core each; `pytest_configure` sets the
worker's CPU affinity, which the engines and commands it starts inherit), so an engine's threads never wait for a
core the other worker's engine holds: with both on both cores, two-thread engines spun against each other (a
6-token reply took 13 s of CPU time, an EAGLE3 test ran past its 300 s). The engine's default thread count follows
the affinity (engine_ext.cpu), and an explicit count is capped at it. A test that needs every CPU (a thread-count
test) is marked `all_cpus`: it runs with the worker's affinity widened to the machine's.

Snapshot tests work in the worker (pytest-textual-snapshot's report and --snapshot-update), but syrupy neither
reports nor deletes snapshot files that no test uses when xdist runs the tests: `-n 0 --snapshot-update` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

MAX_WORKERS = 2
"""Workers by default: each test may start an engine with two threads, so two fill a 2-core machine."""

ORIGINAL_CPUS = pytest.StashKey[set[int]]()

MAX_WORKER_RESTARTS = 100
"""Crashed workers replaced before xdist gives up (its default, 4 per worker, would end the run at the 5th)."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # no xdist; or this is the worker, where xdist has switched distribution off
    option = config.option
    if option.numprocesses is not None or option.dist != "no":
        return  # the command line chose
    if option.usepdb or option.trace or option.collectonly or option.capture == "no":
        return
    # What `-n N` gives (xdist's own pytest_cmdline_main may run before or after this one, depending on whether
    # this module was loaded by a conftest or with -p).
    workers = max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    # Tests one by one to whichever worker is free ("load"): with whole files to a worker (loadfile) a crashed
    # worker's replacement took the crashing test again and again (tests/engine/test_native_crash_isolation.py).
    option.numprocesses, option.dist, option.tx = workers, "load", ["popen"] * workers
    if option.maxworkerrestart is None:
        option.maxworkerrestart = str(MAX_WORKER_RESTARTS)


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker: run on this worker's share of the CPUs (see the module's docstring)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    workers = int(workerinput.get("workercount", 1))
    config.stash[ORIGINAL_CPUS] = set(cpus)
    if workers < 2 or len(cpus) < workers:
        return
    index = int(str(workerinput.get("workerid", "gw0")).removeprefix("gw") or 0) % workers
    os.sched_setaffinity(0, cpus[index::workers])


@pytest.fixture(autouse=True)
def _all_cpus_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `all_cpus` runs with the machine's CPUs (the worker's affinity widened, then set back)."""
    cpus = request.config.stash.get(ORIGINAL_CPUS, None)
    if cpus is None or request.node.get_closest_marker("all_cpus") is None:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)
