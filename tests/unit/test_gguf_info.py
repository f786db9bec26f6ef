"""Tests for engine_ext.gguf: header validation, inspection, memory estimates, descriptions."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from engine_ext.gguf import (
    GGUFError,
    GGUFInfo,
    GGUFValidationError,
    describe,
    estimate_memory,
    inspect_gguf,
    layout_string,
    read_chat_template,
    validate_gguf,
)
from tests import tiny_models as tm

KVWriter = Callable[[GGUFWriter], None]

N_EMBD = 32
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 64
VOCAB = [f"t{i}" for i in range(40)]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------


def _f32(*shape: int) -> np.ndarray[Any, Any]:
    """A numpy array for a tensor with ggml shape ``shape`` (numpy order is reversed)."""
    return np.zeros(tuple(reversed(shape)), dtype=np.float32)


def write_gguf(
    path: Path,
    arch: str,
    kv: KVWriter,
    tensors: dict[str, np.ndarray[Any, Any]],
    *,
    tokenizer: bool = True,
    raw_types: dict[str, GGMLQuantizationType] | None = None,
    **writer_args: Any,
) -> Path:
    """Write a GGUF with ``kv`` metadata, an optional tiny tokenizer, and ``tensors``."""
    w = GGUFWriter(path, arch, **writer_args)
    kv(w)
    if tokenizer:
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_array("tokenizer.ggml.tokens", VOCAB)
        w.add_uint32("tokenizer.ggml.bos_token_id", 1)
        w.add_uint32("tokenizer.ggml.eos_token_id", 2)
        w.add_string("tokenizer.chat_template", TEMPLATE)
    for name, value in tensors.items():
        raw = (raw_types or {}).get(name)
        w.add_tensor(name, value, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _base_kv(w: GGUFWriter, arch: str, block_count: int, **per_layer: int | list[int]) -> None:
    w.add_string("general.name", f"test-{arch}")
    w.add_uint32(f"{arch}.context_length", 2048)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", block_count)
    values: dict[str, int | list[int]] = {
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
    }
    values.update({k.replace("__", "."): v for k, v in per_layer.items()})
    for key, value in values.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)


def _attention_tensors(t: dict[str, np.ndarray[Any, Any]], p: str) -> None:
    t[f"{p}.attn_norm.weight"] = _f32(N_EMBD)
    t[f"{p}.attn_q.weight"] = _f32(N_EMBD, N_EMBD)
    t[f"{p}.attn_k.weight"] = _f32(N_EMBD, HEAD_DIM * N_HEAD_KV)
    t[f"{p}.attn_v.weight"] = _f32(N_EMBD, HEAD_DIM * N_HEAD_KV)
    t[f"{p}.attn_output.weight"] = _f32(N_EMBD, N_EMBD)


def write_llama(path: Path, *, n_layer: int = 2, file_type: int | None = 1, **writer_args: Any) -> Path:
    """A llama-like file: F16 matrices, F32 norms, general.file_type=1 (F16)."""
    t: dict[str, np.ndarray[Any, Any]] = {
        "token_embd.weight": _f32(N_EMBD, len(VOCAB)).astype(np.float16),
        "output_norm.weight": _f32(N_EMBD),
    }
    for i in range(n_layer):
        p = f"blk.{i}"
        _attention_tensors(t, p)
        t[f"{p}.attn_q.weight"] = t[f"{p}.attn_q.weight"].astype(np.float16)
        t[f"{p}.ffn_norm.weight"] = _f32(N_EMBD)
        t[f"{p}.ffn_up.weight"] = _f32(N_EMBD, N_FF).astype(np.float16)
        t[f"{p}.ffn_gate.weight"] = _f32(N_EMBD, N_FF).astype(np.float16)
        t[f"{p}.ffn_down.weight"] = _f32(N_FF, N_EMBD).astype(np.float16)

    def kv(w: GGUFWriter) -> None:
        _base_kv(w, "llama", n_layer)
        if file_type is not None:
            w.add_uint32("general.file_type", file_type)
        w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        w.add_float32("general.sampling.temp", 0.6)

    return write_gguf(path, "llama", kv, t, **writer_args)


NEMO_FF_EXP = [0, 0, 32, 0, 48]
NEMO_USED = [2, 0, 2, 0, 3]
NEMO_KINDS = ["A", "M", "E", "M", "E"]


def write_nemotron(
    path: Path,
    *,
    expert_used: list[int] | int = NEMO_USED,
    expert_ff: list[int] = NEMO_FF_EXP,
    mtp: bool = False,
) -> Path:
    """A nemotron_h_moe-like file: per-layer arrays via raw add_array; metadata plus tiny tensors."""
    arch = "nemotron_h_moe"
    kinds = [*NEMO_KINDS, "E"] if mtp else NEMO_KINDS
    t: dict[str, np.ndarray[Any, Any]] = {"token_embd.weight": _f32(N_EMBD, len(VOCAB))}
    for i, kind in enumerate(kinds):
        p = f"blk.{i}"
        t[f"{p}.attn_norm.weight"] = _f32(N_EMBD)
        if kind == "M":
            t[f"{p}.ssm_in.weight"] = _f32(N_EMBD, 8)
        elif kind == "E":
            t[f"{p}.ffn_up_exps.weight"] = _f32(N_EMBD, 32, 4)
    if mtp:
        t[f"blk.{len(kinds) - 1}.nextn.eh_proj.weight"] = _f32(2 * N_EMBD, N_EMBD)

    def kv(w: GGUFWriter) -> None:
        n_head = [N_HEAD if k == "A" else 0 for k in kinds]
        n_head_kv = [N_HEAD_KV if k == "A" else 0 for k in kinds]
        n_ff = [64 if k == "E" else 0 for k in kinds]
        if mtp:
            n_head[-1], n_head_kv[-1] = N_HEAD, N_HEAD_KV
        _base_kv(
            w,
            arch,
            len(kinds),
            feed_forward_length=n_ff,
            attention__head_count=n_head,
            attention__head_count_kv=n_head_kv,
        )
        w.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
        w.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
        w.add_uint32(f"{arch}.ssm.conv_kernel", 4)
        w.add_uint32(f"{arch}.ssm.inner_size", 128)
        w.add_uint32(f"{arch}.ssm.state_size", 16)
        w.add_uint32(f"{arch}.ssm.time_step_rank", 8)
        w.add_uint32(f"{arch}.ssm.group_count", 2)
        w.add_uint32(f"{arch}.expert_count", 4)
        if isinstance(expert_used, list):
            w.add_array(f"{arch}.expert_used_count", [*expert_used, 2] if mtp else expert_used)
        else:
            w.add_uint32(f"{arch}.expert_used_count", expert_used)
        w.add_array(f"{arch}.expert_feed_forward_length", [*expert_ff, 32] if mtp else expert_ff)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", 32)
        if mtp:
            w.add_uint32(f"{arch}.nextn_predict_layers", 1)

    return write_gguf(path, arch, kv, t)


def write_qwen35(
    path: Path,
    *,
    n_trunk: int = 8,
    sidecar: bool = False,
    recurrent_layers: list[int] | None = None,
    interval: int | None = None,
) -> Path:
    """A qwen35-like hybrid (GDN + attention), optionally an mtp- sidecar (no trunk tensors)."""
    arch = "qwen35"
    n_mtp = 1 if sidecar else 0
    t: dict[str, np.ndarray[Any, Any]] = {"token_embd.weight": _f32(N_EMBD, len(VOCAB))}
    if not sidecar:
        for i in range(n_trunk):
            t[f"blk.{i}.attn_norm.weight"] = _f32(N_EMBD)
    else:
        p = f"blk.{n_trunk}"
        _attention_tensors(t, p)
        t[f"{p}.nextn.eh_proj.weight"] = _f32(2 * N_EMBD, N_EMBD)
        t[f"{p}.nextn.enorm.weight"] = _f32(N_EMBD)

    def kv(w: GGUFWriter) -> None:
        _base_kv(w, arch, n_trunk + n_mtp)
        w.add_uint32(f"{arch}.ssm.conv_kernel", 4)
        w.add_uint32(f"{arch}.ssm.state_size", 16)  # S
        w.add_uint32(f"{arch}.ssm.group_count", 2)  # Hk
        w.add_uint32(f"{arch}.ssm.time_step_rank", 4)  # Hv
        w.add_uint32(f"{arch}.ssm.inner_size", 16 * 4)  # S * Hv
        if interval is not None:
            w.add_uint32(f"{arch}.full_attention_interval", interval)
        if recurrent_layers is not None:
            w.add_array(f"{arch}.attention.recurrent_layers", recurrent_layers)
        if sidecar:
            w.add_uint32(f"{arch}.nextn_predict_layers", 1)

    return write_gguf(path, arch, kv, t)


def write_dflash(path: Path, *, dspark: bool = False, dflash2: bool = False, anchor: bool | None = None) -> Path:
    """A dflash-like draft: target_layers, block_size, mask token; DSpark adds markov_w1."""
    arch = "dflash"
    t: dict[str, np.ndarray[Any, Any]] = {"fc.weight": _f32(2 * N_EMBD, N_EMBD)}
    for i in range(2):
        _attention_tensors(t, f"blk.{i}")
    if dspark:
        t["markov_w1.weight"] = _f32(8, len(VOCAB))
        t["markov_w2.weight"] = _f32(8, len(VOCAB))
    if dflash2:
        t["selector_hidden.weight"] = _f32(N_EMBD, 8)

    def kv(w: GGUFWriter) -> None:
        _base_kv(w, arch, 2)
        w.add_array(f"{arch}.target_layers", [1, 3])
        w.add_uint32(f"{arch}.block_size", 8)
        w.add_uint32("tokenizer.ggml.mask_token_id", 39)
        if anchor is not None:
            w.add_bool(f"{arch}.sample_from_anchor", anchor)
        if dspark:
            w.add_bool(f"{arch}.has_confidence_head", True)
        if dflash2:
            w.add_uint32(f"{arch}.selector_top_k", 4)
            w.add_uint32(f"{arch}.selector_rank", 8)

    return write_gguf(path, arch, kv, t)


# ---------------------------------------------------------------------------
# Byte-level helpers for crafting broken files
# ---------------------------------------------------------------------------


def _tensor_info_pos(data: bytes, name: str) -> int:
    """Offset of tensor ``name``'s info record (its length-prefixed name) in the header."""
    needle = struct.pack("<Q", len(name)) + name.encode()
    pos = data.rfind(needle)
    assert pos > 0, name
    return pos


