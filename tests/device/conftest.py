"""Device tests: the engine built for a GPU backend (scripts/build_engine.sh vulkan .venv-vulkan), run on a device.

On a machine without a GPU, Mesa's lavapipe is the device: a Vulkan driver that runs on the CPU. llama.cpp skips
Vulkan devices of the CPU type unless GGML_VK_VISIBLE_DEVICES names them (ggml-vulkan.cpp, ggml_vk_instance_init:
without the variable only discrete and integrated GPUs are used, and a non-CPU device as a fallback), so these tests
name device 0 unless the variable is set already. Every test here is marked `device` and skipped, with the reason,
where the engine has no Vulkan (or other GPU) device: the normal run (the CPU engine in .venv) stays green and fast.
Run them with `scripts/vulkan_lane.sh`, or `.venv-vulkan/bin/python -m pytest tests/device`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before llama.cpp's backend registry starts (the first ggml_backend call), in this process and in the engine
# workers it spawns (they inherit the environment).
os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
# Mesa keeps compiled shaders in $XDG_CACHE_HOME/mesa_shader_cache, which every test here gets fresh (the hermetic
# dirs): lavapipe then compiles ggml's pipelines again in every engine worker, about 30 s each on 2 cores. A cache
# kept in the build folder (git-ignored) is compiled once; a cache of compiled shaders holds no user data.
os.environ.setdefault("MESA_SHADER_CACHE_DIR", str(Path(__file__).resolve().parents[2] / "build" / "mesa-shader-cache"))

from tests.device.devices import DeviceReport, GpuDevice, find_gpu_device  # noqa: E402

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(pytest.mark.device)


@pytest.fixture(scope="session")
def _gpu_device() -> GpuDevice | str:
    return find_gpu_device()


@pytest.fixture(autouse=True)
def gpu_device(_gpu_device: GpuDevice | str) -> GpuDevice:
    """The device the tests offload to; the test is skipped, saying why, where there is none."""
    if isinstance(_gpu_device, str):
        pytest.skip(_gpu_device)
    return _gpu_device


@pytest.fixture(scope="session")
def device_report() -> DeviceReport:
    return DeviceReport()
