"""Memory estimates from a GGUFInfo: weights, KV cache, recurrent state and compute at a context length."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine_ext.gguf._facts import GGUFInfo, json_safe
from engine_ext.gguf._layers import HYBRID_ARCHS
from engine_ext.gguf._metadata import per_layer_values
from engine_ext.gguf._reader import guarded


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes needed to run a model at a context length; see estimate_memory() for the formulas."""

    n_ctx: int
    n_ctx_cells: int
    n_seq: int
    kv_type_bytes: float
    weights_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    compute_bytes: int
    total_bytes: int
    n_kv_layers: int
    n_recurrent_layers: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        out = json_safe(asdict(self))
        assert isinstance(out, dict)
        return out


def _pad(x: int, n: int) -> int:
    return -(-x // n) * n


def _recurrent_row_floats(info: GGUFInfo) -> tuple[int, int]:
    """llama_hparams::n_embd_r() and n_embd_s(): conv/shift state and recurrent state, in floats per layer."""
    s = info.ssm
    n_embd = info.embedding_length or 0
    n_head0 = per_layer_values(info.head_count, 1)[0]
    if s.wkv_head_size:  # RWKV
        return (s.token_shift_count or 2) * n_embd, n_embd * s.wkv_head_size
    if s.kda_head_dim:  # Kimi delta attention
        conv = (s.conv_kernel - 1) if s.conv_kernel else 3
        return 3 * conv * n_head0 * s.kda_head_dim, s.kda_head_dim * s.kda_head_dim * n_head0
    d_inner, d_state, groups = s.inner_size or 0, s.state_size or 0, s.group_count or 0
    if s.shortconv_l_cache:  # LFM2
        return n_embd * (s.shortconv_l_cache - 1), d_state * d_inner
    # mamba/mamba2 and gated delta net (d_inner = S*Hv, groups = Hk, state = S: conv (2kd+vd), state S*S*Hv)
    conv = (s.conv_kernel - 1) if s.conv_kernel else 0
    return conv * (d_inner + 2 * groups * d_state), d_state * d_inner


def kv_bytes_per_layer(info: GGUFInfo, cells: int, *, kv_type_bytes: float = 2.0, n_ubatch: int = 512) -> list[float]:
    """KV cache bytes of each block at ``cells`` cache cells (0 for blocks without attention); see estimate_memory."""
    kinds = info.layer_kinds
    n_layers = len(kinds)
    hybrid = (info.architecture or "") in HYBRID_ARCHS
    kv_heads = per_layer_values(info.head_count_kv, n_layers)
    k_len, v_len = info.key_length or 0, info.value_length or 0
    swa = info.swa_layers or ()
    swa_cells = min(cells, _pad((info.sliding_window or 0) + n_ubatch, 256))
    out = [0.0] * n_layers
    for il, kind in enumerate(kinds):
        if info.is_mtp_sidecar:
            has_kv = kind == "nextn"
        else:
            has_kv = "attention" in kind or (kind == "nextn" and not hybrid)
        if not has_kv or kv_heads[il] <= 0:
            continue
        is_swa = il < len(swa) and swa[il]
        k = (info.key_length_swa or k_len) if is_swa else k_len
        v = 0 if info.is_mla else ((info.value_length_swa or v_len) if is_swa else v_len)
        out[il] = (swa_cells if is_swa else cells) * kv_heads[il] * (k + v) * kv_type_bytes
    return out


def recurrent_bytes_per_layer(info: GGUFInfo, n_seq: int = 1, n_rs_seq: int = 0) -> int:
    """Recurrent-state bytes of one recurrent block (F32 conv + state rows); see estimate_memory."""
    r_floats, s_floats = _recurrent_row_floats(info)
    return (r_floats + s_floats) * 4 * max(1, n_seq) * (1 + max(0, n_rs_seq))


def estimate_memory(
    info: GGUFInfo,
    n_ctx: int,
    *,
    kv_type_bytes: float = 2.0,
    n_seq: int = 1,
    n_rs_seq: int = 0,
    n_ubatch: int = 512,
    flash_attn: bool = False,
) -> MemoryEstimate:
    """Estimate host+device bytes for weights, KV cache, recurrent state and compute at ``n_ctx``.

    - weights: the tensor data size (all shards).
    - KV cache: cells = n_ctx padded to 256 (shared by the ``n_seq`` sequences); for every attention layer
      ``cells * n_head_kv(il) * (key_length + value_length) * kv_type_bytes`` (MLA: K only). Hybrid models
      count trunk attention layers only; plain transformers count every block, NextN included, as llama.cpp's
      KV cache does; an ``mtp-`` sidecar counts its NextN blocks only (its MTP context's cache). Sliding-window
      layers hold ``min(cells, pad256(window + n_ubatch))`` cells.
    - recurrent state (F32): per recurrent layer ``(n_embd_r + n_embd_s) * 4 * n_seq * (1 + n_rs_seq)`` with
      mamba2/GDN ``n_embd_r = (d_conv-1) * (d_inner + 2*G*N)`` and ``n_embd_s = N * d_inner`` (GDN: N = S,
      d_inner = S*Hv, G = Hk, i.e. conv ``(d_conv-1)*(2kd+vd)`` and state ``S*S*Hv``), as llama-hparams.cpp.
    - compute: llama.cpp's graph buffer for one ubatch, ``max(layer, output)`` with layer
      ``scores + n_ub*4*(2*ff_max + n_embd)``, scores ``n_ub*cells*(n_head+1)*4`` (flash attention:
      ``n_ub*cells*2``), output ``n_ub*4*(n_vocab + 2*n_embd)``; ff_max covers ``n_ff_exp * n_expert_used``.
      Fitted to the CPU backend (within a few % on dense test models); other backends differ somewhat.
    """
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    return guarded(
        info.path,
        lambda: _estimate_memory(
            info,
            n_ctx,
            kv_type_bytes=kv_type_bytes,
            n_seq=n_seq,
            n_rs_seq=n_rs_seq,
            n_ubatch=n_ubatch,
            flash_attn=flash_attn,
        ),
    )


def _estimate_memory(
    info: GGUFInfo, n_ctx: int, *, kv_type_bytes: float, n_seq: int, n_rs_seq: int, n_ubatch: int, flash_attn: bool
) -> MemoryEstimate:
    n_seq = max(1, n_seq)
    cells = _pad(n_ctx, 256)
    n_ub = min(n_ubatch, cells)
    kinds = info.layer_kinds
    n_layers = len(kinds)
    notes: list[str] = []
    sidecar = info.is_mtp_sidecar
    if sidecar:
        notes.append("mtp- sidecar: runs in an MTP context whose cache holds only the NextN block(s)")
    per_layer_kv = kv_bytes_per_layer(info, cells, kv_type_bytes=kv_type_bytes, n_ubatch=n_ubatch)
    kv_bytes = sum(per_layer_kv)
    n_kv_layers = sum(1 for b in per_layer_kv if b > 0)
    k_len = info.key_length or 0
    if n_layers and not k_len and n_kv_layers:
        notes.append("head size unknown: KV cache not estimated")

    n_recurrent = 0 if sidecar else sum(1 for k in kinds if "recurrent" in k)
    recurrent_bytes = n_recurrent * recurrent_bytes_per_layer(info, n_seq, n_rs_seq)
    if n_recurrent and info.architecture == "minimax-01":
        notes.append("minimax-01 linear-attention state is not estimated")

    n_embd = info.embedding_length or 0
    ff = per_layer_values(info.feed_forward_length, n_layers)
    ff_exp = per_layer_values(info.expert_feed_forward_length, n_layers)
    used = per_layer_values(info.expert_used_count, n_layers)
    ff_max = max([0, *ff, *(a * b for a, b in zip(ff_exp, used, strict=True))])
    n_head_max = max([0, *per_layer_values(info.head_count, n_layers)])
    # peak of the layer graph (KQ scores for all heads + KQ mask, F32; flash attention: an F16 mask) with the
    # FFN activations, or of the output head (logits) with two hidden-state buffers
    scores = n_ub * cells * (2 if flash_attn else (n_head_max + 1) * 4) if n_kv_layers else 0
    layer_peak = scores + n_ub * 4 * (2 * ff_max + n_embd)
    output_peak = n_ub * 4 * ((info.vocab_size or 0) + 2 * n_embd)
    compute_bytes = max(layer_peak, output_peak)

    total = info.weights_bytes + int(kv_bytes) + recurrent_bytes + compute_bytes
    return MemoryEstimate(
        n_ctx=n_ctx,
        n_ctx_cells=cells,
        n_seq=n_seq,
        kv_type_bytes=kv_type_bytes,
        weights_bytes=info.weights_bytes,
        kv_bytes=int(kv_bytes),
        recurrent_bytes=recurrent_bytes,
        compute_bytes=compute_bytes,
        total_bytes=total,
        n_kv_layers=n_kv_layers,
        n_recurrent_layers=n_recurrent,
        notes=tuple(notes),
    )
