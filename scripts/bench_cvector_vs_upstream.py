"""Time `llmtui steer make` against llama.cpp's `llama-cvector-generator` on the same 32 prompt pairs.

Both get the same prompts, rendered through the model's chat template (upstream reads them as lines, with
escapes), the same threads and method; the script prints wall times and the ratio llmtui / upstream.

    python scripts/bench_cvector_vs_upstream.py -m starter -t 2 --method pca
(builds llama-cvector-generator from the vendored source into .bench/ when it is missing)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / ".bench" / "build" / "bin" / "llama-cvector-generator"


def thirty_two_pairs() -> list[tuple[str, str]]:
    from app.core.paths import assets_dir
    from engine_ext.steering.extract import PromptSet

    pairs: list[tuple[str, str]] = []
    for name in ("happy-sad", "confident-hedging"):
        pairs += PromptSet.load(assets_dir() / "steering" / f"{name}.json").pairs
    return pairs[:32]


def rendered(model_path: Path, text: str) -> str:
    from engine_ext.chat_prompt import render_chat
    from engine_ext.gguf import read_chat_template

    return render_chat(read_chat_template(model_path), [{"role": "user", "content": text}], bos_token="", eos_token="")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--method", choices=("pca", "mean"), default="pca")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if not TOOL.exists():
        from scripts.bench_vs_llama_bench import build_llama_bench

        build_llama_bench([], ("llama-cvector-generator",))
    from app.core.model_paths import resolve_model

    model = resolve_model(args.model)
    pairs = thirty_two_pairs()
    work = Path(tempfile.mkdtemp(prefix="cvec-bench-"))
    escape = str.maketrans({"\n": "\\n"})
    (work / "pos.txt").write_text("\n".join(rendered(model, p).translate(escape) for p, _ in pairs) + "\n")
    (work / "neg.txt").write_text("\n".join(rendered(model, n).translate(escape) for _, n in pairs) + "\n")
    (work / "set.json").write_text(json.dumps({"name": "bench32", "pairs": pairs}))
    upstream_cmd = [
        str(TOOL),
        "-m",
        str(model),
        "-t",
        str(args.threads),
        "--positive-file",
        str(work / "pos.txt"),
        "--negative-file",
        str(work / "neg.txt"),
        "--method",
        args.method,
        "-o",
        str(work / "up.gguf"),
    ]
    ours_cmd = [
        sys.executable,
        "-m",
        "app",
        "steer",
        "make",
        "-m",
        str(model),
        "--prompts",
        str(work / "set.json"),
        "--method",
        args.method,
        "-t",
        str(args.threads),
        "-o",
        str(work / "ours.gguf"),
    ]
    times: dict[str, list[float]] = {"upstream": [], "llmtui": []}
    for round_no in range(args.rounds):
        order = [("upstream", upstream_cmd), ("llmtui", ours_cmd)]
        if round_no % 2:
            order.reverse()
        for name, cmd in order:
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            times[name].append(time.perf_counter() - t0)
    up, mine = min(times["upstream"]), min(times["llmtui"])
    print(f"32 pairs, {args.method}, {args.threads} threads (best of {args.rounds}, whole process incl. loading)")
    print(f"llama-cvector-generator {up:8.2f} s")
    print(f"llmtui steer make       {mine:8.2f} s   ratio {mine / up:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
