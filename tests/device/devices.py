"""The GPU device the device tests run on, found through the engine's own doctor (engine_ext.doctor)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuDevice:
    name: str  # ggml's device name, e.g. Vulkan0
    description: str  # e.g. llvmpipe (LLVM 15.0.6, 256 bits)
    backend: str  # e.g. Vulkan
    free_bytes: int
    total_bytes: int


def find_gpu_device() -> GpuDevice | str:
    """The first GPU device of the installed engine, or why there is none (the skip reason)."""
    try:
        from engine_ext.doctor import list_devices
    except Exception as e:  # no engine at all: the engine tests fail on their own
        return f"the engine does not import here ({type(e).__name__}: {e})"
    backends, devices = list_devices()
    gpu_backends = [b for b in backends if b not in ("CPU", "RPC", "BLAS")]
    for d in devices:
        if d.type in ("GPU", "integrated GPU"):
            backend = next((b for b in gpu_backends if d.name.startswith(b)), d.name.rstrip("0123456789"))
            return GpuDevice(d.name, d.description, backend, d.free_bytes, d.total_bytes)
    if not gpu_backends:
        return (
            f"this engine is built for the CPU only (backends: {', '.join(backends)}); device tests need one built "
            "with scripts/build_engine.sh vulkan .venv-vulkan, run with .venv-vulkan/bin/python -m pytest tests/device"
        )
    return (
        f"the engine has the {', '.join(gpu_backends)} backend but no device (with Vulkan on a machine without a GPU, "
        "install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)"
    )


class DeviceReport:
    """Rows the tests record (the speculation matrix), each appended at once as a JSON line to
    $LLMTUI_DEVICE_REPORT when it is set (for scripts/vulkan_lane.sh's table): a crash later loses none."""

    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []

    def append(self, row: dict[str, object]) -> None:
        self.rows.append(row)
        target = os.environ.get("LLMTUI_DEVICE_REPORT")
        if target:
            with open(target, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


# ----- llama.cpp's own word on where each layer went --------------------------------------------------------------

_ASSIGNED = re.compile(r"load_tensors: layer +(\d+) assigned to device (\S+),")


@contextmanager
def captured_llama_log() -> Iterator[list[str]]:
    """Every llama.cpp/ggml log line (DEBUG too) written while the block runs, in this process; the tests' quiet
    callback (WARN and up to stderr) is back afterwards."""
    import ctypes

    import llama_cpp

    from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr

    lines: list[str] = []

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,misc]
    def callback(_level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", errors="replace"))

    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        log_llama_to_stderr(GGML_LOG_LEVEL_WARN)


def layer_devices(log: list[str]) -> dict[int, str]:
    """Unit index (blocks 0…N-1, the output head as N) → device, from load_tensors' lines (src/llama-model.cpp)."""
    return {int(m.group(1)): m.group(2) for m in (_ASSIGNED.search(line) for line in "".join(log).splitlines()) if m}
