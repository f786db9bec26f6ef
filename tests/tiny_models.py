"""Tiny random-weight GGUF models for tests.

Every model is written with the PyPI ``gguf`` package and loads and decodes with the
llama.cpp vendored by llama-cpp-python 0.3.36.  All kinds share one byte-level BPE
("gpt2") tokenizer and one chatml template, so drafts are vocab-compatible with
their targets and any text tokenizes.

Weights are F32, drawn from a numpy ``Generator`` seeded per tensor from
``(seed, family, tensor name)``.  Kinds of the same family therefore share identical
weights for identically named tensors: the trunk of ``qwen35_mtp`` equals
``qwen35``, and the ``qwen35_mtp_sidecar`` head equals the in-model head of
``qwen35_mtp`` (likewise ``nemotron_h_moe``/``nemotron_h_moe_mtp``).

Tensor shapes in this module are written in ggml order ``{ne0, ne1, ...}``; the
numpy arrays handed to gguf have the reversed shape.  See
``/work/shared/reference/llama-cpp-notes.md`` section 6 for the recipes.
"""

from __future__ import annotations

import contextvars
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGUFWriter

__all__ = [
    "DRAFT_BLOCK_SIZE",
    "DRAFT_TARGET_LAYERS",
    "EAGLE3_TARGET_LAYERS",
    "NEMOTRON_EXPERT_FF",
    "NEMOTRON_EXPERT_FF_MTP",
    "NEMOTRON_EXPERT_USED",
    "NEMOTRON_EXPERT_USED_MTP",
    "N_EMBD",
    "N_VOCAB",
    "TINY_ARCH",
    "TINY_CHAT_TEMPLATE",
    "TINY_FILE_NAMES",
    "TINY_KINDS",
    "TINY_SPECIAL_TOKEN_IDS",
    "TINY_VOCAB",
    "write_all",
    "write_eagle3_draft",
    "write_tiny_embedder",
    "write_tiny_model",
]

F32Array = npt.NDArray[np.float32]

TINY_KINDS: tuple[str, ...] = (
    "llama",
    "qwen3",
    "qwen35",
    "qwen35_mtp",
    "qwen35_mtp_sidecar",
    "qwen3next",
    "nemotron_h_moe",
    "nemotron_h_moe_mtp",
    "dflash",
    "dspark",
    "eagle3",
)

#: ``general.architecture`` of each kind.
TINY_ARCH: dict[str, str] = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen35": "qwen35",
    "qwen35_mtp": "qwen35",
    "qwen35_mtp_sidecar": "qwen35",
    "qwen3next": "qwen3next",
    "nemotron_h_moe": "nemotron_h_moe",
    "nemotron_h_moe_mtp": "nemotron_h_moe",
    "dflash": "dflash",
    "dspark": "dflash",
    "eagle3": "eagle3",
}

#: File name of each kind inside the directory given to :func:`write_all`.
TINY_FILE_NAMES: dict[str, str] = {
    "llama": "tiny-llama.gguf",
    "qwen3": "tiny-qwen3.gguf",
    "qwen35": "tiny-qwen35.gguf",
    "qwen35_mtp": "tiny-qwen35-mtp.gguf",
    "qwen35_mtp_sidecar": "mtp-tiny-qwen35.gguf",
    "qwen3next": "tiny-qwen3next.gguf",
    "nemotron_h_moe": "tiny-nemotron-h-moe.gguf",
    "nemotron_h_moe_mtp": "tiny-nemotron-h-moe-mtp.gguf",
    "dflash": "dflash-tiny-llama.gguf",
    "dspark": "dspark-tiny-llama.gguf",
    "eagle3": "eagle3-tiny-llama.gguf",
}

TINY_CHAT_TEMPLATE: str = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ---------------------------------------------------------------------------
# Shared dimensions
# ---------------------------------------------------------------------------

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 128
CONTEXT_LENGTH = 4096
RMS_EPS = 1e-6
ROPE_FREQ_BASE = 10000.0

# qwen35 / qwen3next gated delta net: S = head dim, Hk key heads, Hv value heads.
GDN_STATE = 16
GDN_K_HEADS = 2
GDN_V_HEADS = 4
SSM_CONV_KERNEL = 4

# qwen3next MoE (every layer).
QWEN3NEXT_EXPERTS = 4
QWEN3NEXT_EXPERT_USED = 2
QWEN3NEXT_EXPERT_FF = 32
QWEN3NEXT_SHARED_FF = 32

