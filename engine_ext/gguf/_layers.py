"""Which kind each block of a model is (attention, recurrent, MoE, NextN), as llama.cpp's load_arch_hparams() derives
it from the metadata; sliding-window layers; the architecture families this needs; the compact layout string."""

from __future__ import annotations

from collections.abc import Sequence

from engine_ext.gguf._metadata import IntOrLayers, Metadata, per_layer_values

# Architectures whose layer layout llama.cpp derives from metadata (src/models/*.cpp load_arch_hparams).
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
INTERVAL_HYBRID_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next", "qwen4exp", "minimax-01"})
_KV_ZERO_HYBRID_ARCHS = frozenset(
    {
        "bailingmoe3",
        "glm5-next",
        "granitehybrid",
        "jamba",
        "kimi-k3",
        "kimi-linear",
        "lfm2",
        "lfm2moe",
        "plamo2",
    }
)
NEMOTRON_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
HYBRID_ARCHS = (
    INTERVAL_HYBRID_ARCHS | _KV_ZERO_HYBRID_ARCHS | NEMOTRON_ARCHS | {"falcon-h1", "deepseek4"}
)  # llm_arch_is_hybrid
# fmt: off
RECURRENT_TYPE: dict[str, str] = {
    "mamba": "mamba", "jamba": "mamba", "mamba2": "mamba2", "nemotron_h": "mamba2",
    "nemotron_h_moe": "mamba2", "granitehybrid": "mamba2", "falcon-h1": "mamba2", "plamo2": "mamba2",
    "qwen35": "gated delta net", "qwen35moe": "gated delta net", "qwen3next": "gated delta net",
    "qwen4exp": "gated delta net",
    "rwkv6": "rwkv", "rwkv6qwen2": "rwkv", "rwkv7": "rwkv", "arwkv7": "rwkv", "lfm2": "short conv",
    "lfm2moe": "short conv", "kimi-linear": "kimi delta attention", "kimi-k3": "kimi delta attention",
    "glm5-next": "kimi delta attention", "minimax-01": "linear attention",
}
# fmt: on
# (pattern, dense_first) used by load_swa_pattern() when the file has no sliding_window_pattern array
# fmt: off
_SWA_DEFAULTS: dict[str, tuple[int, bool]] = {
    "afmoe": (4, False), "cohere2": (4, False), "cohere2moe": (4, True), "exaone-moe": (4, False),
    "exaone4": (4, False), "gemma-embedding": (6, False), "gemma2": (2, False), "gemma3": (6, False),
    "gemma3n": (5, False), "mellum": (4, False), "modern-bert": (3, True), "muse-glimmer": (4, False),
    "olmo2": (4, False), "gpt-oss": (2, False), "plamo3": (8, False), "smallthinker": (4, True),
}
# fmt: on

LAYER_LETTERS: dict[str, str] = {
    "attention": "A",
    "recurrent": "M",
    "moe": "E",
    "ffn": "F",
    "attention+moe": "AE",
    "recurrent+moe": "ME",
    "attention+recurrent": "AM",
    "nextn": "N",
}
LAYER_LEGEND = "A=attention M=recurrent E=MoE F=dense FFN"


def layout_string(kinds: Sequence[str]) -> str:
    """Letters for the trunk (periodic runs folded as ``(M M M A)×8``) plus ``+ N MTP`` for NextN blocks."""
    trunk = [LAYER_LETTERS.get(k, "?") for k in kinds if k != "nextn"]
    n_nextn = sum(1 for k in kinds if k == "nextn")
    if not trunk:
        text = ""
    elif len(trunk) <= 16:
        text = " ".join(trunk)
    else:
        text = _fold_layout(trunk)
    if n_nextn:
        text = f"{text} + {n_nextn} MTP" if text else f"{n_nextn} MTP"
    return text


