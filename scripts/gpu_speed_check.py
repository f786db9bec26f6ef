"""GPU speed check: build the engine and llama-bench for this machine's GPU, then compare their speed.

On a machine with a GPU (CUDA, ROCm/HIP, Vulkan or Metal):

    python scripts/gpu_speed_check.py                 # detect the backend, build both, compare on the starter model
    python scripts/gpu_speed_check.py -m PATH.gguf --backend cuda -p 512 -n 128 --rounds 3

Steps, each printed before it runs:
1. a virtual environment in .bench/gpu-<backend>/venv with llama-cpp-python==0.3.36 built by
   scripts/build_engine.sh (from the sdist with patches/llama.cpp applied, the backend's CMake flag) and llmtui;
2. `llmtui doctor --json` from that environment must list a GPU device, else the script stops and says so;
3. llama-bench built with the same flag from the same vendored llama.cpp source with the same patches
   (.bench/src, .bench/gpu-<backend>/build);
4. alternating rounds of llama-bench and `llmtui bench` with every layer offloaded (-ngl 99), then the
   prompt (pp) and decode (tg) speed of each and the ratio llmtui / llama-bench (goal: tg ≥ 0.98).

`--dry-run` prints the commands without running them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_llama_bench import ROOT, WORK, build_llama_bench, compare, fetch_sdist  # noqa: E402

FLAGS = {"cuda": "-DGGML_CUDA=on", "hip": "-DGGML_HIP=on", "vulkan": "-DGGML_VULKAN=on", "metal": "-DGGML_METAL=on"}


def detect_backend() -> str | None:
    """The GPU backend this machine can use, judged by its drivers and tools."""
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        return "cuda"
    if Path("/dev/kfd").exists() or shutil.which("rocminfo"):
        return "hip"
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    if shutil.which("vulkaninfo"):
        return "vulkan"
    return None


def run(cmd: list[str], *, dry_run: bool, env: dict[str, str] | None = None) -> None:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items() if os.environ.get(k) != v)
    print("$", (prefix + " " if prefix else "") + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, check=True, env=dict(os.environ, **(env or {})))


BUILD_ENGINE_BACKEND = {"cuda": "cuda", "hip": "rocm", "vulkan": "vulkan", "metal": "metal"}


def setup_engine(backend: str, venv: Path, *, dry_run: bool) -> Path:
    """A venv with llmtui and llama-cpp-python==0.3.36 built for `backend` by scripts/build_engine.sh (from the sdist,
    with patches/llama.cpp applied: the Vulkan build needs them on Debian 12's headers); returns its python."""
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    run(["bash", str(ROOT / "scripts" / "build_engine.sh"), BUILD_ENGINE_BACKEND[backend], str(venv)], dry_run=dry_run)
    run([str(python), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[starter]"], dry_run=dry_run)
    return python


def patch_llama_bench_source(*, dry_run: bool) -> None:
    """Unpack the vendored llama.cpp where build_llama_bench builds it from (.bench/src) and apply patches/llama.cpp,
    so llama-bench is built from the same source as the engine (once: a marker lists the patches applied)."""
    src = WORK / "src"
    patches = sorted((ROOT / "patches" / "llama.cpp").glob("*.patch"))
    marker = src / ".llmtui-patches"
    wanted = "".join(f"{p.name}\n" for p in patches)
    print(f"$ patch -p1 -d {src} < patches/llama.cpp/*.patch ({len(patches)} patches)", flush=True)
    if dry_run or (marker.is_file() and marker.read_text() == wanted):
        return
    if src.exists():  # unpatched, or patched with another set: unpack afresh
        shutil.rmtree(src)
        shutil.rmtree(WORK / "unpacked", ignore_errors=True)
    sdist = fetch_sdist()
    with tarfile.open(sdist) as tar:
        tar.extractall(WORK / "unpacked", filter="data")
    shutil.move(str(next((WORK / "unpacked").iterdir()) / "vendor" / "llama.cpp"), src)
    for patch in patches:
        with patch.open("rb") as f:
            subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(src)], stdin=f, check=True)
    marker.write_text(wanted)


def check_doctor(python: Path, *, dry_run: bool) -> None:
    """Stop unless the freshly built engine sees a GPU device."""
    cmd = [str(python), "-m", "app", "doctor", "--json"]
    print("$", " ".join(cmd), flush=True)
    if dry_run:
        return
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
    gpus = [d for d in report["devices"] if d["type"] in ("GPU", "integrated GPU")]
    for d in gpus:
        print(
            f"  {d['name']} ({d['description']}): {d['free_bytes'] / 2**30:.1f} of {d['total_bytes'] / 2**30:.1f} "
            "GiB free"
        )
    if not gpus:
        advice = "; ".join(report.get("advice", [])) or "see `llmtui doctor`"
        raise SystemExit(f"the engine was built but sees no GPU device: {advice}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("auto", *FLAGS), default="auto")
    parser.add_argument("-m", "--model", default="starter", help="a .gguf path or starter (default)")
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 4)
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="print the steps' commands, run nothing")
    args = parser.parse_args()
    backend = detect_backend() if args.backend == "auto" else args.backend
    if backend is None:
        print(
            "no GPU found (no nvidia-smi, /dev/kfd, Apple Silicon or vulkaninfo); pass --backend to force one",
            file=sys.stderr,
        )
        return 1
    home = WORK / f"gpu-{backend}"
    print(f"backend {backend} ({FLAGS[backend]}), working in {home}", flush=True)
    python = setup_engine(backend, home / "venv", dry_run=args.dry_run)
    check_doctor(python, dry_run=args.dry_run)
    patch_llama_bench_source(dry_run=args.dry_run)
    print(f"$ cmake ... {FLAGS[backend]} (llama-bench from the vendored source, in {home / 'build'})", flush=True)
    if args.dry_run:
        return 0
    binary = build_llama_bench([FLAGS[backend]], build=home / "build")
    args.n_gpu_layers = 99
    args.python = python
    model = str(args.model)
    if model == "starter" or not Path(model).exists():
        out = subprocess.run(
            [str(python), "-c", f"from app.core.model_paths import resolve_model; print(resolve_model({model!r}))"],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        model = out.stdout.strip()
    ratios = compare(binary, model, args)
    tg = ratios.get("tg")
    if tg is not None:
        print(f"decode ratio llmtui / llama-bench on {backend}: {tg:.3f} (goal ≥ 0.98)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
