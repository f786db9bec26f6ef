"""`-ngl auto`: how many layers fit in the free memory of the GPU devices, planned before a model loads.

llama.cpp assigns GPU layers from the end of the model: with ``-ngl k`` the output head is the first unit
offloaded, then block N-1, N-2, ... (src/llama-model.cpp, ``i_gpu_start = n_layer_all + 1 - n_gpu_layers``; the
input embeddings always stay on the CPU). So the plan walks the same order and adds units while what they need
fits: each block's weight bytes (from the GGUF header), its KV cache at the context size and cache types asked
for, its recurrent state, plus one compute buffer and the output head's logits on the device, leaving
``fit_target_mib`` free on every device as llama.cpp's ``--fit`` does (default 1024 MiB).

Upstream's own fitter (common/fit.cpp) measures by loading the model with ``no_alloc`` and reading
``llama_get_memory_breakdown``, a C++ map that ctypes cannot read; this plan uses llmtui's GGUF estimate
instead, which ``tests/unit/test_gguf_info.py`` checks against llama.cpp's buffer sizes. Several devices are planned
as one pool, as llama.cpp's default split shares layers in proportion to free memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engine_ext.gguf import (
    GGUFInfo,
    estimate_memory,
    format_bytes,
    inspect_gguf,
    kv_bytes_per_layer,
    recurrent_bytes_per_layer,
)
from engine_ext.params import GPU_LAYERS_AUTO, ContextParams, EngineError, ModelParams

MiB = 1024 * 1024

# bytes per element of each KV cache type (block types: block bytes / 32 elements)
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


@dataclass(frozen=True)
class DeviceMemory:
    """A device the model can be offloaded to, with its memory as ggml reports it."""

    name: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Placement:
    """The outcome of planning: the `n_gpu_layers` to load with and why."""

    n_gpu_layers: int  # what llama_model_params gets (-1: everything)
    offloaded: int  # units on the devices: blocks plus the output head
    n_units: int  # blocks + 1 (the output head)
    needed_bytes: int  # on the devices, for `offloaded` units
    budget_bytes: int  # free device memory less the margins
    devices: tuple[str, ...]
    reason: str


def unit_costs(info: GGUFInfo, model: ModelParams, ctx: ContextParams) -> list[int]:
    """Device bytes of each unit in llama.cpp's offload order: the output head first, then blocks N-1 … 0."""
    n_blocks = info.block_count or 0
    if len(info.layer_weights_bytes) != n_blocks:
        raise EngineError(f"{info.path}: the header's tensors do not match block_count, cannot plan -ngl auto")
    n_ctx = ctx.n_ctx or info.context_length or 4096
    cells = -(-n_ctx // 256) * 256
    kv_type = (KV_TYPE_BYTES[ctx.type_k] + KV_TYPE_BYTES[ctx.type_v]) / 2
    kv = kv_bytes_per_layer(info, cells, kv_type_bytes=kv_type, n_ubatch=ctx.n_ubatch)
    recurrent = recurrent_bytes_per_layer(info, ctx.n_seq_max, ctx.n_rs_seq)
    n_trunk = info.n_layer_trunk if info.n_layer_trunk is not None else n_blocks
    blocks = []
    for il in range(n_blocks):
        if il >= n_trunk and not model.load_mtp:
            blocks.append(0)  # NextN blocks are not loaded without load_mtp
            continue
        state = recurrent if "recurrent" in info.layer_kinds[il] else 0
        blocks.append(info.layer_weights_bytes[il] + int(kv[il]) + state)
    n_embd = info.embedding_length or 0
    logits = ctx.n_ubatch * 4 * ((info.vocab_size or 0) + n_embd)  # the output head's result buffer
    return [info.output_weights_bytes + logits, *reversed(blocks)]


def plan_gpu_layers(
    info: GGUFInfo, devices: Sequence[DeviceMemory], model: ModelParams, ctx: ContextParams
) -> Placement:
    """The most units that fit on `devices` (already narrowed to those the split mode uses)."""
    n_units = (info.block_count or 0) + 1
    if not devices:
        return Placement(0, 0, n_units, 0, 0, (), "no GPU device: all layers on the CPU")
    margin = model.fit_target_mib * MiB
    n_ctx = ctx.n_ctx or info.context_length or 4096
    compute = estimate_memory(
        info, n_ctx, n_ubatch=ctx.n_ubatch, flash_attn=ctx.flash_attn != "off", n_seq=ctx.n_seq_max
    ).compute_bytes
    names = tuple(d.name for d in devices)
    budget = sum(max(0, d.free_bytes - margin) for d in devices) - compute * len(devices)
    costs = unit_costs(info, model, ctx)
    used = 0
    offloaded = 0
    for cost in costs:
        if used + cost > budget:
            break
        used += cost
        offloaded += 1
    free = format_bytes(sum(d.free_bytes for d in devices))
    where = ", ".join(names)
    needed = used + compute * len(devices)
    if offloaded == n_units:
        reason = f"all {n_units - 1} layers and the output on {where} ({format_bytes(needed)} of {free} free)"
        return Placement(-1, offloaded, n_units, needed, budget, names, reason)
    if offloaded == 0:
        reason = (
            f"nothing fits on {where}: {free} free, {format_bytes(margin)} kept free per device, "
            f"{format_bytes(compute)} compute buffer; all layers on the CPU"
        )
        return Placement(0, 0, n_units, 0, budget, names, reason)
    n_layers = offloaded - 1  # the output head is the first unit
    reason = (
        f"{n_layers} of {n_units - 1} layers and the output on {where} "
        f"({format_bytes(needed)} of {free} free, {format_bytes(margin)} kept free per device)"
    )
    return Placement(offloaded, offloaded, n_units, needed, budget, names, reason)


def offload_devices(model: ModelParams) -> list[DeviceMemory]:
    """The devices llama.cpp would offload to with `model`'s split mode (GPUs; integrated GPUs when no other)."""
    from engine_ext.doctor import list_devices

    _, devices = list_devices()
    gpus = [d for d in devices if d.type == "GPU"] or [d for d in devices if d.type == "integrated GPU"]
    found = [DeviceMemory(d.name, d.free_bytes, d.total_bytes) for d in gpus]
    if model.split_mode == "none" and found:
        if model.main_gpu >= len(found):
            raise EngineError(f"--main-gpu {model.main_gpu}: there are only {len(found)} GPU devices")
        return [found[model.main_gpu]]
    if model.tensor_split and found:
        # devices given a zero share take no layers
        shares = list(model.tensor_split) + [0.0] * len(found)
        return [d for d, share in zip(found, shares, strict=False) if share > 0]
    return found


def resolve_gpu_layers(path: Path, model: ModelParams, ctx: ContextParams) -> tuple[ModelParams, str]:
    """`model` with `-ngl auto` replaced by a planned count, and a line saying what was placed where."""
    model.validate()
    if model.n_gpu_layers != GPU_LAYERS_AUTO:
        return model, ""
    placement = plan_gpu_layers(inspect_gguf(path), offload_devices(model), model, ctx)
    return replace(model, n_gpu_layers=placement.n_gpu_layers), "-ngl auto: " + placement.reason
