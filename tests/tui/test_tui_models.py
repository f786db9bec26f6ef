"""The models screen (F4) against the local Hub: search, inspect and fit, pull with a sidecar, use, delete, pause."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import OptionList, Static

from app.core import paths
from app.tui.app import LlmtuiApp
from app.tui.download_bridge import DownloadProgressed
from app.tui.modals.model_actions import DeleteModelModal, PullModal
from app.tui.screens.models_screen import ModelsScreen
from app.tui.widgets.downloads import DownloadsPanel
from models_catalog.download import Progress, State
from models_catalog.library import LocalModel
from tests.hub_server import HubServer
from tests.pilot import assert_footer_fits, started
from tests.waits import wait_until

REPO = "org/Tiny-Qwen35-GGUF"
GATED = "meta/Gated-GGUF"
SIZES = [(80, 24), (120, 40)]


@pytest.fixture
def models_hub(
    hub_server: HubServer, tiny_models: dict[str, Path], app_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> HubServer:
    """The local Hub with a tiny Qwen3.5 repo (two quants, an mtp- sidecar) and a gated repo; 8 GiB RAM, no GPU."""
    monkeypatch.setenv("LLMTUI_RAM_BYTES", str(8 << 30))
    monkeypatch.setenv("LLMTUI_VRAM_BYTES", "0")
    hub_server.add_repo(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": tiny_models["qwen35_mtp"],
            "Tiny-Q8_0.gguf": tiny_models["qwen35"],
            "mtp-Tiny-Q8_0.gguf": tiny_models["qwen35_mtp_sidecar"],
            "README.md": b"# Tiny Qwen3.5\n",
        },
        downloads=42,
        likes=7,
    )
    hub_server.add_repo(GATED, {"Gated-Q4_K_M.gguf": tiny_models["llama"]}, gated=True, downloads=3)
    return hub_server


def downloaded(screen: ModelsScreen) -> list[LocalModel]:
    """F4's Local models but the bundled starter (listed last when installed)."""
    return [m for m in screen.local_models if m.source != "starter"]


def make_app(tiny_models: dict[str, Path]) -> LlmtuiApp:
    return LlmtuiApp(str(tiny_models["llama"]), start_engine=False)


async def open_models(pilot: Pilot[Any]) -> ModelsScreen:
    await started(pilot)
    await pilot.press("f4")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, ModelsScreen))
    screen = pilot.app.screen
    assert isinstance(screen, ModelsScreen)
    await wait_until(pilot, lambda: screen.memory is not None)
    return screen


async def search_and_open(pilot: Pilot[Any], screen: ModelsScreen, text: str, repo_id: str) -> None:
    await pilot.press("slash")
    await pilot.press(*text, "enter")
    await wait_until(pilot, lambda: [r.repo_id for r in screen.search_results] == [repo_id])
    await pilot.press("enter")
    await wait_until(pilot, lambda: screen.listing is not None and screen.listing.repo_id == repo_id)


def quant_list(screen: ModelsScreen) -> OptionList:
    return screen.query_one("#quant-list", OptionList)


def detail_text(screen: ModelsScreen) -> str:
    return str(screen.query_one("#detail-info", Static).render())


async def highlight_quant(pilot: Pilot[Any], screen: ModelsScreen, tag: str) -> None:
    quants = quant_list(screen)
    quants.focus()
    ids = [quants.get_option_at_index(i).id or "" for i in range(quants.option_count)]
    quants.highlighted = next(i for i, primary in enumerate(ids) if tag in primary)
    await pilot.pause()


def states_of(seen: list[Progress], name: str) -> list[State]:
    return [p.state for p in seen if p.path == name]


