"""Human-readable text for GGUFInfo and MemoryEstimate: describe() (``llmtui info``), format_bytes, format_count."""

from __future__ import annotations

from dataclasses import asdict

from engine_ext.gguf._facts import GGUFInfo
from engine_ext.gguf._layers import LAYER_LEGEND
from engine_ext.gguf._memory import MemoryEstimate
from engine_ext.gguf._metadata import IntOrLayers
from engine_ext.gguf._reader import guarded, some_items
from engine_ext.untrusted_text import shown


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TiB"


def format_count(n: int) -> str:
    """``7_615_616_512`` -> ``"7.62 B"``."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {suffix}"
    return str(n)


def _fmt_layers(value: IntOrLayers | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else "[" + ", ".join(str(v) for v in value) + "]"


def describe(info: GGUFInfo, estimate: MemoryEstimate | None = None) -> list[str]:
    """Lines for ``llmtui info``: architecture, size, quant, layers, experts, MTP, draft keys, memory."""
    return guarded(info.path, lambda: _describe(info, estimate))


def _describe(info: GGUFInfo, estimate: MemoryEstimate | None) -> list[str]:
    lines: list[str] = []

    def add(label: str, text: str) -> None:
        lines.append(shown(f"{label:<12}{text}"))  # names, keys and paths from the file, its controls visible

    size = format_bytes(info.total_size)
    add("File", f"{info.path} ({size}, GGUF v{info.gguf_version})")
    if info.split_count > 1:
        state = "all present" if not info.split_missing else "missing: " + some_items(info.split_missing)
        add("Split", f"{info.split_count} shards ({state})")
    add("Model", f"{info.architecture or '(no architecture)'}" + (f'  "{info.name}"' if info.name else ""))
    weights = format_bytes(info.weights_bytes)
    add("Params", f"{format_count(info.n_params)} in {info.n_tensors} tensors ({weights})")
    ftype = ""
    if info.file_type is not None and not info.file_type_guessed:
        ftype = f" (general.file_type {info.file_type})"
    add("Quant", info.file_type_label + ftype)
    types = ", ".join(f"{name}×{count}" for name, count in info.tensor_types.items())
    add("Tensors", types or "none")
    if info.context_length is not None:
        add("Context", f"{info.context_length} tokens (trained)")
    if info.block_count is not None:
        add("Layers", f"{info.block_count} blocks: {info.layout}  ({LAYER_LEGEND})")
    dims = []
    if info.embedding_length is not None:
        dims.append(f"embd {info.embedding_length}")
    if info.head_count is not None:
        dims.append(f"heads {_fmt_layers(info.head_count)}")
    if info.head_count_kv is not None and info.head_count_kv != info.head_count:
        dims.append(f"kv heads {_fmt_layers(info.head_count_kv)}")
    if info.key_length:
        v_len = "" if info.value_length == info.key_length else f"/{info.value_length}"
        dims.append(f"head dim {info.key_length}{v_len}")
    if info.feed_forward_length is not None:
        dims.append(f"ffn {_fmt_layers(info.feed_forward_length)}")
    if info.sliding_window:
        n_swa = sum(info.swa_layers or ())
        where = f" on {n_swa} layers" if info.swa_layers else ""
        dims.append(f"sliding window {info.sliding_window}{where}")
    if info.is_mla:
        dims.append("MLA")
    if dims:
        add("Dims", ", ".join(dims))
    if info.recurrent_type:
        s = info.ssm
        parts = [f"{k} {v}" for k, v in asdict(s).items() if v is not None]
        add("Recurrent", f"{info.recurrent_type}" + (f": {', '.join(parts)}" if parts else ""))
    if info.expert_count:
        experts = [f"{info.expert_count} experts"]
        experts.append(f"expert_used_count {_fmt_layers(info.expert_used_count)}")
        if info.expert_feed_forward_length is not None:
            experts.append(f"expert_feed_forward_length {_fmt_layers(info.expert_feed_forward_length)}")
        if info.expert_shared_count:
            experts.append(f"{info.expert_shared_count} shared")
        if info.expert_shared_feed_forward_length:
            experts.append(f"shared ffn {info.expert_shared_feed_forward_length}")
        add("Experts", "; ".join(experts))
        if info.moe_variant:
            add("MoE", info.moe_variant)
    if info.n_layer_nextn:
        kind = "in-model NextN head"
        if info.is_mtp_sidecar:
            kind = "mtp- sidecar: NextN head only, no trunk tensors"
        add("MTP", f"{info.n_layer_nextn} head(s), {kind}")
    d = info.draft
    if d.draft_type:
        parts = [d.draft_type]
        for label, value in (
            ("target_layers", list(d.target_layers) if d.target_layers is not None else None),
            ("target_hidden_size", d.target_hidden_size),
            ("block_size", d.block_size),
            ("mask_token_id", d.mask_token_id if d.draft_type != "draft-mtp" else None),
            ("sample_from_anchor", d.sample_from_anchor),
            ("has_confidence_head", d.has_confidence_head),
            ("causal", d.causal_attention),
            ("selector_top_k", d.selector_top_k),
        ):
            if value is not None:
                parts.append(f"{label} {value}")
        add("Draft", ", ".join(parts))
    tok = [info.tokenizer_model or "no tokenizer"]
    if info.tokenizer_pre:
        tok.append(f"pre {info.tokenizer_pre}")
    if info.vocab_size is not None:
        tok.append(f"vocab {info.vocab_size}")
    if info.bos_token_id is not None:
        tok.append(f"bos {info.bos_token_id}")
    if info.eos_token_id is not None:
        tok.append(f"eos {info.eos_token_id}")
    add("Tokenizer", ", ".join(tok))
    template = "yes" if info.has_chat_template else "no"
    if info.chat_template_names:
        template += " (named: " + ", ".join(info.chat_template_names) + ")"
    add("Chat tmpl", template)
    if estimate is not None:
        e = estimate
        add(
            "Memory",
            f"at {e.n_ctx} ctx: weights {format_bytes(e.weights_bytes)} + KV {format_bytes(e.kv_bytes)}"
            + (f" + recurrent {format_bytes(e.recurrent_bytes)}" if e.recurrent_bytes else "")
            + f" + compute ~{format_bytes(e.compute_bytes)} = {format_bytes(e.total_bytes)}",
        )
        for note in e.notes:
            add("", note)
    for warning in info.warnings:
        add("Warning", warning)
    return lines
