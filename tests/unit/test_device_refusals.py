"""Speculative types refused with the target on a device where they crashed the engine (issue 24)."""

from __future__ import annotations

from engine_ext.speculative.catalog import BY_NAME, DEVICE_REFUSALS, device_refusal


def test_refusals_name_real_types_and_say_why_in_one_line() -> None:
    assert set(DEVICE_REFUSALS) <= set(BY_NAME)
    for spec_type in ("draft-dflash", "draft-dspark", "draft-eagle3"):
        message = device_refusal(spec_type, ("Vulkan",))
        assert message is not None and "\n" not in message
        assert message.startswith(f"{spec_type} is off with the target on a Vulkan device: the engine crashes")
        assert "-ngl 0" in message


def test_nothing_is_refused_on_the_cpu_or_other_backends() -> None:
    for spec_type in BY_NAME:
        assert device_refusal(spec_type, ()) is None
        assert device_refusal(spec_type, ("CUDA", "Metal")) is None
    assert device_refusal("draft-mtp", ("Vulkan",)) is None
