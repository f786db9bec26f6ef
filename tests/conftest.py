"""Shared pytest fixtures."""

from __future__ import annotations

import os
import shutil
import site
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.crash_isolation import (  # noqa: F401  (the hooks: xdist workers by default, each on its own CPUs)
    _all_cpus_when_marked,
    pytest_cmdline_main,
    pytest_configure,
)
from tests.hub_server import HubServer
from tests.tiny_models import write_all

# ----- the `slow` marker: left out of the default run ------------------------------------------------------


def _node_ids_named(config: pytest.Config) -> set[str]:
    """The tests the command line names by node id (`path::name`), as ids relative to the rootdir."""
    named = set()
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if not sep:
            continue
        try:
            relative = (config.invocation_params.dir / path).resolve().relative_to(config.rootpath)
        except ValueError:
            continue
        named.add(f"{relative.as_posix()}::{rest}")
    return named


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` run only when asked for: with a marker expression (`-m slow` runs them alone,
    `-m "slow or not slow"` everything) or named by node id. Otherwise they are deselected, and pytest says how
    many."""
    if config.option.markexpr:
        return
    named = _node_ids_named(config)
    slow = [
        item
        for item in items
        if item.get_closest_marker("slow") and item.nodeid not in named and item.nodeid.split("[")[0] not in named
    ]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


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

_HF_ENV_VARS = (
    "HF_ENDPOINT",
    "MODEL_ENDPOINT",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HOME",
    "LLAMA_CACHE",
    "LLMTUI_MODEL_DIRS",
    "LLMTUI_CACHE_DIR",
)


def _leaked_hf_env_vars() -> list[str]:
    """The Hugging Face settings in this environment that a test must not inherit: those above and every other HF_*
    (huggingface_hub reads them once, when it is first imported, so unsetting them per test comes too late)."""
    return [name for name in os.environ if name in _HF_ENV_VARS or name.startswith("HF_")]


for _name in _leaked_hf_env_vars():  # before anything imports huggingface_hub (xdist's workers inherit this)
    del os.environ[_name]


# ----- hermetic tests: every test has its own HOME, config, data, cache, state and log directories -----------


@dataclass(frozen=True)
class HermeticDirs:
    """One test's private directories (made on first write, by whatever writes there: only `home` exists)."""

    home: Path  # HOME
    config: Path  # LLMTUI_CONFIG_DIR: config.toml
    data: Path  # LLMTUI_DATA_DIR: history.sqlite3, steering vectors, model usage
    xdg_config: Path  # XDG_CONFIG_HOME
    xdg_data: Path  # XDG_DATA_HOME
    xdg_cache: Path  # XDG_CACHE_HOME
    xdg_state: Path  # XDG_STATE_HOME (platformdirs' log dir is under it)
    hf_home: Path  # HF_HOME
    hf_cache: Path  # HF_HUB_CACHE

    @property
    def logs(self) -> Path:
        """The app's log dir (engine.log) while LLMTUI_DATA_DIR is set: app.paths.log_dir()."""
        return self.data / "logs"

    @property
    def roots(self) -> tuple[Path, ...]:
        """Every folder a test may write the user's files to (HOME holds the XDG ones)."""
        return (self.home, self.config, self.data, self.hf_home, self.hf_cache)


@pytest.fixture(autouse=True)
def hermetic_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> HermeticDirs:
    """Every test gets a temporary HOME and its own config, data, cache, state and log dirs (the app's
    LLMTUI_* overrides, the XDG dirs platformdirs reads, the Hugging Face cache), so no test reads or writes the
    user's files. Hugging Face tokens, endpoints and offline switches, and extra model folders, are unset."""
    root = tmp_path_factory.mktemp("hermetic")
    home = root / "home"
    home.mkdir()
    dirs = HermeticDirs(
        home=home,
        config=root / "config",
        data=root / "data",
        xdg_config=home / ".config",
        xdg_data=home / ".local" / "share",
        xdg_cache=home / ".cache",
        xdg_state=home / ".local" / "state",
        hf_home=root / "hf-home",
        hf_cache=root / "hf-cache",
    )
    # A Python with packages in the user site (pip install --user) still finds them from a subprocess.
    monkeypatch.setenv("PYTHONUSERBASE", site.getuserbase())
    for name in _leaked_hf_env_vars():
        monkeypatch.delenv(name, raising=False)
    for name, path in (
        ("HOME", dirs.home),
        ("XDG_CONFIG_HOME", dirs.xdg_config),
        ("XDG_DATA_HOME", dirs.xdg_data),
        ("XDG_CACHE_HOME", dirs.xdg_cache),
        ("XDG_STATE_HOME", dirs.xdg_state),
        ("LLMTUI_CONFIG_DIR", dirs.config),
        ("LLMTUI_DATA_DIR", dirs.data),
        ("HF_HOME", dirs.hf_home),
        ("HF_HUB_CACHE", dirs.hf_cache),
    ):
        monkeypatch.setenv(name, str(path))
    monkeypatch.delenv("LLMTUI_TEST_FAULT", raising=False)  # the worker's crash switch: only the tests that set it
    # The engine's thread count follows the machine's load (engine_ext.threads): not in tests, whose speculative
    # step counts must not depend on what else the machine runs. Tests of the governor turn it on.
    monkeypatch.setenv("LLMTUI_ADAPTIVE_THREADS", "off")
    # Pictures in the transcript as coloured half blocks, whatever terminal runs the tests (snapshots stay the same).
    monkeypatch.setenv("LLMTUI_IMAGE_PREVIEW", "halfcell")
    # The app's stats bar reads the machine's load (the busy note): not in tests, whose screens must not depend on
    # what else the machine runs. Tests of the note pass a fake sampler.
    import app.tui.bridge

    monkeypatch.setattr(app.tui.bridge, "CpuContention", lambda: None)
    return dirs


# ----- models: a local Hub on 127.0.0.1 and an isolated Hugging Face environment ---------------------------


@pytest.fixture
def hf_env(hermetic_dirs: HermeticDirs) -> Path:
    """The test's private hub cache (returned; HF_HUB_CACHE) and HF_HOME; no token, not offline, no endpoint."""
    return hermetic_dirs.hf_cache


@pytest.fixture
def hub_server(hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A running local Hub; HF_ENDPOINT points at it."""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def app_dirs(hermetic_dirs: HermeticDirs) -> tuple[Path, Path]:
    """The test's fresh config dir and data dir for the app (LLMTUI_CONFIG_DIR / LLMTUI_DATA_DIR); (config, data)."""
    return hermetic_dirs.config, hermetic_dirs.data


@pytest.fixture(autouse=True)
def app_started_before_the_pilot(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`LlmtuiApp.run_test` hands over its Pilot once the app has started (it reads its settings and history in a
    thread: tests/pilot.py's `started`), as it did when on_mount read them; a test marked `before_start` gets the
    Pilot at once, to see what happens meanwhile."""
    if request.node.get_closest_marker("before_start"):
        return
    from app.tui.app import LlmtuiApp
    from tests.pilot import started

    run_test = LlmtuiApp.run_test

    @asynccontextmanager
    async def run_test_started(app: LlmtuiApp, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with run_test(app, *args, **kwargs) as pilot:
            await started(pilot)
            yield pilot

    monkeypatch.setattr(LlmtuiApp, "run_test", run_test_started)


@pytest.fixture(scope="session", autouse=True)
def quiet_llama_log_in_process() -> None:
    """Tests that run the engine in-process keep llama.cpp's INFO/DEBUG lines out of failure reports."""
    try:
        from engine_ext.bindings import GGML_LOG_LEVEL_WARN, log_llama_to_stderr
    except ImportError:  # llama-cpp-python not importable: engine tests fail on their own
        return
    log_llama_to_stderr(GGML_LOG_LEVEL_WARN)
