"""What the installed engine can use: ggml's backend registry, devices and memory, versions, CPU features."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine_ext.bindings import ggml_lib

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator", 4: "meta"}
# The engine with llmtui's patches for that backend (scripts/build_engine.sh auto, from a clone of llmtui).
REINSTALL = 'CMAKE_ARGS="{flag}" scripts/setup.sh'
# Written into the llama_cpp package by scripts/build_engine.sh: the backend, CMake arguments and patches it carries.
BUILD_RECORD = "llmtui_engine.json"


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    type: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class DoctorReport:
    llmtui_version: str
    llama_cpp_python_version: str
    python: str
    platform: str
    backends: tuple[str, ...]
    devices: tuple[Device, ...]
    cpu_features: tuple[str, ...]
    gpu_offload: bool
    rpc: bool
    hardware_gpus: tuple[str, ...]  # GPUs seen on the machine, whatever the build supports
    advice: tuple[str, ...]
    default_threads: int = 0
    threads_reason: str = ""  # how the default thread count was chosen
    cpu_extra_bufts: tuple[str, ...] = ()  # CPU extra buffer types (weight repacking: AMX, CPU_REPACK, KLEIDIAI)
    repack: bool = True  # whether models load with them (the user's setting; False: --no-repack)
    engine_patches: tuple[
        str, ...
    ] = ()  # patches/llama.cpp/*.patch the engine was built with (scripts/build_engine.sh)
    engine_build: str = ""  # how the engine was built: "vulkan (-DGGML_VULKAN=on …)", or "" without a build record
    images: bool = False  # the engine has libmtmd (images through a model's projector)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_devices() -> tuple[tuple[str, ...], tuple[Device, ...]]:
    from engine_ext.bindings import C

    C.llama_backend_init()
    lib = ggml_lib()
    backends = tuple(
        lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())
    )
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            Device(
                name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
                description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
                type=DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return backends, tuple(devices)


@dataclass(frozen=True)
class EngineBuild:
    """What scripts/build_engine.sh recorded next to the engine it built; `recorded` False for a plain pip build."""

    recorded: bool
    backend: str = ""
    cmake_args: str = ""
    patches: tuple[str, ...] = ()


def engine_build(package_dir: Path | None = None) -> EngineBuild:
    """The build record in the installed llama_cpp package (or in `package_dir`); a bad record reads as none."""
    import json

    if package_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            return EngineBuild(recorded=False)
        package_dir = Path(spec.origin).parent
    path = package_dir / BUILD_RECORD
    try:
        if not path.is_file() or path.stat().st_size > 64 * 1024:
            return EngineBuild(recorded=False)
        data = json.loads(path.read_text(encoding="utf-8"))
        patches = tuple(str(p["name"]) for p in data.get("patches", ()))
        return EngineBuild(
            recorded=True,
            backend=str(data.get("backend", "")),
            cmake_args=str(data.get("cmake_args", "")),
            patches=patches,
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return EngineBuild(recorded=False)


def hardware_gpus() -> tuple[str, ...]:
    """GPUs present on this machine, seen without the engine (so a CPU-only build can be told)."""
    found = []
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        found.append("NVIDIA")
    if Path("/dev/kfd").exists():
        found.append("AMD (ROCm)")
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        found.append("Apple Silicon")
    return tuple(found)


# Mesa's lavapipe (a Vulkan driver that runs on the CPU) names its devices llvmpipe. Mesa 22.3's crashed on every
# mixture-of-experts graph in ggml-vulkan's reordered node order (issue 24); this patch turns the reorder off there.
LAVAPIPE_PATCH = "0002-vulkan-no-reorder-on-cpu-devices.patch"


def is_lavapipe(description: str) -> bool:
    """Whether a ggml device description is Mesa's lavapipe, e.g. 'llvmpipe (LLVM 15.0.6, 256 bits)'."""
    return "llvmpipe" in description


