"""No file I/O on the UI thread (issue 23 item 5): the F9 panel's header reads, the steering screen's vector reads
and the model switcher's folder scan run in thread workers, and the UI answers keys while they read.

Each reader is replaced by one that records whether it ran on the main thread (the event loop's) and sleeps
SLOW_S before reading: a key pressed meanwhile is processed before the read ends only when the read is off the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from app.core import vectors
from app.core.config import SteeringSettings
from app.core.speculation_facts import model_facts
from app.tui.app import LlmtuiApp
from app.tui.modals.model_switcher import ModelSwitcherModal
from app.tui.modals.speculative import SpeculativeModal
from app.tui.screens.steering_panel import SteeringPanel
from tests.fakes import Collector
from tests.pilot import MODEL, started
from tests.tui.test_tui_steering import synthetic_vector
from tests.waits import wait_for, wait_until

SLOW_S = 1.0  # long enough that a key press on a loaded machine is processed well within it


class SlowReader:
    """Wraps a reader: records (on the main thread?, first argument) per call, sleeps SLOW_S, then reads."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.calls: list[tuple[bool, str]] = []
        self.active = 0
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls.append((threading.current_thread() is threading.main_thread(), str(args[0]) if args else ""))
            self.active += 1
        try:
            time.sleep(SLOW_S)
            return self.real(*args, **kwargs)
        finally:
            with self.lock:
                self.active -= 1

    @property
    def on_main_thread(self) -> list[str]:
        return [what for main, what in self.calls if main]


async def answers_keys_while_reading(pilot: Pilot[Any], reader: SlowReader) -> None:
    """With a read in progress, a key press (tab: the focus moves) is processed before that read ends."""
    app = pilot.app
    await wait_until(pilot, lambda: reader.active > 0, "a read to start", timeout_s=10, interval_s=0.01)
    before = app.focused
    await pilot.press("tab")
    assert app.focused is not before, "the tab key was not processed"
    assert reader.active > 0, "the key was processed only after the read: the read blocked the event loop"


@pytest.fixture
def slow_headers(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowReader]:
    import app.core.speculation_facts

    model_facts.cache_clear()
    reader = SlowReader(app.core.speculation_facts.inspect_gguf)
    monkeypatch.setattr("app.core.speculation_facts.inspect_gguf", reader)
    yield reader
    model_facts.cache_clear()


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_f9_panel_reads_headers_off_the_event_loop(
    tiny_models: dict[str, Path], slow_headers: SlowReader
) -> None:
    model = str(tiny_models["qwen35_mtp"])
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.model, app.model_path = replace(MODEL, path=model), model
        await pilot.press("f9")
        await wait_until(pilot, lambda: isinstance(app.screen, SpeculativeModal), "the panel", timeout_s=10)
        panel = app.screen
        assert isinstance(panel, SpeculativeModal)
        await answers_keys_while_reading(pilot, slow_headers)
        await wait_until(pilot, lambda: not panel.reading and "draft-mtp" in panel.types, "the model's types")
        # Typing a draft file's path: read (after a pause in typing) off the loop, keys answered meanwhile.
        draft = panel.query_one("#spec-draft", Input)
        draft.focus()
        path = str(tiny_models["dflash"])
        draft.value = path[:-3]
        await pilot.press(*path[-3:])
        await answers_keys_while_reading(pilot, slow_headers)
        await wait_until(pilot, lambda: not panel.reading and "draft-dflash" in panel.types, "the draft's type")
        assert any(what == path for _, what in slow_headers.calls), "the draft file's header was not read"
    assert slow_headers.calls
    assert not slow_headers.on_main_thread, f"headers read on the UI thread: {slow_headers.on_main_thread}"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_steering_screen_reads_vectors_off_the_event_loop(
    tiny_models: dict[str, Path], slow_headers: SlowReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine_ext.steering.cvec_file as cvec_file

    remembered = synthetic_vector("mood", 64, range(1, 2))
    synthetic_vector("other", 64, range(1, 2))
    vectors._vector_info.cache_clear()
    slow_vectors = SlowReader(cvec_file.read_control_vector)
    monkeypatch.setattr(cvec_file, "read_control_vector", slow_vectors)
    model = str(tiny_models["llama"])
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.config = replace(app.config, steering=SteeringSettings((str(remembered),), (0.5,)))
        app.model, app.model_path = replace(MODEL, path=model), model
        await pilot.press("f6")
        screen = app.screen.query_one(SteeringPanel)
        await wait_until(pilot, lambda: screen.is_open, "the steering panel", timeout_s=10)
        await answers_keys_while_reading(pilot, slow_vectors)
        await wait_until(pilot, lambda: not screen.listing and len(screen.sliders) == 2, "the vectors listed")
        assert screen.sliders[0].vector.path == str(remembered)
    vectors._vector_info.cache_clear()
    assert {Path(what).name for _, what in slow_vectors.calls} >= {"model-mood.gguf", "model-other.gguf"}
    assert not slow_vectors.on_main_thread, f"vectors read on the UI thread: {slow_vectors.on_main_thread}"
    assert not slow_headers.on_main_thread, f"headers read on the UI thread: {slow_headers.on_main_thread}"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_model_switcher_scans_folders_off_the_event_loop(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.tui.modals.model_switcher as switcher_module
    from app.core.config import load_config, save_config

    save_config(replace(load_config(), model_folders=(str(tiny_models["llama"].parent),)))
    scan = SlowReader(switcher_module.local_models)
    monkeypatch.setattr(switcher_module, "local_models", scan)
    headers = SlowReader(switcher_module.describe_models)  # memory need and drafts: GGUF headers
    monkeypatch.setattr(switcher_module, "describe_models", headers)
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.model, app.model_path = replace(MODEL, path=str(tiny_models["llama"])), str(tiny_models["llama"])
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), "the switcher", timeout_s=10)
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await answers_keys_while_reading(pilot, scan)
        assert switcher.scanning
        await wait_until(pilot, lambda: not switcher.scanning, "the model folders scanned")
        assert tiny_models["llama"].stem in [m.name for m in switcher.models]
        await wait_until(pilot, lambda: not switcher.describing, "the models' headers read")
        [llama] = [m for m in switcher.models if m.path == tiny_models["llama"]]
        assert llama.need_bytes and llama.drafts is not None
    assert scan.calls and not scan.on_main_thread, "the model folders were scanned on the UI thread"
    assert headers.calls and not headers.on_main_thread, "the models' headers were read on the UI thread"


