"""llama.cpp's own server tests, read from the vendored sdist, run against `llmtui serve` instead of llama-server.

    .venv/bin/python scripts/upstream_server_tests.py [-m starter] [-c 8192] [TEST_FILE ...]

Their harness (`tools/server/tests/utils.py`'s ServerProcess) starts nothing when DEBUG_EXTERNAL is set: each test
speaks to the server on PORT. This starts one `llmtui serve` there (the model, a context of `-c` tokens as the
tests' presets ask, greedy by default as theirs are seeded), runs pytest in the sdist's test folder (nothing of
upstream's is copied here; pytest's cache is left off so the build folder is not written), prints each test's
result and the pass/fail counts, and stops the server. Tests that download models or images, or name a chat
template file, cannot pass offline whatever the server does (the README's table says which).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
SDIST = ROOT / "build/engine-cpu/llama_cpp_python-0.3.36/vendor/llama.cpp/tools/server/tests"
DEFAULT_FILES = ("unit/test_compat_anthropic.py", "unit/test_compat_oai_responses.py")
START_TIMEOUT_S = 180
_WGET = 'def download(url, out=None, bar=None):\n    raise OSError(f"offline: not downloading {url}")\n'

RUN_TIMEOUT_S = 1800


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-c", "--ctx-size", default="8192")
    parser.add_argument("-t", "--threads", default="2")
    parser.add_argument("--tests", type=Path, default=SDIST, help="llama.cpp's tools/server/tests folder")
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES))
    args = parser.parse_args()
    if not (args.tests / "utils.py").is_file():
        print(f"no llama.cpp server tests at {args.tests} (build the engine first)", file=sys.stderr)
        return 2
    port = free_port()
    serve = [sys.executable, "-m", "app", "serve", "-m", args.model, "--port", str(port)]
    serve += ["-c", args.ctx_size, "-t", args.threads]
    with tempfile.TemporaryDirectory(prefix="llmtui-upstream-") as home:
        env = dict(os.environ, HOME=home, LLMTUI_CONFIG_DIR=f"{home}/config", LLMTUI_DATA_DIR=f"{home}/data")
        env["LLMTUI_ADAPTIVE_THREADS"] = "off"
        env.setdefault("PYTHONPATH", str(ROOT))
        log = open(Path(home) / "serve.log", "w")  # noqa: SIM115 (closed below)
        server = subprocess.Popen(serve, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not healthy(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    print(f"llmtui serve did not start: see {log.name}", file=sys.stderr)
                    return 2
                time.sleep(0.5)
            # utils.py imports `wget` (its model downloads, which an external server never needs): a stand-in.
            (Path(home) / "wget.py").write_text(_WGET)
            tests_env = dict(env, DEBUG_EXTERNAL="1", PORT=str(port), LLAMA_CACHE=str(Path(home) / "cache"))
            tests_env["PYTHONPATH"] = os.pathsep.join([home, env["PYTHONPATH"]])
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA", "-q"]
            command += ["-p", "no:xdist", "-o", "addopts=", *args.files]
            run = subprocess.run(
                command, cwd=args.tests, env=tests_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
            )
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
            log.close()
    results = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", run.stdout, re.MULTILINE)
    for outcome, test in results:
        print(f"{outcome:7} {test}")
    for name in args.files:
        passed = sum(1 for o, t in results if t.startswith(name) and o == "PASSED")
        total = sum(1 for _, t in results if t.startswith(name))
        print(f"{name}: {passed} of {total} passed")
    return 0 if all(o == "PASSED" for o, _ in results) else 1


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
