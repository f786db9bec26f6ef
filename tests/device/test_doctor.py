"""`llmtui doctor` on the device engine: the Vulkan device and its memory, and the patches the engine carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.device.devices import GpuDevice

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "doctor", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_lists_the_device_and_its_memory(gpu_device: GpuDevice) -> None:
    result = doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert gpu_device.backend in report["backends"]
    listed = [d for d in report["devices"] if d["name"] == gpu_device.name]
    assert listed, report["devices"]
    device = listed[0]
    assert device["type"] in ("GPU", "integrated GPU") and device["description"] == gpu_device.description
    assert 0 < device["free_bytes"] <= device["total_bytes"]
    assert report["gpu_offload"] is True
    assert not any("built for the CPU only" in line for line in report["advice"])
    text = doctor().stdout
    line = next(line for line in text.splitlines() if line.strip().startswith(gpu_device.name))
    assert gpu_device.description in line and "GiB free" in line


def test_doctor_reports_the_patches_the_engine_was_built_with() -> None:
    from engine_ext.doctor import engine_build

    build = engine_build()
    patches = sorted(p.name for p in (ROOT / "patches" / "llama.cpp").glob("*.patch"))
    report = json.loads(doctor("--json").stdout)
    if not build.recorded:  # an engine built otherwise (pip): doctor says so
        assert report["engine_patches"] == [] and "engine patches: none" in doctor().stdout
        return
    assert report["engine_patches"] == list(build.patches) == patches, "rebuild: scripts/build_engine.sh"
    assert f"engine patches: {', '.join(patches)}" in doctor().stdout