@pytest.mark.anyio
@pytest.mark.before_start
@pytest.mark.usefixtures("app_dirs")
async def test_start_up_reads_the_settings_history_and_model_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 31 item 7: on_mount reads the settings, opens (and migrates) the history and finds the model in a
    thread; the app answers meanwhile, and a key typed then (ctrl+t, the theme) acts once they are read, so the
    setting it saves is the user's own with the theme changed, not the defaults."""
    import app.tui.start_up as tui
    from app.core.config import Config, config_path, load_config, save_config

    save_config(Config(show_sidebar=False))
    settings = SlowReader(tui.load_config)
    history = SlowReader(tui.open_default_store)
    monkeypatch.setattr(tui, "load_config", settings)
    monkeypatch.setattr(tui, "open_default_store", history)
    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(
            pilot, lambda: settings.active > 0, "the settings read to start", timeout_s=10, interval_s=0.01
        )
        await pilot.press("ctrl+t")  # answered while the settings are read: kept for when they are
        assert settings.active > 0 and not app.started, "the key was processed only after the read"
        await wait_until(pilot, lambda: history.active > 0, "the history to be opened", timeout_s=10, interval_s=0.01)
        assert not app.started and app.chat is None and app.theme == "textual-dark"
        await started(pilot)
        assert app.chat is not None
        await wait_until(pilot, lambda: app.theme == "textual-light", "ctrl+t, typed during the start-up")
    saved = load_config(config_path())
    assert (saved.theme, saved.show_sidebar) == ("light", False)  # the user's settings, the theme changed
    assert settings.calls and not settings.on_main_thread, "the settings were read on the UI thread"
    assert history.calls and not history.on_main_thread, "the history was opened on the UI thread"


@pytest.mark.usefixtures("app_dirs")
def test_the_engine_bridge_reads_the_crash_memory_in_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 7: the App builds its bridge before the first frame; the real client's crash memory (a JSON file,
    /proc/cpuinfo and the engine's libraries) is read in the bridge's thread, not then."""
    import app.core.paths
    from app.tui.bridge import EngineBridge

    memory = SlowReader(app.core.paths.repack_memory)
    monkeypatch.setattr(app.core.paths, "repack_memory", memory)
    bridge = EngineBridge(Collector(), tmp_path / "engine.log")
    try:
        assert memory.calls == []
        bridge.start()
        wait_for(lambda: memory.calls and not memory.active, "the crash memory read", timeout_s=10 + SLOW_S)
    finally:
        bridge.close()
    assert memory.calls and not memory.on_main_thread, "the crash memory was read on the UI thread"
