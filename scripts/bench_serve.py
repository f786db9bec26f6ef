"""Speed through `llmtui serve` beside the engine's own (`llmtui bench`), as ratios in one run.

    .venv/bin/python scripts/bench_serve.py [-m starter] [-t 2] [-n 128] [-r 3]

- decode: tokens/s a streaming client sees (first to last token, timed by the client) ÷ `llmtui bench`'s tg, and
  the server's own `timings.predicted_per_second` ÷ the same, and both beside the same chat request through the
  engine's reply path without the server (`llmtui run`: what the server adds is the difference);
- time to first token: what the client waits minus what the engine reports (`timings.ttft_ms`): the server's
  overhead (HTTP, JSON, the queue, the pipe to the worker).

Same model, threads and machine for both; rounds alternate engine and API so a change in load hits both.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a long story about a lighthouse keeper and the sea."


def llmtui(*args: str) -> list[str]:
    return [sys.executable, "-m", "app", *args]


def engine_tg(model: str, threads: int, n_gen: int) -> float:
    out = subprocess.run(
        llmtui("bench", "-m", model, "-t", str(threads), "-p", "32", "-n", str(n_gen), "-r", "1", "--json"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return float(json.loads(out.stdout)["tg"]["median"])


def engine_run(model: str, threads: int, n_gen: int) -> float:
    """Decode tok/s of the same chat request through the engine's own reply path (`llmtui run`), no server."""
    out = subprocess.run(
        llmtui("run", "-m", model, "-t", str(threads), "-c", "4096", "--temp", "0", "-n", str(n_gen), "-p", PROMPT)
        + ["--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=dict(os.environ, LLMTUI_ADAPTIVE_THREADS="off"),
    )
    return float(json.loads(out.stdout)["stats"]["decode_tps"])


def api_round(http: httpx.Client, base: str, n_gen: int) -> tuple[float, float, float]:
    """(client-side decode tok/s, server-reported decode tok/s, TTFT overhead ms) for one streamed reply."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": n_gen,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    timings: dict[str, float] = {}
    with http.stream("POST", f"{base}/v1/chat/completions", json=body) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
            timings = chunk.get("timings", timings)
    tokens = int(timings["predicted_n"])
    client_tps = (tokens - 1) / (last - first) if last > first else 0.0
    overhead_ms = (first - start) * 1000 - float(timings["ttft_ms"])
    return client_tps, float(timings["predicted_per_second"]), overhead_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, LLMTUI_ADAPTIVE_THREADS="off")
    server = subprocess.Popen(
        llmtui("serve", "-m", args.model, "-t", str(args.threads), "--port", str(port), "-c", "4096"),
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("llmtui serve did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        # One client for all rounds, as an application keeps one (a new one per request spends ~30 ms on TLS set-up
        # and a connection before it sends anything: that is the client's time, not the server's).
        http = httpx.Client(timeout=600)
        api_round(http, base, 16)  # warm-up
        engine, run, client, reported, overhead = [], [], [], [], []
        for _ in range(args.rounds):
            engine.append(engine_tg(args.model, args.threads, args.n_gen))
            run.append(engine_run(args.model, args.threads, args.n_gen))
            c, r, o = api_round(http, base, args.n_gen)
            client.append(c)
            reported.append(r)
            overhead.append(o)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    tg = statistics.median(engine)
    print(
        f"model {args.model}, {args.threads} threads, {args.n_gen} tokens, median of {args.rounds} alternating rounds"
    )
    print(f"{'':34}{'tok/s':>10}{'ratio':>8}")
    print(f"{'llmtui bench (engine, tg)':34}{tg:10.1f}{1.0:8.3f}")
    r = statistics.median(run)
    print(f"{'llmtui run (engine, same chat)':34}{r:10.1f}{r / tg:8.3f}")
    print(f"{'API, as the client sees it':34}{statistics.median(client):10.1f}{statistics.median(client) / tg:8.3f}")
    print(f"{'API, server timings':34}{statistics.median(reported):10.1f}{statistics.median(reported) / tg:8.3f}")
    print(f"API client ÷ llmtui run: {statistics.median(client) / r:.3f}")
    print(f"time to first token overhead (client − engine): {statistics.median(overhead):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
