"""`llmtui bench`: prompt and decode speed like llama-bench, and speculative modes against plain decoding."""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from typing import Any

from app.cli.engine_args import (
    add_engine_args,
    add_spec_args,
    context_params,
    model_params,
    spec_params,
    target_load_plan,
)
from app.cli.session import loaded, recovering, start_engine, stream_reply
from app.cli.types import MAX_CONTEXT, int_range, utf8_text
from app.core.model_paths import resolve_model
from engine_ext.params import ModelParams, SamplingParams
from engine_ext.protocol import (
    ChatMessage,
    Finished,
    Generate,
    GenerationStats,
    ModelInfo,
)
from engine_ext.spec_catalog import SPEC_TYPE


def _check_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.n_prompt == 0 and args.n_gen == 0:
        parser.error("argument -p/--n-prompt: -p and -n are both 0: nothing to measure")


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "mean": round(statistics.fmean(values), 2),
        "stdev": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
    }


COPY_HEAVY_PROMPT = """Repeat these four Python functions exactly, then stop.

def add(a, b):
    return a + b

def subtract(a, b):
    return a - b

def multiply(a, b):
    return a * b

def divide(a, b):
    if b == 0:
        raise ValueError("division by zero")
    return a / b
"""


def cmd_bench_speculative(args: argparse.Namespace) -> int:
    """Plain decoding and each speculative mode on the same chat prompt: tok/s, speedup, acceptance."""
    path = resolve_model(args.model)
    modes = ["plain", *[t.strip() for t in args.spec_type.split(",") if t.strip()]]
    reps = max(1, args.repetitions)
    n_gen = args.n_gen
    greedy = SamplingParams(temperature=0.0)
    prompt = args.prompt or COPY_HEAVY_PROMPT
    specs = {mode: spec_params(args, path, "" if mode == "plain" else mode) for mode in modes}
    for spec in specs.values():
        spec.validate()
    n_rs_seq = max(target_load_plan(spec, path).n_rs_seq for spec in specs.values())
    rows: list[dict[str, Any]] = []
    heads = (spec for spec in specs.values() if target_load_plan(spec, path).load_mtp)
    context = context_params(args, args.ctx_size or 4096, n_rs_seq)
    model = model_params(args, next(heads, None), path)
    with start_engine() as client:

        def measure(model: ModelParams) -> ModelInfo:
            rows.clear()
            info = loaded(client.load(path, model, context))
            for mode in modes:
                client.set_speculative(specs[mode])
                speeds: list[float] = []
                finished: Finished | None = None
                ids: list[int] = []
                for rep in range(reps + 1):  # the first run warms the prompt cache and is not counted
                    request = Generate(
                        request_id=client.new_request_id(),
                        messages=() if args.raw else (ChatMessage("user", prompt),),
                        prompt=prompt if args.raw else None,
                        sampling=greedy,
                        max_tokens=n_gen,
                    )
                    _, ids, finished = stream_reply(client.generate(request), echo=False)
                    if rep > 0:
                        speeds.append(finished.stats.decode_tps)
                assert finished is not None
                s = finished.speculative
                rows.append(
                    {
                        "mode": mode,
                        "tps": round(statistics.median(speeds), 2),
                        "generated": finished.stats.generated_tokens,
                        "proposed": s.proposed if s else 0,
                        "drafted": s.drafted if s else 0,
                        "accepted": s.accepted if s else 0,
                        "mean_accepted_length": round(s.mean_accepted_length, 3) if s else 1.0,
                        "draft_ms": round(s.draft_ms, 2) if s else 0.0,
                        "tokens": ids,
                    }
                )
            return info

        info = recovering(client, model, context, measure)
    plain_tps, plain_ids = rows[0]["tps"], rows[0]["tokens"]
    for row in rows:
        row["speedup"] = round(row["tps"] / plain_tps, 3) if plain_tps else 0.0
        # Greedy speculation must reproduce plain decoding token for token (the trust check).
        row["identical"] = row.pop("tokens") == plain_ids
    if args.json:
        print(
            json.dumps(
                {
                    "model": str(path),
                    "description": info.description,
                    "n_params": info.n_params,
                    "n_gen": n_gen,
                    "modes": rows,
                }
            )
        )
    else:
        header = model_line(info.description, info.n_params, info.backend, info.n_threads)
        print(f"{header}, {n_gen} tokens, median of {reps}")
        # proposed: the drafters' tokens; drafted: those verified (llama.cpp's n_drafted); accepted: of the drafted
        print(
            f"{'mode':>14} {'tok/s':>8} {'speedup':>8} {'proposed':>9} {'drafted':>8} {'accepted':>9} "
            f"{'mean len':>9} {'same text':>10}"
        )
        for row in rows:
            counts = [str(row[k]) if row["mode"] != "plain" else "-" for k in ("proposed", "drafted", "accepted")]
            mean_len = row["mean_accepted_length"]
            same = "yes" if row["identical"] else "DIVERGED"
            print(
                f"{row['mode']:>14} {row['tps']:8.2f} {row['speedup']:7.2f}x {counts[0]:>9} {counts[1]:>8} "
                f"{counts[2]:>9} {mean_len:9.2f} {same:>10}"
            )
    return 0


