"""Compare llmtui's speculative decoding with llama.cpp's `llama-speculative-simple` on the same model and prompt.

For each mode, runs upstream's example and `llmtui bench --spec-type MODE --raw` (same raw prompt, greedy, same
flags) and prints decode tok/s side by side with the ratio, and drafted/accepted counts of both.

Upstream stops only once it has produced more than -n tokens: its last step, begun with exactly n tokens, drafts
without a cap and overshoots. llmtui never generates past -n. So the counts are compared over the steps that
begin before n tokens (read from upstream's debug log, `accepted A/D draft tokens` per step) against llmtui run
with the same -n; the speeds over the same text (llmtui run for as many tokens as upstream decoded).

    python scripts/bench_speculative_vs_upstream.py -m starter -t 2 -n 128 --modes ngram-mod,ngram-cache
(builds llama-speculative-simple from the vendored source into .bench/ when it is missing)
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / ".bench" / "build" / "bin" / "llama-speculative-simple"


def upstream(model: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    from app.cli.bench import COPY_HEAVY_PROMPT as PROMPT

    cmd = [
        str(TOOL),
        "-m",
        model,
        "-p",
        PROMPT,
        "-n",
        str(args.n_gen),
        "-t",
        str(args.threads),
        "--temp",
        "0",
        "--spec-type",
        mode,
        "--spec-draft-n-max",
        str(args.n_max),
        "-c",
        "4096",
        "--seed",
        "1",
    ]
    speeds: list[float] = []
    decoded = 0
    log = ""
    for _ in range(args.repetitions):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        log = out.stdout + out.stderr
        speed = re.search(r"decoded\s+(\d+) tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log)
        if not speed:
            raise RuntimeError(f"could not read llama-speculative-simple's output:\n{log[-2000:]}")
        speeds.append(float(speed.group(2)))
        decoded = int(speed.group(1))
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", log)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", log)
    # The steps, from the debug log (a separate run: logging every token slows it down).
    debug = subprocess.run([*cmd, "-v"], capture_output=True, text=True, check=True)
    steps = [(int(a), int(d)) for a, d in re.findall(r"accepted (\d+)/(\d+) draft tokens", debug.stdout + debug.stderr)]
    n_done = acc_n = drafted_n = 0
    for a, d in steps:
        if n_done >= args.n_gen:
            break
        n_done, acc_n, drafted_n = n_done + a + 1, acc_n + a, drafted_n + d
    return {
        "tps": statistics.median(speeds),
        "decoded": decoded,
        "drafted": int(drafted.group(1)) if drafted else 0,
        "accepted": int(accepted.group(1)) if accepted else 0,
        "drafted_n": drafted_n,
        "accepted_n": acc_n,
    }


def ours(model: str, modes: list[str], args: argparse.Namespace, n_gen: int) -> dict[str, dict[str, float]]:
    """llmtui in this process, greedy on the raw prompt; every repetition starts with fresh drafters, as upstream's
    single run does (drafters keep what they learned across the requests of a session: the n-gram tables)."""
    from app.cli.bench import COPY_HEAVY_PROMPT as PROMPT
    from engine_ext.generate import Session
    from engine_ext.model import Context, Model
    from engine_ext.params import GREEDY, ContextParams, SpeculativeParams
    from engine_ext.protocol import Generate
    from engine_ext.speculative.factory import build_driver

    target = Model(Path(model))
    ctx = Context(target, ContextParams(n_ctx=4096, n_threads=args.threads))
    session = Session(target, ctx)
    results: dict[str, dict[str, float]] = {}
    try:
        for mode in ["plain", *modes]:
            speeds: list[float] = []
            drafted = accepted = 0
            for rep in range(args.repetitions + 1):  # the first run fills the prompt cache and is not counted
                if mode != "plain":
                    fixed = SpeculativeParams(types=(mode,), n_max=args.n_max, fixed_length=True)  # upstream's lengths
                    session.spec = build_driver(fixed, target, ctx)
                request = Generate(request_id=rep + 1, prompt=PROMPT, sampling=GREEDY, max_tokens=n_gen)
                try:
                    done = session.generate(request, lambda _e: None, lambda: False)
                finally:
                    if session.spec is not None:
                        session.spec.close()
                        session.spec = None
                if rep > 0:
                    speeds.append(done.stats.decode_tps)
                if done.speculative is not None:
                    drafted, accepted = done.speculative.drafted, done.speculative.accepted
            tps = statistics.median(speeds) if speeds else 0.0
            results[mode] = {"tps": tps, "drafted": drafted, "accepted": accepted}
    finally:
        ctx.close()
        target.close()
    return results


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
    from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr

    log_llama_to_stderr(GGML_LOG_LEVEL_WARN)  # llama.cpp's load messages off the table
    if not TOOL.exists():
        from scripts.bench_vs_llama_bench import build_llama_bench

        build_llama_bench([], ("llama-speculative-simple",))
    from app.core.model_paths import resolve_model

    model = str(resolve_model(args.model))
    modes = [m for m in args.modes.split(",") if m]
    # Speeds over the same text: llmtui generates as many tokens as upstream decoded (its last step overshoots
    # -n). Counts over the same steps: upstream's steps begun before -n tokens, llmtui run with -n.
    print(
        f"{'mode':>14} {'tokens':>7} {'upstream t/s':>13} {'llmtui t/s':>11} {'ratio':>6} "
        f"{'upstream acc (all)':>19} {'upstream acc @n':>16} {'llmtui acc @n':>14} {'plain t/s':>10} {'auto t/s':>9}"
    )
    for mode in modes:
        ref = upstream(model, mode, args)
        mine = ours(model, [mode, "auto"], args, int(ref["decoded"]))
        counts = ours(model, [mode], argparse.Namespace(**{**vars(args), "repetitions": 0}), args.n_gen)[mode]
        got, plain, auto = mine[mode], mine["plain"], mine["auto"]
        ratio = got["tps"] / ref["tps"]
        same = "" if (counts["accepted"], counts["drafted"]) == (ref["accepted_n"], ref["drafted_n"]) else " *"
        print(
            f"{mode:>14} {int(ref['decoded']):7d} {ref['tps']:13.2f} {got['tps']:11.2f} {ratio:6.3f} "
            f"{int(ref['accepted']):>9}/{int(ref['drafted']):<9} "
            f"{int(ref['accepted_n']):>7}/{int(ref['drafted_n']):<8} "
            f"{counts['accepted']:>6}/{counts['drafted']:<5}{same:2} {plain['tps']:10.2f} {auto['tps']:9.2f}"
        )
    print("* : the counts differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
