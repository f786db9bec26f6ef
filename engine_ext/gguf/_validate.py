"""Metadata rules beyond the file format: counts and sizes inspection reads (llama.cpp refuses them), and metadata that
passes llama.cpp's loader checks and then aborts the process (validate_loadable, for every file llama.cpp loads:
engine_ext.model.Model calls it; validate_main_model adds the refusal of a draft opened as the model)."""

from __future__ import annotations

from pathlib import Path

from engine_ext.gguf._layers import INTERVAL_HYBRID_ARCHS, NEMOTRON_ARCHS
from engine_ext.gguf._metadata import (
    MAX_CONTEXT,
    MAX_DIM,
    MAX_EXPERTS,
    MAX_LAYERS,
    Metadata,
    per_layer_values,
    value_type_name,
)
from engine_ext.gguf._reader import (
    HINT_METADATA,
    U64,
    VT,
    GGUFValidationError,
    Header,
    guarded,
    open_file_source,
    read_header,
    validation_error,
)

_DRAFT_ARCHS = {"dflash": "a DFlash/DSpark draft", "eagle3": "an EAGLE3 draft"}  # for another model


def validate_loadable(path: Path | str) -> None:
    """The rules for every file llama.cpp loads, the model to chat with or a draft (a draft-simple model, an ``mtp-``
    sidecar, a DFlash/DSpark or EAGLE3 draft): the file format (validate_gguf), then the metadata that passes
    llama.cpp's loader checks and then aborts it. GGUFError (one line) when a rule is broken."""
    path = Path(path)
    check_runnable(path, read_header(path))


def validate_main_model(path: Path) -> None:
    """validate_loadable, and refuse a draft that cannot run on its own: a DFlash/DSpark or EAGLE3 draft, or an
    ``mtp-`` sidecar (NextN head only), opened as the model to chat with (llama.cpp aborts or segfaults on them)."""
    path = Path(path)
    header = read_header(path)
    _refuse_draft_as_model(path, header)
    check_runnable(path, header)


def refuse_draft_as_model(path: Path) -> None:
    """Only the draft-as-model refusal of validate_main_model (the worker's; Model checks the rest as it loads)."""
    _refuse_draft_as_model(Path(path), read_header(Path(path)))


def _refuse_draft_as_model(path: Path, header: Header) -> None:
    arch_kv = header.kv.get("general.architecture")
    arch = arch_kv.value if arch_kv is not None and isinstance(arch_kv.value, str) else ""
    what = _DRAFT_ARCHS.get(arch)
    if what is None:
        nextn = header.kv.get(f"{arch}.nextn_predict_layers")
        has_nextn = nextn is not None and isinstance(nextn.value, int) and nextn.value > 0
        # As inspect_gguf's is_mtp_sidecar: NextN blocks and no trunk.
        if has_nextn and not any(t.name == "blk.0.attn_norm.weight" for t in header.tensors):
            what = "an mtp- sidecar (another model's MTP head)"
    if what is not None:
        raise validation_error(
            path,
            f"{what}, not a model to chat with",
            "open the model it belongs to (its drafts are paired automatically)",
        )


