"""Models on this machine (issue 22, Models): ctrl+l lists a model just downloaded in F4 with its size, quant, memory
need and drafts and loads it; F4's keys act wherever focus is; partial downloads in the Local tab; status words
explained."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.binding import Binding
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, TabbedContent

from app.tui.app import LlmtuiApp
from app.tui.modals.model_actions import DeleteModelModal, PullModal
from app.tui.modals.model_switcher import ModelSwitcherModal
from app.tui.screens.models_screen import ModelsScreen
from app.tui.widgets.downloads import DownloadRow, DownloadsPanel
from engine_ext.gguf import format_bytes
from models_catalog import hfcache
from models_catalog.download import State
from tests.hub_server import HubServer
from tests.pilot import ready
from tests.tui.test_first_hour_dialogs import screen_text
from tests.tui.test_tui_models import REPO, downloaded, highlight_quant, models_hub, open_models, search_and_open
from tests.waits import wait_until

__all__ = ["models_hub"]  # the fixture, used by name


def option_texts(options: OptionList) -> list[str]:
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


def row_of(panel: DownloadsPanel, name: str) -> DownloadRow | None:
    return next((r for r in panel.rows.values() if r.progress.path == name), None)


async def download_q8_with_mtp(pilot: Pilot[Any], screen: ModelsScreen) -> None:
    app = pilot.app
    await search_and_open(pilot, screen, "tiny", REPO)
    await highlight_quant(pilot, screen, "Q8_0")
    await pilot.press("d")
    await wait_until(pilot, lambda: isinstance(app.screen, PullModal))
    await pilot.press("enter")  # the mtp sidecar is ticked
    await wait_until(pilot, lambda: any(m.name == f"{REPO}:Q8_0" for m in screen.local_models), "the download")


@pytest.mark.anyio
async def test_switcher_lists_a_model_just_downloaded_with_size_quant_drafts_and_loads_it(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        screen = await open_models(pilot)
        await download_q8_with_mtp(pilot, screen)
        [model] = [m for m in screen.local_models if m.name == f"{REPO}:Q8_0"]
        assert screen.report is not None
        [search_fit] = [q for q in screen.report.quants if q.tag == "Q8_0"]

        # F4's figure for it, from the Local tab
        await pilot.press("3")
        await wait_until(pilot, lambda: screen.local is not None and screen.local_fit is not None, "F4's fit")
        assert screen.local is not None and screen.local.path == model.path and screen.local_fit is not None
        f4_need = format_bytes(screen.local_fit.need_bytes)
        assert screen.local_fit.need_bytes == search_fit.need_bytes  # the same in F4's Search and Local tabs
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.chat, "the chat")

        # ctrl+l: the downloaded model is there, without a restart, with size, quant, memory and its mtp draft
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), "the switcher")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning and not switcher.describing, "the switcher's scan")
        [row] = [m for m in switcher.models if m.path == model.path]
        assert row.quant == "Q8_0" and row.size_bytes == model.size and row.draft_kinds == ("mtp",)
        assert row.need_bytes == screen.local_fit.need_bytes  # one memory figure, F4 and ctrl+l
        assert not any(m.path.name.startswith("mtp-") for m in switcher.models)  # drafts are not chat models
        assert tiny_models["llama"] in [m.path for m in switcher.models]  # the model in use, opened by its path
        [label] = [t for t in option_texts(switcher.query_one(OptionList)) if f"{REPO}:Q8_0" in t]
        assert "Q8_0" in label and format_bytes(model.size) in label and f"needs {f4_need}" in label
        assert "+mtp" in label and "Hugging Face cache" in label

        # selecting it (typed filter, Enter) loads it
        await pilot.press(*"Q8_0", "enter")
        await wait_until(
            pilot, lambda: app.model is not None and app.model.path == str(model.path), "the model loaded", 60
        )
        await ready(pilot)


# ----- F4's keys -------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_slash_focuses_the_search_box_and_types_in_it(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        query = screen.query_one("#search-query", Input)
        assert app.focused is screen.query_one("#catalog-list")
        await pilot.press("slash")  # from the catalog list: focuses the search box, types nothing
        await wait_until(pilot, lambda: app.focused is query, "the search box focused")
        assert screen.query_one(TabbedContent).active == "search" and query.value == ""
        await pilot.press(*"org", "slash", *"Tiny")  # in the box: / is typed (org/name)
        assert query.value == "org/Tiny"
        author = screen.query_one("#search-author", Input)
        author.focus()
        await pilot.press("slash")  # from the author box: back to the query, the author untouched
        await wait_until(pilot, lambda: app.focused is query, "the search box focused again")
        assert author.value == "" and query.value == "org/Tiny"


@pytest.mark.anyio
async def test_one_enter_opens_the_highlighted_result(models_hub: HubServer, tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        await pilot.press("slash", *"tiny", "enter")
        await wait_until(pilot, lambda: [r.repo_id for r in screen.search_results] == [REPO], "the results")
        # Back in the search box with that query's results shown, one Enter opens the highlighted result (it
        # searched again and moved to the results, and a second Enter opened it).
        await pilot.press("slash")
        await wait_until(pilot, lambda: app.focused is screen.query_one("#search-query"), "the search box")
        requests = len(models_hub.requests)
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen.listing is not None and screen.listing.repo_id == REPO, "the repo")
        assert not any("/api/models?" in r.path for r in models_hub.requests[requests:])  # no second search
        # From the results list too, one Enter; and 2 returns to the results shown
        await pilot.press("2")
        await wait_until(pilot, lambda: app.focused is screen.query_one("#search-results"), "the results list")
        screen.listing = None
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen.listing is not None and screen.listing.repo_id == REPO, "the repo")
        # down in the search box goes to the results
        await pilot.press("slash")
        await wait_until(pilot, lambda: app.focused is screen.query_one("#search-query"), "the search box")
        await pilot.press("down")
        await wait_until(pilot, lambda: app.focused is screen.query_one("#search-results"), "the results list")


def footer_keys(screen: ModelsScreen) -> dict[str, str]:
    """The keys the footer shows now, with their labels."""
    return {key: b.binding.description for key, b in screen.active_bindings.items() if b.binding.show}


async def start_slow_download(pilot: Pilot[Any], screen: ModelsScreen) -> DownloadRow:
    await search_and_open(pilot, screen, "tiny", REPO)
    await highlight_quant(pilot, screen, "Q8_0")
    await pilot.press("d")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, PullModal), "the download dialog")
    await pilot.press("shift+tab", "space", "d")  # untick the mtp sidecar, download
    panel = screen.query_one(DownloadsPanel)
    await wait_until(pilot, lambda: bool(panel.rows), "the download's row")
    row = next(iter(panel.rows.values()))
    await wait_until(pilot, lambda: row.progress.state == State.DOWNLOADING, "bytes arriving")
    return row


@pytest.mark.anyio
async def test_p_and_x_act_on_the_highlighted_download_wherever_the_focus_is(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=100_000)  # about 8 s
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        assert "p" not in footer_keys(screen) and "x" not in footer_keys(screen)  # nothing to act on yet
        row = await start_slow_download(pilot, screen)
        assert app.focused is screen.query_one("#quant-list")  # the focus stays on the quants
        await wait_until(pilot, lambda: {"p", "x"} <= set(footer_keys(screen)), "p and x in the footer")
        assert footer_keys(screen)["p"] == "Pause" and footer_keys(screen)["x"] == "Cancel"

        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.PAUSED, "the download paused")
        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.DOWNLOADING, "the download resumed")
        await pilot.press("1")  # the catalog list focused
        await wait_until(pilot, lambda: app.focused is screen.query_one("#catalog-list"), "the catalog list")
        await pilot.press("x")  # asks first (its partial file is deleted): y
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal), "the y/n question")
        await pilot.press("y")
        await wait_until(pilot, lambda: row.progress.state == State.CANCELLED, "the download cancelled")
        assert "p" not in footer_keys(screen) and "x" not in footer_keys(screen)
        # the downloads panel focused: its own footer shows p and x
        screen.query_one(DownloadsPanel).focus()
        await pilot.pause()
        assert footer_keys(screen).get("x") == "Cancel"


@pytest.mark.anyio
async def test_p_and_x_act_on_the_download_just_started_at_80x24(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    """Issue 37 item 3: a finished download was highlighted, so p right after starting another paused nothing; now
    the new download is highlighted, p on a finished one says it has nothing to pause, and x asks (y/n) first."""
    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=100_000)  # about 8 s
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_models(pilot)
        await search_and_open(pilot, screen, "tiny", REPO)
        await highlight_quant(pilot, screen, "Q4_K_M")  # fast: finished at once
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal), "the download dialog")
        await pilot.press("d")
        panel = screen.query_one(DownloadsPanel)
        await wait_until(pilot, lambda: bool(panel.rows), "the first download's row")
        first = next(iter(panel.rows.values()))
        await wait_until(pilot, lambda: first.progress.state == State.DONE, "the first download done")
        assert panel.highlighted is first.progress and "p" not in footer_keys(screen)
        await pilot.press("p")  # on the finished one: one line saying p has nothing to do
        await wait_until(pilot, lambda: any("p has nothing to pause" in n.message for n in app._notifications))
        [note] = [n.message for n in app._notifications if "p has nothing to pause" in n.message]
        assert note.startswith("Tiny-Q4_K_M.gguf is done") and "\n" not in note
        # the slow one: its row is highlighted as it appears, so the first p pauses it
        await highlight_quant(pilot, screen, "Q8_0")
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, PullModal), "the download dialog")
        await pilot.press("enter")  # with its mtp sidecar (small, first), then the model file
        await wait_until(pilot, lambda: row_of(panel, "Tiny-Q8_0.gguf") is not None, "the second download's row")
        second = row_of(panel, "Tiny-Q8_0.gguf")
        assert second is not None
        assert panel.highlighted is not None and panel.highlighted.task_id == second.progress.task_id
        await wait_until(pilot, lambda: second.progress.state == State.DOWNLOADING, "bytes arriving")
        await pilot.press("p")
        await wait_until(pilot, lambda: second.progress.state == State.PAUSED, "the new download paused")
        assert first.progress.state == State.DONE
        # x asks before deleting the partial file: n keeps it, y cancels it
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal), "the y/n question")
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen is screen, "back on the models screen")
        await pilot.pause()
        assert second.progress.state == State.PAUSED
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal), "the y/n question")
        await pilot.press("y")
        await wait_until(pilot, lambda: second.progress.state == State.CANCELLED, "the download cancelled")


@pytest.mark.anyio
async def test_every_key_of_the_models_screen_is_in_its_footer_or_f1(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    from app.tui.screens.help_keys import key_sections, key_text

    [models_keys] = [entries for title, entries in key_sections(LlmtuiApp) if title == "Models (F4)"]
    helped = {(key, entry.binding.action) for entry in models_keys for key in entry.keys}
    for binding in Binding.make_bindings([*ModelsScreen.BINDINGS, *DownloadsPanel.BINDINGS]):
        if not binding.system:
            assert (binding.key, binding.action) in helped, f"{key_text(binding.key)} is not in F1's Models section"


# ----- partial downloads in the Local tab ----------------------------------------------------------------------


def make_partial(model: Path, fraction: float) -> tuple[Path, int]:
    """A partial download of `model` (as the Hub serves it in REPO) in the test's cache: its first bytes, under the
    name an interrupted pull leaves (blobs/<sha256>.incomplete)."""
    data = model.read_bytes()
    oid = hashlib.sha256(data).hexdigest()
    path = hfcache.RepoCache(hfcache.cache_dir(), REPO).partial(oid)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = int(len(data) * fraction)
    path.write_bytes(data[:kept])
    path.chmod(0o600)
    return path, kept


def local_ids(screen: ModelsScreen) -> list[str]:
    options = screen.query_one("#local-list", OptionList)
    return [options.get_option_at_index(i).id or "" for i in range(options.option_count)]


async def highlight_local(pilot: Pilot[Any], screen: ModelsScreen, option_id: str) -> None:
    options = screen.query_one("#local-list", OptionList)
    options.focus()
    options.highlighted = local_ids(screen).index(option_id)
    await pilot.pause()


@pytest.mark.anyio
async def test_partial_downloads_show_in_local_with_progress_resume_and_delete(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    q8, q8_kept = make_partial(tiny_models["qwen35"], 0.4)  # Tiny-Q8_0.gguf
    q4, q4_kept = make_partial(tiny_models["qwen35_mtp"], 0.25)  # Tiny-Q4_K_M.gguf
    q8_total, q4_total = tiny_models["qwen35"].stat().st_size, tiny_models["qwen35_mtp"].stat().st_size
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        await pilot.press("3")
        await wait_until(pilot, lambda: screen.partials_sized and len(screen.partials) == 2, "the partials, sized")
        labels = option_texts(screen.query_one("#local-list", OptionList))
        [q8_label] = [t for t in labels if "Tiny-Q8_0.gguf" in t]
        assert "partial" in q8_label and f"{format_bytes(q8_kept)} / {format_bytes(q8_total)}" in q8_label
        assert f"{100 * q8_kept / q8_total:.0f}%" in q8_label
        [q4_label] = [t for t in labels if "Tiny-Q4_K_M.gguf" in t]
        assert f"{100 * q4_kept / q4_total:.0f}%" in q4_label

        # resume (r): it continues from its bytes against the Hub and becomes a model
        await highlight_local(pilot, screen, f"partial-{q8}")
        assert "r" in footer_keys(screen) and "x" in footer_keys(screen)
        await pilot.press("r")
        await wait_until(
            pilot, lambda: any(m.name == f"{REPO}:Q8_0" for m in screen.local_models), "the resumed model", 60
        )
        assert not q8.exists()
        assert [r.start for r in models_hub.data_requests("Tiny-Q8_0.gguf")] == [q8_kept]  # resumed, not restarted
        await wait_until(pilot, lambda: [r.partial.path for r in screen.partials] == [q4], "one partial left")

        # delete (x): asks, then removes it and frees its bytes
        await highlight_local(pilot, screen, f"partial-{q4}")
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal), "the delete question")
        assert isinstance(app.screen, DeleteModelModal) and app.screen.freed_bytes == q4_kept
        await pilot.press("y")
        await wait_until(pilot, lambda: not q4.exists() and not screen.partials, "the partial deleted")
        await wait_until(
            pilot,
            lambda: any(f"freed {format_bytes(q4_kept)}" in n.message for n in app._notifications),
            "the space freed, said",
        )
        assert [m.name for m in downloaded(screen)] == [f"{REPO}:Q8_0"]  # the model stays


# ----- status words, explained where they show ---------------------------------------------------------------


@pytest.mark.anyio
async def test_status_words_have_tooltips_and_an_f1_entry(models_hub: HubServer, tiny_models: dict[str, Path]) -> None:
    from app.tui.screens.help import HelpScreen, keys_table
    from app.tui.screens.models_local import STATUS_WORDS

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        catalog = screen.query_one("#catalog-list", OptionList)
        assert any("unverified" in t for t in option_texts(catalog))  # the word shows there…
        assert f"unverified: {STATUS_WORDS['unverified']}" in str(catalog.tooltip)  # …and is explained there
        assert "sha256" in STATUS_WORDS["unverified"] and "repository name" in STATUS_WORDS["unverified"]
        shown_where = {
            "#search-results": ("gated",),
            "#quant-list": ("★", "✓", "fits", "tight", "too big", "needs, memory", "+mtp, +dflash…"),
            "#local-list": ("incomplete", "unusable", "partial", "+mtp, +dflash…"),
            "#detail-info": ("unverified", "gated", "fits", "tight", "too big", "incomplete"),
            "#downloads": ("queued", "waiting", "checking", "downloading", "verifying", "paused", "done", "failed"),
        }
        for selector, words in shown_where.items():
            tooltip = str(screen.query_one(selector).tooltip)
            for word in words:
                assert f"{word}: {STATUS_WORDS[word]}" in tooltip, f"{word} unexplained in {selector}"
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "F1's help")
    console = Console(width=200, record=True)
    console.print(keys_table(LlmtuiApp))
    helped = console.export_text()
    for word in STATUS_WORDS:
        assert word in helped, f"{word} is not in F1"
    assert "unreadable" in helped  # the switcher's word


def test_the_switcher_lists_chat_models_with_their_drafts_and_never_a_draft(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Models with their own MTP heads are chat models (+mtp); sidecars and draft models are not offered, also when
    only their header says so (a DFlash draft named like a model)."""
    import shutil

    from app.core.model_list import describe_models, local_models
    from tests.tiny_models import write_tiny_embedder

    folder = tmp_path / "models"
    folder.mkdir()
    for key in ("qwen35_mtp", "qwen35", "qwen35_mtp_sidecar", "llama"):
        shutil.copy(tiny_models[key], folder / tiny_models[key].name)
    dflash = tiny_models["llama"].parent / "dflash-tiny-llama.gguf"
    shutil.copy(dflash, folder / dflash.name)  # a sidecar by name
    shutil.copy(dflash, folder / "Tiny-Llama-DFlash-b16-Q8_0.gguf")  # a model by name
    write_tiny_embedder(folder / "tiny-embedder.gguf")
    write_tiny_embedder(folder / "tiny-reranker.gguf", rerank=True)
    listed = local_models([str(folder)])
    described = {m.path.name: m for m in describe_models(listed, [str(folder)], chat_only=True)}
    assert "tiny-embedder.gguf" not in described and "tiny-reranker.gguf" not in described  # the documents' models
    served = {m.path.name for m in describe_models(listed, [str(folder)])}  # serve's router keeps them
    assert {"tiny-embedder.gguf", "tiny-reranker.gguf"} <= served
    assert "Tiny-Llama-DFlash-b16-Q8_0.gguf" in {m.path.name for m in listed}  # a model by its name…
    assert "Tiny-Llama-DFlash-b16-Q8_0.gguf" not in described  # …a draft by its header
    assert not {tiny_models["qwen35_mtp_sidecar"].name, dflash.name} & {m.path.name for m in listed}
    mtp_model = described[tiny_models["qwen35_mtp"].name]
    assert mtp_model.draft_kinds[0] == "mtp" and mtp_model.need_bytes
    assert "mtp" in described[tiny_models["qwen35"].name].draft_kinds  # the mtp- sidecar beside it
    assert described[tiny_models["llama"].name].draft_kinds == ("dflash",)  # it fits llama; the mtp- one does not


