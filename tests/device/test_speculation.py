"""Greedy output with and without speculation on the device, for every drafter × tiny architecture.

Each row is identical (speculative decoding on the device gives what plain decoding on the device gives), diverged
(measured and named here, with why), refused (up front, with the engine's one-line reason) or crashed, which fails:
no crash may reach the user. Plain decoding on the device is compared with the CPU too (the row records it). The
rows go to scripts/vulkan_lane.sh's table ($LLMTUI_DEVICE_REPORT).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_ext.doctor import is_lavapipe
from tests.device.devices import DeviceReport, GpuDevice
from tests.device.spec_matrix import COMBOS, Combo, run_combo

# combo id → why its speculative output may differ from plain decoding on the device (none known yet).
KNOWN_DIVERGENCES: dict[str, str] = {}
# combo id → the words the engine's refusal must contain: combinations that crashed the engine on the device
# (engine_ext/spec_catalog.py DEVICE_REFUSALS says why). None on a GPU now: DFlash, DSpark and EAGLE3 crashed
# on Vulkan until the worker gave them a target context that had not decoded yet (issue 24).
EXPECTED_REFUSALS: dict[str, str] = {}
# On Mesa's lavapipe, a layer-input drafter with a mixture-of-experts target (factory.lavapipe_refusal): it crashed
# Mesa 22.3's lavapipe in 5 of 5 runs with the fresh context (Mesa 25 ran it).
LAVAPIPE_REFUSALS: dict[str, str] = {
    "draft-dflash-qwen3next-dflash": "draft-dflash is off with a mixture-of-experts target on Mesa's lavapipe"
}


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: c.id)
def test_speculation_on_the_device(
    combo: Combo, tiny_models: dict[str, Path], tmp_path: Path, device_report: DeviceReport, gpu_device: GpuDevice
) -> None:
    row = run_combo(combo, tiny_models, tmp_path / "engine.log")
    device_report.append(row.as_dict())
    print(row)
    assert row.outcome not in ("crashed", "failed"), f"{combo.id}: {row.outcome} {row.detail}"
    expected = {**EXPECTED_REFUSALS, **(LAVAPIPE_REFUSALS if is_lavapipe(gpu_device.description) else {})}
    if combo.id in expected:
        assert row.outcome == "refused" and expected[combo.id] in row.detail, row
        return
    assert row.outcome != "refused", f"{combo.id} refused: {row.detail}"
    if row.outcome == "diverged":
        assert combo.id in KNOWN_DIVERGENCES, f"{combo.id} diverged {row.detail} (drafted {row.drafted})"
    assert row.drafted > 0 or combo.drafter.startswith("ngram"), row
