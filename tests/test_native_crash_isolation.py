"""A native crash in a test (a segfault in llama.cpp, an abort) fails that test; the run goes on and reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

GENERATED_TESTS = '''
import ctypes


def test_crashes_natively():
    ctypes.string_at(0)  # reads address 0: SIGSEGV in the process running the test


def test_passes_after_the_crash():
    assert True
'''


def test_a_native_crash_fails_one_test_and_the_run_still_prints_its_summary(tmp_path: Path) -> None:
    """pytest run as the README says, with this project's configuration (pyproject.toml and the hook that
    tests/conftest.py loads), on a file whose first test segfaults: one failure naming the crash, the next test
    passes, and the summary line prints."""
    import xdist  # noqa: F401  (the test extra installs it: pip install -e '.[test]')

    (tmp_path / "test_generated_crash.py").write_text(GENERATED_TESTS)
    # Not this run's own worker settings (PYTEST_XDIST_WORKER …) or options.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONFAULTHANDLER"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "--confcutdir", str(tmp_path), "-p", "tests.crash_isolation", "-p", "no:cacheprovider",
         str(tmp_path / "test_generated_crash.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert re.search(r"worker 'gw\d+' crashed while running '.*test_crashes_natively'", output), output[-3000:]
    summary = [line for line in result.stdout.splitlines() if re.fullmatch(r"=+ .* in [\d.]+s( \(.*\))? =+", line)]
    assert summary, output[-3000:]
    assert re.search(r"=+ 1 failed, 1 passed in ", summary[-1]), summary[-1]
    assert "FAILED test_generated_crash.py::test_crashes_natively" in result.stdout
