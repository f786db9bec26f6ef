"""-ngl auto: GPU layers planned from free device memory in llama.cpp's offload order (output head, then N-1 … 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.model_paths import starter_model_path
from engine_ext import placement
from engine_ext.client import EngineClient, EngineFailure
from engine_ext.doctor import Device
from engine_ext.gguf import inspect_gguf
from engine_ext.model import model_params_struct
from engine_ext.params import GPU_LAYERS_AUTO, ContextParams, EngineError, ModelParams
from engine_ext.placement import DeviceMemory, plan_gpu_layers, unit_costs

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
AUTO = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO)
CTX = ContextParams(n_ctx=2048)


def _compute(path: Path, ctx: ContextParams = CTX) -> int:
    from engine_ext.gguf import estimate_memory

    return estimate_memory(inspect_gguf(path), ctx.n_ctx, n_ubatch=ctx.n_ubatch, flash_attn=True).compute_bytes


def test_per_layer_weights_add_up_to_the_file(tiny_models: dict[str, Path]) -> None:
    for kind in ("llama", "qwen35_mtp", "nemotron_h_moe"):
        info = inspect_gguf(tiny_models[kind])
        assert len(info.layer_weights_bytes) == info.block_count
        assert all(b > 0 for b in info.layer_weights_bytes)
        assert info.output_weights_bytes > 0
    starter = inspect_gguf(starter_model_path())
    # SmolLM2 ties its output to token_embd: on a GPU the output head is output_norm plus a copy of token_embd,
    # which is exactly what the file holds outside its blocks
    assert starter.weights_bytes - sum(starter.layer_weights_bytes) == starter.output_weights_bytes
    assert starter.output_weights_bytes > 10 * max(starter.layer_weights_bytes)


def test_units_in_llama_cpp_offload_order(tiny_models: dict[str, Path]) -> None:
    info = inspect_gguf(tiny_models["llama"])
    costs = unit_costs(info, AUTO, CTX)
    assert len(costs) == info.block_count + 1
    # the output head first, then the blocks from the last one; each block: weights + its KV cache
    assert costs[0] > info.output_weights_bytes
    kv_per_block = costs[1] - info.layer_weights_bytes[-1]
    assert kv_per_block > 0
    assert costs[1:] == [b + kv_per_block for b in reversed(info.layer_weights_bytes)]
    # a bigger context or a wider cache type costs more per block, a quantized cache less
    assert unit_costs(info, AUTO, ContextParams(n_ctx=8192))[1] > costs[1]
    assert unit_costs(info, AUTO, ContextParams(n_ctx=2048, type_k="q8_0", type_v="q8_0"))[1] < costs[1]


def test_nextn_blocks_cost_nothing_unless_loaded(tiny_models: dict[str, Path]) -> None:
    info = inspect_gguf(tiny_models["qwen35_mtp"])
    assert info.n_layer_nextn >= 1
    without = unit_costs(info, AUTO, CTX)
    with_mtp = unit_costs(info, ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, load_mtp=True), CTX)
    assert without[1] == 0 < with_mtp[1]  # the last block is the NextN head
    assert without[2:] == with_mtp[2:]


@pytest.mark.parametrize("k", [1, 2])  # tiny llama: 2 blocks + the output head
def test_the_most_units_that_fit_and_not_one_more(tiny_models: dict[str, Path], k: int) -> None:
    path = tiny_models["llama"]
    info = inspect_gguf(path)
    costs = unit_costs(info, AUTO, CTX)
    room = AUTO.fit_target_mib * MiB + _compute(path) + sum(costs[:k])
    fits = plan_gpu_layers(info, [DeviceMemory("GPU0", room, 2 * room)], AUTO, CTX)
    assert (fits.n_gpu_layers, fits.offloaded) == (k, k)
    assert f"{k - 1} of {info.block_count} layers" in fits.reason and "GPU0" in fits.reason
    short = plan_gpu_layers(info, [DeviceMemory("GPU0", room - 1, 2 * room)], AUTO, CTX)
    assert short.n_gpu_layers == k - 1


def test_everything_nothing_and_no_device(tiny_models: dict[str, Path]) -> None:
    info = inspect_gguf(tiny_models["llama"])
    big = plan_gpu_layers(info, [DeviceMemory("GPU0", 64 << 30, 80 << 30)], AUTO, CTX)
    assert big.n_gpu_layers == -1 and big.offloaded == big.n_units and "all" in big.reason
    tiny = plan_gpu_layers(info, [DeviceMemory("GPU0", 512 * MiB, 1 << 30)], AUTO, CTX)
    assert tiny.n_gpu_layers == 0 and "nothing fits" in tiny.reason
    none = plan_gpu_layers(info, [], AUTO, CTX)
    assert none.n_gpu_layers == 0 and "no GPU" in none.reason
    # a smaller margin (--fit-target) lets the same device take layers
    loose = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, fit_target_mib=0)
    assert plan_gpu_layers(info, [DeviceMemory("GPU0", 512 * MiB, 1 << 30)], loose, CTX).n_gpu_layers == -1


def test_several_devices_pool_their_memory(tiny_models: dict[str, Path]) -> None:
    path = tiny_models["llama"]
    info = inspect_gguf(path)
    costs = unit_costs(info, AUTO, CTX)
    each = AUTO.fit_target_mib * MiB + _compute(path) + sum(costs[:2]) // 2 + 1
    one = plan_gpu_layers(info, [DeviceMemory("GPU0", each, each)], AUTO, CTX)
    two = plan_gpu_layers(info, [DeviceMemory("GPU0", each, each), DeviceMemory("GPU1", each, each)], AUTO, CTX)
    assert two.n_gpu_layers == 2 > one.n_gpu_layers


def test_split_mode_narrows_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = (
        Device("CPU", "cpu", "CPU", 1 << 34, 1 << 34),
        Device("CUDA0", "a", "GPU", 8 << 30, 16 << 30),
        Device("CUDA1", "b", "GPU", 4 << 30, 16 << 30),
    )
    monkeypatch.setattr("engine_ext.doctor.list_devices", lambda: (("CPU", "CUDA"), gpus))
    names = [d.name for d in placement.offload_devices(AUTO)]
    assert names == ["CUDA0", "CUDA1"]
    none = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, split_mode="none", main_gpu=1)
    assert [d.name for d in placement.offload_devices(none)] == ["CUDA1"]
    with pytest.raises(EngineError, match="only 2 GPU"):
        placement.offload_devices(ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, split_mode="none", main_gpu=2))
    skip = ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, tensor_split=(0.0, 1.0))
    assert [d.name for d in placement.offload_devices(skip)] == ["CUDA1"]
    monkeypatch.setattr("engine_ext.doctor.list_devices", lambda: (("CPU",), gpus[:1]))
    assert placement.offload_devices(AUTO) == []


def test_auto_is_validated_and_never_reaches_llama_cpp_unplanned() -> None:
    with pytest.raises(EngineError, match="tensor"):
        ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, split_mode="tensor").validate()
    with pytest.raises(EngineError, match="GPU layers"):
        ModelParams(n_gpu_layers=-3).validate()
    with pytest.raises(EngineError, match="planned before loading"):
        model_params_struct(AUTO)


def test_worker_plans_auto_on_this_machine(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        info = client.load(tiny_models["llama"], AUTO, ContextParams(n_ctx=256, n_threads=2))
        assert info.placement.startswith("-ngl auto: ")
        if "no GPU device" in info.placement:  # this CPU machine: everything stays on the CPU
            assert info.n_gpu_layers == 0
        with pytest.raises(EngineFailure, match="tensor"):
            client.load(
                tiny_models["llama"],
                ModelParams(n_gpu_layers=GPU_LAYERS_AUTO, split_mode="tensor"),
                ContextParams(n_ctx=256),
            )


def test_cli_accepts_auto_and_says_where_layers_went(tmp_path: Path) -> None:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path))
    cmd = [
        sys.executable,
        "-m",
        "app",
        "run",
        "-m",
        "starter",
        "-ngl",
        "auto",
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "4",
        "-t",
        "2",
        "--json",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "note: -ngl auto: " in done.stderr
    assert len(json.loads(done.stdout)["tokens"]) == 4
    bad = subprocess.run([*cmd[:6], "-ngl", "most"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "all or auto" in bad.stderr