def _tensor_field_pos(data: bytes, name: str, which: str) -> int:
    pos = _tensor_info_pos(data, name) + 8 + len(name)
    n_dims = int(struct.unpack_from("<I", data, pos)[0])
    return {"n_dims": pos, "dim0": pos + 4, "type": pos + 4 + 8 * n_dims, "offset": pos + 8 + 8 * n_dims}[which]


def _tensor_offset(data: bytes, name: str) -> int:
    (offset,) = struct.unpack_from("<Q", data, _tensor_field_pos(data, name, "offset"))
    return int(offset)


def _patch(path: Path, pos: int, fmt: str, value: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, pos, value)
    path.write_bytes(bytes(data))


def _kv_pos(data: bytes, key: str) -> int:
    """Offset of the value-type field that follows metadata key ``key``."""
    needle = struct.pack("<Q", len(key)) + key.encode()
    pos = data.find(needle)
    assert pos > 0, key
    return pos + len(needle)


def _data_end(path: Path) -> int:
    """End of the last tensor's bytes (before trailing padding)."""
    reader = GGUFReader(path)
    return int(max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors))


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    return write_llama(tmp_path / "llama.gguf")


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def test_valid_file_passes_and_matches_gguf_reader(llama: Path) -> None:
    validate_gguf(llama)
    info = inspect_gguf(llama)
    reader = GGUFReader(llama)
    assert info.n_tensors == len(reader.tensors)
    assert info.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert info.weights_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert info.n_kv == len([k for k in reader.fields if not k.startswith("GGUF.")])


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GGUFValidationError, match=r"empty\.gguf: the file is empty \(0 bytes\); .*re-download"):
        validate_gguf(path)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"hello, this is a text file\n", "not a GGUF file but text"),
        (b"<!DOCTYPE html><html>Not Found</html>", "error page"),
        (b'{"error": "Repository not found"}', "not a GGUF file but text"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n", "Git LFS pointer"),
        (b"GGML" + bytes(60), r"starts with b'GGML' instead of b'GGUF'"),
        (b"PK\x03\x04" + bytes(100), "instead of b'GGUF'"),
        (b"GG", "truncated header"),
        (b"GGUF\x03\x00", "truncated header"),
    ],
)
def test_not_gguf(tmp_path: Path, content: bytes, pattern: str) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFValidationError, match=pattern):
        validate_gguf(path)


