"""Speculative types refused with the target on a device where they crashed the engine (issue 24)."""

from __future__ import annotations

from engine_ext.speculative.catalog import (
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