# Rules that llama.cpp enforces with GGML_ASSERT/GGML_ABORT (a worker crash) instead of an error, found by fuzzing
# `run` (scripts/fuzz_run.py); references are to the vendored llama.cpp (llama-cpp-python 0.3.36).
_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES, src/llama-model.cpp:1034
_TENSOR_ALIGNMENT = 32  # TENSOR_ALIGNMENT, ggml/src/ggml-impl.h:44
_INTEGER_TENSOR_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64"}
_GDN_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})  # head_v_dim = d_inner / num_v_heads in the graph
# Graph builders that assert n_embd_head_k == n_embd_head_v (src/models/*.cpp, "GGML_ASSERT(n_embd_head == ...)")
# fmt: off
_HEAD_K_EQ_V_ARCHS = frozenset({
    "afmoe", "apertus", "arcee", "arctic", "baichuan", "bailingmoe2", "bert", "bitnet", "bloom", "chameleon",
    "chatglm", "codeshell", "cogvlm", "cohere2", "cohere2moe", "command-r", "dbrx", "deci", "deepseek", "dots1",
    "dream", "ernie4_5", "ernie4_5-moe", "eurobert", "exaone", "exaone-moe", "exaone4", "falcon", "glm4", "glm4moe",
    "gpt2", "gptneox", "granite", "granite_swa", "granitehybrid", "graniteswitch", "grok", "grovemoe", "hunyuan-moe",
    "hunyuan_vl", "hy_v3", "internlm2", "jais", "jais2", "laguna", "llada", "llada-moe", "llama", "llama4",
    "maincoder", "maple", "mellum", "minimax-01", "minimax-m2", "minimax-m3", "mistral3", "modern-bert", "mpt",
    "muse-glimmer", "nanbeige", "nemotron", "nemotron_h", "neo-bert", "olmo", "olmo2", "olmoe", "openelm", "orion",
    "paddleocr", "pangu-embedded", "phi2", "phi3", "plamo", "pockettts", "qwen", "qwen2", "qwen2moe", "qwen2vl",
    "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3vl", "qwen3vlmoe", "refact", "rnd1", "seed_oss",
    "smallthinker", "smollm3", "spark2_5", "stablelm", "starcoder", "starcoder2", "t5", "talkie", "xverse",
})
# ... and that also assert n_embd_head == n_rot
_ROT_EQ_HEAD_ARCHS = frozenset({
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe", "dbrx", "deci",
    "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone", "exaone-moe", "exaone4", "falcon", "granite",
    "granite_swa", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais2",
    "llada", "llada-moe", "llama", "llama4", "maincoder", "mellum", "minimax-01", "minimax-m2", "mistral3",
    "nemotron", "olmo", "olmo2", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo", "pockettts", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "rnd1", "seed_oss", "smallthinker",
    "smollm3", "starcoder2", "talkie", "xverse",
})
# Architectures that read rope.dimension_sections (multi-section rope; ggml_mrope_cache_init asserts their sum)
_MROPE_ARCHS = frozenset({
    "bailingmoe3", "deepseek32", "dflash", "ernie4_5", "glm-dsa", "glm4", "glm4moe", "hunyuan_vl", "qwen2vl",
    "qwen35", "qwen35moe", "qwen3vl", "qwen3vlmoe", "qwen4exp",
})
# Architectures without rope (llama_model_rope_type, src/llama-model.cpp:3026-3049): their rope keys are unused
_NO_ROPE_ARCHS = frozenset({
    "clip", "gpt2", "gptj", "mpt", "refact", "bloom", "mamba", "mamba2", "jamba", "jina-bert-v2", "t5", "t5encoder",
    "jais", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "wavtokenizer-dec", "nemotron_h", "nemotron_h_moe",
    "kimi-linear", "kimi-k3", "glm5-next",
})
# Architectures whose graph normalises with layer_norm_epsilon only (load_arch_hparams reads no RMS epsilon)
_LAYERNORM_ARCHS = frozenset({
    "bert", "bloom", "codeshell", "cohere2", "command-r", "dbrx", "falcon", "gpt2", "gptneox", "jais", "jais2",
    "jina-bert-v2", "jina-bert-v3", "modern-bert", "mpt", "nemotron", "nomic-bert", "nomic-bert-moe", "olmo", "orion",
    "phi2", "pockettts", "stablelm", "starcoder", "starcoder2", "wavtokenizer-dec",
})
# fmt: on


def check_runnable(path: Path | str, header: Header) -> None:
    """Refuse, before llama.cpp sees the file, metadata that passes llama.cpp's loader checks and then aborts it."""
    arch_kv = header.kv.get("general.architecture")
    arch = arch_kv.value if arch_kv is not None and isinstance(arch_kv.value, str) else None
    meta = Metadata(header.kv, arch)
    guarded(path, lambda: _check_experts(path, meta))
    guarded(path, lambda: _check_attention(path, meta))
    guarded(path, lambda: _check_recurrent(path, meta))
    guarded(path, lambda: _check_kv_heads(path, meta, header))
    _check_tensor_types(path, header)
    guarded(path, lambda: _check_dspark(path, meta, header))
    _check_tokens(path, header)
    model = header.kv.get("tokenizer.ggml.model")
    if model is not None and model.value in ("none", "no_vocab"):  # llama-vocab.cpp:3422 on the first tokenize
        raise _refuse(path, f"tokenizer.ggml.model is {model.value!r}: the model has no tokenizer to chat with")


def _refuse(path: Path | str, problem: str) -> GGUFValidationError:
    return validation_error(
        path, problem, "llama.cpp would abort on this metadata; re-download or re-convert the model"
    )