def test_garbage_bytes(tmp_path: Path) -> None:
    rng = random.Random(1)
    for i in range(20):
        path = tmp_path / f"garbage{i}.gguf"
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096))))
        with pytest.raises(GGUFValidationError):
            validate_gguf(path)


def test_garbage_after_magic(tmp_path: Path) -> None:
    rng = random.Random(2)
    for i in range(50):
        path = tmp_path / f"g{i}.gguf"
        version = struct.pack("<I", rng.choice([2, 3]))
        path.write_bytes(b"GGUF" + version + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 2048))))
        with pytest.raises(GGUFValidationError):
            validate_gguf(path)


@pytest.mark.parametrize(
    ("version", "pattern"),
    [
        (0, "version is 0"),
        (1, "version 1 is no longer supported"),
        (4, "version 4 is newer"),
        (0x03000000, "big-endian"),
    ],
)
def test_bad_version(llama: Path, version: int, pattern: str) -> None:
    _patch(llama, 4, "<I", version)
    with pytest.raises(GGUFValidationError, match=pattern):
        validate_gguf(llama)


def test_version_2_accepted(llama: Path) -> None:
    _patch(llama, 4, "<I", 2)
    validate_gguf(llama)
    assert inspect_gguf(llama).gguf_version == 2


def test_every_truncation_is_a_validation_error(llama: Path, tmp_path: Path) -> None:
    data = llama.read_bytes()
    end = _data_end(llama)
    cut_path = tmp_path / "cut.gguf"
    for cut in [*range(1, 200), *range(200, end, 97), end - 1]:
        cut_path.write_bytes(data[:cut])
        with pytest.raises(GGUFValidationError) as err:
            validate_gguf(cut_path)
        assert "truncated" in str(err.value) or "claims" in str(err.value), (cut, str(err.value))


def test_truncated_header_message(llama: Path, tmp_path: Path) -> None:
    path = tmp_path / "head.gguf"
    path.write_bytes(llama.read_bytes()[:100])
    with pytest.raises(GGUFValidationError, match=r"head\.gguf: .*only 100 bytes.*re-download"):
        validate_gguf(path)


def test_truncated_tensor_data_message(llama: Path, tmp_path: Path) -> None:
    data = llama.read_bytes()
    end = _data_end(llama)
    path = tmp_path / "chopped.gguf"
    path.write_bytes(data[: end - 10])
    with pytest.raises(
        GGUFValidationError,
        match=rf"truncated: tensor '[^']+' needs bytes up to {end} but the file has {end - 10}.*re-download",
    ):
        validate_gguf(path)
    # a whole tensor section gone: the first missing tensor is named and the count given
    reader = GGUFReader(llama)
    start = min(int(t.data_offset) for t in reader.tensors)
    path.write_bytes(data[: start + 4])
    with pytest.raises(GGUFValidationError, match=r"truncated: tensor .* tensors affected"):
        inspect_gguf(path)


def test_trailing_padding_may_be_missing(llama: Path, tmp_path: Path) -> None:
    path = tmp_path / "nopad.gguf"
    path.write_bytes(llama.read_bytes()[: _data_end(llama)])
    validate_gguf(path)


def test_misaligned_offset(llama: Path) -> None:
    data = llama.read_bytes()
    pos = _tensor_field_pos(data, "output_norm.weight", "offset")
    _patch(llama, pos, "<Q", _tensor_offset(data, "output_norm.weight") + 4)
    with pytest.raises(GGUFValidationError, match="'output_norm.weight' data offset .* not a multiple of .* 32"):
        validate_gguf(llama)


def test_overlapping_tensors(llama: Path) -> None:
    data = llama.read_bytes()
    first = _tensor_offset(data, "token_embd.weight")
    _patch(llama, _tensor_field_pos(data, "output_norm.weight", "offset"), "<Q", first)
    with pytest.raises(GGUFValidationError, match="overlap"):
        validate_gguf(llama)


def test_out_of_order_offsets(llama: Path) -> None:
    # swap two same-sized tensors: aligned, in range, no overlap, but not in header order as llama.cpp requires
    data = llama.read_bytes()
    a, b = "blk.0.attn_norm.weight", "blk.1.attn_norm.weight"
    off_a, off_b = _tensor_offset(data, a), _tensor_offset(data, b)
    _patch(llama, _tensor_field_pos(data, a, "offset"), "<Q", off_b)
    _patch(llama, _tensor_field_pos(data, b, "offset"), "<Q", off_a)
    with pytest.raises(GGUFValidationError, match="llama.cpp expects .* header order"):
        validate_gguf(llama)


def test_offset_far_past_end(llama: Path) -> None:
    data = llama.read_bytes()
    _patch(llama, _tensor_field_pos(data, "output_norm.weight", "offset"), "<Q", 1 << 50)
    with pytest.raises(GGUFValidationError, match="'output_norm.weight' needs bytes up to"):
        validate_gguf(llama)


@pytest.mark.parametrize(
    ("pos", "fmt", "value", "pattern"),
    [
        (8, "<Q", 1 << 40, r"claims 1099511627776 tensors \(at most 1000000"),
        (8, "<Q", 10**6, r"truncated header: it declares 1000000 tensors, which need at least 32000000"),
        (16, "<Q", 1 << 62, r"claims \d+ metadata entries"),
        (16, "<Q", 5000, r"truncated header: it declares 5000 metadata entries"),
        (24, "<Q", 1 << 40, "claims a length of"),
    ],
)
def test_absurd_counts(llama: Path, pos: int, fmt: str, value: int, pattern: str) -> None:
    _patch(llama, pos, fmt, value)
    with pytest.raises(GGUFValidationError, match=pattern):
        validate_gguf(llama)


def test_absurd_array_length(llama: Path) -> None:
    data = llama.read_bytes()
    pos = _kv_pos(data, "tokenizer.ggml.tokens")  # type (u32 array), element type (u32), count (u64)
    _patch(llama, pos + 8, "<Q", 1 << 33)
    with pytest.raises(GGUFValidationError, match="'tokenizer.ggml.tokens' claims 8589934592 elements"):
        validate_gguf(llama)


def test_absurd_string_in_array(llama: Path) -> None:
    data = llama.read_bytes()
    pos = _kv_pos(data, "tokenizer.ggml.tokens") + 16  # first element's length
    _patch(llama, pos, "<Q", 1 << 35)
    with pytest.raises(GGUFValidationError, match="element 0 of 'tokenizer.ggml.tokens' claims a length"):
        validate_gguf(llama)


def test_unknown_value_type(llama: Path) -> None:
    pos = _kv_pos(llama.read_bytes(), "general.name")
    _patch(llama, pos, "<I", 99)
    with pytest.raises(GGUFValidationError, match="'general.name' has unknown value type 99"):
        validate_gguf(llama)


def test_array_of_arrays_rejected(llama: Path) -> None:
    pos = _kv_pos(llama.read_bytes(), "tokenizer.ggml.tokens")
    _patch(llama, pos + 4, "<I", 9)
    with pytest.raises(GGUFValidationError, match="array of arrays"):
        validate_gguf(llama)


@pytest.mark.parametrize(
    ("which", "value", "pattern"),
    [
        ("type", 31, "unknown ggml type 31"),
        ("type", 1000, "unknown ggml type 1000"),
        ("n_dims", 5, "has 5 dimensions"),
        ("n_dims", 0, "has 0 dimensions"),
        ("dim0", 0, "dimension 0 is 0"),
        ("dim0", (1 << 64) - 1, "dimension 0 is"),
    ],
)
def test_bad_tensor_info(llama: Path, which: str, value: int, pattern: str) -> None:
    pos = _tensor_field_pos(llama.read_bytes(), "output_norm.weight", which)
    _patch(llama, pos, "<Q" if which == "dim0" else "<I", value)
    with pytest.raises(GGUFValidationError, match=pattern):
        validate_gguf(llama)


def test_row_not_multiple_of_block(llama: Path) -> None:
    pos = _tensor_field_pos(llama.read_bytes(), "output_norm.weight", "type")
    _patch(llama, pos, "<I", int(GGMLQuantizationType.Q4_0))  # 32 elements per row fits; shrink the row
    _patch(llama, _tensor_field_pos(llama.read_bytes(), "output_norm.weight", "dim0"), "<Q", 31)
    with pytest.raises(GGUFValidationError, match="not a multiple of the block size 32"):
        validate_gguf(llama)


def test_alignment_rules(tmp_path: Path) -> None:
    def kv_bad_value(w: GGUFWriter) -> None:
        w.add_uint32("general.alignment", 48)

    def kv_bad_type(w: GGUFWriter) -> None:
        w.add_uint64("general.alignment", 32)

    t = {"a.weight": _f32(16)}
    bad = write_gguf(tmp_path / "a48.gguf", "llama", kv_bad_value, t, tokenizer=False)
    with pytest.raises(GGUFValidationError, match="alignment 48 is not a power of two"):
        validate_gguf(bad)
    bad = write_gguf(tmp_path / "a64.gguf", "llama", kv_bad_type, t, tokenizer=False)
    with pytest.raises(GGUFValidationError, match="general.alignment must be a u32 but is a u64"):
        validate_gguf(bad)

    def kv_custom(w: GGUFWriter) -> None:
        w.add_custom_alignment(64)

    good = write_gguf(tmp_path / "c64.gguf", "llama", kv_custom, {"a.weight": _f32(3), "b.weight": _f32(5)})
    validate_gguf(good)
    assert inspect_gguf(good).alignment == 64


