"""`llmtui serve` run as a user runs it, in a subprocess, for the tests that speak HTTP to it."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO

import httpx2 as httpx

from tests.rpc_server import ROOT, free_port
from tests.waits import wait_for

__all__ = ["free_port", "running_serve"]


@contextmanager
def running_serve(
    args: list[str],
    env: Mapping[str, str],
    port: int,
    *,
    stderr: IO[str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[str]:
    """Start `llmtui serve ARGS` (which name `port`), wait until /health answers, yield its base URL; SIGINT after.
    `stderr`: a file for its log (else a temporary file, read when it exits early: a pipe nobody reads would stop
    the server once its request log filled it); `preexec_fn` runs in the child (limits)."""
    log = stderr if stderr is not None else tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
        preexec_fn=preexec_fn,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            said = "see its log"
            if stderr is None:
                log.seek(0)
                said = log.read()
            raise AssertionError(f"llmtui serve exited: {said}")
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, "llmtui serve to answer /health", timeout_s=120, interval_s=0.2)
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if stderr is None:
            log.close()