@pytest.mark.anyio
async def test_search_inspect_pull_with_mtp_use_in_chat_and_delete(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=400_000)  # about 2 s: progress is visible
    seen: list[Progress] = []

    def hook(message: Message) -> None:
        if isinstance(message, DownloadProgressed):
            seen.append(message.progress)

    app = make_app(tiny_models)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        screen = await open_models(pilot)
        await search_and_open(pilot, screen, "tiny", REPO)

        # quants grouped, each with a fit verdict from the remote header, one recommended
        report = screen.report
        assert report is not None and report.info.architecture == "qwen35"
        assert {q.tag: str(q.verdict) for q in report.quants} == {"Q4_K_M": "fits", "Q8_0": "fits"}
        assert report.recommended in ("Q4_K_M", "Q8_0")
        assert quant_list(screen).option_count == 2
        labels = [str(quant_list(screen).get_option_at_index(i).prompt) for i in range(2)]
        assert all("fits" in label for label in labels) and sum("★" in label for label in labels) == 1
        assert "qwen35" in detail_text(screen) and "mtp-Tiny-Q8_0.gguf" in detail_text(screen)

        # download Q8_0: the dialog ticks its mtp- sidecar; progress, then completion
        await highlight_quant(pilot, screen, "Q8_0")
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal))
        await pilot.press("enter")
        await wait_until(pilot, lambda: any(m.name == f"{REPO}:Q8_0" for m in screen.local_models))
        assert State.DOWNLOADING in states_of(seen, "Tiny-Q8_0.gguf")
        assert any(p.rate > 0 and p.eta is not None for p in seen if p.path == "Tiny-Q8_0.gguf")
        assert states_of(seen, "Tiny-Q8_0.gguf")[-1] == State.DONE
        assert states_of(seen, "mtp-Tiny-Q8_0.gguf")[-1] == State.DONE
        panel = screen.query_one(DownloadsPanel)
        assert panel.display and [r.progress.state for r in panel.rows.values()] == [State.DONE, State.DONE]
        [model] = downloaded(screen)
        assert set(model.sidecars) == {"mtp"} and model.architecture == "qwen35"
        assert "✓" in str(quant_list(screen).get_option_at_index(quant_list(screen).highlighted or 0).prompt)

        # use it in the chat
        await pilot.press("3")
        await wait_until(pilot, lambda: screen.local is not None and screen.local_fit is not None)
        assert "mtp" in detail_text(screen) and "fits" in detail_text(screen)
        await pilot.press("u")
        await wait_until(pilot, lambda: app.chat is not None and app.screen is app.chat)
        assert app.model_path == str(model.path)
        usage_file = paths.data_dir() / "model-usage.json"
        await wait_until(
            pilot,
            lambda: usage_file.is_file() and str(model.path.absolute()) in usage_file.read_text(),
            what="the model's use, recorded in a thread",
        )
        usage = json.loads((paths.data_dir() / "model-usage.json").read_text())
        assert str(model.path.absolute()) in usage

        # delete it: refused while it is open in the chat, then confirmed with the space it frees
        screen = await open_models(pilot)
        await pilot.press("3")
        await wait_until(pilot, lambda: screen.local is not None)
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, DeleteModelModal) and model.path.exists()
        app.model_path = str(tiny_models["llama"])
        size = model.size + model.sidecars["mtp"].stat().st_size
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal))
        assert isinstance(app.screen, DeleteModelModal) and app.screen.freed_bytes == size
        await pilot.press("y")
        await wait_until(pilot, lambda: not downloaded(screen) and not model.path.exists())
        await wait_until(pilot, lambda: any(f"freed {_mib(size)}" in n.message for n in app._notifications))


def _mib(n: int) -> str:
    from engine_ext.gguf import format_bytes

    return format_bytes(n)


@pytest.mark.anyio
async def test_a_download_in_progress_pauses_and_resumes(models_hub: HubServer, tiny_models: dict[str, Path]) -> None:
    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=150_000)  # about 5 s
    app = make_app(tiny_models)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        await search_and_open(pilot, screen, "tiny", REPO)
        await highlight_quant(pilot, screen, "Q8_0")
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal))
        await pilot.press("shift+tab", "space", "d")  # untick the mtp sidecar, download
        panel = screen.query_one(DownloadsPanel)
        await wait_until(pilot, lambda: bool(panel.rows))
        assert len(panel.rows) == 1
        row = next(iter(panel.rows.values()))
        await wait_until(pilot, lambda: row.progress.state == State.DOWNLOADING and row.progress.downloaded > 0)

        panel.focus()
        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.PAUSED)
        kept = row.progress.downloaded
        await pilot.pause(0.5)  # time passes: a paused download stays paused
        assert row.progress.state == State.PAUSED and 0 < kept < row.progress.total
        assert "paused" in str(row.query_one(".download-stats", Static).render())
        assert not downloaded(screen)

        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.DONE)
        resumed_from = [r.start for r in models_hub.data_requests("Tiny-Q8_0.gguf")]
        assert resumed_from[0] == 0 and resumed_from[-1] > 0  # the second request continued, not restarted
        await wait_until(pilot, lambda: [m.name for m in downloaded(screen)] == [f"{REPO}:Q8_0"])


@pytest.mark.anyio
async def test_quit_asks_while_a_download_is_unfinished(models_hub: HubServer, tiny_models: dict[str, Path]) -> None:
    """ctrl+q quit at once during a paused download: it now asks (Stay keeps the app; a second ctrl+q, or Quit,
    quits), and the partial bytes stay for the next pull."""
    from app.tui.app import QuitWithDownloadsModal

    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=150_000)  # about 5 s
    app = make_app(tiny_models)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        assert app.unfinished_downloads() == []
        await search_and_open(pilot, screen, "tiny", REPO)
        await highlight_quant(pilot, screen, "Q8_0")
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal))
        await pilot.press("shift+tab", "space", "d")  # untick the mtp sidecar, download
        panel = screen.query_one(DownloadsPanel)
        await wait_until(pilot, lambda: bool(panel.rows))
        row = next(iter(panel.rows.values()))
        await wait_until(pilot, lambda: row.progress.state == State.DOWNLOADING and row.progress.downloaded > 0)
        panel.focus()
        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.PAUSED)
        await pilot.press("escape")  # back to the chat: the download stays with the models screen
        await wait_until(pilot, lambda: not isinstance(app.screen, type(screen)), what="the chat again")
        assert app.unfinished_downloads() == ["Tiny-Q8_0.gguf (paused)"]

        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitWithDownloadsModal), what="the quit question")
        assert "1 download not finished: Tiny-Q8_0.gguf (paused)" in app.screen.title_text
        await pilot.press("down", "enter")  # Stay
        await wait_until(
            pilot, lambda: not isinstance(app.screen, QuitWithDownloadsModal), what="the question to close"
        )
        assert app.is_running and app.return_code is None

        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitWithDownloadsModal), what="the quit question again")
        await pilot.press("ctrl+q")  # a second ctrl+q quits
        await wait_until(pilot, lambda: app.return_code is not None or not app.is_running, what="the app to quit")