def test_duplicate_key_and_tensor_name(tmp_path: Path) -> None:
    def kv(w: GGUFWriter) -> None:
        w.add_uint32("x.aaaa", 1)
        w.add_uint32("x.bbbb", 2)

    path = write_gguf(tmp_path / "d.gguf", "llama", kv, {"t1.weight": _f32(8), "t2.weight": _f32(8)}, tokenizer=False)
    data = bytearray(path.read_bytes())
    pos = data.find(b"x.bbbb")
    data[pos : pos + 6] = b"x.aaaa"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFValidationError, match="'x.aaaa' appears twice"):
        validate_gguf(path)
    data[pos : pos + 6] = b"x.bbbb"
    pos = data.find(b"t2.weight")
    data[pos : pos + 9] = b"t1.weight"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFValidationError, match="tensor name 't1.weight' appears twice"):
        validate_gguf(path)


def test_random_header_corruption_never_escapes(llama: Path, tmp_path: Path) -> None:
    """Flip bytes anywhere in the header: the result validates or raises GGUFError, nothing else."""
    data = llama.read_bytes()
    header_end = min(int(t.data_offset) for t in GGUFReader(llama).tensors)
    rng = random.Random(3)
    path = tmp_path / "fuzz.gguf"
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            pos = rng.randrange(4, header_end)
            mutated[pos] = rng.randrange(256)
        path.write_bytes(bytes(mutated))
        try:
            inspect_gguf(path)
        except GGUFError:
            pass


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="no such file") as err:
        validate_gguf(tmp_path / "nope.gguf")
    assert not isinstance(err.value, GGUFValidationError)
    with pytest.raises(GGUFError, match="is a directory"):
        inspect_gguf(tmp_path)


# ---------------------------------------------------------------------------
# Inspection
# ---------------------------------------------------------------------------


def test_inspect_llama(llama: Path) -> None:
    info = inspect_gguf(llama)
    assert info.architecture == "llama"
    assert info.name == "test-llama"
    assert (info.file_type, info.file_type_label, info.file_type_guessed) == (1, "F16", False)
    assert info.context_length == 2048
    assert info.embedding_length == N_EMBD
    assert (info.block_count, info.n_layer_nextn, info.n_layer_trunk) == (2, 0, 2)
    assert (info.head_count, info.head_count_kv) == (N_HEAD, N_HEAD_KV)
    assert (info.key_length, info.value_length) == (HEAD_DIM, HEAD_DIM)  # n_embd / n_head
    assert info.layer_kinds == ("attention", "attention")
    assert info.layout == "A A"
    assert info.expert_count is None and info.expert_used_count is None
    assert info.draft_type is None and not info.is_mtp_sidecar
    assert info.vocab_size == len(VOCAB)
    assert (info.tokenizer_model, info.bos_token_id, info.eos_token_id) == ("gpt2", 1, 2)
    assert info.has_chat_template
    assert info.sampling_defaults == {"temp": pytest.approx(0.6)}
    assert info.tensor_types == {"F32": 11, "F16": 9}
    assert info.file_size == llama.stat().st_size == info.total_size
    assert info.split_count == 1 and info.split_missing == ()
    assert read_chat_template(llama) == TEMPLATE
    assert read_chat_template(llama, "tool_use") is None


def test_to_dict_is_json_safe(llama: Path) -> None:
    info = inspect_gguf(llama)
    data = json.loads(json.dumps(info.to_dict()))
    assert data["layout"] == "A A"
    assert data["draft"]["draft_type"] is None
    assert data["tensor_types"] == {"F32": 11, "F16": 9}
    assert isinstance(data["layer_kinds"], list)
    assert "chat_template" not in data  # the template stays out of the info
    est = estimate_memory(info, 1024)
    assert json.loads(json.dumps(est.to_dict()))["total_bytes"] == est.total_bytes


def test_guessed_file_type_from_tensor_types(tmp_path: Path) -> None:
    # three Q8_0 matrices (32-element blocks of 34 bytes) and two F32 norms, no general.file_type
    q8 = np.zeros((4, 34), dtype=np.uint8)
    tensors = {f"blk.{i}.w.weight": q8 for i in range(3)} | {"n1.weight": _f32(8), "n2.weight": _f32(8)}
    raw = {f"blk.{i}.w.weight": GGMLQuantizationType.Q8_0 for i in range(3)}

    def kv(w: GGUFWriter) -> None:
        w.add_uint32("llama.block_count", 3)

    path = write_gguf(tmp_path / "q8.gguf", "llama", kv, tensors, raw_types=raw, tokenizer=False)
    info = inspect_gguf(path)
    assert (info.file_type, info.file_type_label, info.file_type_guessed) == (7, "(guessed) Q8_0", True)
    assert info.tensor_types == {"Q8_0": 3, "F32": 2}
    assert info.n_params == 3 * 4 * 32 + 2 * 8
    assert info.weights_bytes == 3 * 4 * 34 + 2 * 8 * 4


@pytest.mark.parametrize(
    ("ftype", "label"), [(15, "Q4_K - Medium"), (3, "Q4_1"), (1024 | 7, "(guessed) Q8_0"), (77, "unknown")]
)
def test_file_type_labels(tmp_path: Path, ftype: int, label: str) -> None:
    info = inspect_gguf(write_llama(tmp_path / "f.gguf", file_type=ftype))
    assert info.file_type == ftype
    assert info.file_type_label.startswith(label)


