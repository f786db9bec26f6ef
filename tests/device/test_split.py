"""Two devices: the Vulkan device and a CPU served by a loopback RPC server (`llmtui rpc-server`), the layers split
between them with --split-mode layer and --tensor-split; each layer's device read back from llama.cpp's load log."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ext.params import ModelParams
from tests.device.devices import GpuDevice
from tests.device.test_offload import greedy, loaded
from tests.rpc_server import rpc_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rpc_endpoint(tmp_path: Path) -> Iterator[str]:
    from engine_ext.bindings import C

    if not C.llama_supports_rpc():
        pytest.skip("engine built without RPC (scripts/build_engine.sh turns it on)")
    with rpc_server(tmp_path) as endpoint:
        yield endpoint


SPLIT_LOAD = """
import json, sys
from pathlib import Path
from engine_ext.params import ModelParams
from engine_ext.rpc import add_rpc_servers
from tests.device.test_offload import greedy, loaded
path, endpoint = Path(sys.argv[1]), sys.argv[2]
add_rpc_servers((endpoint,))  # as the engine worker does before loading
params = ModelParams(n_gpu_layers=-1, rpc_servers=(endpoint,), split_mode="layer", tensor_split=(1.0, 1.0))
with loaded(path, params) as (model, ctx, placed):
    tokens, _ = greedy(model, ctx)
print(json.dumps({"placed": placed, "tokens": tokens}))
"""


def test_layers_split_across_the_device_and_an_rpc_cpu(
    tiny_models: dict[str, Path], rpc_endpoint: str, gpu_device: GpuDevice
) -> None:
    path = tiny_models["llama"]
    with loaded(path, ModelParams(n_gpu_layers=0)) as (model, ctx, _):
        cpu_tokens, _ = greedy(model, ctx)
    # In a process of its own: the RPC device stays registered for the rest of a process's life.
    out = subprocess.run(
        [sys.executable, "-c", SPLIT_LOAD, str(path), rpc_endpoint],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    used = set(result["placed"].values())
    assert gpu_device.name in used, result["placed"]
    assert any(d.startswith("RPC") for d in used), result["placed"]  # the other share: the RPC server's CPU
    assert "CPU" not in used, result["placed"]  # every unit went to one of the two devices
    assert result["tokens"] == cpu_tokens
