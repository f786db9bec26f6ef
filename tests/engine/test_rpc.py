"""llama.cpp RPC on loopback: a ggml RPC server in a subprocess serves a tiny model's layers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
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
        assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr
        assert "cannot reach the RPC server at 127.0.0.1:1 (Connection refused)" in unreachable.stderr


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, never listening: a connection to it is refused
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_rpc_endpoints_that_cannot_be_reached_are_one_line(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """Issue 32: `--rpc 127.0.0.1:1` with nothing listening aborted the worker inside ggml-rpc (a 32-line crash
    report). The endpoint is checked with a bounded TCP connect before the load: one line, exit 1, no crash."""
    if not rpc_built():
        pytest.skip("engine built without RPC (CMAKE_ARGS=-DGGML_RPC=ON)")
    from engine_ext.params import EngineError
    from engine_ext.rpc import check_rpc_endpoint

    port = _closed_port()
    bad = [f"127.0.0.1:{port}", "127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:١", ":80", "host-only"]
    worst = 0.0
    for endpoint in bad:
        t0 = time.monotonic()
        with pytest.raises(EngineError) as exc:
            check_rpc_endpoint(endpoint, timeout_s=5.0)
        worst = max(worst, time.monotonic() - t0)
        assert "\n" not in str(exc.value) and len(str(exc.value)) <= 300, exc.value
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    args = ["run", "-m", str(tiny_models["llama"]), "-p", "hi", "-n", "2", "-t", "2", "--rpc", f"127.0.0.1:{port}"]
    result = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0] == (
        f"llmtui: error: cannot reach the RPC server at 127.0.0.1:{port} (Connection refused); "
        "start `llmtui rpc-server` there or fix --rpc"
    )
    print(f"\nunreachable RPC endpoints: {len(bad) + 1} cases, {len(bad) + 1} refused, 0 crashes, worst {worst:.2f} s")
