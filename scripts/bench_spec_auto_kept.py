"""Auto mode against a fixed speculative type and plain decoding, with drafters kept between requests (as in a chat).

Each mode keeps its own drafter for the whole run, so ngram-mod learns the reply in the first round (not counted)
and copies it afterwards. The modes take turns within every round, so the machine's drift affects them alike; the
ratios are medians of the per-round ratios. Greedy, raw prompt; the texts of all modes are compared.

    python scripts/bench_spec_auto_kept.py                      # the copy-heavy prompt, auto vs ngram-mod
    python scripts/bench_spec_auto_kept.py -p "Once upon a time, in a lighthouse by the sea, there lived"
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from app.cli.bench import COPY_HEAVY_PROMPT
    from app.core.model_paths import resolve_model
    from engine_ext.generate import Session
    from engine_ext.model import Context, Model
    from engine_ext.params import GREEDY, ContextParams, SpeculativeParams
    from engine_ext.protocol import Generate, TokenChunk
    from engine_ext.speculative.factory import build_driver

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-p", "--prompt", default=COPY_HEAVY_PROMPT)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--rounds", type=int, default=6, help="rounds counted (after one that teaches)")
    parser.add_argument("--fixed", default="ngram-mod", help="the fixed type auto is compared with")
    args = parser.parse_args()

    target = Model(resolve_model(args.model))
    ctx = Context(target, ContextParams(n_ctx=4096, n_threads=args.threads))
    session = Session(target, ctx)
    drivers: dict[str, Any] = {
        mode: build_driver(SpeculativeParams(types=(mode,), n_max=16), target, ctx) for mode in ("auto", args.fixed)
    }
    drivers["plain"] = None
    speeds: dict[str, list[float]] = {mode: [] for mode in drivers}
    texts: dict[str, set[str]] = {mode: set() for mode in drivers}
    request_id = 0
    try:
        for round_ in range(args.rounds + 1):
            for mode, driver in drivers.items():
                request_id += 1
                session.spec = driver
                pieces: list[str] = []

                def emit(event: Any, pieces: list[str] = pieces) -> None:
                    if isinstance(event, TokenChunk):
                        pieces.append(event.text)

                request = Generate(request_id=request_id, prompt=args.prompt, sampling=GREEDY, max_tokens=args.n_gen)
                done = session.generate(request, emit, lambda: False)
                texts[mode].add("".join(pieces))
                if round_ > 0:
                    speeds[mode].append(done.stats.decode_tps)
    finally:
        session.spec = None
        for driver in drivers.values():
            if driver is not None:
                driver.close()
        ctx.close()
        target.close()

    def per_round(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(speeds[a], speeds[b], strict=True) if y > 0)

    for mode, values in speeds.items():
        print(f"{mode:>12}  median {statistics.median(values):7.1f} tok/s   rounds {[round(v, 1) for v in values]}")
    print(
        f"auto / {args.fixed} (median of per-round ratios) {per_round('auto', args.fixed):.3f}   "
        f"auto / plain {per_round('auto', 'plain'):.3f}"
    )
    same = len(set.union(*texts.values())) == 1
    print("the same text in every mode and round" if same else "TEXTS DIFFER between modes or rounds")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