def test_inspect_nemotron_per_layer_arrays(tmp_path: Path) -> None:
    info = inspect_gguf(write_nemotron(tmp_path / "nemo.gguf"))
    assert info.architecture == "nemotron_h_moe"
    assert info.expert_used_count == (2, 0, 2, 0, 3)
    assert info.expert_feed_forward_length == (0, 0, 32, 0, 48)
    assert info.expert_count == 4
    assert info.layer_kinds == ("attention", "recurrent", "moe", "recurrent", "moe")
    assert info.layout == "A M E M E"
    assert info.moe_variant == "Puzzle (heterogeneous expert_used_count)"
    assert info.recurrent_type == "mamba2"
    assert info.head_count_kv == (N_HEAD_KV, 0, 0, 0, 0)
    assert info.draft_type is None and info.n_layer_nextn == 0
    assert info.warnings == ()
    text = "\n".join(describe(info))
    assert "expert_used_count [2, 0, 2, 0, 3]" in text
    assert "expert_feed_forward_length [0, 0, 32, 0, 48]" in text
    assert "A M E M E" in text and "Puzzle" in text


def test_nemotron_uniform_variant(tmp_path: Path) -> None:
    info = inspect_gguf(write_nemotron(tmp_path / "nemo.gguf", expert_used=2))
    assert info.expert_used_count == 2
    assert info.moe_variant == "uniform expert_used_count"


def test_nemotron_with_mtp(tmp_path: Path) -> None:
    info = inspect_gguf(write_nemotron(tmp_path / "nemo-mtp.gguf", mtp=True))
    assert (info.block_count, info.n_layer_nextn, info.n_layer_trunk) == (6, 1, 5)
    assert info.layer_kinds[-1] == "nextn"
    assert info.layout == "A M E M E + 1 MTP"
    assert info.expert_used_count == (2, 0, 2, 0, 3, 2)
    assert info.draft_type == "draft-mtp"
    assert not info.is_mtp_sidecar
    assert any("MTP" in line and "in-model" in line for line in describe(info))


def test_nemotron_mtp_pitfall_warning(tmp_path: Path) -> None:
    info = inspect_gguf(write_nemotron(tmp_path / "n.gguf", expert_used=[0, 0, 2, 0, 3], mtp=True))
    assert any("SIGFPE" in w for w in info.warnings)


def test_wrong_array_length_refused(tmp_path: Path) -> None:
    with pytest.raises(GGUFValidationError, match="expert_used_count has 4 entries but block_count is 5"):
        inspect_gguf(write_nemotron(tmp_path / "n.gguf", expert_used=[2, 0, 2, 0]))


def test_qwen35_layout_default_interval(tmp_path: Path) -> None:
    info = inspect_gguf(write_qwen35(tmp_path / "q.gguf"))
    assert info.layer_kinds == ("recurrent",) * 3 + ("attention",) + ("recurrent",) * 3 + ("attention",)
    assert info.layout == "M M M A M M M A"
    assert info.recurrent_type == "gated delta net"
    info = inspect_gguf(write_qwen35(tmp_path / "q2.gguf", interval=2))
    assert info.layout == "M A M A M A M A"
    flags = [1, 0, 0, 1, 1, 1, 1, 0]
    info = inspect_gguf(write_qwen35(tmp_path / "q3.gguf", recurrent_layers=flags))
    assert info.layout == "M A A M M M M A"


def test_mtp_sidecar(tmp_path: Path) -> None:
    info = inspect_gguf(write_qwen35(tmp_path / "mtp-q.gguf", n_trunk=4, sidecar=True))
    assert info.is_mtp_sidecar
    assert info.n_layer_nextn == 1 and info.block_count == 5
    assert info.draft_type == "draft-mtp"
    assert info.layout == "M M M A + 1 MTP"
    assert any("sidecar" in line for line in describe(info))
    est = estimate_memory(info, 1024)
    assert (est.n_kv_layers, est.n_recurrent_layers, est.recurrent_bytes) == (1, 0, 0)
    assert est.kv_bytes == 1024 * N_HEAD_KV * 2 * HEAD_DIM * 2


def test_dflash_draft(tmp_path: Path) -> None:
    info = inspect_gguf(write_dflash(tmp_path / "dflash.gguf"))
    d = info.draft
    assert d.draft_type == "dflash"
    assert d.target_layers == (1, 3)
    assert d.block_size == 8
    assert d.mask_token_id == 39
    assert d.sample_from_anchor is None and d.has_confidence_head is None
    assert info.warnings == ()
    line = next(line for line in describe(info) if line.startswith("Draft"))
    assert "target_layers [1, 3]" in line and "block_size 8" in line and "mask_token_id 39" in line


def test_dflash2_and_dspark(tmp_path: Path) -> None:
    info = inspect_gguf(write_dflash(tmp_path / "dflash2.gguf", dflash2=True))
    assert info.draft_type == "dflash2"
    assert info.draft.selector_top_k == 4
    info = inspect_gguf(write_dflash(tmp_path / "dspark.gguf", dspark=True, anchor=False))
    assert info.draft_type == "dspark"
    assert info.draft.sample_from_anchor is False
    assert info.draft.has_confidence_head is True


def test_eagle3(tmp_path: Path) -> None:
    def kv(w: GGUFWriter) -> None:
        _base_kv(w, "eagle3", 1)
        w.add_array("eagle3.target_layers", [2, 10, 20])
        w.add_uint32("eagle3.target_hidden_size", 4096)

    info = inspect_gguf(write_gguf(tmp_path / "eagle3.gguf", "eagle3", kv, {"fc.weight": _f32(96, 32)}))
    assert info.draft_type == "eagle3"
    assert info.draft.target_layers == (2, 10, 20)
    assert info.draft.target_hidden_size == 4096