@pytest.mark.anyio
async def test_a_download_paused_in_this_session_shows_in_local_and_resumes_or_is_deleted_there(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    models_hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=100_000)  # about 8 s
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models(pilot)
        row = await start_slow_download(pilot, screen)
        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.PAUSED, "the download paused")
        await pilot.press("3")
        await wait_until(pilot, lambda: [p.file.name for p in screen.partials if p.file] == ["Tiny-Q8_0.gguf"], "it")
        [partial] = screen.partials
        assert row.progress.downloaded == partial.partial.size  # the panel and the Local tab: the same bytes
        await highlight_local(pilot, screen, f"partial-{partial.partial.path}")
        await pilot.press("r")  # its own task resumes: one row in the panel, not a second download
        await wait_until(pilot, lambda: row.progress.state == State.DOWNLOADING, "the same download resumed")
        assert len(screen.downloads_panel.rows) == 1
        await wait_until(  # its row in Local follows: being written now, r not offered
            pilot,
            lambda: any("downloading" in t for t in option_texts(screen.query_one("#local-list", OptionList))),
            "the Local row saying it is downloading",
        )
        assert "r" not in footer_keys(screen)
        await pilot.press("p")
        await wait_until(pilot, lambda: row.progress.state == State.PAUSED, "paused again")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: f"partial-{partial.partial.path}" in local_ids(screen), "the partial listed")
        await highlight_local(pilot, screen, f"partial-{partial.partial.path}")
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, DeleteModelModal), "the delete question")
        await pilot.press("y")  # its task is cancelled, which deletes the partial file
        await wait_until(pilot, lambda: row.progress.state == State.CANCELLED, "the download cancelled")
        await wait_until(pilot, lambda: not partial.partial.path.exists() and not screen.partials, "the file gone")


