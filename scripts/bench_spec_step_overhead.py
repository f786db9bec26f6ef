"""Python time per speculative verify step outside `llama_decode`, on the starter model and the copy-heavy prompt.

Every `llama_decode` call (target and draft model) is timed with perf_counter_ns; a step runs from one
`SpeculativeDriver.draft` call to the next (drafting, the verify batch, sampling, bookkeeping, streaming the
tokens), and its Python time is its time minus the time spent inside `llama_decode`. Only steps that verified a
draft count (not the plain steps where no drafter proposed anything). Both wall time and the main thread's CPU
time (time.thread_time_ns) are reported: the CPU time is robust to other processes sharing the machine.

    python scripts/bench_spec_step_overhead.py --modes ngram-simple,ngram-mod,draft-simple -r 5
    python scripts/bench_spec_step_overhead.py --root /tmp/before  # the same measure on another checkout
    python scripts/bench_spec_step_overhead.py --backend-sampling  # greedy verification inside llama_decode

With --root, the engine is imported from that tree (to compare before/after in alternating runs). Backend
sampling (Session.backend_greedy) moves the argmax of each verify row into `llama_decode`: the decode ms/step
column shows what that costs there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from app.cli.bench import COPY_HEAVY_PROMPT
    from app.core.model_paths import resolve_model
    from engine_ext.bindings import C
    from engine_ext.generate import Session
    from engine_ext.model import Context, Model
    from engine_ext.params import GREEDY, ContextParams, SpeculativeParams
    from engine_ext.protocol import Generate
    from engine_ext.speculative.factory import build_driver

    path = resolve_model(args.model)
    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=4096, n_batch=512, n_threads=args.threads))
    session = Session(model, ctx)
    if args.backend_sampling:
        session.backend_greedy = True  # an engine without the attribute has no backend sampling
    draft_model = str(path) if mode == "draft-simple" else None
    spec = build_driver(SpeculativeParams(types=(mode,), draft_model=draft_model, n_max=args.n_max), model, ctx)
    session.spec = spec
    real_decode = C.llama_decode
    state = {"decode_ns": 0, "decode_cpu_ns": 0, "accepts": 0, "rows": 0}
    # (wall, cpu, decode wall so far, decode cpu so far, accepts so far) at each draft() call
    marks: list[tuple[int, int, int, int, int, int]] = []
    wall, cpu = time.perf_counter_ns, time.thread_time_ns

    def timed_decode(handle: Any, batch: Any) -> int:
        t0, c0 = wall(), cpu()
        rc: int = real_decode(handle, batch)
        state["decode_cpu_ns"] += cpu() - c0
        state["decode_ns"] += wall() - t0
        return rc

    real_accept, real_draft = spec.accept, spec.draft

    def counted_accept(*a: Any, **kw: Any) -> None:
        real_accept(*a, **kw)
        state["accepts"] += 1
        state["rows"] += 1 + int(a[1])  # the verify batch: id_last and the draft

    def marked_draft(*a: Any, **kw: Any) -> Any:
        marks.append((wall(), cpu(), state["decode_ns"], state["decode_cpu_ns"], state["accepts"], state["rows"]))
        return real_draft(*a, **kw)

    spec.accept = counted_accept  # type: ignore[method-assign]
    spec.draft = marked_draft  # type: ignore[method-assign]
    C.llama_decode = timed_decode
    step_ms: list[float] = []
    step_cpu_ms: list[float] = []
    decode_ms: list[float] = []
    rows: list[int] = []
    tps: list[float] = []
    drafted = accepted = 0
    try:
        for rep in range(args.repetitions + 1):  # the first run fills the prompt cache and is not counted
            marks.clear()
            request = Generate(request_id=rep + 1, prompt=COPY_HEAVY_PROMPT, sampling=GREEDY, max_tokens=args.n_gen)
            done = session.generate(request, lambda _e: None, lambda: False)
            if rep == 0:
                continue
            tps.append(done.stats.decode_tps)
            if done.speculative is not None:
                drafted, accepted = done.speculative.drafted, done.speculative.accepted
            for (t0, c0, d0, e0, n0, r0), (t1, c1, d1, e1, n1, r1) in zip(marks, marks[1:], strict=False):
                if n1 - n0 == 1:  # the step verified a draft
                    rows.append(r1 - r0)
                    step_ms.append(((t1 - t0) - (d1 - d0)) / 1e6)
                    step_cpu_ms.append(((c1 - c0) - (e1 - e0)) / 1e6)
                    decode_ms.append((d1 - d0) / 1e6)
    finally:
        C.llama_decode = real_decode
        spec.close()
        ctx.close()
        model.close()
    return {
        "mode": mode,
        "steps": len(step_ms),
        "py_ms_median": round(statistics.median(step_ms), 4) if step_ms else 0.0,
        "py_ms_mean": round(statistics.fmean(step_ms), 4) if step_ms else 0.0,
        "py_cpu_ms_median": round(statistics.median(step_cpu_ms), 4) if step_cpu_ms else 0.0,
        "decode_ms_median": round(statistics.median(decode_ms), 4) if decode_ms else 0.0,
        "us_per_row": round(1000 * sum(step_ms) / sum(rows), 2) if rows else 0.0,
        "rows_per_step": round(statistics.fmean(rows), 1) if rows else 0.0,
        "tps": round(statistics.median(tps), 2) if tps else 0.0,
        "drafted": drafted,
        "accepted": accepted,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("--n-max", type=int, default=16)
    parser.add_argument("--modes", default="ngram-simple,ngram-mod,draft-simple")
    parser.add_argument("--root", default=str(ROOT), help="import the engine from this checkout")
    parser.add_argument("--backend-sampling", action="store_true", help="verify greedy drafts in llama_decode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.root).resolve()))
    try:  # llama.cpp's load messages off the table (an older checkout given as --root may lack the filter)
        from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr

        log_llama_to_stderr(GGML_LOG_LEVEL_WARN)
    except ImportError:
        pass
    rows = [measure(mode, args) for mode in args.modes.split(",") if mode]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{'mode':>14} {'steps':>6} {'rows/step':>9} {'py ms/step median':>18} {'mean':>7} {'py CPU ms median':>17} "
        f"{'py us/row':>10} {'decode ms/step':>15} {'tok/s':>8} {'accepted':>10}"
    )
    for r in rows:
        print(
            f"{r['mode']:>14} {r['steps']:6d} {r['rows_per_step']:9.1f} {r['py_ms_median']:18.3f} "
            f"{r['py_ms_mean']:7.3f} "
            f"{r['py_cpu_ms_median']:17.3f} {r['us_per_row']:10.1f} {r['decode_ms_median']:15.3f} {r['tps']:8.2f} "
            f"{r['accepted']:>4}/{r['drafted']:<5}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
