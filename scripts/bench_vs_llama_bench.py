"""Compare `llmtui bench` with llama.cpp's own `llama-bench` built from the same vendored source, with the same
patches (patches/llama.cpp) and weight repacking on (AMX where the CPU has it), as the engine.

Runs both on the same model, threads and sizes, alternating rounds so drift hits both alike, and prints
prompt-processing and decode speed side by side with the ratio llmtui / llama-bench.

    python scripts/bench_vs_llama_bench.py --build -m starter -t 2 -p 512 -n 128 -r 5 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"


def llama_bench_path(build: Path = WORK / "build") -> Path:
    return build / "bin" / "llama-bench"


def fetch_sdist() -> Path:
    """The llama-cpp-python sdist (the vendored llama.cpp) in WORK, downloaded once."""
    WORK.mkdir(exist_ok=True)
    sdists = list(WORK.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(WORK),
                LLAMA_CPP_PYTHON,
            ],
            check=True,
        )
        sdists = list(WORK.glob("llama_cpp_python-*.tar.gz"))
    return sdists[0]


def build_llama_bench(
    cmake_args: list[str], targets: tuple[str, ...] = ("llama-bench",), build: Path = WORK / "build"
) -> Path:
    """Fetch the llama-cpp-python sdist (the vendored llama.cpp) and build llama-bench (and `targets`) with CMake."""
    sdist = fetch_sdist()
    src = WORK / "src"
    # The engine is the vendored llama.cpp with patches/llama.cpp applied (scripts/build_engine.sh): so is llama-bench.
    patches = sorted((ROOT / "patches" / "llama.cpp").glob("*.patch"))
    stamp = "\n".join(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in patches)
    if src.exists() and (not (WORK / "src.patches").is_file() or (WORK / "src.patches").read_text() != stamp):
        shutil.rmtree(src)  # extracted before these patches (or without any): start again
        shutil.rmtree(WORK / "unpacked", ignore_errors=True)
    if not src.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(WORK / "unpacked", filter="data")
        unpacked = next((WORK / "unpacked").iterdir())
        shutil.move(str(unpacked / "vendor" / "llama.cpp"), src)
        for patch in patches:
            subprocess.run(
                ["patch", "-p1", "--forward", "--batch", "--quiet", "-d", str(src)], stdin=patch.open("rb"), check=True
            )
        (WORK / "src.patches").write_text(stamp)
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=ON",
            "-DLLAMA_BUILD_SERVER=OFF",
            *cmake_args,
        ],
        check=True,
    )
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", jobs], check=True)
    return llama_bench_path(build)


def resolve_model(spec: str) -> str:
    sys.path.insert(0, str(ROOT))
    from app.core.model_paths import resolve_model as resolve

    return str(resolve(spec))


def bench_flags(model: str, args: argparse.Namespace) -> list[str]:
    """The flags llama-bench and `llmtui bench` share (llmtui's are llama-bench's names)."""
    numbers = {"-t": args.threads, "-p": args.n_prompt, "-n": args.n_gen, "-r": args.repetitions}
    return [
        "-m",
        model,
        *(x for flag, value in numbers.items() for x in (flag, str(value))),
        "-ngl",
        str(args.n_gpu_layers),
    ]


def run_llama_bench(binary: Path, model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    cmd = [str(binary), *bench_flags(model, args), "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, list[float]] = {}
    for test in json.loads(out):
        key = "pp" if test["n_prompt"] > 0 and test["n_gen"] == 0 else "tg"
        result[key] = [float(v) for v in test["samples_ts"]]
    return result


def run_llmtui_bench(model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    python = getattr(args, "python", None) or sys.executable  # the interpreter whose engine build is measured
    cmd = [str(python), "-m", "app", "bench", *bench_flags(model, args), "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    return {key: [float(v) for v in out[key]["tps"]] for key in ("pp", "tg") if key in out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=5)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both tools")
    parser.add_argument("--build", action="store_true", help="build llama-bench if it is not built yet")
    parser.add_argument("--cmake-arg", action="append", default=[], help="extra CMake flag, e.g. -DGGML_CUDA=ON")
    parser.add_argument("--llama-bench", type=Path, default=None, help="use this llama-bench binary")
    args = parser.parse_args()

    binary = args.llama_bench or llama_bench_path()
    if not binary.exists():
        if not args.build:
            print(f"llama-bench not found at {binary}; run with --build to build it", file=sys.stderr)
            return 1
        binary = build_llama_bench(args.cmake_arg)
    compare(binary, resolve_model(args.model), args)
    return 0


def compare(binary: Path, model: str, args: argparse.Namespace) -> dict[str, float]:
    """Alternating rounds of llama-bench and `llmtui bench`; prints the table, returns the ratio per test."""
    ratios_out: dict[str, float] = {}
    samples: dict[str, dict[str, list[float]]] = {"llama-bench": {}, "llmtui": {}}
    round_ratios: dict[str, list[float]] = {}  # llmtui median / llama-bench median within each round
    for round_no in range(args.rounds):
        this_round: dict[str, dict[str, float]] = {}
        order = [
            ("llama-bench", lambda: run_llama_bench(binary, model, args)),
            ("llmtui", lambda: run_llmtui_bench(model, args)),
        ]
        if round_no % 2:
            order.reverse()
        for name, run in order:
            for key, values in run().items():
                samples[name].setdefault(key, []).extend(values)
                this_round.setdefault(key, {})[name] = statistics.median(values)
            print(f"round {round_no + 1}/{args.rounds}: {name} done", file=sys.stderr)
        for key, pair in this_round.items():
            if len(pair) == 2:
                round_ratios.setdefault(key, []).append(pair["llmtui"] / pair["llama-bench"])

    print(f"model {model}, {args.threads} threads, {args.rounds} rounds × {args.repetitions} repetitions")
    # The machine's speed drifts between rounds; the median of per-round ratios is the robust figure.
    print(f"{'test':>8} {'llama-bench t/s':>16} {'llmtui t/s':>12} {'ratio':>7} {'per-round ratios (median)':>30}")
    for key, label in (("pp", f"pp{args.n_prompt}"), ("tg", f"tg{args.n_gen}")):
        ref, ours = samples["llama-bench"].get(key), samples["llmtui"].get(key)
        if not ref or not ours:
            continue
        ref_med, our_med = statistics.median(ref), statistics.median(ours)
        ratios = round_ratios.get(key, [])
        per_round = " ".join(f"{r:.3f}" for r in ratios)
        print(
            f"{label:>8} {ref_med:16.2f} {our_med:12.2f} {our_med / ref_med:7.3f}   {per_round} "
            f"({statistics.median(ratios):.3f})"
        )
        ratios_out[key] = statistics.median(ratios)
    return ratios_out


if __name__ == "__main__":
    sys.exit(main())