def _check_experts(path: Path | str, meta: Metadata) -> None:
    """block_count and the expert counts as load_hparams asserts them (src/llama-model.cpp:1328-1377)."""
    arch = meta.arch
    if arch is None:
        return
    block_count = meta.checked_int(f"{arch}.block_count", path, 1, MAX_LAYERS)  # llama-model.cpp:1328
    meta.checked_int(f"{arch}.nextn_predict_layers", path, 0, block_count or MAX_LAYERS)  # llama-model.cpp:1330
    meta.checked_int(f"{arch}.expert_count", path, 0, MAX_EXPERTS)  # llama-model.cpp:1361
    meta.check_int_or_layers(f"{arch}.expert_used_count", path, MAX_EXPERTS, block_count)
    n_expert = meta.arch_int("expert_count") or 0
    used = meta.arch_int_or_layers("expert_used_count")
    used_max = (max(used) if used else 0) if isinstance(used, tuple) else (used or 0)
    groups = meta.arch_int("expert_group_count") or 0
    group_used = meta.arch_int("expert_group_used_count") or 0
    if arch in ("hunyuan-dense", "hunyuan_vl") and n_expert <= 1:
        n_expert = used_max = 0
    if used_max > n_expert:
        raise _refuse(path, f"{arch}.expert_used_count {used_max} exceeds expert_count {n_expert}")
    if n_expert > 0:
        if used_max == 0:
            raise _refuse(
                path,
                f"{arch}.expert_count is {n_expert} but expert_used_count is 0 or missing "
                "(an MoE model must route to at least one expert)",
            )
        if groups >= n_expert:
            raise _refuse(path, f"{arch}.expert_group_count {groups} must be below expert_count {n_expert}")
        if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            raise _refuse(
                path,
                f"{arch}.expert_group_count {groups} must divide expert_count {n_expert} and "
                f"expert_group_used_count ({group_used}) must be 1 to {groups - 1}",
            )
    elif groups:
        raise _refuse(path, f"{arch}.expert_group_count is {groups} but the model has no experts")
    if arch in NEMOTRON_ARCHS and n_expert > 0 and block_count:
        # A trunk layer with n_ff != 0 is an MoE layer whose expert width falls back to n_ff / n_expert_used(il)
        # when expert_feed_forward_length is 0 there (models/nemotron-h.cpp:102-115): SIGFPE when both are 0.
        n_ff = per_layer_values(meta.arch_int_or_layers("feed_forward_length"), block_count)
        ff_exp = per_layer_values(meta.arch_int_or_layers("expert_feed_forward_length"), block_count)
        used_l = per_layer_values(used, block_count)
        for il in range(block_count - (meta.arch_int("nextn_predict_layers") or 0)):
            if n_ff[il] and not ff_exp[il] and not used_l[il]:
                raise _refuse(
                    path,
                    f"{arch}.feed_forward_length is {n_ff[il]} at layer {il} (an MoE layer) but "
                    f"expert_used_count and expert_feed_forward_length are 0 there (divides by 0)",
                )


