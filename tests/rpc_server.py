"""`llmtui rpc-server` on a free loopback port, for the tests that split a model across it (tests/engine/test_rpc.py,
tests/device/test_split.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def rpc_server(data_dir: Path, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the server (its logs in `data_dir`), wait until it listens (fails after `timeout_s`), yield
    "127.0.0.1:PORT", stop it."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "app", "rpc-server", "--port", str(port), "-t", "1"],
        cwd=ROOT,
        env=dict(os.environ, LLMTUI_DATA_DIR=str(data_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the RPC server did not start listening within {timeout_s:.0f} s")
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
