"""`llmtui serve` without -m (the router): time to first token of a cold request (the model's load and its prompt)
against a warm one, and the cost of a swap at `--models-max 1` (the idle model unloaded, the other loaded), measured
by a client over HTTP; the same against llama-server's router mode (`--models-dir DIR --models-max 1`) when a
llama-server built from the same source is given.

    python scripts/bench_router.py --models-dir DIR --model A --model B --rounds 3 [--llama-server PATH]

Each request asks for a few tokens of a prompt no earlier request sent (no prompt cache helps a warm one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent
_prompts = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(cmd: list[str], base: str, env: dict[str, str], log: Path) -> Iterator[None]:
    """Start `cmd`, wait until GET /v1/models answers (at most 120 s), stop it with Ctrl+C after."""
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{cmd[0]} exited: see {log}")
            try:
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{cmd[0]} did not answer within 120 s: see {log}")
            time.sleep(0.2)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def ttft_ms(base: str, model: str, n_predict: int) -> float:
    """Milliseconds from sending a streamed chat request for `model` to its first content."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {next(_prompts)}: write a line about the sea."}],
        "max_tokens": n_predict,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as answer:
        if answer.status_code != 200:
            raise SystemExit(f"{model}: HTTP {answer.status_code}: {answer.read()[:300]!r}")
        first = None
        for line in answer.iter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = (time.perf_counter() - start) * 1000
    if first is None:
        raise SystemExit(f"{model}: no content in the reply")
    return first


def unload(base: str, model: str) -> None:
    httpx.post(f"{base}/models/unload", json={"model": model}, timeout=120)


def measure(base: str, a: str, b: str, rounds: int, n_predict: int) -> dict[str, float]:
    """Medians over `rounds` of: A cold (nothing loaded), A warm, B swapped in for A, A swapped back."""
    samples: dict[str, list[float]] = {"cold": [], "warm": [], "swap": [], "swap back": []}
    for _ in range(rounds):
        unload(base, a)
        unload(base, b)
        samples["cold"].append(ttft_ms(base, a, n_predict))
        samples["warm"].append(ttft_ms(base, a, n_predict))
        samples["swap"].append(ttft_ms(base, b, n_predict))
        samples["swap back"].append(ttft_ms(base, a, n_predict))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", required=True, type=Path, help="a folder with the two models")
    parser.add_argument("--model", action="append", required=True, help="a model's id (twice: A then B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--n-predict", type=int, default=8)
    parser.add_argument("-t", "--threads", type=int, default=0, help="threads per model (0: each's default)")
    parser.add_argument("--llama-server", type=Path, default=None, help="llama-server built from the same source")
    parser.add_argument("--port", type=int, default=0, help="the servers' port (default: a free one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if len(args.model) != 2:
        parser.error("give --model twice: the model to load cold, then the one to swap in")
    a, b = args.model
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = dict(os.environ, LLMTUI_DATA_DIR=str(home / "data"), LLMTUI_CONFIG_DIR=str(home / "config"))
        env["LLMTUI_CACHE_DIR"] = str(home / "cache")
        threads = ["-t", str(args.threads)] if args.threads else []
        port = args.port or free_port()
        base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "app", "serve", "--models-dir", str(args.models_dir), "--models-max", "1"]
        with running([*cmd, "--port", str(port), *threads], base, env, home / "llmtui.log"):
            results["llmtui serve"] = measure(base, a, b, args.rounds, args.n_predict)
        server = args.llama_server or (Path(found) if (found := shutil.which("llama-server")) else None)
        if server is not None and server.is_file():
            port = args.port or free_port()
            base = f"http://127.0.0.1:{port}"
            cmd = [str(server), "--models-dir", str(args.models_dir), "--models-max", "1", "--port", str(port)]
            with running([*cmd, *threads], base, env, home / "llama-server.log"):
                results["llama-server"] = measure(base, a, b, args.rounds, args.n_predict)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"time to first token, ms (median of {args.rounds}); A={a}, B={b}, --models-max 1")
    print(f"{'server':<14}{'A cold':>10}{'A warm':>10}{'B swap':>10}{'A back':>10}{'swap cost':>11}")
    for name, row in results.items():
        cells = "".join(f"{row[k]:>10.0f}" for k in ("cold", "warm", "swap", "swap back"))
        print(f"{name:<14}{cells}{row['swap'] - row['warm']:>11.0f}")
    if "llama-server" not in results:
        print("llama-server: not found (give --llama-server PATH; it is not built in this checkout)")


if __name__ == "__main__":
    main()
