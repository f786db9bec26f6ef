"""`llmtui doctor`: backends, devices, memory and versions."""

from __future__ import annotations

import argparse
import json
import os

from app.cli.engine_args import _saved_repack


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.core.paths import repack_memory
    from engine_ext.doctor import diagnose
    from engine_ext.recovery import SKIP_ENV

    crashes = repack_memory()
    if getattr(args, "forget_crashes", False):
        forgot = crashes.forget()
        print(
            "forgot the CPU extra buffer types left out after a native crash: the next start repacks for them again"
            if forgot
            else "nothing remembered: no extra buffer type is left out on this CPU with this engine build"
        )
        return 0
    skipped = crashes.skipped()
    if skipped:  # what the engine worker leaves out, left out here too (before llama.cpp's CPU backend lists them)
        os.environ[SKIP_ENV] = ",".join(skipped)
    report = diagnose(repack=_saved_repack())
    if args.json:
        print(json.dumps({**report.to_dict(), "left_out_after_crash": list(skipped)}))
        return 0
    gib = 1024**3
    print(
        f"llmtui {report.llmtui_version}, llama-cpp-python {report.llama_cpp_python_version}, "
        f"Python {report.python}, {report.platform}"
    )
    if report.engine_build:
        patches = ", ".join(report.engine_patches) or "none"
        print(f"engine patches: {patches}  (built by scripts/build_engine.sh: {report.engine_build})")
    else:
        print("engine patches: none (a plain pip build; scripts/build_engine.sh builds one with patches/llama.cpp)")
    print(f"backends: {', '.join(report.backends)}  (RPC {'yes' if report.rpc else 'no'})")
    print(f"images: {'yes (libmtmd)' if report.images else 'no: the engine was built without libmtmd'}")
    for d in report.devices:
        memory = f"{d.free_bytes / gib:.1f} / {d.total_bytes / gib:.1f} GiB free"
        print(f"  {d.name:10} {d.type:14} {d.description}  {memory}")
    print(f"CPU features: {' '.join(report.cpu_features)}")
    print(f"threads by default: {report.threads_reason}")
    if report.cpu_extra_bufts:
        use = (
            "in use: CPU weights are repacked for them when a model loads (--no-repack or F3 → Repack weights "
            "turns it off)"
            if report.repack
            else "not in use: repacking is off in the settings (F3)"
        )
        print(f"CPU extra buffer types: {', '.join(report.cpu_extra_bufts)}, {use}")
    else:
        print("CPU extra buffer types: none in this build on this CPU (no weight repacking)")
    if skipped:
        print(f"CPU extra buffer types {crashes.describe()} (llmtui doctor --forget-crashes tries them again)")
    if report.hardware_gpus:
        print(f"GPUs on this machine: {', '.join(report.hardware_gpus)}")
    for line in report.advice:
        print(f"note: {line}")
    return 0


def add_doctor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser("doctor", help="backends, devices, memory, versions")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument(
        "--forget-crashes",
        action="store_true",
        help="repack weights for the CPU extra buffer types left out after a native crash again",
    )
