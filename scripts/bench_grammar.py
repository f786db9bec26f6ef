"""The grammar sampler's cost per token: plain greedy decoding against greedy decoding under a JSON schema and under
a GBNF grammar, on the starter model (or -m MODEL), side by side.

Each mode decodes the same chat prompt greedily in the engine's own decode loop (engine_ext.generate.Session, in
this process: no worker, no pipe), a few times, the modes taking turns; the table gives the median decode speed,
the median time per token, and the ratio of each mode's time per token to plain decoding's (1.00: the grammar costs
nothing), in wall time and in the process's CPU time per token (CPU time counts what the engine computed, not the
time it waited for a CPU: steadier when other programs share the machine). The
constrained replies are checked (the JSON parses, the grammar's lines match it), so a grammar that was not applied
cannot pass for a cheap one. A JSON schema goes through llmtui's converter (engine_ext.grammar.grammar_for, which
uses llama-cpp-python's json_schema_to_gbnf) and both through llama.cpp's grammar sampler in the native chain.

    python scripts/bench_grammar.py                   # starter model, 128 tokens, 5 runs, 1 thread
    python scripts/bench_grammar.py -n 256 -r 7 -t 2 --json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PROMPT = "List as many fruits as you can, with their colour, one per line."
# A JSON schema whose answer can run long (a list of objects), so that every mode decodes about as many tokens.
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "fruits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "colour": {"type": "string"}},
                    "required": ["name", "colour"],
                },
            }
        },
        "required": ["fruits"],
    }
)
# A GBNF grammar of the same shape in plain lines: "- name: colour".
GRAMMAR = 'root ::= line+\nline ::= "- " word ": " word "\\n"\nword ::= [A-Za-z] [A-Za-z ]{0,30}\n'
LINE = re.compile(r"- [A-Za-z][A-Za-z ]{0,30}: [A-Za-z][A-Za-z ]{0,30}")


def valid(mode: str, text: str, finished: bool) -> bool:
    """Whether a reply follows its mode's constraint (a reply cut by max tokens: its complete part)."""
    if mode == "json_schema":
        if not finished:
            return text.lstrip().startswith("{")  # cut mid-object: the prefix of one
        return isinstance(json.loads(text).get("fruits"), list)
    if mode == "grammar":
        lines = text.split("\n")
        complete = lines if finished else lines[:-1]
        return all(LINE.fullmatch(line) for line in complete if line)
    return True


def collect_into(chunks: list[Any]) -> Any:
    """An event sink for Session.generate that keeps the reply's token chunks."""
    from engine_ext.protocol import TokenChunk

    def emit(event: object) -> None:
        if isinstance(event, TokenChunk):
            chunks.append(event)

    return emit


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every mode's runs, interleaved (plain, schema, grammar, plain, …) so that a machine whose load changes while
    the benchmark runs slows each mode alike."""
    from app.core.model_paths import resolve_model
    from engine_ext.generate import Session
    from engine_ext.model import Context, Model
    from engine_ext.params import GREEDY, ContextParams
    from engine_ext.protocol import ChatMessage, Generate, TokenChunk

    model = Model(resolve_model(args.model))
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=512, n_threads=args.threads))
    session = Session(model, ctx)
    constraints: dict[str, dict[str, str]] = {"plain": {}, "json_schema": {"json_schema": SCHEMA}}
    constraints["grammar"] = {"grammar": GRAMMAR}
    runs: dict[str, list[tuple[float, float, int]]] = {mode: [] for mode in constraints}  # (tok/s, CPU ms/token, n)
    request_id = 0
    try:
        for rep in range(args.repetitions + 1):  # the first round warms up (the prompt cache) and is not counted
            for mode, constraint in constraints.items():
                request_id += 1
                request = Generate(
                    request_id=request_id,
                    messages=(ChatMessage("user", PROMPT),),
                    sampling=GREEDY,
                    max_tokens=args.n_gen,
                    **constraint,  # type: ignore[arg-type]
                )
                chunks: list[TokenChunk] = []
                cpu = time.process_time()
                done = session.generate(request, collect_into(chunks), lambda: False)
                cpu = time.process_time() - cpu
                text = "".join(chunk.text for chunk in chunks)
                if not valid(mode, text, done.stop_reason != "max_tokens"):
                    raise SystemExit(f"{mode}: the reply does not follow its constraint: {text[:200]!r}")
                n = done.stats.generated_tokens
                if rep and n:
                    runs[mode].append((done.stats.decode_tps, 1000.0 * cpu / n, n))
    finally:
        ctx.close()
        model.close()
    rows = []
    for mode, results in runs.items():
        tps = statistics.median(r[0] for r in results)
        rows.append(
            {
                "mode": mode,
                "runs": len(results),
                "tokens": int(statistics.median(r[2] for r in results)),
                "tps": round(tps, 2),
                "ms_per_token": round(1000.0 / tps, 3) if tps else 0.0,
                "cpu_ms_per_token": round(statistics.median(r[1] for r in results), 3),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=1)  # CPU time per token: the decode thread
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr

    log_llama_to_stderr(GGML_LOG_LEVEL_WARN)  # llama.cpp's load messages off the table
    rows = measure(args)
    plain, plain_cpu = rows[0]["ms_per_token"], rows[0]["cpu_ms_per_token"]
    for row in rows:
        row["ratio"] = round(row["ms_per_token"] / plain, 3) if plain else 0.0
        row["cpu_ratio"] = round(row["cpu_ms_per_token"] / plain_cpu, 3) if plain_cpu else 0.0
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{'mode':>12} {'runs':>5} {'tokens':>7} {'tok/s median':>13} {'ms/token':>9} {'ratio':>6} "
        f"{'CPU ms/token':>13} {'CPU ratio':>10}"
    )
    for r in rows:
        print(
            f"{r['mode']:>12} {r['runs']:5d} {r['tokens']:7d} {r['tps']:13.2f} {r['ms_per_token']:9.3f} "
            f"{r['ratio']:6.3f} {r['cpu_ms_per_token']:13.3f} {r['cpu_ratio']:10.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