@pytest.mark.anyio
async def test_a_gated_repo_says_how_to_set_hf_token(models_hub: HubServer, tiny_models: dict[str, Path]) -> None:
    app = make_app(tiny_models)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        await search_and_open(pilot, screen, "gated", GATED)
        text = detail_text(screen)
        assert "HF_TOKEN is not set" in text and "settings/tokens" in text
        assert screen.report is None and screen.fit_error and "gated" in screen.fit_error.lower()


@pytest.mark.anyio
async def test_f4_and_the_command_palette_open_the_models_screen(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    app = make_app(tiny_models)
    async with app.run_test(size=(120, 40)) as pilot:
        first = await open_models(pilot)
        await pilot.press("f4")
        await wait_until(pilot, lambda: app.screen is app.chat)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Models: Browse and download models" in titles
        app.action_models()
        await wait_until(pilot, lambda: app.screen is first)  # the same screen: its downloads live on
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.chat)


# ----- snapshots ---------------------------------------------------------------------------------------------


def in_progress() -> list[Progress]:
    """A download half-way at a fixed rate and ETA, and its sidecar queued (deterministic snapshots)."""
    return [
        Progress(1, REPO, "Tiny-Q8_0.gguf", State.DOWNLOADING, 3_500_000, 8_400_000, 1_250_000.0, 3.9),
        Progress(2, REPO, "mtp-Tiny-Q8_0.gguf", State.QUEUED, 0, 3_440_000),
    ]


async def catalog_with_download(pilot: Pilot[Any]) -> None:
    screen = await open_models(pilot)
    for progress in in_progress():
        screen.downloads_panel.show_progress(progress)
    await pilot.pause()


async def repo_detail_with_download(pilot: Pilot[Any]) -> None:
    screen = await open_models(pilot)
    await search_and_open(pilot, screen, "tiny", REPO)
    for progress in in_progress():
        screen.downloads_panel.show_progress(progress)
    await pilot.pause()


SCENES = {"models_catalog_download": catalog_with_download, "models_repo_download": repo_detail_with_download}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", list(SCENES))
def test_models_screen_snapshot(
    snap_compare: Any, models_hub: HubServer, tiny_models: dict[str, Path], scene: str, size: tuple[int, int]
) -> None:
    assert snap_compare(make_app(tiny_models), terminal_size=size, run_before=SCENES[scene])


def test_progress_messages_of_a_task_replace_each_other_not_other_tasks() -> None:
    model, sidecar = (DownloadProgressed(p) for p in in_progress())
    model_later = DownloadProgressed(Progress(1, REPO, "Tiny-Q8_0.gguf", State.DOWNLOADING, 5_000_000, 8_400_000))
    assert model_later.can_replace(model) and not sidecar.can_replace(model) and not model_later.can_replace(sidecar)


@pytest.mark.anyio
async def test_a_model_used_from_the_first_run_screen_opens_the_chat(
    models_hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.tui.screens.first_run import FirstRunScreen

    monkeypatch.setattr("app.tui.start_up.starter_model_path", lambda: None)
    monkeypatch.setattr("app.core.model_list.starter_model_path", lambda: None)
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, FirstRunScreen))
        screen = await open_models(pilot)
        await search_and_open(pilot, screen, "tiny", REPO)
        await highlight_quant(pilot, screen, "Q4_K_M")
        await pilot.press("enter")  # on a quant: the download dialog
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal))
        await pilot.press("d")
        await wait_until(pilot, lambda: bool(screen.local_models))
        await pilot.press("u")  # the highlighted quant is downloaded now
        await wait_until(pilot, lambda: app.chat is not None and app.screen is app.chat)
        assert app.model_path == str(screen.local_models[0].path)
        assert not any(isinstance(s, FirstRunScreen) for s in app.screen_stack)


@pytest.mark.anyio
async def test_the_models_footer_fits_80_columns_with_a_download_running(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    """F4 at 80×24 with a download running: every key in the footer is drawn whole, Quit and Help included (issue
    22: the footer was cut at 80 columns)."""
    app = make_app(tiny_models)
    async with app.run_test(size=(80, 24)) as pilot:
        await catalog_with_download(pilot)
        labels = assert_footer_fits(app, 80)
        assert {"Search", "Download", "Pause", "Cancel", "Back", "Quit", "Help"} <= set(labels), labels
