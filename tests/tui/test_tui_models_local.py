"""Models on this machine (issue 22, Models): ctrl+l lists a model just downloaded in F4 with its size, quant, memory
need and drafts and loads it; F4's keys act wherever focus is; partial downloads in the Local tab; status words
explained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList

from app.modals.model_actions import PullModal
from app.modals.model_switcher import ModelSwitcherModal
from app.screens.models import ModelsScreen
from app.tui import LlmtuiApp
from engine_ext.gguf_info import format_bytes
from tests.hub_server import HubServer
from tests.tui.test_tui import ready
from tests.tui.test_tui_models import REPO, highlight_quant, models_hub, open_models, search_and_open
from tests.waits import wait_until

__all__ = ["models_hub"]  # the fixture, used by name


def option_texts(options: OptionList) -> list[str]:
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


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

        # F4's figure for it, from the Local tab
        await pilot.press("3")
        await wait_until(pilot, lambda: screen.local is not None and screen.local_fit is not None, "F4's fit")
        assert screen.local is not None and screen.local.path == model.path and screen.local_fit is not None
        f4_need = format_bytes(screen.local_fit.need_bytes)
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
        [label] = [t for t in option_texts(switcher.query_one(OptionList)) if f"{REPO}:Q8_0" in t]
        assert "Q8_0" in label and format_bytes(model.size) in label and f"needs {f4_need}" in label
        assert "+mtp" in label and "Hugging Face cache" in label

        # selecting it (typed filter, Enter) loads it
        await pilot.press(*"Q8_0", "enter")
        await wait_until(
            pilot, lambda: app.model is not None and app.model.path == str(model.path), "the model loaded", 60
        )
        await ready(pilot)