def test_split_model(tmp_path: Path) -> None:
    single = write_llama(tmp_path / "one.gguf")
    write_llama(tmp_path / "model.gguf", split_max_tensors=8)
    shards = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert [s.name for s in shards] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for shard in shards:
        validate_gguf(shard)
    whole = inspect_gguf(single)
    info = inspect_gguf(shards[0])
    assert info.split_count == 3
    assert info.split_missing == ()
    assert info.n_tensors == whole.n_tensors
    assert info.n_params == whole.n_params
    assert info.weights_bytes == whole.weights_bytes
    assert info.total_size == sum(s.stat().st_size for s in shards)
    assert info.architecture == "llama" and info.block_count == 2
    assert info.warnings == ()
    # any shard leads to the same description
    assert inspect_gguf(shards[1]).path == str(shards[0])
    # a missing shard is reported, not fatal
    shards[2].unlink()
    info = inspect_gguf(shards[0])
    assert info.split_missing == (str(shards[2]),)
    assert any("1 of 3 shards are missing" in w for w in info.warnings)
    assert any("missing" in line for line in describe(info))
    # a later shard without the first one
    shards[0].unlink()
    with pytest.raises(GGUFError, match="shard 2 of 3 .* first shard"):
        inspect_gguf(shards[1])


def test_first_shard_with_wrong_split_no(tmp_path: Path) -> None:
    write_llama(tmp_path / "m.gguf", split_max_tensors=10)
    first = sorted(tmp_path.glob("m-*-of-*.gguf"))[0]
    _patch(first, _kv_pos(first.read_bytes(), "split.no") + 4, "<H", 1)
    with pytest.raises(GGUFValidationError, match="says this is shard 2 of 2, but its name says it is the first"):
        inspect_gguf(first)


def test_corrupt_shard_is_reported(tmp_path: Path) -> None:
    write_llama(tmp_path / "m.gguf", split_max_tensors=10)
    shards = sorted(tmp_path.glob("m-*-of-*.gguf"))
    shards[1].write_bytes(shards[1].read_bytes()[:200])
    with pytest.raises(GGUFValidationError, match=shards[1].name):
        inspect_gguf(shards[0])


def test_large_arrays_are_counted_not_kept(tmp_path: Path) -> None:
    tokens = [f"tok{i}" for i in range(20_000)]

    def kv(w: GGUFWriter) -> None:
        w.add_uint32("llama.block_count", 1)
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.scores", [0.0] * len(tokens))

    info = inspect_gguf(write_gguf(tmp_path / "v.gguf", "llama", kv, {"a.weight": _f32(8)}, tokenizer=False))
    assert info.vocab_size == 20_000
    assert not info.has_chat_template


# ---------------------------------------------------------------------------
# Layout strings
# ---------------------------------------------------------------------------


def test_layout_string_folding() -> None:
    assert layout_string(["attention", "recurrent", "moe", "nextn"]) == "A M E + 1 MTP"
    assert layout_string(["recurrent", "recurrent", "recurrent", "attention"] * 12) == "(M M M A)×12"
    assert layout_string(["attention"] * 32) == "A×32"
    assert layout_string(["attention+moe"] * 3) == "AE AE AE"
    odd = ["recurrent"] * 10 + ["attention"] + ["moe"] * 9
    assert layout_string(odd) == "M×10 A E×9"
    assert layout_string([]) == ""


# ---------------------------------------------------------------------------
# Memory estimates
# ---------------------------------------------------------------------------


def test_estimate_llama_kv(llama: Path) -> None:
    info = inspect_gguf(llama)
    est = estimate_memory(info, 4096)
    assert est.n_ctx_cells == 4096
    assert est.kv_bytes == 2 * 4096 * N_HEAD_KV * (HEAD_DIM + HEAD_DIM) * 2
    assert est.recurrent_bytes == 0
    assert est.weights_bytes == info.weights_bytes
    assert est.total_bytes == est.weights_bytes + est.kv_bytes + est.compute_bytes
    assert est.n_kv_layers == 2
    # padded to 256 cells, quantized cache, flash attention
    est = estimate_memory(info, 1000, kv_type_bytes=1.0, flash_attn=True)
    assert est.n_ctx_cells == 1024
    assert est.kv_bytes == 2 * 1024 * N_HEAD_KV * (2 * HEAD_DIM) * 1
    assert est.compute_bytes < estimate_memory(info, 1000, kv_type_bytes=1.0).compute_bytes
    with pytest.raises(ValueError):
        estimate_memory(info, 0)


def test_estimate_nemotron_hybrid(tmp_path: Path) -> None:
    info = inspect_gguf(write_nemotron(tmp_path / "nemo.gguf", mtp=True))
    est = estimate_memory(info, 2048)
    # KV: only trunk layer 0 is attention (the MTP block is not in the main context's cache)
    assert est.n_kv_layers == 1
    assert est.kv_bytes == 2048 * N_HEAD_KV * 2 * HEAD_DIM * 2
    # mamba2 per layer: conv (d_conv-1)*(d_inner + 2*G*N) + state N*d_inner floats
    per_layer = (3 * (128 + 2 * 2 * 16) + 16 * 128) * 4
    assert est.n_recurrent_layers == 2
    assert est.recurrent_bytes == 2 * per_layer
    assert estimate_memory(info, 2048, n_seq=2, n_rs_seq=3).recurrent_bytes == 2 * per_layer * 2 * 4