def parameters_text(n: int) -> str:
    """A model's parameter count as a person says it: ``134_515_008`` -> ``"134.5M parameters"`` (issue 37)."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.{2 if div >= 1e9 else 1}f}{suffix} parameters"
    return f"{n} parameters"


def model_line(description: str, n_params: int, backend: str, n_threads: int) -> str:
    """bench's header: the parameter count first, llama.cpp's description (its size class, e.g. "llama 256M" for a
    135M model, and the quant) named as llama.cpp's, so the two figures are not read as one."""
    threads = "1 thread" if n_threads == 1 else f"{n_threads} threads"
    return f"model: {parameters_text(n_params)} (llama.cpp: {description}; {backend}, {threads})"


def cmd_bench(args: argparse.Namespace) -> int:
    """Prompt processing (pp) and token generation (tg) speed through the app's own worker and client."""
    if args.spec_type:
        return cmd_bench_speculative(args)
    path = resolve_model(args.model)
    n_prompt, n_gen, reps = args.n_prompt, args.n_gen, max(1, args.repetitions)
    n_ctx = args.ctx_size or max(n_prompt, n_gen + 1) + 16
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(1234)
    model, context = model_params(args), context_params(args, n_ctx)
    with start_engine() as client:

        def measure(model: ModelParams) -> dict[str, Any]:
            info = loaded(client.load(path, model, context))
            n_vocab = info.n_vocab

            def run(tokens: list[int], max_tokens: int) -> GenerationStats:
                request = Generate(
                    request_id=client.new_request_id(),
                    prompt_tokens=tuple(tokens),
                    sampling=greedy,
                    max_tokens=max_tokens,
                    ignore_eos=True,
                )
                return stream_reply(client.generate(request), echo=False)[2].stats

            def fresh(n: int, previous: list[int]) -> list[int]:
                # Random tokens whose first differs from the last run's, so nothing comes from the cache.
                tokens = [rng.randrange(n_vocab) for _ in range(n)]
                while previous and tokens[0] == previous[0]:
                    tokens[0] = rng.randrange(n_vocab)
                return tokens

            results: dict[str, Any] = {
                "model": str(path),
                "description": info.description,
                "n_params": info.n_params,
                "backend": info.backend,
                "n_threads": info.n_threads,
                "n_ctx": info.n_ctx,
            }
            last: list[int] = []
            if n_prompt > 0:
                last = fresh(min(n_prompt, 8), last)
                run(last, 1)  # warm-up
                pp: list[float] = []
                for _ in range(reps):
                    last = fresh(n_prompt, last)
                    stats = run(last, 1)
                    pp.append(stats.prompt_tps)
                results["pp"] = {"n_prompt": n_prompt, "tps": [round(v, 2) for v in pp], **_summary(pp)}
            if n_gen > 0:
                last = fresh(1, last)
                run(last, 2)  # warm-up
                tg: list[float] = []
                for _ in range(reps):
                    last = fresh(1, last)
                    stats = run(last, n_gen + 1)  # n_gen decodes after the first sampled token
                    tg.append(stats.decode_tps)
                results["tg"] = {"n_gen": n_gen, "tps": [round(v, 2) for v in tg], **_summary(tg)}
            return results

        results = recovering(client, model, context, measure)
    if args.json:
        print(json.dumps(results))
    else:
        print(model_line(results["description"], results["n_params"], results["backend"], results["n_threads"]))
        for key, label in (("pp", f"pp{n_prompt}"), ("tg", f"tg{n_gen}")):
            if key in results:
                r = results[key]
                print(f"{label:>8}: {r['median']:10.2f} tok/s (median of {reps}; mean {r['mean']} ± {r['stdev']})")
    return 0


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="prompt and decode speed (like llama-bench)")
    add_engine_args(bench, default_ctx=0)
    bench.add_argument("-p", "--n-prompt", type=int_range(0, MAX_CONTEXT), default=512, help="prompt tokens (0: skip)")
    bench.add_argument("-n", "--n-gen", type=int_range(0, MAX_CONTEXT), default=128, help="generated tokens (0: skip)")
    bench.add_argument("-r", "--repetitions", type=int_range(1, 1000), default=5)
    bench.add_argument("--json", action="store_true")
    add_spec_args(bench)
    bench.add_argument(
        "--prompt", type=utf8_text, help=f"chat prompt for {SPEC_TYPE.flag} runs (default: a copy-heavy one)"
    )
    bench.add_argument(
        "--raw", action="store_true", help=f"{SPEC_TYPE.flag} runs complete the prompt without a template"
    )
    bench.set_defaults(check_args=lambda args: _check_bench(bench, args))