@pytest.mark.anyio
async def test_the_starter_is_listed_beside_other_models_and_a_nested_folders_model_once(
    models_hub: HubServer, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49 item 8: F4's Local tab named the bundled starter only while nothing else was on disk, and a model
    folder inside another model folder listed its files twice. The starter is a row of its own (not deleted from
    here), each file is listed once; without the starter and models, the tab says so (issue 37 item 5)."""
    import shutil

    from textual.widgets import Static

    from app.core.paths import config_path
    from app.tui.screens.models_local import NO_LOCAL_MODELS

    starter = tmp_path / "bundle" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    starter.parent.mkdir()
    shutil.copyfile(tiny_models["llama"], starter)
    monkeypatch.setattr("app.core.model_list.starter_model_path", lambda: starter)
    outer = tmp_path / "models"
    (outer / "sub").mkdir(parents=True)
    shutil.copyfile(tiny_models["llama"], outer / "sub" / "nested-Q8_0.gguf")
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text(f'[models]\nfolders = ["{outer}", "{outer / "sub"}"]\n', encoding="utf-8")
    app = LlmtuiApp(str(starter), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_models(pilot)
        await pilot.press("3")
        await wait_until(pilot, lambda: len(screen.local_models) >= 2, "the Local tab's list")
        assert [(m.name, m.source) for m in screen.local_models] == [
            ("sub/nested-Q8_0.gguf", str(outer)),
            ("starter (SmolLM2-135M-Instruct)", "starter"),
        ]
        assert "bundled" in option_texts(screen.query_one("#local-list", OptionList))[1]
        await highlight_local(pilot, screen, "1")
        await wait_until(pilot, lambda: screen.local is not None and screen.local.source == "starter", "the starter")
        detail = str(screen.query_one("#detail-info", Static).render())
        assert "In: bundled with llmtui" in detail and "x: delete" not in detail
        assert "x" not in footer_keys(screen)
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, DeleteModelModal) and starter.exists()
        await highlight_local(pilot, screen, "0")
        assert "x" in footer_keys(screen)

        monkeypatch.setattr("app.core.model_list.starter_model_path", lambda: None)
        shutil.rmtree(outer)
        await pilot.press("ctrl+r")  # the Local tab read again
        local_list = screen.query_one("#local-list", OptionList)
        await wait_until(pilot, lambda: option_texts(local_list) == [NO_LOCAL_MODELS], "nothing on disk, said")
        await wait_until(pilot, lambda: screen.local is None, "no model's detail left behind")


@pytest.mark.anyio
async def test_e_edits_a_local_models_serve_preset_in_config_toml(
    models_hub: HubServer, tiny_models: dict[str, Path]
) -> None:
    """Issue 45 item 4: F4's detail shows a local model's [models."ID"] preset, e edits it (checked by the
    declarations, an empty field unset), and `llmtui serve` reads it from config.toml."""
    from textual.widgets import Select, Static

    from app.core.config import load_config
    from app.tui.modals.model_preset import ModelPresetModal

    folder = tiny_models["llama"].parent
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.save_settings(replace(app.config, model_folders=(str(folder),)))
        screen = await open_models(pilot)
        await pilot.press("3")
        name = tiny_models["llama"].name
        await wait_until(pilot, lambda: any(m.path.name == name for m in screen.local_models), "the folder's models")
        await highlight_local(pilot, screen, str([m.path.name for m in screen.local_models].index(name)))
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPresetModal), "the preset dialog")
        dialog = app.screen
        assert isinstance(dialog, ModelPresetModal) and dialog.preset.model == tiny_models["llama"].stem
        dialog.query_one("#preset-alias", Input).value = "fast"
        dialog.query_one("#preset-n_ctx", Input).value = "many"
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, ModelPresetModal)  # refused: "context size: 'many' is not a whole number"
        dialog.query_one("#preset-n_ctx", Input).value = "1024"
        dialog.query_one("#preset-pin", Select).value = "on"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is screen, "the models screen again")
        [preset] = load_config().model_presets
        assert preset.model == tiny_models["llama"].stem
        assert dict(preset.values) == {"alias": "fast", "n_ctx": 1024, "pin": True}
        detail = str(screen.query_one("#detail-info", Static).render())
        assert "Serve preset: alias fast · context size 1024 · pinned" in detail
        await pilot.press("e")  # opened again, each field shows the saved value: a choice too (it showed "(serve's)")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPresetModal), "the preset dialog again")
        await pilot.pause()
        pinned = next(row for row in screen_text(app).splitlines() if "Pinned" in row)
        assert " on " in pinned and "(serve's)" not in pinned, pinned
        await pilot.press("escape")


@pytest.mark.anyio
async def test_ctrl_l_offers_a_model_used_outside_the_folders_and_marks_those_with_a_projector(
    tiny_models: dict[str, Path], tmp_path: Path, app_dirs: tuple[Path, Path]
) -> None:
    """Issue 49 item 9: a model opened with `-m PATH` outside the model folders was gone from ctrl+l once another
    model was in use, and ctrl+l did not mark models with a projector beside them (F4 shows +mmproj)."""
    import shutil

    from app.core.config import load_config, save_config
    from app.core.model_paths import record_use

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    used = elsewhere / "used-before-Q8_0.gguf"
    shutil.copyfile(tiny_models["llama"], used)
    (elsewhere / "mmproj-used-before-f16.gguf").write_bytes(b"GGUF")  # paired by its name, as the app loads it
    assert record_use(used) is None  # as loading it for a chat does (`llmtui -m PATH`, then ctrl+l to another)
    gone = elsewhere / "deleted-since.gguf"
    shutil.copyfile(tiny_models["llama"], gone)
    assert record_use(gone) is None
    gone.unlink()
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(tiny_models["llama"], folder / "seeing-Q8_0.gguf")
    (folder / "mmproj-seeing-f16.gguf").write_bytes(b"GGUF")
    blind = folder / "text-only" / "blind-Q8_0.gguf"  # a folder without a projector
    blind.parent.mkdir()
    shutil.copyfile(tiny_models["qwen3"], blind)
    save_config(replace(load_config(), model_folders=(str(folder),)))
    app = LlmtuiApp(str(blind), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), "the switcher")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning and not switcher.describing, "the switcher's scan")
        rows = {m.path.name: m for m in switcher.models}
        assert "used-before-Q8_0.gguf" in rows and "deleted-since.gguf" not in rows
        assert rows["used-before-Q8_0.gguf"].where == str(elsewhere)
        options = switcher.query_one("#model-options", OptionList)
        labels = {
            (option.id or "").removeprefix("local:"): str(option.prompt)
            for option in (options.get_option_at_index(i) for i in range(options.option_count))
        }
        assert "+mmproj" in labels[str(used)] and "+mmproj" in labels[str(folder / "seeing-Q8_0.gguf")]
        assert "+mmproj" not in labels[str(blind)]
        await pilot.press(*"used-before")
        await wait_until(pilot, lambda: options.option_count == 1, "the filter narrowed to it")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model_path == str(used), "the model used before, chosen again")
    from app.core.model_list import local_models

    assert used not in [m.path for m in local_models([str(folder)], recent=0)]  # as `serve` lists them: not served
