"""Model placement flags (llama.cpp names) map onto llama_model_params; what llama.cpp would refuse is refused."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_ext.bindings import TensorBuftOverride, ggml_cpu_buffer_type
from engine_ext.client import EngineClient, EngineFailure
from engine_ext.model import model_params_struct
from engine_ext.params import EngineError, ModelParams

ROOT = Path(__file__).resolve().parents[2]


def test_every_model_flag_maps_onto_llama_params() -> None:
    params = ModelParams(
        n_gpu_layers=12,
        use_mmap=False,
        use_mlock=True,
        load_mtp=True,
        main_gpu=1,
        split_mode="row",
        tensor_split=(3.0, 1.0),
        n_cpu_moe=2,
    )
    m = model_params_struct(params)
    assert (m.n_gpu_layers, m.use_mmap, m.use_mlock, m.load_mtp, m.main_gpu) == (12, False, True, True, 1)
    assert m.split_mode == 2
    assert (m.tensor_split[0], m.tensor_split[1]) == (3.0, 1.0)
    overrides = ctypes.cast(m.tensor_buft_overrides, ctypes.POINTER(TensorBuftOverride))
    assert [overrides[i].pattern for i in range(2)] == [
        b"blk\\.0\\.ffn_(up|down|gate|gate_up)_(ch|)exps",
        b"blk\\.1\\.ffn_(up|down|gate|gate_up)_(ch|)exps",
    ]
    assert overrides[0].buft == ggml_cpu_buffer_type() and overrides[2].pattern is None  # NULL-terminated
    assert model_params_struct(ModelParams()).n_gpu_layers == 999  # -1: every layer
    assert model_params_struct(ModelParams(split_mode="tensor")).split_mode == 3


@pytest.mark.parametrize(
    "params, message",
    [
        (ModelParams(split_mode="diagonal"), "split mode"),
        (ModelParams(split_mode="none", tensor_split=(1.0, 1.0)), "split mode other than none"),
        (ModelParams(tensor_split=(-1.0, 2.0)), "non-negative"),
        (ModelParams(n_cpu_moe=-1), "must not be negative"),
    ],
)
def test_invalid_combinations_are_refused(params: ModelParams, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        params.validate()


def test_experts_on_cpu_and_tensor_split_mode_in_the_worker(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path))
    base = [
        sys.executable,
        "-m",
        "app",
        "run",
        "-m",
        str(tiny_models["qwen3next"]),
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "8",
        "-t",
        "2",
        "--json",
    ]
    plain = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    moe = subprocess.run([*base, "--n-cpu-moe", "4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert moe.returncode == 0, moe.stderr
    assert json.loads(moe.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        # Tensor parallelism needs at least one non-CPU device: llama.cpp refuses the load, the worker survives.
        with pytest.raises(EngineFailure, match="could not load"):
            client.load(tiny_models["llama"], ModelParams(split_mode="tensor"))
        assert "for tensor parallelism" in (tmp_path / "engine.log").read_text()  # llama.cpp said why
        client.load(tiny_models["llama"], ModelParams())
