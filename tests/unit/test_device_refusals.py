"""Speculative types refused with the target on a device where they crashed the engine (issue 24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_ext.doctor import Device
from engine_ext.params import ModelParams, SpeculativeParams
from engine_ext.spec_catalog import (
    BY_NAME,
    DEVICE_REFUSALS,
    LAYER_INPUT_TYPES,
    device_refusal,
    needs_fresh_context,
)


def test_refusals_name_real_types_and_say_why_in_one_line() -> None:
    assert set(DEVICE_REFUSALS) <= set(BY_NAME)
    for spec_type, by_backend in DEVICE_REFUSALS.items():
        for backend in by_backend:
            message = device_refusal(spec_type, (backend,))
            assert message is not None and "\n" not in message
            assert message.startswith(f"{spec_type} is off with the target on a {backend} device: ")
            assert "-ngl 0" in message


def test_layer_input_drafters_get_a_fresh_context_instead_of_a_refusal() -> None:
    for spec_type in LAYER_INPUT_TYPES:
        assert spec_type in BY_NAME
        assert device_refusal(spec_type, ("Vulkan",)) is None
        assert needs_fresh_context((spec_type,))
    assert needs_fresh_context(("auto",))
    assert not needs_fresh_context(("draft-mtp", "ngram-mod"))
    assert not needs_fresh_context(())  # speculation off (the worker asks this of the types turned off, too)
    assert needs_fresh_context(("ngram-mod", "draft-eagle3"))  # one in a chain is enough


def test_nothing_is_refused_on_the_cpu_or_other_backends() -> None:
    for spec_type in BY_NAME:
        assert device_refusal(spec_type, ()) is None
        assert device_refusal(spec_type, ("CUDA", "Metal")) is None
    assert device_refusal("draft-mtp", ("Vulkan",)) is None


class _Target:
    """What lavapipe_refusal and auto_types read of a loaded target."""

    def __init__(self, path: Path, n_gpu_layers: int) -> None:
        self.path = path
        self.params = ModelParams(n_gpu_layers=n_gpu_layers)
        self.n_layer_nextn = 0


def _devices(description: str) -> tuple[tuple[str, ...], tuple[Device, ...]]:
    return ("Vulkan", "CPU"), (Device("Vulkan0", description, "GPU", 2 << 30, 2 << 30),)


@pytest.mark.parametrize("description", ["llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA GeForce RTX 4090"])
def test_a_layer_input_drafter_with_an_moe_target_is_refused_on_lavapipe_only(
    description: str, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_ext.speculative import factory

    monkeypatch.setattr("engine_ext.doctor.list_devices", lambda: _devices(description))
    lavapipe = description.startswith("llvmpipe")
    moe, dense = _Target(tiny_models["qwen3next"], -1), _Target(tiny_models["llama"], -1)
    for spec_type in LAYER_INPUT_TYPES:
        refusal = factory.lavapipe_refusal(spec_type, moe)  # type: ignore[arg-type]
        if lavapipe:
            assert refusal is not None and "\n" not in refusal and "-ngl 0" in refusal
            assert refusal.startswith(f"{spec_type} is off with a mixture-of-experts target on Mesa's lavapipe")
        else:
            assert refusal is None
        assert factory.lavapipe_refusal(spec_type, dense) is None  # type: ignore[arg-type]
        assert factory.lavapipe_refusal(spec_type, _Target(moe.path, 0)) is None  # type: ignore[arg-type]
    assert factory.lavapipe_refusal("draft-simple", moe) is None  # type: ignore[arg-type]
    # auto leaves the refused drafter out of its chain (and keeps it where it runs)
    params = SpeculativeParams(types=("auto",), draft_model=str(tiny_models["dflash"]))
    chain = factory.auto_types(params, moe)  # type: ignore[arg-type]
    assert chain == (("ngram-mod",) if lavapipe else ("ngram-mod", "draft-dflash"))
    assert factory.auto_types(params, dense) == ("ngram-mod", "draft-dflash")  # type: ignore[arg-type]
