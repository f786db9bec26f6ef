"""Shared pytest fixtures."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_server import HubServer
from tests.tiny_models import write_all


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tiny GGUF model kind (see tests/tiny_models.py), written once per test session."""
    return write_all(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def lone_llama(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama alone in a folder: no draft sidecars beside it (in tiny_models' folder it has three, which
    auto mode drafts with)."""
    path = tmp_path_factory.mktemp("lone-llama") / tiny_models["llama"].name
    shutil.copyfile(tiny_models["llama"], path)
    return path


# ----- models: a local Hub on 127.0.0.1 and an isolated Hugging Face environment ---------------------------

_HF_ENV_VARS = ("HF_ENDPOINT", "MODEL_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LLAMA_CACHE",
                "LLMTUI_MODEL_DIRS")


@pytest.fixture
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private hub cache (returned) and HF_HOME; no token, not offline, no endpoint."""
    for name in _HF_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return cache


@pytest.fixture
def hub_server(hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A running local Hub; HF_ENDPOINT points at it."""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def app_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A fresh config dir and data dir for the app (LLMTUI_CONFIG_DIR / LLMTUI_DATA_DIR); (config, data)."""
    config, data = tmp_path / "config", tmp_path / "data"
    monkeypatch.setenv("LLMTUI_CONFIG_DIR", str(config))
    monkeypatch.setenv("LLMTUI_DATA_DIR", str(data))
    return config, data


@pytest.fixture(scope="session", autouse=True)
def quiet_llama_log_in_process() -> None:
    """Tests that run the engine in-process keep llama.cpp's INFO/DEBUG lines out of failure reports."""
    try:
        from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr
    except ImportError:  # llama-cpp-python not importable: engine tests fail on their own
        return
    log_llama_to_stderr(GGML_LOG_LEVEL_WARN)
