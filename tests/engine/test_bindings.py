"""The llama-ext.h functions bound by mangled name, on tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_ext import bindings
from engine_ext.bindings import C, ExtensionUnavailable, _ExtFunction
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


def test_context_params_layout_matches_llama_h() -> None:
    # llama.h: n_ctx n_batch n_ubatch n_seq_max n_rs_seq n_outputs_max n_outputs_max_per_seq (uint32) n_threads...
    fields = [name for name, *_ in C.llama_context_params._fields_]
    assert fields[:9] == [
        "n_ctx",
        "n_batch",
        "n_ubatch",
        "n_seq_max",
        "n_rs_seq",
        "n_outputs_max",
        "n_outputs_max_per_seq",
        "n_threads",
        "n_threads_batch",
    ]
    assert fields[-3:] == ["samplers", "n_samplers", "ctx_other"]
    assert C.llama_context_params.n_outputs_max_per_seq.offset == 24


def test_backend_greedy_sampling_gives_the_argmax_of_every_row(tiny_models: dict[str, Path]) -> None:
    model = Model(tiny_models["llama"])
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2))
    try:
        tokens = model.tokenize("one two three four five six", add_special=False, parse_special=False)
        ctx.decode(tokens, 0, logits_last=False, logits_all=True)
        logits = np.ctypeslib.as_array(C.llama_get_logits(ctx.handle), shape=(len(tokens), model.n_vocab)).copy()
        assert not ctx.backend_greedy
        assert ctx.set_backend_greedy(True) and ctx.backend_greedy
        assert ctx.set_backend_greedy(True)  # already attached: nothing changes
        ctx.truncate(0)
        ctx.decode(tokens, 0, logits_last=False, logits_all=True)
        sampled = [ctx.sampled_token(i) for i in range(len(tokens))]
        assert sampled == logits.argmax(axis=1).tolist()
        assert ctx.sampled_token(-1) == sampled[-1]
        # Detached, decoding gives logits again (and no sampled tokens).
        assert not ctx.set_backend_greedy(False) and not ctx.backend_greedy
        ctx.truncate(0)
        ctx.decode(tokens, 0, logits_last=False, logits_all=True)
        again = np.ctypeslib.as_array(C.llama_get_logits(ctx.handle), shape=(len(tokens), model.n_vocab))
        assert np.array_equal(again, logits)
        assert ctx.set_backend_greedy(True)  # a fresh chain attaches again
    finally:
        ctx.close()  # frees the attached chain after the context
        model.close()
