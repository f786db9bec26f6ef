"""Layer offload on the device: load and decode with -ngl 0, a middle count, all, and auto, each checked against
where llama.cpp says it put every layer (its load_tensors lines), and greedy output against the CPU's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine_ext.gguf import inspect_gguf
from engine_ext.model import Context, Model
from engine_ext.params import GPU_LAYERS_AUTO, ContextParams, ModelParams
from engine_ext.placement import MiB, offload_devices, plan_gpu_layers, resolve_gpu_layers, unit_costs
from tests.device.devices import GpuDevice, captured_llama_log, layer_devices

CONTEXT = ContextParams(n_ctx=256, n_batch=64, n_threads=2)
ARCHS = ("llama", "qwen35", "qwen3next", "nemotron_h_moe")
PROMPT = "Once upon a time"


@contextmanager
def loaded(path: Path, params: ModelParams) -> Iterator[tuple[Model, Context, dict[int, str]]]:
    with captured_llama_log() as log:
        model = Model(path, params)
    ctx = Context(model, CONTEXT)
    try:
        yield model, ctx, layer_devices(log)
    finally:
        ctx.close()
        model.close()


def greedy(model: Model, ctx: Context, n: int = 16) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after PROMPT, and the first step's logits."""
    tokens = model.tokenize(PROMPT, add_special=False, parse_special=False)
    ctx.clear()
    ctx.decode(tokens, 0)
    first = np.ctypeslib.as_array(ctx.logits_row(-1), shape=(model.n_vocab,)).copy()
    out: list[int] = []
    pos = len(tokens)
    for _ in range(n):
        logits = np.ctypeslib.as_array(ctx.logits_row(-1), shape=(model.n_vocab,))
        token = int(np.argmax(logits))
        out.append(token)
        ctx.decode_one(token, pos)
        pos += 1
    return out, first


def on_device(devices: dict[int, str], device: GpuDevice) -> int:
    return sum(d == device.name for d in devices.values())


@pytest.mark.parametrize("kind", ARCHS)
def test_load_and_decode_with_0_some_and_all_layers_on_the_device(
    kind: str, tiny_models: dict[str, Path], gpu_device: GpuDevice
) -> None:
    path = tiny_models[kind]
    n_units = (inspect_gguf(path).block_count or 0) + 1  # blocks and the output head
    outputs = {}
    for ngl, expected in ((0, 0), (n_units // 2, n_units // 2), (-1, n_units)):
        with loaded(path, ModelParams(n_gpu_layers=ngl)) as (model, ctx, devices):
            assert len(devices) == n_units, devices
            assert on_device(devices, gpu_device) == expected, (ngl, devices)
            # llama.cpp offloads from the end: the output head first, then the last blocks
            assert all(devices[u] == gpu_device.name for u in range(n_units - expected, n_units))
            outputs[ngl], first = greedy(model, ctx)
            assert np.isfinite(first).all()
            if ngl == 0:
                cpu_first = first
            else:
                # The device computes the same function: logits agree to about 1e-3 of their scale (ggml-vulkan
                # multiplies in f16 where the CPU keeps f32).
                assert np.abs(first - cpu_first).max() <= 1e-2 * max(1.0, float(np.abs(cpu_first).max()))
    assert outputs[n_units // 2] == outputs[0] and outputs[-1] == outputs[0], outputs


def plan_for(path: Path, device: GpuDevice, fit_target_mib: int) -> int:
    """The planner's n_gpu_layers for this device with fit_target_mib kept free."""
    model = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, fit_target_mib=fit_target_mib)
    resolved, reason = resolve_gpu_layers(path, model, CONTEXT)
    assert reason.startswith("-ngl auto: ")
    return resolved.n_gpu_layers


@pytest.mark.parametrize("kind", ARCHS)
def test_auto_offloads_what_the_planner_counted(kind: str, tiny_models: dict[str, Path], gpu_device: GpuDevice) -> None:
    path = tiny_models[kind]
    info = inspect_gguf(path)
    n_units = (info.block_count or 0) + 1
    devices = offload_devices(ModelParams())
    assert [d.name for d in devices] == [gpu_device.name]
    # The default margin (1 GiB) leaves room for the whole tiny model: everything goes.
    ngl = plan_for(path, gpu_device, ModelParams().fit_target_mib)
    assert ngl == -1
    with loaded(path, ModelParams(n_gpu_layers=ngl)) as (_, _, placed):
        assert on_device(placed, gpu_device) == n_units
    # A device with room for about half the units (their bytes from the planner's own costs; the real device's
    # free memory narrowed, as MiB margins are too coarse for a tiny model): a middle count, and llama.cpp offloads
    # exactly that many.
    params = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO)
    margin = params.fit_target_mib * MiB
    compute = devices[0].free_bytes - margin - plan_gpu_layers(info, devices, params, CONTEXT).budget_bytes
    costs = unit_costs(info, params, CONTEXT)
    half = n_units // 2
    narrowed = replace(devices[0], free_bytes=margin + compute + sum(costs[:half]) + costs[half] // 2)
    plan = plan_gpu_layers(info, [narrowed], params, CONTEXT)
    assert plan.n_gpu_layers == plan.offloaded == half, (plan, costs)
    with loaded(path, replace(params, n_gpu_layers=plan.n_gpu_layers)) as (_, _, placed):
        assert on_device(placed, gpu_device) == plan.offloaded, placed
        assert all(placed[u] == gpu_device.name for u in range(n_units - half, n_units))
    # No room at all: nothing offloaded.
    assert plan_for(path, gpu_device, int(devices[0].total_bytes // MiB) + 1) == 0