def lavapipe_advice(devices: Sequence[Device], build: EngineBuild) -> list[str]:
    """What a user on lavapipe with an engine that lacks LAVAPIPE_PATCH should do before loading an MoE model."""
    if LAVAPIPE_PATCH in build.patches:
        return []
    return [
        f"{d.name} is Mesa's lavapipe and this engine lacks patch {LAVAPIPE_PATCH[:4]}: mixture-of-experts models "
        "crash Mesa 22.3's lavapipe without it; build the engine with scripts/build_engine.sh vulkan VENV, or set "
        "GGML_VK_DISABLE_GRAPH_OPTIMIZE=1"
        for d in devices
        if is_lavapipe(d.description)
    ]


# A Xeon with AMX crashed on the first prompt in ggml's AMX matmul without this patch (a GCC 12 miscompile, issue 30).
AMX_PATCH = "0003-amx-tile-config-before-ldtilecfg.patch"
REBUILD = "rebuild it with scripts/setup.sh (or scripts/build_engine.sh cpu VENV) from a clone of llmtui"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags (Linux); empty where /proc does not say."""
    try:
        with open(cpuinfo, "rb") as file:
            text = file.read(256 * 1024).decode("ascii", "replace")
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def amx_advice(flags: frozenset[str], build: EngineBuild) -> list[str]:
    """What a user on a CPU with AMX whose engine lacks AMX_PATCH should do."""
    if "amx_tile" not in flags or AMX_PATCH in build.patches:
        return []
    return [
        f"this CPU has AMX and this engine lacks patch {AMX_PATCH[:4]}: llama.cpp's AMX matmul crashes on the first "
        f"prompt without it (GCC 12 drops the tile configuration's stores); {REBUILD}"
    ]


def diagnose(*, repack: bool = True) -> DoctorReport:
    """What the engine can use here; `repack` is whether models load with CPU weight repacking (the user's setting)."""
    from importlib.metadata import PackageNotFoundError, version

    from engine_ext.bindings import C, cpu_extra_buffer_types
    from engine_ext.cpu import thread_plan

    backends, devices = list_devices()
    build = engine_build()
    threads = thread_plan()
    info = C.llama_print_system_info().decode("utf-8", errors="replace")
    features = tuple(
        part.split("=")[0].split(":")[-1].strip()
        for part in info.replace("|", "\n").splitlines()
        if part.strip().endswith("= 1")
    )
    gpus = hardware_gpus()
    has_gpu_backend = any(d.type in ("GPU", "integrated GPU", "accelerator") for d in devices)
    advice = []
    fixes = (("NVIDIA", "-DGGML_CUDA=on"), ("AMD (ROCm)", "-DGGML_HIP=on"), ("Apple Silicon", "-DGGML_METAL=on"))
    for gpu, flag in fixes:
        if gpu in gpus and not has_gpu_backend:
            advice.append(
                f"a {gpu} GPU is present but this engine is built for the CPU only; rebuild it with: "
                + REINSTALL.format(flag=flag)
            )
    if not has_gpu_backend and not gpus:
        advice.append("no GPU found: the engine runs on the CPU (-t sets its threads)")
    advice.extend(lavapipe_advice(devices, build))
    advice.extend(amx_advice(cpu_flags(), build))

    def pkg_version(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return DoctorReport(
        llmtui_version=pkg_version("llmtui"),
        llama_cpp_python_version=pkg_version("llama-cpp-python"),
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        backends=backends,
        devices=devices,
        cpu_features=features,
        gpu_offload=bool(C.llama_supports_gpu_offload()),
        rpc=bool(C.llama_supports_rpc()),
        hardware_gpus=gpus,
        advice=tuple(advice),
        default_threads=threads.threads,
        threads_reason=threads.describe(),
        cpu_extra_bufts=cpu_extra_buffer_types(),
        repack=repack,
        engine_patches=build.patches,
        engine_build=f"{build.backend} ({build.cmake_args})" if build.recorded else "",
        images=_has_mtmd(),
    )


def _has_mtmd() -> bool:
    from engine_ext.bindings import MultimodalUnavailable, mtmd

    try:
        mtmd()
    except MultimodalUnavailable:
        return False
    return True
