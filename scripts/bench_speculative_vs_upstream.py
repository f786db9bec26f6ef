"""Compare llmtui's speculative decoding with llama.cpp's `llama-speculative-simple` on the same model and prompt.

For each mode, runs upstream's example and `llmtui bench --spec-type MODE --raw` (same raw prompt, greedy, same
n_max) and prints decode tok/s side by side with the ratio, and drafted/accepted counts of both.

    python scripts/bench_speculative_vs_upstream.py -m starter -t 2 -n 128 --modes ngram-mod,ngram-cache
(builds llama-speculative-simple from the vendored source into .bench/ when it is missing)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / ".bench" / "build" / "bin" / "llama-speculative-simple"


def upstream(model: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    from app.__main__ import COPY_HEAVY_PROMPT as PROMPT

    cmd = [str(TOOL), "-m", model, "-p", PROMPT, "-n", str(args.n_gen), "-t", str(args.threads), "--temp", "0",
           "--spec-type", mode, "--spec-draft-n-max", str(args.n_max), "-c", "4096", "--seed", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    speed = re.search(r"decoded\s+(\d+) tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log)
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", log)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", log)
    if not speed:
        raise RuntimeError(f"could not read llama-speculative-simple's output:\n{log[-2000:]}")
    return {"tps": float(speed.group(2)), "drafted": int(drafted.group(1)) if drafted else 0,
            "accepted": int(accepted.group(1)) if accepted else 0}


def ours(model: str, modes: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, "-m", "app", "bench", "-m", model, "--spec-type", ",".join(modes), "--raw",
           "-n", str(args.n_gen), "-r", str(args.repetitions), "-t", str(args.threads), "-c", "4096",
           "--spec-draft-n-max", str(args.n_max), "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    return {m["mode"]: m for m in out["modes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("--n-max", type=int, default=16)
    parser.add_argument("--modes", default="ngram-simple,ngram-map-k,ngram-mod,ngram-cache")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if not TOOL.exists():
        from scripts.bench_vs_llama_bench import build_llama_bench

        build_llama_bench([], ("llama-speculative-simple",))
    from app.models import resolve_model

    model = str(resolve_model(args.model))
    modes = [m for m in args.modes.split(",") if m]
    mine = ours(model, modes + ["auto"], args)
    print(f"{'mode':>14} {'upstream t/s':>13} {'llmtui t/s':>11} {'ratio':>6} {'upstream acc':>13} {'llmtui acc':>11}")
    plain = mine["plain"]
    print(f"{'plain':>14} {'':>13} {plain['tps']:11.2f} {'':>6}")
    for mode in modes:
        ref = upstream(model, mode, args)
        got = mine[mode]
        print(f"{mode:>14} {ref['tps']:13.2f} {got['tps']:11.2f} {got['tps'] / ref['tps']:6.3f} "
              f"{int(ref['accepted']):>6}/{int(ref['drafted']):<6} {got['accepted']:>5}/{got['drafted']:<5}")
    auto = mine["auto"]
    print(f"{'auto':>14} {'':>13} {auto['tps']:11.2f} {'':>6} {'':>13} {auto['accepted']:>5}/{auto['drafted']:<5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
