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
    return {"tps": float(speed.group(2)), "decoded": int(speed.group(1)),
            "drafted": int(drafted.group(1)) if drafted else 0, "accepted": int(accepted.group(1)) if accepted else 0}


def ours(model: str, modes: list[str], args: argparse.Namespace, n_gen: int) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, "-m", "app", "bench", "-m", model, "--spec-type", ",".join(modes), "--raw",
           "-n", str(n_gen), "-r", str(args.repetitions), "-t", str(args.threads), "-c", "4096",
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
    # Upstream finishes its last step past -n; llmtui then generates exactly as many tokens, so both runs cover
    # the same text (drafted/accepted counts are comparable).
    print(f"{'mode':>14} {'tokens':>7} {'upstream t/s':>13} {'llmtui t/s':>11} {'ratio':>6} {'upstream acc':>13} "
          f"{'llmtui acc':>11} {'plain t/s':>10} {'auto t/s':>9}")
    for mode in modes:
        ref = upstream(model, mode, args)
        mine = ours(model, [mode, "auto"], args, int(ref["decoded"]))
        got, plain, auto = mine[mode], mine["plain"], mine["auto"]
        ratio = got["tps"] / ref["tps"]
        print(f"{mode:>14} {int(ref['decoded']):7d} {ref['tps']:13.2f} {got['tps']:11.2f} {ratio:6.3f} "
              f"{int(ref['accepted']):>6}/{int(ref['drafted']):<6} {got['accepted']:>5}/{got['drafted']:<5} "
              f"{plain['tps']:10.2f} {auto['tps']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