def test_estimate_qwen35_gdn(tmp_path: Path) -> None:
    info = inspect_gguf(write_qwen35(tmp_path / "q.gguf"))
    est = estimate_memory(info, 512)
    s, hk, hv, d_conv = 16, 2, 4, 4
    kd, vd = s * hk, s * hv
    per_layer = (s * s * hv + (d_conv - 1) * (2 * kd + vd)) * 4
    assert est.n_recurrent_layers == 6
    assert est.recurrent_bytes == 6 * per_layer
    assert est.n_kv_layers == 2
    assert est.kv_bytes == 2 * 512 * N_HEAD_KV * 2 * HEAD_DIM * 2


def test_estimate_sliding_window_and_mla(tmp_path: Path) -> None:
    def gemma2(w: GGUFWriter) -> None:
        _base_kv(w, "gemma2", 4)
        w.add_uint32("gemma2.attention.sliding_window", 1024)

    info = inspect_gguf(write_gguf(tmp_path / "g.gguf", "gemma2", gemma2, {"a.weight": _f32(8)}))
    assert info.swa_layers == (True, False, True, False)
    est = estimate_memory(info, 32768)
    per_cell = N_HEAD_KV * 2 * HEAD_DIM * 2
    assert est.kv_bytes == 2 * 32768 * per_cell + 2 * 1536 * per_cell  # pad256(1024 + 512)

    def deepseek(w: GGUFWriter) -> None:
        _base_kv(w, "deepseek2", 2, attention__head_count_kv=1)
        w.add_uint32("deepseek2.attention.key_length", 576)
        w.add_uint32("deepseek2.attention.value_length", 512)
        w.add_uint32("deepseek2.attention.key_length_mla", 192)
        w.add_uint32("deepseek2.attention.value_length_mla", 128)

    info = inspect_gguf(write_gguf(tmp_path / "d.gguf", "deepseek2", deepseek, {"a.weight": _f32(8)}))
    assert info.is_mla
    assert estimate_memory(info, 1024).kv_bytes == 2 * 1024 * 576 * 2  # K only


def test_describe_with_memory(llama: Path) -> None:
    info = inspect_gguf(llama)
    lines = describe(info, estimate_memory(info, 2048))
    text = "\n".join(lines)
    assert all(isinstance(line, str) for line in lines)
    for fragment in ("llama", "F16", "2048 tokens", "A A", "Chat tmpl   yes", "at 2048 ctx", "KV 256.00 KiB"):
        assert fragment in text, fragment


# ---------------------------------------------------------------------------
# Layering
# ---------------------------------------------------------------------------


def test_module_imports_no_ui_or_llama_cpp() -> None:
    code = (
        "import sys, engine_ext.gguf; "
        "bad = [m for m in ('llama_cpp', 'textual', 'rich') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------
# The shared tiny models (tests/tiny_models.py)
# ---------------------------------------------------------------------------


def test_tiny_models_all_inspect(tiny_models: dict[str, Path]) -> None:
    for kind, path in tiny_models.items():
        validate_gguf(path)
        info = inspect_gguf(path)
        assert isinstance(info, GGUFInfo)
        assert info.architecture == tm.TINY_ARCH[kind]
        assert info.warnings == (), (kind, info.warnings)
        json.dumps(info.to_dict())
        assert read_chat_template(path) == tm.TINY_CHAT_TEMPLATE
        assert estimate_memory(info, 4096).total_bytes > info.weights_bytes
        assert describe(info)


def test_tiny_nemotron(tiny_models: dict[str, Path]) -> None:
    info = inspect_gguf(tiny_models["nemotron_h_moe"])
    assert info.expert_used_count == tuple(tm.NEMOTRON_EXPERT_USED)
    assert info.expert_feed_forward_length == tuple(tm.NEMOTRON_EXPERT_FF)
    assert info.layout == "A M E M E"
    assert info.moe_variant == "Puzzle (heterogeneous expert_used_count)"
    mtp = inspect_gguf(tiny_models["nemotron_h_moe_mtp"])
    assert mtp.expert_used_count == tuple(tm.NEMOTRON_EXPERT_USED_MTP)
    assert mtp.expert_feed_forward_length == tuple(tm.NEMOTRON_EXPERT_FF_MTP)
    assert mtp.layout == "A M E M E + 1 MTP"
    assert mtp.draft_type == "draft-mtp" and not mtp.is_mtp_sidecar


def test_tiny_qwen35_mtp_and_sidecar(tiny_models: dict[str, Path]) -> None:
    plain = inspect_gguf(tiny_models["qwen35"])
    assert plain.draft_type is None and plain.n_layer_nextn == 0
    full = inspect_gguf(tiny_models["qwen35_mtp"])
    assert full.draft_type == "draft-mtp" and not full.is_mtp_sidecar
    assert full.layer_kinds[-1] == "nextn"
    sidecar = inspect_gguf(tiny_models["qwen35_mtp_sidecar"])
    assert sidecar.is_mtp_sidecar and sidecar.draft_type == "draft-mtp"
    assert sidecar.layout == full.layout


def test_tiny_drafts(tiny_models: dict[str, Path]) -> None:
    dflash = inspect_gguf(tiny_models["dflash"])
    assert dflash.draft_type == "dflash"
    assert dflash.draft.target_layers == tuple(tm.DRAFT_TARGET_LAYERS)
    assert dflash.draft.block_size == tm.DRAFT_BLOCK_SIZE
    assert dflash.draft.mask_token_id is not None
    dspark = inspect_gguf(tiny_models["dspark"])
    assert dspark.draft_type == "dspark"
    assert dspark.draft.sample_from_anchor is True and dspark.draft.has_confidence_head is True