# nemotron_h_moe: layer kinds [A, M, E, M, E] (+ MTP); mamba2 dims.
NEMOTRON_LAYOUT: tuple[str, ...] = ("A", "M", "E", "M", "E")
NEMOTRON_EXPERT_FF: list[int] = [0, 0, 32, 0, 48]
NEMOTRON_EXPERT_USED: list[int] = [2, 0, 2, 0, 3]
NEMOTRON_EXPERT_FF_MTP: list[int] = [*NEMOTRON_EXPERT_FF, 32]
NEMOTRON_EXPERT_USED_MTP: list[int] = [*NEMOTRON_EXPERT_USED, 2]
NEMOTRON_EXPERTS = 4
NEMOTRON_SHARED_FF = 32
NEMOTRON_DENSE_FF = 64  # feed_forward_length of MoE layers (only marks the layer kind)
MAMBA_INNER = 128
MAMBA_STATE = 16
MAMBA_HEADS = 8
MAMBA_GROUPS = 2

# dflash / dspark drafts for the tiny "llama" target.
DRAFT_TARGET_LAYERS: list[int] = [0, 1]
DRAFT_BLOCK_SIZE = 4
DRAFT_N_LAYER = 2
DSPARK_MARKOV_RANK = 8

# eagle3 draft for the tiny "llama" target: exactly 3 target layer ids, each < the target's 2 layers.
EAGLE3_TARGET_LAYERS: list[int] = [0, 1, 1]

# ---------------------------------------------------------------------------
# Shared tokenizer
# ---------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """Return GPT-2's reversible byte -> printable unicode character mapping."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_CHARS = _bytes_to_unicode()

# Merge rules (rank order); each product is also a vocab entry.
_MERGES: tuple[tuple[str, str], ...] = (
    ("Ġ", "t"),
    ("h", "e"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("Ġt", "he"),
    ("o", "n"),
    ("Ġ", "s"),
    ("r", "e"),
    ("a", "n"),
)

_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|mask|>",
)

#: Token texts: ids 0-255 are the byte-level characters of bytes 0-255 (id == byte value),
#: then the merge products, then the special tokens.
TINY_VOCAB: tuple[str, ...] = (
    *(_BYTE_CHARS[b] for b in range(256)),
    *(a + b for a, b in _MERGES),
    *_SPECIAL_TOKENS,
)
N_VOCAB = len(TINY_VOCAB)

#: Ids of the special tokens, by text.
TINY_SPECIAL_TOKEN_IDS: dict[str, int] = {t: TINY_VOCAB.index(t) for t in _SPECIAL_TOKENS}

_TOKEN_TYPE_NORMAL = 1
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4
# <think>/</think> are user-defined (as in Qwen3 GGUFs): always parsed and rendered as text.
_USER_DEFINED_TOKENS = frozenset({"<think>", "</think>"})


def _token_type(text: str) -> int:
    """Return the gguf token type of one vocab entry."""
    if text in _USER_DEFINED_TOKENS:
        return _TOKEN_TYPE_USER_DEFINED
    if text in TINY_SPECIAL_TOKEN_IDS:
        return _TOKEN_TYPE_CONTROL
    return _TOKEN_TYPE_NORMAL


_fim_tokens: contextvars.ContextVar[bool] = contextvars.ContextVar("tiny_fim_tokens", default=False)
_chat_template: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tiny_chat_template", default=TINY_CHAT_TEMPLATE
)