def _fold_layout(letters: list[str]) -> str:
    n = len(letters)
    for period in range(1, 9):
        if n % period == 0 and letters == letters[:period] * (n // period):
            unit = " ".join(letters[:period])
            return f"{unit}×{n}" if period == 1 else f"({unit})×{n // period}"
    runs: list[str] = []
    i = 0
    while i < n:
        j = i
        while j < n and letters[j] == letters[i]:
            j += 1
        runs.append(letters[i] if j - i == 1 else f"{letters[i]}×{j - i}")
        i = j
    return " ".join(runs)


def _moe_layers(
    meta: Metadata, n_layers: int, expert_used: IntOrLayers | None, expert_ff: IntOrLayers | None
) -> list[bool]:
    if not meta.arch_int("expert_count"):
        return [False] * n_layers
    used = per_layer_values(expert_used, n_layers, default=1)
    ff = per_layer_values(expert_ff, n_layers, default=1) if isinstance(expert_ff, tuple) else [1] * n_layers
    dense_lead = meta.arch_int("leading_dense_block_count") or 0
    step = meta.arch_int("interleave_moe_layer_step") or 0
    return [
        used[il] > 0 and ff[il] > 0 and il >= dense_lead and (step <= 1 or (il + 1) % step == 0)
        for il in range(n_layers)
    ]


def classify_layers(
    meta: Metadata,
    block_count: int | None,
    n_nextn: int,
    head_count_kv: IntOrLayers | None,
    feed_forward: IntOrLayers | None,
    expert_used: IntOrLayers | None,
    expert_ff: IntOrLayers | None,
) -> tuple[str, ...]:
    """One kind per block, following each architecture's load_arch_hparams() in llama.cpp."""
    if not block_count or block_count <= 0 or block_count > 100_000:
        return ()
    arch = meta.arch or ""
    n_trunk = max(block_count - n_nextn, 0)
    kv_heads = per_layer_values(head_count_kv, block_count)
    n_ff = per_layer_values(feed_forward, block_count)
    moe = _moe_layers(meta, block_count, expert_used, expert_ff)
    kinds: list[str] = []
    recurrent = _recurrent_flags(meta, arch, block_count, n_trunk, kv_heads)
    for il in range(n_trunk):
        if arch in NEMOTRON_ARCHS:
            if n_ff[il] > 0:
                kinds.append("moe" if meta.arch_int("expert_count") else "ffn")
            else:
                kinds.append("attention" if kv_heads[il] > 0 else "recurrent")
            continue
        if arch == "falcon-h1":
            mixer = "attention+recurrent"
        elif arch in _RECURRENT_ARCHS:
            mixer = "recurrent"
        else:
            mixer = "recurrent" if recurrent[il] else "attention"
        kinds.append(f"{mixer}+moe" if moe[il] and mixer != "attention+recurrent" else mixer)
    kinds.extend(["nextn"] * (block_count - n_trunk))
    return tuple(kinds)


def _recurrent_flags(meta: Metadata, arch: str, block_count: int, n_trunk: int, kv_heads: list[int]) -> list[bool]:
    if arch in INTERVAL_HYBRID_ARCHS:
        stored = meta.arch_value("attention.recurrent_layers")
        if isinstance(stored, list) and stored:
            if len(stored) == block_count and all(v in (0, 1, True, False) for v in stored):
                return [bool(v) and il < n_trunk for il, v in enumerate(stored)]
            indices = {int(v) for v in stored if isinstance(v, int)}
            return [il in indices and il < n_trunk for il in range(block_count)]
        interval = meta.arch_int("full_attention_interval") or 4
        return [il < n_trunk and (il + 1) % interval != 0 for il in range(block_count)]
    if arch in _KV_ZERO_HYBRID_ARCHS:
        return [il < n_trunk and kv_heads[il] == 0 for il in range(block_count)]
    return [False] * block_count


def find_moe_variant(
    arch: str | None,
    expert_count: int | None,
    expert_used: IntOrLayers | None,
    expert_ff: IntOrLayers | None,
    n_trunk: int | None,
) -> str | None:
    if not expert_count:
        return None
    if arch == "nemotron_h_moe":
        # llama.cpp's own discriminator (src/models/nemotron-h.cpp): any trunk top-k differing from layer 0's
        trunk = list(expert_used[: n_trunk or len(expert_used)]) if isinstance(expert_used, tuple) else []
        if any(v != trunk[0] for v in trunk[1:]):
            return "Puzzle (heterogeneous expert_used_count)"
        return "Super (uniform expert_used_count)" if n_trunk == 88 else "uniform expert_used_count"
    varied = [
        key
        for key, value in (("expert_used_count", expert_used), ("expert_feed_forward_length", expert_ff))
        if isinstance(value, tuple) and len({v for v in value if v}) > 1
    ]
    if varied:
        return "heterogeneous per-layer experts (" + ", ".join(varied) + ")"
    return None


def sliding_window_layers(
    meta: Metadata, arch: str | None, sliding_window: int | None, block_count: int | None, n_trunk: int
) -> tuple[bool, ...] | None:
    if not sliding_window or not block_count or block_count > 100_000:
        return None
    stored = meta.arch_value("attention.sliding_window_pattern")
    if isinstance(stored, list):
        flags = [bool(v) for v in stored[:block_count]]
        return tuple(flags + [False] * (block_count - len(flags)))
    if isinstance(stored, int) and not isinstance(stored, bool):
        pattern, dense_first = stored, _SWA_DEFAULTS.get(arch or "", (0, False))[1]
    elif arch in _SWA_DEFAULTS:
        pattern, dense_first = _SWA_DEFAULTS[arch]
    else:
        return None
    flags = []
    for il in range(block_count):
        if il >= n_trunk:
            flags.append(False)
        elif pattern == 0:
            flags.append(True)
        elif dense_first:
            flags.append(il % pattern != 0)
        else:
            flags.append(il % pattern < pattern - 1)
    return tuple(flags)
