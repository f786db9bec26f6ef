"""`llmtui serve` on the tiny model against hostile clients (issue 42): more idle connections than the process has
files, a prompt longer than the context, an API key no client can send. Each is one line or a normal answer."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.serve_process import ROOT, free_port, running_serve

FILES = 1024  # the child's open-file limit (ulimit -n), as in the reproducer
CONNECTIONS = 1100


def hermetic_env(root: Path, **extra: str) -> dict[str, str]:
    home = root / "home"
    return dict(
        os.environ,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        LLMTUI_CONFIG_DIR=str(root / "config"),
        LLMTUI_DATA_DIR=str(root / "data"),
        HF_HOME=str(root / "hf"),
        LLMTUI_ADAPTIVE_THREADS="off",
        **extra,
    )


def few_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))


def test_idle_connections_past_the_file_limit_neither_stop_health_nor_flood_the_log(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 64:
        pytest.skip(f"this test opens {CONNECTIONS} connections; the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, CONNECTIONS + 64), hard))
    port = free_port()
    log = tmp_path / "serve.log"
    args = ["-m", str(tiny_models["llama"]), "-t", "1", "-c", "256", "--port", str(port)]
    idle: list[socket.socket] = []
    try:
        with (
            log.open("w") as stderr,
            running_serve(args, hermetic_env(tmp_path), port, stderr=stderr, preexec_fn=few_files) as base,
        ):
            for _ in range(CONNECTIONS):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            started = time.monotonic()
            assert httpx.get(f"{base}/health", timeout=5).json() == {"status": "ok"}
            assert time.monotonic() - started < 2
            # A prompt longer than the context: llama-server's 400, which the OpenAI SDK does not retry.
            answer = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 600, "max_tokens": 4}, timeout=30)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["type"] == "exceed_context_size_error" and error["code"] == 400
            assert error["n_ctx"] == 256 and error["n_prompt_tokens"] > 256
            assert error["message"] == f"the prompt is {error['n_prompt_tokens']} tokens but the context holds 256"
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    text = log.read_text()
    assert len(text) < 2000 and "Traceback" not in text, text[-2000:]
    # The request log (issue 49, 19): a line for the refused completion; none for /health (polled at the start).
    [request] = [line for line in text.splitlines() if " POST " in line]
    assert request.startswith("llmtui serve: 127.0.0.1 POST /v1/completions 400 · ") and request.endswith(" s")
    assert " GET /health" not in text


def test_an_api_key_no_client_can_send_is_refused_at_start(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    env = hermetic_env(tmp_path, SERVE_TEST_KEY="clé-secrète")
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve", "-m", str(tiny_models["llama"]), "--api-key-env", "SERVE_TEST_KEY"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--api-key-env SERVE_TEST_KEY: the API key holds the character U+00E9" in lines[0]