def _add_tokenizer(w: GGUFWriter) -> None:
    """Write the shared byte-level BPE tokenizer and chat template."""
    ids = TINY_SPECIAL_TOKEN_IDS
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", list(TINY_VOCAB))
    w.add_array("tokenizer.ggml.token_type", [_token_type(t) for t in TINY_VOCAB])
    w.add_array("tokenizer.ggml.merges", [f"{a} {b}" for a, b in _MERGES])
    w.add_uint32("tokenizer.ggml.bos_token_id", ids["<|endoftext|>"])
    w.add_uint32("tokenizer.ggml.eos_token_id", ids["<|im_end|>"])
    w.add_uint32("tokenizer.ggml.eot_token_id", ids["<|im_end|>"])
    w.add_uint32("tokenizer.ggml.padding_token_id", ids["<|endoftext|>"])
    w.add_uint32("tokenizer.ggml.mask_token_id", ids["<|mask|>"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    if _fim_tokens.get():  # fill in the middle: three special tokens named as FIM's prefix, suffix and middle
        w.add_uint32("tokenizer.ggml.fim_pre_token_id", ids["<think>"])
        w.add_uint32("tokenizer.ggml.fim_suf_token_id", ids["</think>"])
        w.add_uint32("tokenizer.ggml.fim_mid_token_id", ids["<|mask|>"])
    template = _chat_template.get()
    if template is not None:
        w.add_string("tokenizer.chat_template", template)


# ---------------------------------------------------------------------------
# Tensor helpers
# ---------------------------------------------------------------------------


class _Tensors:
    """An ordered set of named F32 tensors with per-name deterministic random values."""

    def __init__(self, family: str, seed: int) -> None:
        self.family = family
        self.seed = seed
        self.data: dict[str, F32Array] = {}

    def _rng(self, name: str) -> np.random.Generator:
        """Return a generator seeded from (seed, family, name)."""
        return np.random.default_rng([self.seed, zlib.crc32(f"{self.family}/{name}".encode())])

    def _put(self, name: str, value: npt.NDArray[np.floating]) -> None:
        """Store one tensor, refusing duplicates."""
        if name in self.data:
            raise ValueError(f"duplicate tensor {name!r}")
        self.data[name] = np.ascontiguousarray(value, dtype=np.float32)

    def normal(self, name: str, ggml_shape: Sequence[int], std: float = 0.05, mean: float = 0.0) -> None:
        """Add a random-normal tensor with the given ggml shape."""
        self._put(name, mean + std * self._rng(name).standard_normal(tuple(reversed(ggml_shape))))

    def norm(self, name: str, ggml_shape: Sequence[int]) -> None:
        """Add a norm weight close to 1."""
        self.normal(name, ggml_shape, std=0.02, mean=1.0)

    def negative(self, name: str, ggml_shape: Sequence[int]) -> None:
        """Add a strictly negative tensor (SSM ``A`` decay parameters)."""
        self._put(name, -np.exp(0.1 * self._rng(name).standard_normal(tuple(reversed(ggml_shape)))))

    def without_prefixes(self, prefixes: Sequence[str]) -> dict[str, F32Array]:
        """Return the tensors whose names start with none of ``prefixes``."""
        return {k: v for k, v in self.data.items() if not k.startswith(tuple(prefixes))}


def _add_embeddings(t: _Tensors, *, output: bool = True) -> None:
    """Add token_embd, output_norm and (optionally) an untied output head."""
    t.normal("token_embd.weight", (N_EMBD, N_VOCAB), std=0.1)
    t.norm("output_norm.weight", (N_EMBD,))
    if output:
        t.normal("output.weight", (N_EMBD, N_VOCAB), std=0.1)


def _add_attention(
    t: _Tensors,
    p: str,
    *,
    n_head: int = N_HEAD,
    n_head_kv: int = N_HEAD_KV,
    q_factor: int = 1,
    qk_norm: bool = False,
) -> None:
    """Add attn_q/k/v/output (q widened by ``q_factor`` for gated attention) and optional q/k norms."""
    t.normal(f"{p}.attn_q.weight", (N_EMBD, HEAD_DIM * n_head * q_factor))
    t.normal(f"{p}.attn_k.weight", (N_EMBD, HEAD_DIM * n_head_kv))
    t.normal(f"{p}.attn_v.weight", (N_EMBD, HEAD_DIM * n_head_kv))
    t.normal(f"{p}.attn_output.weight", (HEAD_DIM * n_head, N_EMBD))
    if qk_norm:
        t.norm(f"{p}.attn_q_norm.weight", (HEAD_DIM,))
        t.norm(f"{p}.attn_k_norm.weight", (HEAD_DIM,))


def _add_swiglu_ffn(t: _Tensors, p: str, n_ff: int = N_FF) -> None:
    """Add a dense gated FFN (ffn_gate/up/down)."""
    t.normal(f"{p}.ffn_gate.weight", (N_EMBD, n_ff))
    t.normal(f"{p}.ffn_up.weight", (N_EMBD, n_ff))
    t.normal(f"{p}.ffn_down.weight", (n_ff, N_EMBD))


def _add_experts(t: _Tensors, p: str, n_expert: int, n_ff_exp: int, *, gated: bool) -> None:
    """Add a routed-expert bank: router, (gate,) up and down expert tensors."""
    t.normal(f"{p}.ffn_gate_inp.weight", (N_EMBD, n_expert))
    if gated:
        t.normal(f"{p}.ffn_gate_exps.weight", (N_EMBD, n_ff_exp, n_expert))
    t.normal(f"{p}.ffn_up_exps.weight", (N_EMBD, n_ff_exp, n_expert))
    t.normal(f"{p}.ffn_down_exps.weight", (n_ff_exp, N_EMBD, n_expert))


def _add_shared_expert(t: _Tensors, p: str, n_ff: int, *, gated: bool) -> None:
    """Add a shared expert (ffn_{gate,}up/down_shexp)."""
    if gated:
        t.normal(f"{p}.ffn_gate_shexp.weight", (N_EMBD, n_ff))
    t.normal(f"{p}.ffn_up_shexp.weight", (N_EMBD, n_ff))
    t.normal(f"{p}.ffn_down_shexp.weight", (n_ff, N_EMBD))


def _add_gdn(t: _Tensors, p: str, *, fused_ba: bool) -> None:
    """Add a gated-delta-net (linear attention) mixer; ``fused_ba`` selects qwen3next's ssm_ba."""
    key_dim = GDN_STATE * GDN_K_HEADS
    value_dim = GDN_STATE * GDN_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    t.normal(f"{p}.attn_qkv.weight", (N_EMBD, conv_dim))
    t.normal(f"{p}.attn_gate.weight", (N_EMBD, value_dim))
    t.normal(f"{p}.ssm_conv1d.weight", (SSM_CONV_KERNEL, conv_dim), std=0.2)
    t.normal(f"{p}.ssm_dt.bias", (GDN_V_HEADS,), std=0.1)
    t.negative(f"{p}.ssm_a", (GDN_V_HEADS,))
    if fused_ba:
        t.normal(f"{p}.ssm_ba.weight", (N_EMBD, 2 * GDN_V_HEADS))
    else:
        t.normal(f"{p}.ssm_beta.weight", (N_EMBD, GDN_V_HEADS))
        t.normal(f"{p}.ssm_alpha.weight", (N_EMBD, GDN_V_HEADS))
    t.norm(f"{p}.ssm_norm.weight", (GDN_STATE,))
    t.normal(f"{p}.ssm_out.weight", (value_dim, N_EMBD))


def _add_mamba2(t: _Tensors, p: str) -> None:
    """Add a mamba2 mixer (nemotron_h)."""
    d_xbc = MAMBA_INNER + 2 * MAMBA_GROUPS * MAMBA_STATE
    t.normal(f"{p}.ssm_in.weight", (N_EMBD, 2 * MAMBA_INNER + 2 * MAMBA_GROUPS * MAMBA_STATE + MAMBA_HEADS))
    t.normal(f"{p}.ssm_conv1d.weight", (SSM_CONV_KERNEL, d_xbc), std=0.2)
    t.normal(f"{p}.ssm_conv1d.bias", (d_xbc,), std=0.02)
    t.normal(f"{p}.ssm_dt.bias", (MAMBA_HEADS,), std=0.1)
    t.negative(f"{p}.ssm_a", (1, MAMBA_HEADS))
    t.normal(f"{p}.ssm_d", (1, MAMBA_HEADS), std=0.1, mean=1.0)
    t.norm(f"{p}.ssm_norm.weight", (MAMBA_INNER // MAMBA_GROUPS, MAMBA_GROUPS))
    t.normal(f"{p}.ssm_out.weight", (MAMBA_INNER, N_EMBD))


def _add_nextn(t: _Tensors, p: str, *, shared_head_norm: bool) -> None:
    """Add the NextN/MTP input-fusion tensors (eh_proj, enorm, hnorm[, shared_head_norm])."""
    t.normal(f"{p}.nextn.eh_proj.weight", (2 * N_EMBD, N_EMBD))
    t.norm(f"{p}.nextn.enorm.weight", (N_EMBD,))
    t.norm(f"{p}.nextn.hnorm.weight", (N_EMBD,))
    if shared_head_norm:
        t.norm(f"{p}.nextn.shared_head_norm.weight", (N_EMBD,))


# ---------------------------------------------------------------------------
# Metadata helpers
# ---------------------------------------------------------------------------


def _add_base_hparams(
    w: GGUFWriter,
    arch: str,
    name: str,
    *,
    block_count: int,
    n_ff: int | list[int] = N_FF,
    n_head: int | list[int] = N_HEAD,
    n_head_kv: int | list[int] = N_HEAD_KV,
    rms_eps: bool = True,
    rope: bool = True,
) -> None:
    """Write general.* and the generic {arch}.* hyperparameters."""
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", 0)  # all F32
    w.add_uint32(f"{arch}.context_length", CONTEXT_LENGTH)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.block_count", block_count)
    w.add_uint32(f"{arch}.vocab_size", N_VOCAB)
    for key, value in (
        ("feed_forward_length", n_ff),
        ("attention.head_count", n_head),
        ("attention.head_count_kv", n_head_kv),
    ):
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
    if rms_eps:
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", RMS_EPS)
    if rope:
        w.add_float32(f"{arch}.rope.freq_base", ROPE_FREQ_BASE)
        w.add_uint32(f"{arch}.rope.dimension_count", HEAD_DIM)


def _add_gdn_hparams(w: GGUFWriter, arch: str, *, full_attention_interval: int) -> None:
    """Write the gated-delta-net ssm.* keys shared by qwen35 and qwen3next."""
    w.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV_KERNEL)
    w.add_uint32(f"{arch}.ssm.state_size", GDN_STATE)
    w.add_uint32(f"{arch}.ssm.group_count", GDN_K_HEADS)
    w.add_uint32(f"{arch}.ssm.time_step_rank", GDN_V_HEADS)
    w.add_uint32(f"{arch}.ssm.inner_size", GDN_STATE * GDN_V_HEADS)
    w.add_uint32(f"{arch}.full_attention_interval", full_attention_interval)


def _write_gguf(path: Path, arch: str, add_kv: Callable[[GGUFWriter], None], tensors: dict[str, F32Array]) -> Path:
    """Write one GGUF file: arch-specific KV, the shared tokenizer, then the tensors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(path, arch)
    try:
        add_kv(w)
        _add_tokenizer(w)
        for name, value in tensors.items():
            w.add_tensor(name, value)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------

_LLAMA_LAYERS = 2
_QWEN3_LAYERS = 2
_QWEN35_LAYERS = 4  # [GDN, attention, GDN, attention] with full_attention_interval=2
_QWEN3NEXT_LAYERS = 4
_FULL_ATTENTION_INTERVAL = 2


def _build_llama(path: Path, seed: int, *, name: str = "tiny-llama", pooling: int | None = None) -> Path:
    """Write a 2-layer llama (GQA attention + SwiGLU FFN, untied head); `pooling` writes llama.pooling_type."""
    arch = "llama"
    t = _Tensors("llama", seed)
    _add_embeddings(t)
    for i in range(_LLAMA_LAYERS):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        _add_attention(t, p)
        t.norm(f"{p}.ffn_norm.weight", (N_EMBD,))
        _add_swiglu_ffn(t, p)

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, name, block_count=_LLAMA_LAYERS)
        if pooling is not None:
            w.add_uint32(f"{arch}.pooling_type", pooling)

    return _write_gguf(path, arch, kv, t.data)


def _build_qwen3(path: Path, seed: int, *, rerank: bool = False) -> Path:
    """Write a 2-layer qwen3 (llama + per-head q/k RMS norms); `rerank`: rank pooling and a yes/no head (cls.output),
    as llama.cpp converts Qwen3-Reranker."""
    arch = "qwen3"
    t = _Tensors("qwen3", seed)
    _add_embeddings(t)
    for i in range(_QWEN3_LAYERS):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        _add_attention(t, p, qk_norm=True)
        t.norm(f"{p}.ffn_norm.weight", (N_EMBD,))
        _add_swiglu_ffn(t, p)
    if rerank:
        t.normal("cls.output.weight", (N_EMBD, 2), std=0.2)

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, "tiny-qwen3-reranker" if rerank else "tiny-qwen3", block_count=_QWEN3_LAYERS)
        if rerank:
            w.add_uint32(f"{arch}.pooling_type", 4)  # LLAMA_POOLING_TYPE_RANK
            w.add_array(f"{arch}.classifier.output_labels", ["yes", "no"])

    return _write_gguf(path, arch, kv, t.data)


def write_tiny_embedder(path: Path, *, seed: int = 0, rerank: bool = False) -> Path:
    """An embedding model (the tiny llama with mean pooling named in its GGUF) or, with `rerank`, a reranker (the
    tiny qwen3 with rank pooling and a two-label head); no chat template."""
    token = _chat_template.set(None)
    try:
        if rerank:
            return _build_qwen3(Path(path), seed, rerank=True)
        return _build_llama(Path(path), seed, name="tiny-embedder", pooling=1)  # LLAMA_POOLING_TYPE_MEAN
    finally:
        _chat_template.reset(token)


def _qwen35_tensors(seed: int, *, mtp: bool) -> _Tensors:
    """Return the tensors of the qwen35 trunk, plus the MTP block when ``mtp``."""
    t = _Tensors("qwen35", seed)
    _add_embeddings(t)
    for i in range(_QWEN35_LAYERS):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        t.norm(f"{p}.post_attention_norm.weight", (N_EMBD,))
        if (i + 1) % _FULL_ATTENTION_INTERVAL == 0:
            _add_attention(t, p, q_factor=2, qk_norm=True)
        else:
            _add_gdn(t, p, fused_ba=False)
        _add_swiglu_ffn(t, p)
    if mtp:
        p = f"blk.{_QWEN35_LAYERS}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        t.norm(f"{p}.post_attention_norm.weight", (N_EMBD,))
        _add_attention(t, p, q_factor=2, qk_norm=True)
        _add_swiglu_ffn(t, p)
        _add_nextn(t, p, shared_head_norm=True)
    return t


def _write_qwen35(path: Path, seed: int, *, mtp: bool, sidecar: bool) -> Path:
    """Write a qwen35 hybrid (GDN + gated attention); optionally with MTP head, or only the head."""
    arch = "qwen35"
    t = _qwen35_tensors(seed, mtp=mtp or sidecar)
    tensors = t.without_prefixes([f"blk.{i}." for i in range(_QWEN35_LAYERS)]) if sidecar else t.data
    n_nextn = 1 if (mtp or sidecar) else 0
    name = "mtp-tiny-qwen35" if sidecar else ("tiny-qwen35-mtp" if mtp else "tiny-qwen35")

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, name, block_count=_QWEN35_LAYERS + n_nextn)
        w.add_array(f"{arch}.rope.dimension_sections", [HEAD_DIM // 8, HEAD_DIM // 8, HEAD_DIM // 4, 0])
        _add_gdn_hparams(w, arch, full_attention_interval=_FULL_ATTENTION_INTERVAL)
        if n_nextn:
            w.add_uint32(f"{arch}.nextn_predict_layers", n_nextn)

    return _write_gguf(path, arch, kv, tensors)


def _build_qwen35(path: Path, seed: int) -> Path:
    """Write a 4-layer qwen35 without MTP."""
    return _write_qwen35(path, seed, mtp=False, sidecar=False)


def _build_qwen35_mtp(path: Path, seed: int) -> Path:
    """Write the 4-layer qwen35 plus one in-model MTP (NextN) block."""
    return _write_qwen35(path, seed, mtp=True, sidecar=False)


def _build_qwen35_mtp_sidecar(path: Path, seed: int) -> Path:
    """Write the "mtp-" sidecar: the qwen35_mtp head alone (embeddings, head, blk.4), no trunk."""
    return _write_qwen35(path, seed, mtp=False, sidecar=True)


def _build_qwen3next(path: Path, seed: int) -> Path:
    """Write a 4-layer qwen3next (GDN + gated attention, MoE with shared expert on every layer)."""
    arch = "qwen3next"
    t = _Tensors("qwen3next", seed)
    _add_embeddings(t)
    for i in range(_QWEN3NEXT_LAYERS):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        t.norm(f"{p}.post_attention_norm.weight", (N_EMBD,))
        if (i + 1) % _FULL_ATTENTION_INTERVAL == 0:
            _add_attention(t, p, q_factor=2, qk_norm=True)
        else:
            _add_gdn(t, p, fused_ba=True)
        _add_experts(t, p, QWEN3NEXT_EXPERTS, QWEN3NEXT_EXPERT_FF, gated=True)
        t.normal(f"{p}.ffn_gate_inp_shexp.weight", (N_EMBD,))
        _add_shared_expert(t, p, QWEN3NEXT_SHARED_FF, gated=True)

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, "tiny-qwen3next", block_count=_QWEN3NEXT_LAYERS)
        _add_gdn_hparams(w, arch, full_attention_interval=_FULL_ATTENTION_INTERVAL)
        w.add_uint32(f"{arch}.expert_count", QWEN3NEXT_EXPERTS)
        w.add_uint32(f"{arch}.expert_used_count", QWEN3NEXT_EXPERT_USED)
        w.add_uint32(f"{arch}.expert_feed_forward_length", QWEN3NEXT_EXPERT_FF)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", QWEN3NEXT_SHARED_FF)

    return _write_gguf(path, arch, kv, t.data)


def _add_nemotron_moe(t: _Tensors, p: str, n_ff_exp: int) -> None:
    """Add a nemotron_h MoE FFN (ReLU^2 experts without gate, router bias, shared expert)."""
    _add_experts(t, p, NEMOTRON_EXPERTS, n_ff_exp, gated=False)
    t.normal(f"{p}.exp_probs_b.bias", (NEMOTRON_EXPERTS,), std=0.02)
    _add_shared_expert(t, p, NEMOTRON_SHARED_FF, gated=False)


def _write_nemotron_h_moe(path: Path, seed: int, *, mtp: bool) -> Path:
    """Write a nemotron_h_moe with layer kinds [A, M, E, M, E] and per-layer expert arrays (+ MTP block)."""
    arch = "nemotron_h_moe"
    expert_ff = NEMOTRON_EXPERT_FF_MTP if mtp else NEMOTRON_EXPERT_FF
    expert_used = NEMOTRON_EXPERT_USED_MTP if mtp else NEMOTRON_EXPERT_USED
    t = _Tensors("nemotron_h_moe", seed)
    _add_embeddings(t)
    n_head: list[int] = []
    n_head_kv: list[int] = []
    n_ff: list[int] = []
    for i, kind in enumerate(NEMOTRON_LAYOUT):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        if kind == "A":
            _add_attention(t, p)
        elif kind == "M":
            _add_mamba2(t, p)
        else:
            _add_nemotron_moe(t, p, expert_ff[i])
        n_head.append(N_HEAD if kind == "A" else 0)
        n_head_kv.append(N_HEAD_KV if kind == "A" else 0)
        n_ff.append(NEMOTRON_DENSE_FF if kind == "E" else 0)
    if mtp:
        i = len(NEMOTRON_LAYOUT)
        p = f"blk.{i}"
        _add_nextn(t, p, shared_head_norm=True)
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        _add_attention(t, p)
        t.norm(f"{p}.post_attention_norm.weight", (N_EMBD,))
        _add_nemotron_moe(t, p, expert_ff[i])
        n_head.append(N_HEAD)
        n_head_kv.append(N_HEAD_KV)
        n_ff.append(NEMOTRON_DENSE_FF)
    name = "tiny-nemotron-h-moe-mtp" if mtp else "tiny-nemotron-h-moe"

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(
            w, arch, name, block_count=len(n_ff), n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, rope=False
        )
        w.add_float32(f"{arch}.attention.layer_norm_epsilon", 1e-5)
        w.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV_KERNEL)
        w.add_uint32(f"{arch}.ssm.inner_size", MAMBA_INNER)
        w.add_uint32(f"{arch}.ssm.state_size", MAMBA_STATE)
        w.add_uint32(f"{arch}.ssm.time_step_rank", MAMBA_HEADS)
        w.add_uint32(f"{arch}.ssm.group_count", MAMBA_GROUPS)
        w.add_uint32(f"{arch}.expert_count", NEMOTRON_EXPERTS)
        w.add_array(f"{arch}.expert_used_count", list(expert_used))
        w.add_array(f"{arch}.expert_feed_forward_length", list(expert_ff))
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", NEMOTRON_SHARED_FF)
        w.add_bool(f"{arch}.expert_weights_norm", True)
        w.add_float32(f"{arch}.expert_weights_scale", 1.0)
        if mtp:
            w.add_uint32(f"{arch}.nextn_predict_layers", 1)

    return _write_gguf(path, arch, kv, t.data)


def _build_nemotron_h_moe(path: Path, seed: int) -> Path:
    """Write the 5-layer nemotron_h_moe without MTP."""
    return _write_nemotron_h_moe(path, seed, mtp=False)


def _build_nemotron_h_moe_mtp(path: Path, seed: int) -> Path:
    """Write the 5-layer nemotron_h_moe plus one MTP block (attention + MoE)."""
    return _write_nemotron_h_moe(path, seed, mtp=True)


def _write_draft(path: Path, seed: int, *, dspark: bool) -> Path:
    """Write a dflash (or DSpark) draft for the tiny llama target; it has no token_embd/output of its own."""
    arch = "dflash"
    t = _Tensors("dspark" if dspark else "dflash", seed)
    t.normal("fc.weight", (len(DRAFT_TARGET_LAYERS) * N_EMBD, N_EMBD))
    t.norm("enc.output_norm.weight", (N_EMBD,))
    t.norm("output_norm.weight", (N_EMBD,))
    for i in range(DRAFT_N_LAYER):
        p = f"blk.{i}"
        t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
        _add_attention(t, p, qk_norm=True)
        t.norm(f"{p}.ffn_norm.weight", (N_EMBD,))
        _add_swiglu_ffn(t, p)
    if dspark:
        t.normal("markov_w1.weight", (DSPARK_MARKOV_RANK, N_VOCAB))
        t.normal("markov_w2.weight", (DSPARK_MARKOV_RANK, N_VOCAB))
        t.normal("conf_proj.weight", (N_EMBD + DSPARK_MARKOV_RANK, 1))
        t.normal("conf_proj.bias", (1,))
    name = "dspark-tiny-llama" if dspark else "dflash-tiny-llama"

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, name, block_count=DRAFT_N_LAYER)
        w.add_array(f"{arch}.target_layers", list(DRAFT_TARGET_LAYERS))
        w.add_uint32(f"{arch}.block_size", DRAFT_BLOCK_SIZE)
        if dspark:
            w.add_bool(f"{arch}.sample_from_anchor", True)
            w.add_bool(f"{arch}.has_confidence_head", True)

    return _write_gguf(path, arch, kv, t.data)


def _build_dflash(path: Path, seed: int) -> Path:
    """Write a 2-layer DFlash draft (block diffusion) for the tiny llama."""
    return _write_draft(path, seed, dspark=False)


def _build_dspark(path: Path, seed: int) -> Path:
    """Write a 2-layer DSpark draft (DFlash + Markov and confidence heads) for the tiny llama."""
    return _write_draft(path, seed, dspark=True)


def _write_eagle3(
    path: Path,
    seed: int,
    *,
    target_layers: Sequence[int] = tuple(EAGLE3_TARGET_LAYERS),
    target_hidden_size: int = N_EMBD,
) -> Path:
    """Write a one-layer EAGLE3 draft (src/models/eagle3.cpp); it borrows token_embd/output from its target."""
    arch = "eagle3"
    t = _Tensors("eagle3", seed)
    t.normal("fc.weight", (len(target_layers) * target_hidden_size, N_EMBD))
    t.norm("output_norm.weight", (N_EMBD,))
    p = "blk.0"
    t.norm(f"{p}.attn_norm.weight", (N_EMBD,))
    t.norm(f"{p}.attn_norm_2.weight", (N_EMBD,))
    # Attention reads [norm(token embedding), norm(g)]: twice the hidden size.
    t.normal(f"{p}.attn_q.weight", (2 * N_EMBD, HEAD_DIM * N_HEAD))
    t.normal(f"{p}.attn_k.weight", (2 * N_EMBD, HEAD_DIM * N_HEAD_KV))
    t.normal(f"{p}.attn_v.weight", (2 * N_EMBD, HEAD_DIM * N_HEAD_KV))
    t.normal(f"{p}.attn_output.weight", (HEAD_DIM * N_HEAD, N_EMBD))
    t.norm(f"{p}.ffn_norm.weight", (N_EMBD,))
    _add_swiglu_ffn(t, p)

    def kv(w: GGUFWriter) -> None:
        _add_base_hparams(w, arch, "eagle3-tiny-llama", block_count=1)
        w.add_array(f"{arch}.target_layers", list(target_layers))
        w.add_uint32(f"{arch}.target_hidden_size", target_hidden_size)

    return _write_gguf(path, arch, kv, t.data)


def _build_eagle3(path: Path, seed: int) -> Path:
    """Write a one-layer EAGLE3 draft for the tiny llama (target layers EAGLE3_TARGET_LAYERS)."""
    return _write_eagle3(path, seed)


def write_eagle3_draft(
    path: Path,
    *,
    target_layers: Sequence[int] = tuple(EAGLE3_TARGET_LAYERS),
    target_hidden_size: int = N_EMBD,
    seed: int = 0,
) -> Path:
    """An EAGLE3 draft with other target layers or target hidden size (e.g. to test refusals)."""
    return _write_eagle3(Path(path), seed, target_layers=target_layers, target_hidden_size=target_hidden_size)


_BUILDERS: dict[str, Callable[[Path, int], Path]] = {
    "llama": _build_llama,
    "qwen3": _build_qwen3,
    "qwen35": _build_qwen35,
    "qwen35_mtp": _build_qwen35_mtp,
    "qwen35_mtp_sidecar": _build_qwen35_mtp_sidecar,
    "qwen3next": _build_qwen3next,
    "nemotron_h_moe": _build_nemotron_h_moe,
    "nemotron_h_moe_mtp": _build_nemotron_h_moe_mtp,
    "dflash": _build_dflash,
    "dspark": _build_dspark,
    "eagle3": _build_eagle3,
}
assert tuple(_BUILDERS) == TINY_KINDS


def write_tiny_model(
    kind: str, path: Path, *, seed: int = 0, chat_template: str | None = TINY_CHAT_TEMPLATE, fim_tokens: bool = False
) -> Path:
    """Write the tiny model ``kind`` (one of :data:`TINY_KINDS`) to ``path`` and return ``path``.

    ``chat_template`` replaces the embedded chatml template; None writes no template at all. ``fim_tokens`` names
    three special tokens as the fill-in-the-middle ones.
    """
    try:
        builder = _BUILDERS[kind]
    except KeyError:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {TINY_KINDS}") from None
    token, fim = _chat_template.set(chat_template), _fim_tokens.set(fim_tokens)
    try:
        return builder(Path(path), seed)
    finally:
        _chat_template.reset(token)
        _fim_tokens.reset(fim)


def write_all(directory: Path) -> dict[str, Path]:
    """Write every kind into ``directory`` (names from :data:`TINY_FILE_NAMES`); return kind -> path."""
    directory = Path(directory)
    return {kind: write_tiny_model(kind, directory / TINY_FILE_NAMES[kind]) for kind in TINY_KINDS}
