"""The llama-ext.h functions bound by mangled name, on tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_ext import bindings
from engine_ext.bindings import ExtensionUnavailable, _ExtFunction
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams
from tests.tiny_models import DRAFT_TARGET_LAYERS, N_EMBD


def test_installed_library_exports_every_ext_function() -> None:
    assert bindings.missing_ext_functions() == []


def test_missing_symbol_gives_a_clear_error() -> None:
    missing = _ExtFunction("llama_imaginary", ("_Z15llama_imaginaryv",), [], None)
    assert not missing.available
    with pytest.raises(ExtensionUnavailable, match="llama_imaginary.*llama-cpp-python==0.3.36"):
        missing()


def test_target_layer_ids_of_a_dflash_draft(tiny_models: dict[str, Path]) -> None:
    draft = Model(tiny_models["dflash"])
    try:
        assert bindings.target_layer_ids(draft.handle) == DRAFT_TARGET_LAYERS
        assert bindings.model_dflash_selector_top_k(draft.handle) == 0  # DFlash, not DFlash2
    finally:
        draft.close()
    plain = Model(tiny_models["llama"])
    try:
        assert bindings.target_layer_ids(plain.handle) == []
    finally:
        plain.close()


def test_layer_input_embeddings_are_readable(tiny_models: dict[str, Path]) -> None:
    model = Model(tiny_models["llama"])
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2))
    try:
        bindings.set_embeddings_layer_inp(ctx.handle, 1, True)
        tokens = model.tokenize("hello world", add_special=False, parse_special=False)
        ctx.decode(tokens, 0)
        ptr = bindings.get_embeddings_layer_inp(ctx.handle, 1)
        assert ptr
        rows = np.ctypeslib.as_array(ptr, shape=(len(tokens), N_EMBD))
        assert np.isfinite(rows).all() and np.abs(rows).sum() > 0
    finally:
        ctx.close()
        model.close()
