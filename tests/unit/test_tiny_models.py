"""Fast checks of the tiny GGUF fixtures (file level only; loading is tested elsewhere)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from tests.tiny_models import (
    N_VOCAB,
    NEMOTRON_EXPERT_FF,
    NEMOTRON_EXPERT_FF_MTP,
    NEMOTRON_EXPERT_USED,
    NEMOTRON_EXPERT_USED_MTP,
    TINY_ARCH,
    TINY_CHAT_TEMPLATE,
    TINY_FILE_NAMES,
    TINY_KINDS,
    TINY_SPECIAL_TOKEN_IDS,
    write_tiny_model,
)


def _field(reader: GGUFReader, key: str) -> object:
    """Return the decoded value of one metadata key."""
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def test_write_all_produces_every_kind(tiny_models: dict[str, Path]) -> None:
    assert tuple(tiny_models) == TINY_KINDS
    assert tiny_models["qwen35_mtp_sidecar"].name == "mtp-tiny-qwen35.gguf"
    assert tiny_models["dflash"].name == "dflash-tiny-llama.gguf"
    assert tiny_models["dspark"].name == "dspark-tiny-llama.gguf"
    for kind, path in tiny_models.items():
        assert path.name == TINY_FILE_NAMES[kind]
        assert path.stat().st_size < 2 * 1024 * 1024, kind
        reader = GGUFReader(path)
        assert _field(reader, "general.architecture") == TINY_ARCH[kind], kind
        tokens = _field(reader, "tokenizer.ggml.tokens")
        assert isinstance(tokens, list) and len(tokens) == N_VOCAB
        assert _field(reader, "tokenizer.ggml.eos_token_id") == TINY_SPECIAL_TOKEN_IDS["<|im_end|>"]
        assert _field(reader, "tokenizer.ggml.mask_token_id") == TINY_SPECIAL_TOKEN_IDS["<|mask|>"]
        assert _field(reader, "tokenizer.chat_template") == TINY_CHAT_TEMPLATE


def test_kind_specific_metadata(tiny_models: dict[str, Path]) -> None:
    nem = GGUFReader(tiny_models["nemotron_h_moe"])
    assert _field(nem, "nemotron_h_moe.expert_feed_forward_length") == NEMOTRON_EXPERT_FF
    assert _field(nem, "nemotron_h_moe.expert_used_count") == NEMOTRON_EXPERT_USED
    nem_mtp = GGUFReader(tiny_models["nemotron_h_moe_mtp"])
    assert _field(nem_mtp, "nemotron_h_moe.expert_feed_forward_length") == NEMOTRON_EXPERT_FF_MTP
    assert _field(nem_mtp, "nemotron_h_moe.expert_used_count") == NEMOTRON_EXPERT_USED_MTP
    assert _field(nem_mtp, "nemotron_h_moe.nextn_predict_layers") == 1

    sidecar = GGUFReader(tiny_models["qwen35_mtp_sidecar"])
    names = {t.name for t in sidecar.tensors}
    assert not any(n.startswith("blk.0.") for n in names)
    assert "blk.4.nextn.eh_proj.weight" in names

    dspark = {t.name for t in GGUFReader(tiny_models["dspark"]).tensors}
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"} <= dspark
    assert "token_embd.weight" not in dspark and "output.weight" not in dspark


def test_deterministic_and_shared_weights(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    again = write_tiny_model("qwen35_mtp", tmp_path / "again.gguf")
    assert again.read_bytes() == tiny_models["qwen35_mtp"].read_bytes()
    reseeded = write_tiny_model("llama", tmp_path / "s1.gguf", seed=1)
    assert reseeded.read_bytes() != tiny_models["llama"].read_bytes()

    def tensors(path: Path) -> dict[str, np.ndarray]:
        return {t.name: np.array(t.data) for t in GGUFReader(path).tensors}

    mtp = tensors(tiny_models["qwen35_mtp"])
    sidecar = tensors(tiny_models["qwen35_mtp_sidecar"])
    trunk = tensors(tiny_models["qwen35"])
    for name, value in sidecar.items():
        np.testing.assert_array_equal(value, mtp[name])
    for name, value in trunk.items():
        np.testing.assert_array_equal(value, mtp[name])
