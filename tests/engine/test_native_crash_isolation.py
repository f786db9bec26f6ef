"""A native crash in a test (a segfault in llama.cpp, an abort) fails that test; the run goes on and reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GENERATED_TESTS = """
import ctypes


def test_crashes_natively():
    ctypes.string_at(0)  # reads address 0: SIGSEGV in the process running the test


def test_passes_after_the_crash():
    assert True
"""

GENERATED_HANG = """
import time


def test_hangs():
    time.sleep(3600)  # a wait nobody bounded


def test_passes_after_the_hang():
    assert True
"""


def test_a_native_crash_fails_one_test_and_the_run_still_prints_its_summary(tmp_path: Path) -> None:
    """pytest run as the README says, with this project's configuration (pyproject.toml and the hook that
    tests/conftest.py loads), on a file whose first test segfaults: one failure naming the crash, the next test
    passes, and the summary line prints."""
    import xdist  # noqa: F401  (the test extra installs it: pip install -e '.[test]')

    result = _pytest(tmp_path, "test_generated_crash.py", GENERATED_TESTS)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert re.search(r"worker 'gw\d+' crashed while running '.*test_crashes_natively'", output), output[-3000:]
    summary = [line for line in result.stdout.splitlines() if re.fullmatch(r"=+ .* in [\d.]+s( \(.*\))? =+", line)]
    assert summary, output[-3000:]
    assert re.search(r"=+ 1 failed, 1 passed in ", summary[-1]), summary[-1]
    assert "FAILED test_generated_crash.py::test_crashes_natively" in result.stdout


def test_a_hung_test_fails_after_the_timeout_and_the_run_goes_on(tmp_path: Path) -> None:
    """pytest-timeout (timeout in pyproject.toml, here shortened to 3 s) stops a test that waits forever: it fails
    with its traceback, and the next test runs."""
    result = _pytest(tmp_path, "test_generated_hang.py", GENERATED_HANG, "--timeout", "3")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Timeout" in output and "time.sleep(3600)" in output, output[-3000:]
    assert re.search(r"=+ 1 failed, 1 passed in ", output), output[-3000:]


def _pytest(tmp_path: Path, name: str, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    """pytest run as the README says, with this project's configuration, on one generated test file."""
    (tmp_path / name).write_text(source)
    # Not this run's own worker settings (PYTEST_XDIST_WORKER …) or options.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONFAULTHANDLER"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "--confcutdir",
            str(tmp_path),
            "-p",
            "tests.crash_isolation",
            "-p",
            "no:cacheprovider",
            *options,
            str(tmp_path / name),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