def _check_attention(path: Path | str, meta: Metadata) -> None:
    """Norm epsilons, rope scaling type and head sizes that the graph asserts on (ggml-cpu/ops.cpp, models/*.cpp)."""
    arch = meta.arch
    if arch is None:
        return
    for suffix in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = meta.arch_value(suffix)
        if suffix == "attention.layer_norm_epsilon" and arch not in _LAYERNORM_ARCHS:
            continue  # read but not used by this architecture's graph
        if isinstance(eps, float) and not eps >= 0.0:  # ggml-cpu/ops.cpp:4026 (norm), 4132 (rms_norm)
            raise _refuse(path, f"{arch}.{suffix} is {eps} (must be >= 0)")
    scaling = meta.arch_value("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in _ROPE_SCALING_TYPES:  # llama-model.cpp:1420
        known = ", ".join(_ROPE_SCALING_TYPES)
        raise _refuse(path, f"{arch}.rope.scaling.type {scaling!r} is unknown (one of {known})")
    block_count = meta.arch_int("block_count")
    heads = per_layer_values(
        meta.arch_int_or_layers("attention.head_count"), MAX_LAYERS if block_count is None else int(block_count or 0)
    )
    heads_kv_raw = meta.arch_int_or_layers("attention.head_count_kv")
    heads_kv = heads if heads_kv_raw is None else per_layer_values(heads_kv_raw, len(heads))
    # Grouped-query attention broadcasts K/V over the heads (ggml_mul_mat asserts it): checked for the model-wide
    # values (layer 0's, which every graph uses); per-layer arrays are checked against the K tensors below.
    if heads and heads_kv and heads_kv[0] > 0 and heads[0] % heads_kv[0]:
        raise _refuse(path, f"{arch}.attention.head_count_kv {heads_kv[0]} must divide head_count {heads[0]}")
    n_head = heads[0] if heads else 0
    n_embd = meta.arch_int("embedding_length")
    if n_head <= 0 or not n_embd:
        return
    head_k = meta.arch_int("attention.key_length") or n_embd // n_head  # llama-model.cpp:1435-1447
    head_v = meta.arch_int("attention.value_length") or n_embd // n_head
    n_rot = meta.arch_int("rope.dimension_count")
    sections = meta.arch_int_or_layers("rope.dimension_sections")
    if arch in _MROPE_ARCHS and isinstance(sections, tuple):  # ggml-cpu/ops.cpp:6232, an int32 sum as in C
        total = _int32(sum(_int32(v) for v in sections[:4]))
        if total > head_k:
            raise _refuse(
                path, f"{arch}.rope.dimension_sections {list(sections[:4])} add up to more than the head size {head_k}"
            )
        if total == 0 and _uses_mrope(arch, [_int32(v) for v in (*sections[:4], 0, 0, 0, 0)[:4]]):
            # ops.cpp:6237 (i0 / 2) % sect_dims: SIGFPE
            raise _refuse(
                path, f"{arch}.rope.dimension_sections {list(sections[:4])} add up to 0 as int32 (divided by)"
            )
    if arch in _HEAD_K_EQ_V_ARCHS and head_k != head_v:
        raise _refuse(path, f"{arch}.attention.key_length {head_k} must equal value_length {head_v} for {arch}")
    if n_rot is None or arch in _NO_ROPE_ARCHS:
        return
    if arch in _ROT_EQ_HEAD_ARCHS and n_rot != head_k:
        raise _refuse(path, f"{arch}.rope.dimension_count {n_rot} must equal the head size {head_k} for {arch}")
    # ggml-cpu/ops.cpp:6355-6356 assert n_dims <= ne0 and n_dims % 2 == 0; n_dims 0 spins forever in the decode
    if n_rot < 2 or n_rot % 2 or n_rot > head_k:
        raise _refuse(path, f"{arch}.rope.dimension_count {n_rot} must be even, 2 to the head size {head_k}")


# The DSpark head is built one step per block position, about 8 graph nodes each (src/models/dflash.cpp:349-385),
# for min(block_size, micro-batch) positions when the graph is reserved; llama.cpp's graph holds max(1024, 8 ×
# tensors) nodes, and 128 positions already abort the tiny draft (GGML_ASSERT(obj_new), ggml.c:1814). Real DSpark
# and DFlash drafts use blocks of 16.
_MAX_DSPARK_BLOCK = 64


def _check_dspark(path: Path | str, meta: Metadata, header: Header) -> None:
    """A DSpark draft (a DFlash draft with a Markov head) needs dflash.block_size from 1 to _MAX_DSPARK_BLOCK:
    models/dflash.cpp:312-314 asserts it is there and positive, and a larger one overflows the graph."""
    if meta.arch != "dflash" or not any(t.name == "markov_w1.weight" for t in header.tensors):
        return
    block = meta.arch_int("block_size")
    if block is None or not 1 <= block <= _MAX_DSPARK_BLOCK:
        shown = "missing" if block is None else f"{block}"
        raise _refuse(path, f"dflash.block_size is {shown} in a DSpark draft (must be 1 to {_MAX_DSPARK_BLOCK})")


def _uses_mrope(arch: str, sections: list[int]) -> bool:
    """Whether llama.cpp ropes ``arch`` in sections with these values (llama_model_rope_type, llama-model.cpp:3179
    and 3187-3204; use_mrope, llama-hparams.cpp:352)."""
    if arch in ("qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "qwen3tts"):
        return True
    if arch in ("glm4", "glm4moe", "hunyuan_vl"):
        return sections[0] > 0 and sections[1] > 0
    return arch == "dflash" and any(sections)


def _int32(value: int) -> int:
    """``value`` as a C int32_t holds it (two's complement wrap)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _check_recurrent(path: Path | str, meta: Metadata) -> None:
    """The layer pattern and the gated delta net sizes the loader and graph divide by and reshape with
    (src/models/qwen35.cpp:18-21 and 341-346)."""
    arch = meta.arch
    if arch in INTERVAL_HYBRID_ARCHS and meta.arch_value("attention.recurrent_layers") is None:
        if meta.arch_int("full_attention_interval") == 0:  # (i + 1) % full_attn_interval: SIGFPE
            raise _refuse(path, f"{arch}.full_attention_interval is 0 (must be at least 1)")
    if arch not in _GDN_ARCHS:
        return
    inner, state = meta.arch_int("ssm.inner_size"), meta.arch_int("ssm.state_size")
    rank = meta.arch_int("ssm.time_step_rank")
    if inner is None or state is None or rank is None:
        return  # llama.cpp refuses a missing key itself
    if rank == 0 or inner != state * rank:
        raise _refuse(
            path, f"{arch}.ssm.inner_size {inner} must equal ssm.state_size × ssm.time_step_rank ({state} × {rank})"
        )


def _check_kv_heads(path: Path | str, meta: Metadata, header: Header) -> None:
    """A per-layer head_count_kv array must agree with each layer's K projection: the KV cache is sized per layer
    from the array while most graphs build K from the tensor, and ggml_set_rows asserts they match (ggml.c:4014)."""
    arch = meta.arch
    kv_heads = meta.arch_int_or_layers("attention.head_count_kv")
    if arch is None or not isinstance(kv_heads, tuple) or meta.arch_value("attention.key_length_swa") is not None:
        return
    heads = meta.arch_int_or_layers("attention.head_count")
    n_head = heads[0] if isinstance(heads, tuple) and heads else heads
    n_embd = meta.arch_int("embedding_length")
    if not isinstance(n_head, int) or n_head <= 0 or not n_embd:
        return
    head_k = meta.arch_int("attention.key_length") or n_embd // n_head
    widths = {t.name: t.shape[1] for t in header.tensors if len(t.shape) == 2 and t.name.endswith(".attn_k.weight")}
    for il, hkv in enumerate(kv_heads):
        width = widths.get(f"blk.{il}.attn_k.weight")
        if width is not None and width != head_k * hkv:
            raise _refuse(
                path,
                f"{arch}.attention.head_count_kv is {hkv} at layer {il} but blk.{il}.attn_k.weight "
                f"has {width} rows ({width // head_k if head_k else '?'} heads of {head_k})",
            )


def _check_tensor_types(path: Path | str, header: Header) -> None:
    """Weights llama.cpp maps but cannot compute with or point at."""
    for t in header.tensors:
        # ggml-cpu binary ops and matmuls abort or crash on them; only a draft's d2t token map is I64 (eagle3.cpp:312)
        if t.type_id in _INTEGER_TENSOR_TYPES and not t.name.endswith(("d2t", "t2d")):
            raise _refuse(
                path,
                f"tensor {t.name!r} has the integer type {_INTEGER_TENSOR_TYPES[t.type_id]}, "
                "which no model weight uses",
            )
        start = header.data_offset + t.offset
        if start % _TENSOR_ALIGNMENT:  # ggml-backend.cpp:2527, the mapped weights must be 32-byte aligned
            raise _refuse(
                path,
                f"tensor {t.name!r} data starts at file offset {start}, not a multiple of "
                f"{_TENSOR_ALIGNMENT} (general.alignment is {header.alignment})",
            )


def _check_tokens(path: Path | str, header: Header) -> None:
    """Every token text must be distinct (src/llama-vocab.cpp:2544 asserts id_to_token.size() == token_to_id.size());
    an empty token is renamed to [EMPTY_<id>] first. Reads the token array's bytes once, nothing else."""
    span = header.spans.get("tokenizer.ggml.tokens")
    if span is None:
        return
    start, end = span
    with open_file_source(Path(path)) as src:
        raw = src.read(start, end - start)
    seen: dict[bytes, int] = {}
    pos, i, n = 0, 0, len(raw)
    while pos + 8 <= n:
        (length,) = U64.unpack_from(raw, pos)
        word = raw[pos + 8 : pos + 8 + length] or f"[EMPTY_{i}]".encode()
        pos += 8 + length
        first = seen.setdefault(word, i)
        if first != i:
            shown = word[:40].decode("utf-8", errors="replace")
            raise _refuse(path, f"tokenizer.ggml.tokens has {shown!r} twice (ids {first} and {i})")
        i += 1
    model = header.kv.get("tokenizer.ggml.model")
    if model is not None and model.value == "llama":
        # SentencePiece falls back to a byte token for a piece it cannot form, and llama.cpp's byte_to_token looks
        # it up with token_to_id.at() (llama-vocab.cpp:4009-4014): a missing byte throws std::out_of_range through
        # the C API, which terminates the process on the first such character typed.
        missing = [b for b in range(256) if b"<0x%02X>" % b not in seen and bytes([b]) not in seen]
        if missing:
            raise _refuse(
                path,
                f"tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no byte "
                f"token for {len(missing)} of the 256 bytes (first <0x{missing[0]:02X}>)",
            )


# (key suffix, largest value, may be a per-layer array) for every count or size inspection reads
_HPARAMS: tuple[tuple[str, int, bool], ...] = (
    ("context_length", MAX_CONTEXT, False),
    ("embedding_length", MAX_DIM, False),
    ("feed_forward_length", MAX_DIM, True),
    ("attention.head_count", MAX_DIM, True),
    ("attention.head_count_kv", MAX_DIM, True),
    ("attention.key_length", MAX_DIM, False),
    ("attention.value_length", MAX_DIM, False),
    ("attention.key_length_swa", MAX_DIM, False),
    ("attention.value_length_swa", MAX_DIM, False),
    ("attention.key_length_mla", MAX_DIM, False),
    ("attention.value_length_mla", MAX_DIM, False),
    ("attention.sliding_window", MAX_CONTEXT, False),
    ("expert_count", MAX_EXPERTS, False),
    ("expert_used_count", MAX_EXPERTS, True),
    ("expert_feed_forward_length", MAX_DIM, True),
    ("expert_shared_count", MAX_EXPERTS, False),
    ("expert_shared_feed_forward_length", MAX_DIM, False),
    ("leading_dense_block_count", MAX_LAYERS, False),
    ("interleave_moe_layer_step", MAX_LAYERS, False),
    ("full_attention_interval", MAX_LAYERS, False),
    ("vocab_size", MAX_CONTEXT, False),
    ("ssm.conv_kernel", MAX_DIM, False),
    ("ssm.inner_size", MAX_DIM, False),
    ("ssm.state_size", MAX_DIM, False),
    ("ssm.group_count", MAX_DIM, False),
    ("ssm.time_step_rank", MAX_DIM, False),
    ("wkv.head_size", MAX_DIM, False),
    ("token_shift_count", MAX_DIM, False),
    ("shortconv.l_cache", MAX_DIM, False),
    ("kda.head_dim", MAX_DIM, False),
    ("target_hidden_size", MAX_DIM, False),
    ("block_size", MAX_DIM, False),
    ("selector_top_k", MAX_DIM, False),
)


def check_hparams(path: Path | str, meta: Metadata) -> None:
    """Refuse every count and size inspection uses that llama.cpp would refuse, before anything loops on it."""
    if meta.arch is None:
        return
    arch = meta.arch
    block_count = meta.checked_int(f"{arch}.block_count", path, 0, MAX_LAYERS)
    meta.checked_int(f"{arch}.nextn_predict_layers", path, 0, MAX_LAYERS if block_count is None else block_count)
    for suffix, high, per_layer in _HPARAMS:
        if per_layer:
            meta.check_int_or_layers(f"{arch}.{suffix}", path, high, block_count)
        else:
            meta.checked_int(f"{arch}.{suffix}", path, 0, high)
    expert_count = meta.arch_int("expert_count")
    used = meta.arch_int_or_layers("expert_used_count")
    top = max(used) if isinstance(used, tuple) and used else used
    if expert_count is not None and isinstance(top, int) and top > expert_count:
        raise validation_error(
            path, f"{arch}.expert_used_count {top} exceeds expert_count {expert_count}", HINT_METADATA
        )
    target = meta.entries.get(f"{arch}.target_layers")
    if target is not None:
        values = target.value if isinstance(target.value, list) else None
        if (
            target.vtype != int(VT.ARRAY)
            or values is None
            or len(values) > MAX_LAYERS
            or not all(isinstance(v, int) and 0 <= v < MAX_LAYERS for v in values)
        ):
            raise validation_error(
                path,
                f"{arch}.target_layers must be an array of at most {MAX_LAYERS} layer indices below {MAX_LAYERS} "
                f"but is {value_type_name(target)}" + (f" of {target.count}" if target.vtype == int(VT.ARRAY) else ""),
                HINT_METADATA,
            )
    for suffix in ("attention.recurrent_layers", "attention.sliding_window_pattern"):
        entry = meta.entries.get(f"{arch}.{suffix}")
        if entry is not None and entry.vtype == int(VT.ARRAY) and entry.count > MAX_LAYERS:
            raise validation_error(
                path, f"{arch}.{suffix} has {entry.count} entries (at most {MAX_LAYERS})", HINT_METADATA
            )
