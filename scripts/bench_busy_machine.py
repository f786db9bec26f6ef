"""Decode speed on a quiet and on a busy machine: the engine's adaptive thread count against every fixed count.

For each condition (quiet; then with `--busy N` competing processes that each keep one CPU busy, `yes > /dev/null`
as a user's build or backup would), runs `llmtui bench --spec-type SPEC` (plain decoding and one speculative mode
on the same copy-heavy prompt) with the adaptive count (no -t) and with `-t 1` … `-t DEFAULT`, in alternating rounds
so drift hits all alike, and prints tok/s with the ratios the issue asks for: adaptive / best fixed count under
load, adaptive / default count when quiet.

    python scripts/bench_busy_machine.py -m starter -n 128 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_threads() -> int:
    sys.path.insert(0, str(ROOT))
    from engine_ext.cpu import default_threads as threads

    return threads()


def run_bench(model: str, threads: int | None, args: argparse.Namespace, home: Path) -> dict[str, float]:
    """tok/s of plain decoding and of the speculative mode, one `llmtui bench` run."""
    cmd = [sys.executable, "-m", "app", "bench", "-m", model, "-n", str(args.n_gen), "-r", "1"]
    cmd += ["--spec-type", args.spec, "--json"]
    if threads is not None:
        cmd += ["-t", str(threads)]
    env = dict(os.environ, LLMTUI_DATA_DIR=str(home / "data"), LLMTUI_CONFIG_DIR=str(home / "config"))
    env.pop("LLMTUI_ADAPTIVE_THREADS", None)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900).stdout
    rows = {row["mode"]: row for row in json.loads(out)["modes"]}
    return {"plain": float(rows["plain"]["tps"]), "spec": float(rows[args.spec]["tps"])}


def measure(model: str, args: argparse.Namespace, settings: list[int | None], home: Path) -> dict[str, dict]:
    samples: dict[str, dict[str, list[float]]] = {label(t): {"plain": [], "spec": []} for t in settings}
    for _ in range(args.rounds):
        for threads in settings:
            result = run_bench(model, threads, args, home)
            for kind in ("plain", "spec"):
                samples[label(threads)][kind].append(result[kind])
    return {name: {k: statistics.median(v) for k, v in kinds.items()} for name, kinds in samples.items()}


def label(threads: int | None) -> str:
    return "adaptive" if threads is None else f"-t {threads}"


def report(title: str, table: dict[str, dict], reference: str | None) -> None:
    print(f"\n{title}")
    print(f"{'threads':>10} {'plain tok/s':>12} {'spec tok/s':>11}")
    for name, row in table.items():
        print(f"{name:>10} {row['plain']:12.1f} {row['spec']:11.1f}")
    fixed = {k: v for k, v in table.items() if k != "adaptive"}
    for kind in ("plain", "spec"):
        best = max(fixed, key=lambda k: fixed[k][kind])
        ref = reference or best
        ratio = table["adaptive"][kind] / fixed[ref][kind] if fixed[ref][kind] else 0.0
        what = f"the default ({ref})" if reference else f"the best fixed count ({best})"
        print(f"  {kind:>5}: adaptive / {what} = {ratio:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("--spec", default="ngram-simple", help="the speculative mode measured beside plain decoding")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (the median is shown)")
    parser.add_argument("--busy", type=int, default=1, help="competing busy processes in the busy condition")
    args = parser.parse_args()
    n = default_threads()
    settings: list[int | None] = [None, *range(1, n + 1)]
    print(f"model {args.model}, {n} threads by default, {args.n_gen} tokens, median of {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="llmtui-bench-busy-") as tmp:
        home = Path(tmp)
        quiet = measure(args.model, args, settings, home)
        report("quiet machine", quiet, reference=f"-t {n}")
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy)]
        try:
            busy = measure(args.model, args, settings, home)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        report(f"busy machine ({args.busy} process{'es' if args.busy > 1 else ''} keeping a CPU busy)", busy, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
