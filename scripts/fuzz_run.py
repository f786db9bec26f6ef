"""Fuzz `run` in the engine worker: seeded metadata and tensor-info mutants of real models, loaded and decoded.

Every mutant keeps the weights of the model it came from (so the ones that pass validation really load) and
changes the header: hyperparameters (block_count, context_length, embedding_length, head counts, rope and SSM
sizes, expert counts, per-layer arrays), the tokenizer (model, token/type/score/merge arrays, special token ids),
general.file_type and general.alignment, and tensor shapes or names. Each mutant is first checked with
validate_main_model (as the worker does); one that passes is loaded in the real worker (engine_ext.client) and
asked for a short greedy chat reply. Every wait is bounded: a worker that does not answer in time is killed and
counted as a hang.

    .venv/bin/python scripts/fuzz_run.py [--seed 21] [-n 200] [--kinds llama,qwen3,...] [--no-starter] [--json]
    .venv/bin/python scripts/fuzz_run.py --drafts [--seed 21] [-n 300]

--drafts mutates draft files instead (DRAFT_PAIRS: a draft-simple model, an mtp- sidecar, DFlash, DSpark and
EAGLE3 drafts) and runs each as the --spec-draft-model of its target, unvalidated by this script: what the worker
refuses (a GGUFError from Model's validate_loadable) counts as refused.

prints a table: cases, refused by validation, loaded and decoded, clean load/decode failures, worker crashes by
signal and assert text, hangs. tests/engine/test_run_fuzz.py imports the mutant builder from here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gguf import GGUFReader, GGUFValueType  # noqa: E402

_VT = GGUFValueType
_SCALAR_FMT = {
    int(_VT.UINT8): "<B",
    int(_VT.INT8): "<b",
    int(_VT.UINT16): "<H",
    int(_VT.INT16): "<h",
    int(_VT.UINT32): "<I",
    int(_VT.INT32): "<i",
    int(_VT.FLOAT32): "<f",
    int(_VT.BOOL): "<?",
    int(_VT.UINT64): "<Q",
    int(_VT.INT64): "<q",
    int(_VT.FLOAT64): "<d",
}
_INT_TYPES = {
    int(t) for t in (_VT.UINT8, _VT.INT8, _VT.UINT16, _VT.INT16, _VT.UINT32, _VT.INT32, _VT.UINT64, _VT.INT64)
}
_FLOAT_TYPES = {int(_VT.FLOAT32), int(_VT.FLOAT64)}
_STR, _ARR, _U32, _I32, _BOOL, _F32 = (
    int(t) for t in (_VT.STRING, _VT.ARRAY, _VT.UINT32, _VT.INT32, _VT.BOOL, _VT.FLOAT32)
)

KV = tuple[str, int, int, Any]  # key, value type, element type of an array (or -1), value

RUN_KINDS = ("llama", "qwen3", "qwen35", "qwen35_mtp", "qwen3next", "nemotron_h_moe")
# Draft files (tiny models kinds) with the target and speculative type each drafts for (--drafts)
DRAFT_PAIRS: dict[str, tuple[str, str]] = {
    "qwen3": ("llama", "draft-simple"),
    "qwen35_mtp_sidecar": ("qwen35", "draft-mtp"),
    "dflash": ("llama", "draft-dflash"),
    "dspark": ("llama", "draft-dspark"),
    "eagle3": ("llama", "draft-eagle3"),
}


@dataclass
class TensorInfo:
    name: str
    shape: list[int]  # ggml order
    type_id: int
    offset: int


@dataclass
class Model:
    """A model file taken apart: metadata entries, tensor infos, and the data section (kept byte for byte)."""

    name: str
    path: Path
    kvs: list[KV]
    tensors: list[TensorInfo]
    alignment: int
    data: bytes = field(repr=False)

    @property
    def arch(self) -> str:
        return str(self.get("general.architecture"))

    def get(self, key: str) -> Any:
        return next((v for k, _, _, v in self.kvs if k == key), None)


def load_model(name: str, path: Path) -> Model:
    reader = GGUFReader(path)
    kvs: list[KV] = []
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        sub = int(f.types[1]) if vtype == _ARR else -1
        value = f.contents()
        if vtype == _ARR and sub == _STR:
            value = list(value)
        kvs.append((f.name, vtype, sub, value))
    raw = path.read_bytes()
    data_offset = int(reader.data_offset)
    tensors = [
        TensorInfo(t.name, [int(d) for d in t.shape], int(t.tensor_type), int(t.data_offset) - data_offset)
        for t in reader.tensors
    ]
    alignment = next((int(v) for k, _, _, v in kvs if k == "general.alignment"), 32)
    return Model(name, path, kvs, tensors, alignment, raw[data_offset:])


# ----- encoding ------------------------------------------------------------------------------------------


def _str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any) -> bytes:
    if vtype == _STR:
        return _str(value if isinstance(value, str | bytes) else str(value))
    fmt = _SCALAR_FMT[vtype]
    try:
        return struct.pack(fmt, value)
    except struct.error:
        return struct.pack(fmt, 0)


def encode(kvs: list[KV], tensors: list[TensorInfo], alignment: int) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for key, vtype, sub, value in kvs:
        out += _str(key) + struct.pack("<I", vtype)
        if vtype == _ARR:
            out += struct.pack("<IQ", sub, len(value))
            for v in value:
                out += _value(sub, v)
        else:
            out += _value(vtype, value)
    for t in tensors:
        out += _str(t.name) + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", d) for d in t.shape)
        out += struct.pack("<IQ", t.type_id, t.offset)
    out += b"\0" * (-len(out) % alignment)
    return bytes(out)


def write_mutant(m: Model, kvs: list[KV], tensors: list[TensorInfo], out: Path) -> Path:
    alignment = next((int(v) for k, vt, _, v in kvs if k == "general.alignment" and vt == _U32), 32)
    alignment = alignment if alignment > 0 and alignment & (alignment - 1) == 0 and alignment <= 4096 else 32
    with open(out, "wb") as f:
        f.write(encode(kvs, tensors, alignment))
        f.write(m.data)
    return out


def set_kv(kvs: list[KV], new: KV) -> list[KV]:
    """Replace (in place of the old entry) or append one metadata entry."""
    out = [new if kv[0] == new[0] else kv for kv in kvs]
    return out if any(kv[0] == new[0] for kv in kvs) else [*out, new]


def del_kv(kvs: list[KV], key: str) -> list[KV]:
    return [kv for kv in kvs if kv[0] != key]


# ----- mutations -----------------------------------------------------------------------------------------

_TOKENIZER_MODELS = ["llama", "gpt2", "bert", "t5", "rwkv", "plamo2", "none", "no_vocab", "nonsense", ""]
_PRE = ["default", "llama3", "qwen2", "deepseek-llm", "nonsense", "", "smollm", "gpt-4o"]
_SPECIAL_IDS = [
    "bos",
    "eos",
    "eot",
    "eom",
    "unknown",
    "seperator",
    "padding",
    "mask",
    "cls",
    "sep",
    "fim_pre",
    "fim_suf",
    "fim_mid",
    "fim_pad",
    "fim_rep",
    "fim_sep",
]


def _int_candidates(v: int, rng: random.Random) -> list[int]:
    base = [
        0,
        1,
        2,
        3,
        5,
        7,
        8,
        16,
        17,
        32,
        64,
        100,
        128,
        256,
        1000,
        4096,
        65536,
        v - 1,
        v + 1,
        v // 2,
        v * 2,
        v * 3,
        2**31 - 1,
    ]
    return [x for x in base if x >= 0 and x != v]


def _mutate_int(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    """Change one integer hyperparameter (a scalar, or one entry or the length of a per-layer array)."""
    arch = m.arch
    keys = [
        kv
        for kv in kvs
        if kv[0].startswith(arch + ".") and (kv[1] in _INT_TYPES or (kv[1] == _ARR and kv[2] in _INT_TYPES))
    ]
    key, vtype, sub, value = rng.choice(keys)
    if vtype == _ARR:
        values = list(value)
        r = rng.random()
        if r < 0.5 and values:
            i = rng.randrange(len(values))
            values[i] = rng.choice(_int_candidates(int(values[i]), rng))
            what = f"{key}[{i}]={values[i]}"
        elif r < 0.75 and values:
            values = values[: rng.randrange(len(values))]
            what = f"{key} cut to {len(values)} entries"
        else:
            values = values + values[: rng.randrange(1, 4)]
            what = f"{key} grown to {len(values)} entries"
        if sub in (int(_VT.UINT32), int(_VT.UINT64), int(_VT.UINT16), int(_VT.UINT8)):
            values = [abs(x) for x in values]
        return set_kv(kvs, (key, vtype, sub, values)), what
    new = rng.choice(_int_candidates(int(value), rng))
    if rng.random() < 0.2:  # a scalar turned into a per-layer array
        n = int(m.get(f"{arch}.block_count") or 2)
        vals = [int(value)] * n
        vals[rng.randrange(n)] = new
        return set_kv(kvs, (key, _ARR, _U32, vals)), f"{key}=[{', '.join(map(str, vals[:6]))}]"
    vt = vtype if new < 2**31 or vtype not in (_I32,) else _U32
    return set_kv(kvs, (key, vt, -1, new)), f"{key}={new}"


def _mutate_float(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    keys = [kv for kv in kvs if kv[0].startswith(m.arch + ".") and kv[1] in _FLOAT_TYPES]
    if not keys:
        return _mutate_int(m, kvs, rng)
    key, vtype, _, _ = rng.choice(keys)
    new = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e-30, 1e30])
    return set_kv(kvs, (key, vtype, -1, new)), f"{key}={new}"


def _add_hparam(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    """Add (or overwrite) a hyperparameter the model may not have."""
    arch = m.arch
    suffix = rng.choice(
        [
            "rope.dimension_count",
            "attention.key_length",
            "attention.value_length",
            "attention.head_count_kv",
            "expert_count",
            "expert_used_count",
            "expert_shared_count",
            "expert_feed_forward_length",
            "attention.sliding_window",
            "full_attention_interval",
            "nextn_predict_layers",
            "vocab_size",
            "ssm.conv_kernel",
            "ssm.inner_size",
            "ssm.state_size",
            "ssm.group_count",
            "ssm.time_step_rank",
            "rope.dimension_sections",
            "attention.layer_norm_rms_epsilon",
            "context_length",
            "leading_dense_block_count",
            "expert_gating_func",
            "rope.scaling.type",
            "pooling_type",
            "attention.causal",
            "rope.scaling.factor",
            "attention.clamp_kqv",
            "logit_scale",
            "embedding_length_per_layer_input",
        ]
    )
    key = f"{arch}.{suffix}"
    if suffix == "rope.dimension_sections":
        vals = [rng.choice([0, 1, 4, 8, 16, 64]) for _ in range(4)]
        return set_kv(kvs, (key, _ARR, _I32, vals)), f"{key}={vals}"
    if suffix in ("attention.layer_norm_rms_epsilon", "rope.scaling.factor", "logit_scale"):
        v = rng.choice([0.0, -1.0, float("nan"), 1e-6])
        return set_kv(kvs, (key, _F32, -1, v)), f"{key}={v}"
    if suffix == "rope.scaling.type":
        v = rng.choice(["linear", "yarn", "longrope", "bogus", ""])
        return set_kv(kvs, (key, _STR, -1, v)), f"{key}={v!r}"
    if suffix == "attention.causal":
        v = rng.random() < 0.5
        return set_kv(kvs, (key, _BOOL, -1, v)), f"{key}={v}"
    v = rng.choice([0, 1, 2, 3, 4, 8, 16, 32, 64, 127, 256, 1000])
    return set_kv(kvs, (key, _U32, -1, v)), f"{key}={v}"


def _mutate_tokenizer(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    tokens = list(m.get("tokenizer.ggml.tokens") or [])
    n_vocab = len(tokens)
    r = rng.random()
    if r < 0.25:  # a special token id out of range (or just at the edge)
        name = rng.choice(_SPECIAL_IDS)
        key = f"tokenizer.ggml.{name}_token_id"
        v = rng.choice([n_vocab, n_vocab + 1, n_vocab + 1000, 70000, 2**31 - 1, 2**32 - 1, n_vocab - 1, 0])
        vt = _U32 if rng.random() < 0.7 else _I32
        if vt == _I32 and v >= 2**31:
            v = -1
        return set_kv(kvs, (key, vt, -1, v)), f"{key}={v}"
    if r < 0.35:
        key, choices = rng.choice([("tokenizer.ggml.model", _TOKENIZER_MODELS), ("tokenizer.ggml.pre", _PRE)])
        v = rng.choice(choices)
        return set_kv(kvs, (key, _STR, -1, v)), f"{key}={v!r}"
    if r < 0.5:  # the token array shorter or longer than the embedding rows, or with odd entries
        s = rng.random()
        if s < 0.4:
            n = rng.choice([0, 1, 10, n_vocab // 2, n_vocab - 1])
            new = tokens[:n]
            what = f"tokens cut to {n}"
        elif s < 0.6:
            new = tokens + [f"extra{i}" for i in range(rng.choice([1, 5, 100]))]
            what = f"tokens grown to {len(new)}"
        elif s < 0.8:
            new = list(tokens)
            for _ in range(rng.choice([1, 3])):
                new[rng.randrange(n_vocab)] = rng.choice(["", tokens[0], "\x00", "\ufffd" * 3])
            what = "tokens with empty/duplicate entries"
        else:
            return del_kv(kvs, "tokenizer.ggml.tokens"), "del tokenizer.ggml.tokens"
        return set_kv(kvs, ("tokenizer.ggml.tokens", _ARR, _STR, new)), what
    if r < 0.65:  # token_type / scores arrays
        key = rng.choice(["tokenizer.ggml.token_type", "tokenizer.ggml.scores"])
        cur = m.get(key)
        if key == "tokenizer.ggml.scores":
            base = list(cur) if cur is not None else [0.0] * n_vocab
            s = rng.random()
            new_f = base[: rng.randrange(max(n_vocab, 1))] if s < 0.5 else base + [0.0] * 3
            return set_kv(kvs, (key, _ARR, _F32, new_f)), f"{key} of {len(new_f)}"
        base_i = [int(x) for x in cur] if cur is not None else [1] * n_vocab
        s = rng.random()
        if s < 0.4:
            new_i = base_i[: rng.randrange(max(n_vocab, 1))]
            what = f"{key} cut to {len(new_i)}"
        elif s < 0.6:
            new_i = base_i + [1, 1]
            what = f"{key} grown to {len(new_i)}"
        else:
            new_i = list(base_i)
            i = rng.randrange(len(new_i))
            new_i[i] = rng.choice([0, 2, 5, 6, 7, 8, 100, -1])
            what = f"{key}[{i}]={new_i[i]}"
        return set_kv(kvs, (key, _ARR, _I32, new_i)), what
    if r < 0.8:  # merges
        merges = list(m.get("tokenizer.ggml.merges") or [])
        s = rng.random()
        if s < 0.25 or not merges:
            return del_kv(kvs, "tokenizer.ggml.merges"), "del merges"
        new = list(merges)
        i = rng.randrange(len(new))
        new[i] = rng.choice(["", "a", "a b c", "zzz qqq", " ", "a  b", "\u0120 \u0120"])
        return set_kv(kvs, ("tokenizer.ggml.merges", _ARR, _STR, new)), f"merges[{i}]={new[i]!r}"
    if r < 0.9:
        key = rng.choice(
            [
                "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token",
                "tokenizer.ggml.add_space_prefix",
                "tokenizer.ggml.remove_extra_whitespaces",
            ]
        )
        v: Any = rng.choice([True, "yes", 7])
        vt = _BOOL if isinstance(v, bool) else (_STR if isinstance(v, str) else _U32)
        return set_kv(kvs, (key, vt, -1, v)), f"{key}={v!r}"
    key = rng.choice(
        [
            "tokenizer.ggml.model",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
        ]
    )
    return del_kv(kvs, key), f"del {key}"


def _mutate_general(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    r = rng.random()
    if r < 0.45:
        v = rng.choice([0, 1, 2, 3, 7, 8, 15, 24, 32, 36, 37, 40, 100, 1024, 9999, 2**31 - 1])
        return set_kv(kvs, ("general.file_type", _U32, -1, v)), f"general.file_type={v}"
    if r < 0.7:
        v = rng.choice([1, 2, 8, 16, 64, 256])
        return set_kv(kvs, ("general.alignment", _U32, -1, v)), f"general.alignment={v}"
    if r < 0.85:
        v = rng.choice(
            [
                "llama",
                "qwen3",
                "qwen35",
                "qwen3next",
                "nemotron_h_moe",
                "mamba2",
                "gemma3",
                "bert",
                "t5",
                "rwkv7",
                "mtp",
                "clip",
                "dflash",
            ]
        )
        return set_kv(kvs, ("general.architecture", _STR, -1, v)), f"general.architecture={v}"
    key = rng.choice([kv[0] for kv in kvs if kv[0].startswith(m.arch + ".")])
    return del_kv(kvs, key), f"del {key}"


def _mutate_tensor(m: Model, tensors: list[TensorInfo], rng: random.Random) -> tuple[list[TensorInfo], str]:
    tensors = [TensorInfo(t.name, list(t.shape), t.type_id, t.offset) for t in tensors]
    r = rng.random()
    if r < 0.5:  # same number of elements, another shape
        cands = [t for t in tensors if len(t.shape) >= 2 or t.shape[0] % 2 == 0]
        t = rng.choice(cands)
        old = list(t.shape)
        s = rng.random()
        if len(t.shape) >= 2 and s < 0.5:
            t.shape[0], t.shape[1] = t.shape[1], t.shape[0]
        elif s < 0.75 and t.shape[0] % 2 == 0:
            t.shape = [t.shape[0] // 2, *t.shape[1:]]
            t.shape[-1 if len(t.shape) > 1 else 0] *= 2 if len(t.shape) > 1 else 1
            if len(old) == 1:
                t.shape = [old[0] // 2, 2]
        else:
            t.shape = [*t.shape, 1] if len(t.shape) < 4 else t.shape
        if t.shape[0] % _block(t.type_id):
            t.shape = old
        return tensors, f"{t.name} {old}->{t.shape}"
    t = rng.choice(tensors)
    if r < 0.8:  # renamed: missing where llama.cpp wants it, unexpected under its new name
        old_name = t.name
        t.name = rng.choice(
            [
                t.name.replace("weight", "bias"),
                t.name + ".x",
                "blk.99." + t.name.split(".")[-2] + ".weight" if t.name.count(".") >= 2 else t.name + "2",
            ]
        )
        if any(o is not t and o.name == t.name for o in tensors):
            t.name = old_name + ".dup"
        return tensors, f"rename {old_name} -> {t.name}"
    # type with the same bytes per element (F32 <-> I32)
    t.type_id = rng.choice([26, 1 if t.type_id == 0 else 0])  # 26 = I32, 1 = F16 (halves the size: refused)
    return tensors, f"{t.name} type -> {t.type_id}"


def _block(type_id: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return int(GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0])
    except (ValueError, KeyError):
        return 1


def mutate(m: Model, rng: random.Random) -> tuple[list[KV], list[TensorInfo], str]:
    """One mutant of ``m``: one or two edits."""
    kvs, tensors = list(m.kvs), list(m.tensors)
    whats = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        kind = rng.choices(["int", "float", "add", "tok", "general", "tensor"], weights=[8, 1, 3, 5, 2, 2])[0]
        if kind == "tensor":
            tensors, what = _mutate_tensor(m, tensors, rng)
        else:
            fn = {
                "int": _mutate_int,
                "float": _mutate_float,
                "add": _add_hparam,
                "tok": _mutate_tokenizer,
                "general": _mutate_general,
            }[kind]
            kvs, what = fn(m, kvs, rng)
        whats.append(what)
    return kvs, tensors, "; ".join(whats)


def _mutate_draft(m: Model, kvs: list[KV], rng: random.Random) -> tuple[list[KV], str]:
    """The hyperparameters a draft's own loader path reads: layer counts, the NextN count, rope sizes and sections,
    the target layers and block size of a DFlash/EAGLE3 draft."""
    arch = m.arch
    n_layer = int(m.get(f"{arch}.block_count") or 1)
    suffix = rng.choice(
        ["block_count", "nextn_predict_layers", "rope.dimension_count", "rope.dimension_sections", "target_layers"]
        + ["block_size", "attention.head_count", "embedding_length", "target_hidden_size"]
    )
    key = f"{arch}.{suffix}"
    if suffix == "rope.dimension_sections":
        vals = [rng.choice([0, 2, 4, 8, 11, 24, 99, 2**31 - 1]) for _ in range(4)]
        return set_kv(kvs, (key, _ARR, _I32, vals)), f"{key}={vals}"
    if suffix == "target_layers":
        vals = [rng.choice([0, 1, n_layer, 7, 511, 512, 2**31 - 1]) for _ in range(rng.choice([0, 1, 3, 5]))]
        return set_kv(kvs, (key, _ARR, _I32, vals)), f"{key}={vals}"
    v = rng.choice([0, 1, 3, n_layer + 1, 100, 512, 513, 65535, 2**31 - 1])
    return set_kv(kvs, (key, _U32, -1, v)), f"{key}={v}"


def draft_mutants(
    models: dict[str, Model], seed: int, n: int
) -> Iterator[tuple[int, str, str, list[KV], list[TensorInfo]]]:
    """``n`` deterministic mutants of the draft kinds in ``models``: half a draft hyperparameter, half as mutate."""
    rng = random.Random(seed)
    names = sorted(k for k in models if k in DRAFT_PAIRS)
    for i in range(n):
        m = models[rng.choice(names)]
        if rng.random() < 0.5:
            kvs, what = _mutate_draft(m, list(m.kvs), rng)
            tensors = list(m.tensors)
        else:
            kvs, tensors, what = mutate(m, rng)
        yield i, m.name, what, kvs, tensors


def mutants(models: dict[str, Model], seed: int, n: int) -> Iterator[tuple[int, str, str, list[KV], list[TensorInfo]]]:
    """``n`` deterministic mutants: (index, model name, what changed, metadata, tensor infos)."""
    rng = random.Random(seed)
    names = sorted(models)
    for i in range(n):
        m = models[rng.choice(names)]
        kvs, tensors, what = mutate(m, rng)
        yield i, m.name, what, kvs, tensors


# ----- running one case in the worker --------------------------------------------------------------------

_ASSERT = re.compile(
    r"(GGML_ASSERT\(.*?\) failed|GGML_ABORT.*|[\w/.-]+\.(?:cpp|c|h):\d+: .*|"
    r"terminate called .*|what\(\): .*|Segmentation fault.*|Aborted.*)"
)


@dataclass
class Outcome:
    kind: str  # refused | load_failed | ok | decode_failed | crash | hang
    detail: str
    seconds: float


def crash_signature(exit_code: int | None, log: str) -> str:
    import signal

    sig = ""
    if exit_code is not None and exit_code < 0:
        try:
            sig = signal.Signals(-exit_code).name
        except ValueError:
            sig = f"signal {-exit_code}"
    elif exit_code is not None:
        sig = f"exit {exit_code}"
    hits = [h for line in log.splitlines() for h in _ASSERT.findall(line)]
    where = hits[0] if hits else (log.strip().splitlines()[-1][:160] if log.strip() else "")
    where = re.sub(r"/[^ :]*/(src|ggml)/", r"\1/", where)
    return f"{sig or 'crash'}: {where}"[:200]


class Runner:
    """One engine worker (restarted after a crash or a hang); every wait bounded."""

    def __init__(
        self, log_path: Path, *, load_timeout: float = 60.0, gen_timeout: float = 30.0, n_ctx: int = 512
    ) -> None:
        from engine_ext.client import EngineClient
        from engine_ext.params import ContextParams

        self.log_path = log_path
        self.client = EngineClient(log_path, start_timeout_s=60.0)
        self.load_timeout, self.gen_timeout = load_timeout, gen_timeout
        self.ctx = ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2)
        self.started = False
        self.target: Path | None = None  # the target loaded for run_draft

    def close(self) -> None:
        self.client.close(timeout_s=3.0)
        self.started = False
        self.target = None

    def _wait(self, want: tuple[type, ...], deadline: float) -> Any:
        """Events until one of ``want``, a Failed, a Crashed, or the deadline (None)."""
        from engine_ext.protocol import Crashed, Failed

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            event = self.client.next_event(timeout=min(left, 1.0))
            if event is None:
                continue
            if isinstance(event, (*want, Failed, Crashed)):
                return event

    def run(self, path: Path) -> Outcome:
        from engine_ext.gguf import GGUFError, validate_main_model
        from engine_ext.params import SamplingParams
        from engine_ext.protocol import ChatMessage, Finished, Generate, Loaded, LoadModel

        t0 = time.monotonic()
        try:
            validate_main_model(path)
        except GGUFError as exc:
            return Outcome("refused", str(exc), time.monotonic() - t0)
        if not self.started:
            self.client.start()
            self.started = True
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.client.send(LoadModel(str(path), context=self.ctx))
        event = self._wait((Loaded,), time.monotonic() + self.load_timeout)
        outcome = self._judge(event, "load", log_start, t0, (Loaded,))
        if outcome is not None:
            return outcome
        request = Generate(
            request_id=self.client.new_request_id(),
            messages=(ChatMessage("user", "Hello, how are you?"),),
            sampling=SamplingParams(temperature=0.0),
            max_tokens=4,
        )
        self.client.send(request)
        event = self._wait((Finished,), time.monotonic() + self.gen_timeout)
        outcome = self._judge(event, "decode", log_start, t0, (Finished,))
        if outcome is not None:
            return outcome
        return Outcome("ok", "", time.monotonic() - t0)

    def run_draft(self, target: Path, draft: Path, spec_type: str) -> Outcome:
        """``draft`` as the --spec-draft-model of ``target`` (loaded once and kept): nothing validated here, the
        worker's own path must refuse what would abort llama.cpp (a Failed GGUFError counts as refused)."""
        from engine_ext.params import SamplingParams, SpeculativeParams
        from engine_ext.protocol import Failed, Finished, Generate, Loaded, LoadModel, SetSpeculative, SpeculativeSet

        t0 = time.monotonic()
        if not self.started or self.target != target:
            if not self.started:
                self.client.start()
                self.started = True
            self.client.send(LoadModel(str(target), context=self.ctx))
            event = self._wait((Loaded,), time.monotonic() + self.load_timeout)
            outcome = self._judge(event, "target_load", 0, t0, (Loaded,))
            if outcome is not None:
                return outcome
            self.target = target
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.client.send(SetSpeculative(SpeculativeParams(types=(spec_type,), draft_model=str(draft), n_max=4)))
        event = self._wait((SpeculativeSet,), time.monotonic() + self.load_timeout)
        if isinstance(event, Failed) and event.error.startswith("GGUF"):  # the worker's validation refused it
            return Outcome("refused", event.message, time.monotonic() - t0)
        outcome = self._judge(event, "draft_load", log_start, t0, (SpeculativeSet,))
        if outcome is not None:
            return outcome
        request = Generate(
            request_id=self.client.new_request_id(),
            prompt="Hello, how are you?",
            sampling=SamplingParams(temperature=0.0),
            max_tokens=6,
            ignore_eos=True,
        )
        self.client.send(request)
        event = self._wait((Finished,), time.monotonic() + self.gen_timeout)
        outcome = self._judge(event, "decode", log_start, t0, (Finished,))
        if outcome is None or outcome.kind == "decode_failed":  # the worker is alive: close the draft
            self.client.send(SetSpeculative(SpeculativeParams()))
            after = self._wait((SpeculativeSet,), time.monotonic() + self.load_timeout)
            outcome = outcome or self._judge(after, "draft_close", log_start, t0, (SpeculativeSet,))
        return outcome or Outcome("ok", "", time.monotonic() - t0)

    def _judge(self, event: Any, stage: str, log_start: int, t0: float, good: tuple[type, ...]) -> Outcome | None:
        from engine_ext.protocol import Crashed, Failed

        if isinstance(event, good):
            return None
        if event is None:
            self.close()
            return Outcome(
                "hang",
                f"no answer to {stage} in time; log: " + crash_signature(None, self._log(log_start)),
                time.monotonic() - t0,
            )
        if isinstance(event, Failed):
            return Outcome(f"{stage}_failed", f"{event.error}: {event.message}"[:300], time.monotonic() - t0)
        assert isinstance(event, Crashed)
        self.started = False
        self.target = None
        log = self._log(log_start)
        return Outcome("crash", f"{stage}: " + crash_signature(event.exit_code, log), time.monotonic() - t0)

    def _log(self, start: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read()[-20000:].decode("utf-8", "replace")
        except OSError:
            return ""


# ----- the table -----------------------------------------------------------------------------------------


def build_models(workdir: Path, kinds: list[str], starter: bool) -> dict[str, Model]:
    from tests.tiny_models import write_tiny_model

    models: dict[str, Model] = {}
    for kind in kinds:
        models[kind] = load_model(kind, write_tiny_model(kind, workdir / f"{kind}.gguf"))
    if starter:
        from app.core.model_paths import starter_model_path

        path = starter_model_path()
        if path is not None:
            models["starter"] = load_model("starter", path)
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--kinds", default=",".join(RUN_KINDS))
    ap.add_argument("--drafts", action="store_true", help="mutate draft files, run each as another's draft")
    ap.add_argument("--no-starter", action="store_true")
    ap.add_argument("--json", action="store_true", help="print every case as one JSON line too")
    ap.add_argument("--only", default="", help="run only these case numbers (comma-separated)")
    ap.add_argument("--keep", default="", help="copy the mutants run into this folder")
    ap.add_argument("--show", default="crash,hang", help="outcome kinds whose cases are listed")
    ap.add_argument("--mem-gb", type=float, default=6.0, help="address-space limit of the worker")
    args = ap.parse_args(argv)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # an abort is reported at once, without gdb attaching
    limit = int(args.mem_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # inherited by the worker
    counts: Counter[str] = Counter()
    crashes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    shown: list[str] = []
    worst = 0.0
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.drafts:
            kinds = sorted({*DRAFT_PAIRS, *(target for target, _ in DRAFT_PAIRS.values())})
            models = build_models(work, kinds, False)
            cases = draft_mutants(models, args.seed, args.n)
        else:
            models = build_models(work, [k for k in args.kinds.split(",") if k], not args.no_starter)
            cases = mutants(models, args.seed, args.n)
        runner = Runner(work / "engine.log")
        try:
            only = {int(x) for x in args.only.split(",") if x}
            for i, name, what, kvs, tensors in cases:
                if only and i not in only:
                    continue
                path = write_mutant(models[name], kvs, tensors, work / f"mutant{i}.gguf")
                if args.drafts:
                    target, spec_type = DRAFT_PAIRS[name]
                    if name == "qwen35_mtp_sidecar":  # found as a sidecar by its mtp- name
                        path = path.rename(path.with_name(f"mtp-{path.name}"))
                    out = runner.run_draft(models[target].path, path, spec_type)
                else:
                    out = runner.run(path)
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    path.replace(Path(args.keep) / path.name)
                else:
                    path.unlink()
                worst = max(worst, out.seconds)
                counts[out.kind] += 1
                if out.kind == "crash":
                    crashes[out.detail] += 1
                elif out.kind.endswith("_failed"):
                    failures[out.detail.split(":")[0]] += 1
                line = f"#{i} {name} [{what}] -> {out.kind} {out.detail}"
                if out.kind in args.show.split(","):
                    shown.append(line)
                if args.json:
                    print(
                        json.dumps(
                            {
                                "i": i,
                                "model": name,
                                "what": what,
                                "outcome": out.kind,
                                "detail": out.detail,
                                "seconds": round(out.seconds, 2),
                            }
                        ),
                        flush=True,
                    )
        finally:
            runner.close()
    total = sum(counts.values())
    print(
        f"\nrun fuzz: seed {args.seed}, {total} cases, models {', '.join(sorted(models))}, "
        f"{time.monotonic() - t_start:.0f} s, slowest case {worst:.1f} s"
    )
    print(f"{'outcome':<36}{'cases':>7}")
    for kind in dict.fromkeys(["refused", "ok", "load_failed", "decode_failed", "crash", "hang", *counts]):
        print(f"{kind:<36}{counts.get(kind, 0):>7}")
    if failures:
        print("\nclean failures by error type:")
        for k, v in failures.most_common():
            print(f"  {v:>4}  {k}")
    if crashes:
        print("\nworker crashes by signal and assert:")
        for k, v in crashes.most_common():
            print(f"  {v:>4}  {k}")
    if shown:
        print("\ncases:")
        for line in shown:
            print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
