"""llama.cpp RPC on loopback: a ggml RPC server in a subprocess serves a tiny model's layers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rpc_server import rpc_server

ROOT = Path(__file__).resolve().parents[2]


def rpc_built() -> bool:
    code = "from engine_ext.bindings import C; print(int(C.llama_supports_rpc()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "1"


def test_generation_through_a_loopback_rpc_server(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    if not rpc_built():
        print("llama-cpp-python was built without GGML_RPC=ON: the RPC test cannot run")
        pytest.skip("engine built without RPC (CMAKE_ARGS=-DGGML_RPC=ON)")
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path))
    with rpc_server(tmp_path, timeout_s=30) as endpoint:
        args = [
            "-m",
            "app",
            "run",
            "-m",
            str(tiny_models["llama"]),
            "-p",
            "hello",
            "--temp",
            "0",
            "-n",
            "8",
            "-t",
            "2",
            "--json",
        ]
        local = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        remote = subprocess.run(
            [sys.executable, *args, "--rpc", endpoint, "-ngl", "99"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert remote.returncode == 0, remote.stderr
        assert json.loads(remote.stdout)["tokens"] == json.loads(local.stdout)["tokens"]
        log = (tmp_path / "logs" / "engine.log").read_text()
        assert "RPC" in log
        unreachable = subprocess.run(
            [sys.executable, *args, "--rpc", "127.0.0.1:1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr
