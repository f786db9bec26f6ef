"""Issue 22's leftovers (found in its acceptance walk): where early keys go, an honest speculation ratio, F4's
progress at 80×24, the Search tab's detail pane, the check dialog's prompt line, the heat strip's scale."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from textual import events
from textual.geometry import Region
from textual.widgets import Input, Label

from app.core.config import SpeculativeSettings, SteeringSettings
from app.core.paths import steering_dir
from app.core.speculation_facts import short_summary
from app.core.store import open_default_store
from app.tui.app import LlmtuiApp
from app.tui.screens.ab_run import ABRunScreen
from app.tui.screens.spec_check import Side, SpecCheckScreen, verdict
from app.tui.screens.steering_ab import SteeringABScreen
from app.tui.screens.steering_panel import HeatStrip
from app.tui.widgets.downloads import progress_text
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.spec_meter import SpecMeter
from engine_ext.protocol import SteeringSet
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from tests.fakes import engine_message, speculative_event
from tests.pilot import chat_of, loaded, make_app, seeded  # noqa: F401 (seeded: fixture)
from tests.tui.test_tui_models import (
    GATED,
    REPO,
    catalog_with_download,
    detail_text,
    in_progress,
    models_hub,  # noqa: F401 (a fixture)
    open_models,
    quant_list,
)
from tests.tui.test_tui_models import make_app as models_app
from tests.tui.test_tui_spec import STATS, _types_read, _without_engine
from tests.tui.test_tui_steering import _with_tiny_model, type_strength, vectors_listed
from tests.waits import wait_until


def _post_keys(app: LlmtuiApp, text: str) -> None:
    """Keys as the terminal driver posts them: queued on the App at once, before it drew anything."""
    for character in text:
        key = "space" if character == " " else character
        event = events.Key(key, character)
        event.set_sender(app)
        app.post_message(event)


class _TypedAhead(LlmtuiApp):
    """The app with keys already waiting when it starts (typed while it was launching): the terminal driver
    queues them on the App before the App's own mount handler has pushed the chat."""

    def on_mount(self) -> None:  # Textual calls this before LlmtuiApp.on_mount (a subclass's handler runs first)
        _post_keys(self, "hello there")


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
async def test_keys_typed_before_the_first_screen_land_in_the_prompt() -> None:
    app = _TypedAhead("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = chat_of(app)
        search = chat.query_one("#conversation-search", Input)
        await wait_until(
            pilot, lambda: chat.prompt.text == "hello there", what="the early keys in the prompt", timeout_s=10
        )
        assert search.value == ""
        assert app.focused is chat.prompt


# ----- 2. the stats bar's speedup, as honest as the speculation check -----------------------------------------


def test_the_bars_speedup_is_marked_unless_outside_the_measured_spread() -> None:
    """The check's verdict and the bar's mark agree: no measurable difference (within the spread, or not measured)
    is "~"; a ratio outside the spread is shown plain."""
    assert short_summary(STATS) == "74% ~×1.4"  # one reply: its spread is not measured
    assert short_summary(STATS, 0.05) == "74% ×1.4"  # steady replies: 1.36 is outside a 5% spread
    assert short_summary(STATS, 0.40) == "74% ~×1.4"  # replies vary by 40%: 1.36 is within it
    assert short_summary(replace(STATS, effective_tps=135.0), 0.0) == "74% ~×1.0"  # within 3%, however steady
    plain, spec = Side(tokens_per_s=100.0, speeds=[80.0, 100.0, 120.0]), Side(tokens=12, tokens_per_s=130.0)
    spec.speeds = [110.0, 130.0, 150.0]
    assert "no measurable difference" in verdict(plain, spec, STATS, "ngram-mod")[1]
    assert short_summary(replace(STATS, effective_tps=130.0, plain_tps=100.0), 0.4).endswith("~×1.3")


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_after_one_message_the_stats_bar_marks_the_speedup_as_unmeasured_noise() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        app.config = replace(app.config, speculative=SpeculativeSettings(enabled=True, spec_type="ngram-mod"))
        app.set_engine_state("ready")
        chat = chat_of(app)

        def bar() -> str:
            return chat.stats.render().plain

        async def reply(tps: float) -> None:
            app.post_message(engine_message(app, speculative_event(replace(STATS, effective_tps=tps), final=True)))
            await wait_until(
                pilot, lambda: app.speculation.stats is not None and app.speculation.stats.effective_tps == tps
            )
            await pilot.pause()

        await reply(172.9)  # one message: ×1.3, and nothing says how much replies vary
        await wait_until(pilot, lambda: "spec 74% ~×1.3" in bar(), what="the bar's speedup marked ~ after one reply")
        meter = chat.query_one(SpecMeter)
        await wait_until(pilot, lambda: "~×1.30" in meter.render().plain, what="the meter's speedup marked ~")
        await reply(133.0 * 1.05)  # a second reply: the ratios vary by 21%, and 1.05 is inside that
        await wait_until(pilot, lambda: "spec 74% ~×1.1" in bar(), what="a ratio within the spread marked ~")
        for _ in range(4):  # steady replies: the last five ratios are all 1.36, so the spread is 0
            await reply(181.0)
        await wait_until(pilot, lambda: "spec 74% ×1.4" in bar(), what="a steady, measurable speedup shown plain")
        assert "~" not in bar()
        await wait_until(pilot, lambda: "  ×1.36" in meter.render().plain, what="the meter's speedup plain")


# ----- 3. F4's download progress, readable at 80×24 while a toast shows ----------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("models_hub")
async def test_the_download_progress_is_readable_at_80x24_while_toasts_show(tiny_models: dict[str, Path]) -> None:
    app = models_app(tiny_models)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await catalog_with_download(pilot)
        screen = app.screen
        screen.notify(f"Downloading {REPO}:Q8_0 with mtp.")  # what d says, and what a finished download says
        screen.notify(f"Downloaded {REPO}:Q8_0. Press u to chat with it.")
        await wait_until(pilot, lambda: len(screen.query("Toast")) == 2, what="the two toasts shown")
        await pilot.pause()
        toasts = [toast.region for toast in screen.query("Toast")]
        rows = list(screen.query(".download-row"))
        assert len(rows) == 2
        for row, progress in zip(rows, in_progress(), strict=True):
            stats = row.query_one(".download-stats", Label)
            drawn = stats.render_lines(Region(0, 0, stats.size.width, 1))[0].text.rstrip()
            assert drawn == progress_text(progress)  # every number, not cut at 80 columns
            assert stats.region.right <= 80
            for toast in toasts:
                assert not toast.overlaps(row.region), f"a toast at {toast} covers the download row at {row.region}"


# ----- 4. F4's Search tab: the detail pane follows the highlighted result --------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("models_hub")
async def test_the_search_tabs_detail_follows_the_highlighted_result(tiny_models: dict[str, Path]) -> None:
    app = models_app(tiny_models)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_models(pilot)
        catalog_model = screen.entry
        assert catalog_model is not None and catalog_model.name in detail_text(screen)  # the catalog's first model
        await pilot.press("slash", *"gguf", "enter")  # both repos of the local Hub, the most downloaded first
        await wait_until(
            pilot, lambda: [r.repo_id for r in screen.search_results] == [REPO, GATED], what="the two results"
        )
        await wait_until(pilot, lambda: REPO in detail_text(screen), what="the first result in the detail pane")
        assert catalog_model.name not in detail_text(screen) and "↓42 ♥7" in detail_text(screen)
        await pilot.press("down")  # the keyboard moves the highlight: the pane follows, without Enter
        await wait_until(pilot, lambda: GATED in detail_text(screen), what="the highlighted result's facts")
        assert REPO not in detail_text(screen) and "Gated" in detail_text(screen)
        assert screen.listing is None and not quant_list(screen).display  # nothing read: Enter reads the repo
        await pilot.press("up", "enter")
        await wait_until(
            pilot, lambda: screen.listing is not None and screen.listing.repo_id == REPO, what="Enter opened it"
        )
        assert quant_list(screen).option_count == 2 and app.focused is quant_list(screen)


# ----- 5. the speculation check's prompt, from its start at 80 columns ------------------------------------------

LONG_PROMPT = (
    "repeat this text: The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill "
    "in the afternoon sun, and nobody minds."
)


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("view", ["check", "steering A/B"])
async def test_the_checks_prompt_wraps_at_words_from_its_start_at_80_columns(view: str) -> None:
    """The speculation check (F9, ctrl+b) and the steering A/B view (F6, b) open on the last message."""
    store = open_default_store()
    conversation = store.conversations.create_conversation(
        "Repeat"
    )  # the newest: the chat opens it, the view runs its message
    store.tree.add_user_message(conversation.id, LONG_PROMPT)
    store.close()
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        if view == "check":
            await pilot.press("f9")
            await _types_read(pilot)
            await pilot.press("ctrl+b")
            kind: type[ABRunScreen] = SpecCheckScreen
        else:
            app.action_steering_ab()  # (the panel's b; F6 needs the model's facts, this scene has no file)
            kind = SteeringABScreen
        await wait_until(
            pilot, lambda: isinstance(app.screen, kind) and app.screen.query(".ab-prompt"), what=f"the {view} open"
        )
        prompt = app.screen.query_one(".ab-prompt")  # (any widget: an Input showed it from its end, mid-word)
        await pilot.pause()
        assert isinstance(prompt, PromptInput) and prompt.text == LONG_PROMPT and app.focused is prompt
        width, height = prompt.size
        lines = [strip.text.strip() for strip in prompt.render_lines(Region(0, 0, width, height))]
        lines = [line for line in lines if line]
        assert len(lines) >= 2 and lines[0].startswith("repeat this text: The quick")  # from its start
        assert " ".join(lines) == LONG_PROMPT  # wrapped between words: no word cut, nothing hidden
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.chat, what=f"Esc closes the {view}")


# ----- 6. the heat strip saturates at each slider's own range ---------------------------------------------------

PEAKED = (0.1, 0.1, 4.0)
"""Per-layer norms of a vector strong on its last layer only (the tiny model steers layers 1-3): its slider spans
±20 (the median layer, 0.1, sets the range on this 64-wide model), so the old strip, full at an applied norm of 2,
was full at strength 1."""


def _peaked_vector() -> Path:
    directions = {}
    for layer, norm in zip(range(1, 4), PEAKED, strict=True):
        direction = np.random.default_rng(layer).standard_normal(64).astype(np.float32)
        directions[layer] = direction / np.linalg.norm(direction) * norm
    metadata = {"llmtui.prompt_set": "peaked", "llmtui.positive": "happy", "llmtui.negative": "sad"}
    return write_control_vector(ControlVector(directions, "llama", metadata), steering_dir() / "model-peaked.gguf")


def _cells(heat: HeatStrip) -> str:
    return heat.render().plain.removeprefix("layers 1 ").rsplit(" ", 1)[0]


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
async def test_the_heat_strip_fills_only_when_a_slider_reaches_its_own_range(tiny_models: dict[str, Path]) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        _with_tiny_model(app, tiny_models["qwen35"])
        vector = _peaked_vector()
        app.config = replace(app.config, steering=SteeringSettings((str(vector),), (1.0,)))
        app.steering.applied = SteeringSet(True, 1, 3, PEAKED, (1, 2, 3))  # strength 1: the norms themselves
        await app.action_steering()
        await vectors_listed(pilot)
        panel = chat_of(app).steering_panel
        slider = panel.sliders[0]
        assert slider.range == 20.0 and slider.strength == 1.0
        heat = panel.query_one(HeatStrip)
        await wait_until(pilot, lambda: heat.layer_norms == PEAKED, what="the strip on what the engine applies")
        await pilot.pause()
        assert _cells(heat) == "▁▁▁"  # a twentieth of the slider: no cell full (it was "▁▁█")
        assert abs(heat.full - 80.0) < 1e-3  # the scale: ±20 × the largest norm, 4
        slider.focus()
        await type_strength(pilot, "20")  # the slider's end
        assert app.config.steering.strengths == (20.0,)
        app.post_message(engine_message(app, SteeringSet(True, 1, 3, tuple(20 * n for n in PEAKED), (1, 2, 3))))
        await wait_until(pilot, lambda: heat.layer_norms[-1] == 80.0, what="the engine's answer shown")
        assert abs(heat.full - 80.0) < 1e-3
        assert _cells(heat) == "▁▁█"  # at its range's end, its strongest layer is full
