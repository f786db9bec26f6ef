"""Speculative decoding in the TUI: the panel (F9), the toggle (F8), the live meter, and greedy text unchanged."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Select

from app.core.config import ConfigError, SamplingSettings, SpeculativeSettings, load_config
from app.core.speculation_facts import find_sidecars, load_options, short_summary, sparkline, supported_types
from app.core.store import open_default_store
from app.tui.app import LlmtuiApp
from app.tui.modals.pick import PickModal
from app.tui.modals.speculative import SpeculativeModal
from app.tui.screens.spec_check import Side, SpecCheckScreen, first_difference, run_to_run_noise, side_text, verdict
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.spec_meter import SpecMeter
from engine_ext.protocol import DrafterReport, SpeculativeStats
from tests.fakes import drafted_chunk, engine_message, speculative_event
from tests.pilot import (  # noqa: F401 (seeded: fixture)
    MODEL,
    SIZES,
    chat_of,
    loaded,
    make_app,
    press_and_start,
    press_to_cancel,
    ready,
    reply_done,
    seeded,
    send,
    started,
)
from tests.waits import wait_until

GREEDY = SamplingSettings(temperature=0.0, max_tokens=24)

STATS = SpeculativeStats(
    request_id=1,
    steps=40,
    drafted=160,
    accepted=118,
    acceptance_rate=118 / 160,
    mean_accepted_length=3.95,
    acceptance_per_position=(0.95, 0.8, 0.7, 0.5),
    recent_acceptance=(0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 0.5, 1.0, 1.0, 1.0, 0.875),
    draft_ms=12.0,
    verify_ms=300.0,
    effective_tps=181.0,
    plain_tps=133.0,
    drafters=(DrafterReport("ngram-mod", 40, 160, 118, (0.95, 0.8, 0.7, 0.5), 12.0),),
    n_max=16,
    status="drafting with ngram-mod",
)

AUTO_WITHOUT_MODEL_DRAFTER = ("ngram-mod", "ngram-prompt")  # auto on a model with no model drafter


def _generated(app: LlmtuiApp) -> str:
    chat = chat_of(app)
    assert chat.conversation_id is not None
    return app.store.tree.active_path(chat.conversation_id)[-1].content


async def _types_read(pilot: Pilot[Any]) -> None:
    """Let the panel read its types (the GGUF headers are read in a thread; typing is read once it pauses)."""
    await pilot.pause()
    panel = pilot.app.screen
    if isinstance(panel, SpeculativeModal):
        await wait_until(pilot, lambda: not panel.reading, what="the panel's types, read in a thread")
        await pilot.pause()


async def _choose_in_panel(pilot: Pilot[Any], spec_type: str, key: str) -> None:
    """Open the speculative panel (F9), highlight `spec_type` and press `key` (ctrl+s apply, ctrl+b check)."""
    await pilot.press("f9")
    await pilot.pause()
    await _types_read(pilot)
    panel = pilot.app.screen
    assert isinstance(panel, SpeculativeModal)
    panel.query_one(OptionList).highlighted = panel.types.index(spec_type)
    await pilot.press(key)


@asynccontextmanager
async def _without_engine(
    size: tuple[int, int], model: str = "/models/a.gguf"
) -> AsyncIterator[tuple[LlmtuiApp, Pilot[Any]]]:
    """The app without an engine, as if the model at `model` were loaded."""
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.model = replace(MODEL, path=model)
        app.model_path = model
        yield app, pilot


async def _plain_reply(pilot: Pilot[Any], app: LlmtuiApp) -> str:
    """Once the model is ready, a greedy reply without speculation."""
    await ready(pilot)
    await send(pilot, "hello there")
    await reply_done(pilot)
    return _generated(app)


async def _regenerated_with_drafts(pilot: Pilot[Any], app: LlmtuiApp, plain: str) -> None:
    """Regenerate (ctrl+r) with speculation on: drafts were verified and the text is `plain`'s."""
    await press_and_start(pilot, "ctrl+r")
    await reply_done(pilot)
    await wait_until(pilot, lambda: app.speculation.stats is not None)
    assert _generated(app) == plain
    assert app.speculation.stats is not None and app.speculation.stats.drafted > 0


async def _check_screen(pilot: Pilot[Any]) -> SpecCheckScreen:
    """The speculation check just opened."""
    await pilot.pause()
    check = pilot.app.screen
    assert isinstance(check, SpecCheckScreen)
    return check


# ----- pure helpers ---------------------------------------------------------------------------------


def test_supported_types_follow_the_model_and_the_draft_file(tiny_models: dict[str, Path]) -> None:
    plain = [t for t, _ in supported_types(str(tiny_models["llama"]), "")]
    assert plain[0] == "auto" and "ngram-mod" in plain and "draft-mtp" not in plain
    assert "draft-mtp" in [t for t, _ in supported_types(str(tiny_models["qwen35_mtp"]), "")]
    with_dflash = [t for t, _ in supported_types(str(tiny_models["llama"]), str(tiny_models["dflash"]))]
    assert "draft-dflash" in with_dflash and "draft-dspark" not in with_dflash
    assert "draft-simple" in [t for t, _ in supported_types(str(tiny_models["llama"]), str(tiny_models["llama"]))]
    assert supported_types(str(tiny_models["llama"]), "/no/such/draft.gguf") == supported_types(
        str(tiny_models["llama"]), ""
    )


def test_load_options_load_mtp_heads_and_rollback_only_when_they_draft(tiny_models: dict[str, Path]) -> None:
    mtp = str(tiny_models["qwen35_mtp"])
    assert load_options(mtp, SpeculativeSettings(enabled=False)) == (False, 0)
    assert load_options(mtp, SpeculativeSettings(enabled=True, spec_type="ngram-mod")) == (False, 0)
    assert load_options(mtp, SpeculativeSettings(enabled=True, spec_type="draft-mtp", n_max=8)) == (True, 8)
    assert load_options(mtp, SpeculativeSettings(enabled=True, spec_type="auto")) == (True, 16)
    assert load_options(str(tiny_models["llama"]), SpeculativeSettings(enabled=True)) == (False, 0)


def test_readouts() -> None:
    assert sparkline((0.0, 0.5, 1.0), 8) == "▁▅█"
    assert len(sparkline(tuple(i / 100 for i in range(100)), 16)) == 16
    assert short_summary(STATS) == "74% ~×1.4"  # one reply: the spread is not measured (test_leftovers.py)
    assert short_summary(replace(STATS, drafted=0, plain_tps=0.0)) == "on"


class MeterHost(App[None]):
    def compose(self) -> ComposeResult:
        yield SpecMeter()


@pytest.mark.anyio
async def test_meter_shows_sparkline_length_speedup_and_status() -> None:
    async with MeterHost().run_test(size=(140, 3)) as pilot:
        meter = pilot.app.query_one(SpecMeter)
        meter.spec_type = "auto"
        await pilot.pause()
        assert "waiting for a reply" in meter.render().plain
        meter.drafters = ("ngram-mod",)
        meter.stats = STATS
        await pilot.pause()
        text = meter.render().plain
        assert "auto (ngram-mod)" in text
        assert sparkline(STATS.recent_acceptance, 16) in text
        assert "74% accepted" in text and "3.95 tok/step" in text and "×1.36" in text
        assert "drafting with ngram-mod" in text


CHAINED = replace(
    STATS,
    drafters=(
        DrafterReport("ngram-mod", 30, 120, 100, (1.0, 0.9, 0.8), 4.0),
        DrafterReport("draft-mtp", 10, 40, 18, (0.8, 0.5, 0.2), 8.0),
    ),
)


@pytest.mark.anyio
async def test_expanded_meter_shows_counts_positions_time_and_each_drafter() -> None:
    async with MeterHost().run_test(size=(140, 8)) as pilot:
        meter = pilot.app.query_one(SpecMeter)
        meter.spec_type, meter.drafters, meter.stats = "auto", ("ngram-mod", "draft-mtp"), CHAINED
        await pilot.pause()
        assert meter.size.height == 1 and "\n" not in meter.render().plain
        meter.expanded = True
        await pilot.pause()
        lines = meter.render().plain.split("\n")
        assert meter.size.height == len(lines) == 6
        assert lines[0].startswith(" ⚡ auto (ngram-mod+draft-mtp)")
        assert lines[1] == "   proposed 160  drafted 160  accepted 118 (74%)  steps 40  181.0 tok/s vs plain 133.0"
        bars = sparkline(STATS.acceptance_per_position, 4)
        assert lines[2] == f"   by position {bars}  1: 95%  2: 80%  3: 70%  4: 50%"
        assert lines[3] == "   drafting 12.0 ms (4%)  verifying 300.0 ms (96%)"
        mod, mtp = (sparkline(report.acceptance_per_position, 3) for report in CHAINED.drafters)
        assert lines[4] == f"   ngram-mod     30 drafts  accepted 100 of 120 proposed (83%)  {mod}  4.0 ms drafting"
        assert lines[5] == f"   draft-mtp     10 drafts  accepted 18 of 40 proposed (45%)  {mtp}  8.0 ms drafting"
        # Sixteen positions: a bar each, the rates of the first four and the last.
        meter.stats = replace(STATS, acceptance_per_position=tuple(1 - i / 16 for i in range(16)), drafters=())
        await pilot.pause()
        assert meter.size.height == len(meter.render().plain.split("\n")) == 4  # no line per drafter for one
        positions = meter.render().plain.split("\n")[2]
        assert (
            positions
            == "   by position "
            + sparkline([1 - i / 16 for i in range(16)], 16)
            + "  1: 100%  2: 94%  3: 88%  4: 81%  …  16: 6%"
        )


@pytest.mark.anyio
async def test_the_meter_fits_80_columns_status_and_speeds_first() -> None:
    """Issue 37 item 4: at 80 columns the lines ended in "…" before "drafting"/"paused" and the speeds; the narrow
    forms put them first and shorten the rest, and the whole status is the tooltip."""
    paused = (
        "paused: measured 0.83× plain speed with 40% of drafted tokens accepted; plain decoding for 64 tokens, "
        "then trying again"
    )
    async with MeterHost().run_test(size=(80, 8)) as pilot:
        meter = pilot.app.query_one(SpecMeter)
        meter.spec_type, meter.drafters, meter.stats = (
            "auto",
            ("ngram-mod", "draft-mtp"),
            replace(CHAINED, status=paused),
        )
        await pilot.pause()
        [summary] = meter.render().plain.split("\n")
        assert summary[:80].startswith(" ⚡ auto  paused  74% accepted  3.95 tok/step  ~×1.36  ")
        assert "n_max 16" in summary[:80] and meter.tooltip == paused
        meter.stats = replace(CHAINED, status="drafting: 1.36× plain speed, n_max 16")
        await pilot.pause()
        assert meter.render().plain.startswith(" ⚡ auto  drafting  74% accepted")
        meter.expanded = True
        await pilot.pause()
        lines = meter.render().plain.split("\n")
        assert meter.size.height == len(lines) == 6
        assert lines[1] == "   181.0 tok/s vs plain 133.0  steps 40  accepted 118/160 (74%)  proposed 160"
        mod = sparkline(CHAINED.drafters[0].acceptance_per_position, 3)
        assert lines[4] == f"   ngram-mod     30 drafts  accepted 100/120 (83%)  4.0 ms  {mod}"
        assert all(len(line) <= 80 for line in lines[1:])


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_ctrl_o_expands_the_meter_live_and_is_remembered(lone_llama: Path) -> None:
    app = LlmtuiApp(str(lone_llama), default_sampling=SamplingSettings(temperature=0.0, max_tokens=96))
    async with app.run_test(size=(120, 40)) as pilot:
        chat = await ready(pilot)
        await pilot.press("ctrl+o")  # speculation off: says how to turn it on, changes nothing
        await pilot.pause()
        assert not app.config.spec_details
        await pilot.press("f8")
        await wait_until(pilot, lambda: app.speculation.drafters == AUTO_WITHOUT_MODEL_DRAFTER)
        await pilot.press("ctrl+o")
        await pilot.pause()
        meter = chat.query_one(SpecMeter)
        assert meter.expanded and load_config().spec_details  # remembered
        await send(pilot, "a b c a b c a b c a b c a b c a b c")
        await reply_done(pilot)
        await wait_until(pilot, lambda: app.speculation.stats is not None and app.speculation.stats.drafted > 0)
        await pilot.pause()
        lines = meter.render().plain.split("\n")
        assert meter.size.height == len(lines) >= 4
        stats = app.speculation.stats
        assert lines[1].startswith(f"   proposed {stats.proposed}  drafted {stats.drafted}  accepted {stats.accepted}")
        assert lines[2].startswith("   by position ")
        # A click folds it (and ctrl+o or a click opens it again).
        await pilot.click(SpecMeter)
        await pilot.pause()
        assert not meter.expanded and meter.size.height == 1 and not load_config().spec_details


# ----- the panel ------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_panel_says_which_paired_drafts_are_not_downloaded() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        app.speculation.missing_drafts = (("mtp", "org/model-GGUF"), ("dspark", "org/model-DSpark"))
        await pilot.press("f9")
        await pilot.pause()
        await _types_read(pilot)
        hint = app.screen.query_one("#spec-draft", Input).placeholder
        assert hint == "a draft .gguf; not downloaded: MTP sidecar, DSpark draft (Models, F4)"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_fixed_type_that_slows_a_reply_down_is_said_once() -> None:
    async with _without_engine((120, 40)) as (app, pilot):

        def warnings() -> list[str]:
            return [n.message for n in app._notifications if "slower than plain decoding" in n.message]

        slow = replace(STATS, effective_tps=80.0)  # 0.60× plain
        for spec_type, stats, final in (
            ("ngram-simple", slow, False),  # live figures say nothing yet
            ("auto", slow, True),  # auto pauses on its own
            ("ngram-simple", STATS, True),  # faster
            ("ngram-simple", replace(slow, steps=3), True),
        ):  # too short to tell
            app.config = replace(app.config, speculative=SpeculativeSettings(enabled=True, spec_type=spec_type))
            app.post_message(engine_message(app, speculative_event(stats, final=final)))
            await pilot.pause()
        assert warnings() == []
        for _ in range(2):
            app.post_message(engine_message(app, speculative_event(slow, final=True)))
            await pilot.pause()
        assert len(warnings()) == 1 and warnings()[0].startswith(
            "ngram-simple made this reply slower than plain decoding (0.60×, 74% of drafted tokens accepted)"
        )


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_panel_offers_what_the_model_supports_and_validates(tiny_models: dict[str, Path]) -> None:
    async with _without_engine((120, 40), str(tiny_models["qwen35_mtp"])) as (app, pilot):
        await pilot.press("f9")
        await pilot.pause()
        await _types_read(pilot)
        panel = app.screen
        assert isinstance(panel, SpeculativeModal)
        assert "draft-mtp" in panel.types and "draft-dflash" not in panel.types
        # A DFlash draft file adds its type.
        panel.query_one("#spec-draft", Input).value = str(tiny_models["dflash"])
        await pilot.pause()
        await _types_read(pilot)
        assert "draft-dflash" in panel.types
        # A bad number is refused with a notification; the panel stays.
        panel.query_one("#spec-n_max", Input).value = "lots"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is panel
        assert any("n_max" in n.message for n in app._notifications)
        # Esc cancels: nothing changes.
        await pilot.press("escape")
        await pilot.pause()
        assert app.config.speculative == SpeculativeSettings()


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_panel_and_the_settings_screen_take_defaults_and_ranges_from_the_declarations() -> None:
    """F9's number fields and F3's engine fields show each declaration's default, and one past a draft setting's
    declared maximum is refused with the declaration's one-line message (engine_ext.settings_schema)."""
    from app.tui.screens.settings_screen import SettingsScreen
    from engine_ext import settings_schema as s

    async with _without_engine((120, 40)) as (app, pilot):
        await pilot.press("f9")
        await _types_read(pilot)
        panel = app.screen
        assert isinstance(panel, SpeculativeModal)
        for setting in s.DRAFT_NUMBERS:
            assert panel.query_one(f"#spec-{setting.name}", Input).value == str(setting.default), setting.name
        panel.query_one(f"#spec-{s.DRAFT_N_MAX.name}", Input).value = str(s.DRAFT_N_MAX.maximum + 1)
        with pytest.raises(ConfigError) as refused:
            panel.read_settings()
        assert str(refused.value) == s.DRAFT_N_MAX.refusal(s.DRAFT_N_MAX.maximum + 1)
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings screen (F3)")
        screen = app.screen
        for setting in s.ENGINE:
            if setting in (s.N_GPU_LAYERS, *s.MODEL_LISTS):  # shown in their own text forms
                continue
            field = screen.query_one(f"#setting-{setting.name}")
            if isinstance(field, Input):
                assert field.value == str(setting.default), setting.name
            else:
                assert isinstance(field, Select) and field.value == setting.default, setting.name


# ----- with the engine ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_toggling_speculation_keeps_greedy_text_and_feeds_the_meter(lone_llama: Path) -> None:
    app = LlmtuiApp(str(lone_llama), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        chat = await ready(pilot)
        # Repeated text gives the n-gram drafter something to draft.
        await send(pilot, "a b c a b c a b c a b c")
        await reply_done(pilot)
        plain = _generated(app)
        assert not chat.query(SpecMeter)
        await pilot.press("f8")
        await wait_until(pilot, lambda: app.speculation.drafters == AUTO_WITHOUT_MODEL_DRAFTER)
        assert app.config.speculative.enabled and load_config().speculative.enabled  # persisted
        meter = chat.query_one(SpecMeter)
        await press_and_start(pilot, "ctrl+r")
        await reply_done(pilot)
        await wait_until(pilot, lambda: app.speculation.stats is not None)
        assert _generated(app) == plain
        assert meter.stats is app.speculation.stats and meter.stats is not None
        assert "tok/step" in meter.render().plain
        assert "spec" in chat.stats.extras
        # Off again: the meter goes, the text is still the same.
        await pilot.press("f8")
        await wait_until(pilot, lambda: not chat.query(SpecMeter) and app.speculation.drafters == ())
        await press_and_start(pilot, "ctrl+r")
        await reply_done(pilot)
        assert _generated(app) == plain
        assert "spec" not in chat.stats.extras


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_mtp_from_the_panel_reloads_with_heads_and_keeps_greedy_text(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["qwen35_mtp"]), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        plain = await _plain_reply(pilot, app)
        assert app.speculation.loaded_with == (False, 0)
        await _choose_in_panel(pilot, "draft-mtp", "ctrl+s")
        await wait_until(pilot, lambda: app.speculation.drafters == ("draft-mtp",))
        assert app.speculation.loaded_with == (True, 16)  # reloaded with the MTP heads and GDN rollback
        await _regenerated_with_drafts(pilot, app, plain)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_auto_drafts_with_the_mtp_sidecar_beside_the_model_and_keeps_greedy_text(
    tiny_models: dict[str, Path],
) -> None:
    """tiny-qwen35 has no MTP heads of its own but mtp-tiny-qwen35.gguf lies beside it: as llama.cpp attaches a
    sidecar in the model's folder, F8 (auto) drafts with it, reloading for GDN rollback, with nothing typed."""
    app = LlmtuiApp(str(tiny_models["qwen35"]), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        plain = await _plain_reply(pilot, app)
        assert [c.kind for c in app.speculation.draft_sidecars][:1] == ["mtp"]
        await pilot.press("f8")
        await wait_until(pilot, lambda: app.speculation.drafters == ("ngram-mod", "draft-mtp"))
        # the user's choice kept
        assert app.speculation.loaded_with == (False, 16) and app.config.speculative.draft_model == ""
        await _regenerated_with_drafts(pilot, app, plain)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_panel_ctrl_d_picks_a_draft_found_on_this_machine(tiny_models: dict[str, Path]) -> None:
    async with _without_engine((120, 40), str(tiny_models["llama"])) as (app, pilot):
        app.speculation.draft_sidecars = tuple(find_sidecars(app.model_path, ()))
        await pilot.press("f9")
        await pilot.pause()
        await _types_read(pilot)
        panel = app.screen
        assert isinstance(panel, SpeculativeModal)
        draft = panel.query_one("#spec-draft", Input)
        # An empty field means the sidecar auto drafts with; the sidecars' types are offered.
        assert draft.placeholder == "empty: dspark-tiny-llama.gguf (beside the model)"
        assert {"draft-dspark", "draft-dflash", "draft-eagle3"} <= set(panel.types)
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: isinstance(app.screen, PickModal))
        pick = app.screen
        assert isinstance(pick, PickModal)
        assert [label.split()[0] for label in pick.labels] == ["draft-dspark", "draft-dflash", "draft-eagle3"]
        await pilot.press("down", "down", "enter")
        await wait_until(pilot, lambda: app.screen is panel)
        await _types_read(pilot)
        assert draft.value == str(tiny_models["eagle3"])
        assert panel.types[panel.query_one("#spec-types", OptionList).highlighted or 0] == "draft-eagle3"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.config.speculative.spec_type == "draft-eagle3"
        assert app.config.speculative.draft_model == str(tiny_models["eagle3"])


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_refused_configuration_is_a_notification_and_speculation_turns_off(
    tiny_models: dict[str, Path],
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        # A DSpark draft offered as DFlash: the engine refuses it, the worker stays up.
        app.speculation.apply(
            SpeculativeSettings(enabled=True, spec_type="draft-dflash", draft_model=str(tiny_models["dspark"]))
        )
        await wait_until(pilot, lambda: not app.config.speculative.enabled)
        # notify() posts a message: the notification lands on the next turn of the event loop.
        await wait_until(pilot, lambda: any("Speculative decoding failed" in n.message for n in app._notifications))
        assert app.engine_state == "ready"
        await send(pilot, "still alive?")
        await reply_done(pilot)
        assert _generated(app)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_draft_colouring_marks_the_text_of_accepted_draft_tokens(lone_llama: Path) -> None:
    app = LlmtuiApp(str(lone_llama), default_sampling=SamplingSettings(temperature=0.0, max_tokens=96))
    async with app.run_test(size=(120, 40)) as pilot:
        chat = await ready(pilot)
        await pilot.press("f8")
        await wait_until(pilot, lambda: app.speculation.drafters == AUTO_WITHOUT_MODEL_DRAFTER)
        await send(pilot, "a b c a b c a b c a b c a b c a b c")
        await reply_done(pilot)
        await wait_until(pilot, lambda: app.speculation.stats is not None)
        assert app.speculation.stats is not None and app.speculation.stats.accepted > 0
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        spans = reply.stats.get("draft_spans")
        # Accepted drafts by either drafter of the chain, and the target's tokens where a draft was rejected.
        assert spans and all(
            0 <= start < end <= len(reply.content) and drafter.removeprefix("target/") in AUTO_WITHOUT_MODEL_DRAFTER
            for start, end, drafter in spans
        )
        view = chat.transcript.views()[-1]
        assert not view.colour_drafts and not any(
            s.style and s.style.underline for strip in view._strips for s in strip
        )
        await pilot.press("f7")
        await pilot.pause()
        assert view.colour_drafts and load_config().draft_colouring  # persisted
        underlined = "".join(s.text for strip in view._strips for s in strip if s.style and s.style.underline)
        drafted = "".join(reply.content[start:end] for start, end, _ in spans)
        assert underlined.strip() and set(underlined) - {" "} <= set(drafted)  # drafted characters only
        await pilot.press("f7")
        await pilot.pause()
        assert not any(s.style and s.style.underline for strip in view._strips for s in strip)


# ----- the speculation check (A/B) ------------------------------------------------------------------


def test_first_difference() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("abc", "abcdef") == 3  # one is a prefix of the other: where the shorter ends
    assert first_difference("", "x") == 0


def test_verdict_says_same_or_where_it_diverged_with_speeds_and_acceptance() -> None:
    plain = Side("def add(a, b):\n    return a + b", tokens=12, tokens_per_s=100.0, speeds=[98.0, 100.0, 102.0])
    same, line = verdict(plain, replace(plain, tokens_per_s=150.0, speeds=[148.0, 150.0, 152.0]), STATS, "ngram-mod")
    assert same
    assert line == (
        "✓ The same text (12 tokens) · plain 100.0 tok/s · ngram-mod 150.0 tok/s (1.50× faster, runs "
        "vary by 4%) · proposed 160 · drafted 160 · accepted 118 (74%), 3.95 tokens per step"
    )
    other = Side("def add(a, b):\n    return b + a", tokens=12, tokens_per_s=150.0)
    same, line = verdict(plain, other, None, "draft-mtp")
    assert not same
    assert line.startswith("✗ DIVERGED at character 26, after “f add(a, b):⏎    return ”")
    assert line.endswith("nothing was drafted: B decoded as A did")


def test_the_speed_verdict_comes_from_the_statistics_and_the_noise() -> None:
    """A check that reported 1.26× with 0 tokens drafted: with nothing drafted there is no speed-up to measure, and a
    difference inside the run-to-run noise is no measurable difference, never a speed-up."""
    plain = Side("x", tokens=12, tokens_per_s=100.0, speeds=[90.0, 100.0, 110.0])
    faster = replace(plain, tokens_per_s=126.0, speeds=[120.0, 126.0, 132.0])
    nothing_drafted = replace(STATS, steps=0, drafted=0, accepted=0)
    assert "(nothing was drafted: no speed-up to measure)" in verdict(plain, faster, nothing_drafted, "auto")[1]
    assert "(nothing was drafted: no speed-up to measure)" in verdict(plain, faster, None, "auto")[1]
    assert "(1.26× faster, runs vary by 20%)" in verdict(plain, faster, STATS, "auto")[1]
    within_noise = replace(plain, tokens_per_s=108.0, speeds=[98.0, 108.0, 118.0])
    assert "(no measurable difference: runs vary by 20%)" in verdict(plain, within_noise, STATS, "auto")[1]
    slower = replace(plain, tokens_per_s=64.0, speeds=[63.0, 64.0, 65.0])
    assert "(36% slower, runs vary by 20%)" in verdict(plain, slower, STATS, "auto")[1]
    steady = replace(plain, speeds=[100.0, 100.0, 100.0])
    assert (
        "(no measurable difference: runs vary by 0%)"
        in verdict(steady, replace(steady, tokens_per_s=102.0, speeds=[102.0] * 3), STATS, "auto")[1]
    )  # within 3% whatever
    assert run_to_run_noise(Side(speeds=[100.0]), plain) is None  # one run: no noise measured
    assert "(1.26× faster, one run each)" in verdict(replace(plain, speeds=[]), faster, STATS, "auto")[1]


def test_side_text_underlines_drafts_and_marks_the_divergence() -> None:
    side = Side("abcdef", draft_spans=[(1, 3)])
    shown = side_text(side, 4, drafted=True)
    assert shown.plain == "abcdef"
    styles = {(span.start, span.end, str(span.style)) for span in shown.spans}
    assert styles == {(1, 3, "underline"), (4, 6, "bold red reverse")}
    shorter = side_text(Side("abcd", reasoning="thinking"), 4, drafted=False)
    assert shorter.plain == "thinking\n\nabcd ⟂ ends here"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_check_from_the_panel_runs_plain_then_speculative_and_finds_the_same_text(
    tiny_models: dict[str, Path],
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await _choose_in_panel(pilot, "ngram-mod", "ctrl+b")  # apply, then check
        check = await _check_screen(pilot)
        await wait_until(pilot, lambda: app.speculation.drafters == ("ngram-mod",))
        check.query_one(PromptInput).load_text("a b c a b c a b c a b c a b c a b c")
        await pilot.press("enter")
        await wait_until(pilot, lambda: check.runs_done == 1)
        a, b = check.sides["a"], check.sides["b"]
        assert a.text and a.text == b.text and a.tokens == b.tokens
        assert check.identical is True
        assert "b" in check.side_stats and check.side_stats["b"].accepted > 0 and b.draft_spans  # B really drafted
        assert not a.draft_spans
        verdict_line = str(check.query_one("#check-verdict").render())
        assert verdict_line.startswith(f"✓ The same text ({b.tokens} tokens)")
        # The engine is back on the user's settings, and the chat was not touched.
        await wait_until(pilot, lambda: app.speculation.drafters == ("ngram-mod",))
        assert app.config.speculative.enabled and app.config.speculative.spec_type == "ngram-mod"
        assert chat_of(app).conversation_id is None
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SpecCheckScreen)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_check_asked_for_while_a_reply_is_written_runs_after_it_on_the_last_message(
    tiny_models: dict[str, Path],
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        chat = await ready(pilot)
        pid = app.bridge.pid or 0  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)  # the reply cannot end before the check is asked for
        try:
            await send(pilot, "a b c a b c a b c")
            app.action_spec_check(SpeculativeSettings(spec_type="ngram-mod"))
            check = await _check_screen(pilot)
            assert check.query_one(PromptInput).text == "a b c a b c a b c"  # the conversation's last message
            await pilot.press("enter")
            await pilot.pause()
            assert check.waiting and check.running is None
            assert "waiting for the chat's reply to end" in str(check.query_one("#check-hint").render())
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_until(pilot, lambda: check.runs_done == 1)
        assert chat.generation is None and check.identical is True
        assert not app.config.speculative.enabled  # the user's setting is untouched: speculation stays off
        await wait_until(pilot, lambda: app.speculation.drafters == ())


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_check_survives_an_engine_crash_mid_run_and_runs_again_after_the_restart(
    tiny_models: dict[str, Path],
) -> None:
    from app.tui.modals.crash import EngineCrashedModal

    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.action_spec_check(SpeculativeSettings(spec_type="ngram-mod"))
        check = await _check_screen(pilot)
        pid = app.bridge.pid or 0  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        await pilot.press("enter")
        await pilot.pause()
        assert check.running == "a"
        os.kill(pid, signal.SIGKILL)
        await wait_until(pilot, lambda: isinstance(app.screen, EngineCrashedModal))
        assert check.running is None and check.request_id is None
        assert "the engine crashed" in str(check.query_one("#check-hint").render())
        await pilot.press("r")  # restart, from the crash dialog over the check
        await ready(pilot)
        assert app.screen is check
        await pilot.press("enter")
        await wait_until(pilot, lambda: check.runs_done == 1)
        assert check.identical is True


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_check_says_when_the_engine_refused_the_speculative_settings(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        # A DSpark draft offered as DFlash: the engine refuses it; B runs plain and must not pass as "the same".
        app.action_spec_check(SpeculativeSettings(spec_type="draft-dflash", draft_model=str(tiny_models["dspark"])))
        check = await _check_screen(pilot)
        check.query_one(PromptInput).load_text("hello")
        await pilot.press("enter")
        await wait_until(pilot, lambda: check.runs_done == 1)
        assert check.identical is None
        assert str(check.query_one("#check-verdict").render()).startswith("B ran without speculation:")
        assert not app.config.speculative.enabled and app.engine_state == "ready"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_check_waits_for_a_reload_and_closing_it_mid_run_restores_speculation(
    tiny_models: dict[str, Path],
) -> None:
    app = LlmtuiApp(str(tiny_models["qwen35_mtp"]), default_sampling=GREEDY)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await _choose_in_panel(pilot, "draft-mtp", "ctrl+b")  # needs a reload with the MTP heads: the check waits
        check = await _check_screen(pilot)
        check.query_one(PromptInput).load_text("hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: check.runs_done == 1)
        assert app.speculation.loaded_with == (True, 16)
        assert check.identical is True and "b" in check.side_stats and check.side_stats["b"].drafted > 0
        # Closed while A is being written (the engine paused, so the tiny model cannot finish first): the
        # generation is cancelled and the user's drafter set again.
        pid = app.bridge.pid or 0  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        try:
            await pilot.press("enter")
            await pilot.pause()
            assert check.running == "a"
            await press_to_cancel(pilot, "escape")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert not isinstance(app.screen, SpecCheckScreen)
        app.speculation.stats = None
        await send(pilot, "hello there")
        await reply_done(pilot)
        stats = app.speculation.stats
        assert stats is not None and stats.drafted > 0  # the chat's reply was drafted again
        assert app.speculation.drafters == ("draft-mtp",)


# ----- snapshots ------------------------------------------------------------------------------------


async def _panel(pilot: Pilot[Any]) -> None:
    await loaded(pilot)
    await pilot.press("f9")
    await pilot.pause()
    await _types_read(pilot)


async def _meter(pilot: Pilot[Any], details: bool = False) -> None:
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    await started(pilot)  # the settings read, before they are changed
    app.config = replace(app.config, speculative=SpeculativeSettings(enabled=True), spec_details=details)
    await loaded(pilot)
    app.speculation.drafters = ("ngram-mod", "draft-mtp") if details else ("ngram-mod",)
    app.speculation.stats = CHAINED if details else STATS
    app.refresh_feature_readouts()
    await pilot.pause()


async def _meter_details(pilot: Pilot[Any]) -> None:
    await _meter(pilot, details=True)


def _check(diverge: bool) -> Any:
    async def run(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, LlmtuiApp)
        await loaded(pilot)
        app.push_screen(SpecCheckScreen(SpeculativeSettings(spec_type="ngram-mod"), "Repeat: def add(a, b)"))
        check = await _check_screen(pilot)
        text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b"
        for side, reply, spans, speed in (
            ("a", text, (), 131.0),
            (
                "b",
                text.replace("a - b", "b - a") if diverge else text,
                ((4, 14, "ngram-mod"), (31, 45, "ngram-mod")),
                176.5,
            ),
        ):
            check.running = side
            check.tokens(drafted_chunk(7, reply, spans))
            check.sides[side].tokens, check.sides[side].tokens_per_s = 24, speed
        check.running = None
        check.side_stats["b"] = STATS
        check.conclude()
        await pilot.pause()

    return run


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", ["panel", "meter", "meter_details", "check_same", "check_diverged"])
def test_snapshot(snap_compare: Any, scene: str, size: tuple[int, int]) -> None:
    run = {
        "panel": _panel,
        "meter": _meter,
        "meter_details": _meter_details,
        "check_same": _check(False),
        "check_diverged": _check(True),
    }[scene]
    assert snap_compare(make_app(), terminal_size=size, run_before=run)


DRAFTED_REPLY = "Lists have a `reverse()` method:\n\n```python\nxs.reverse()\n```\n\nIt reverses the list in place."
DRAFTED = ("have a `reverse()`", "xs.reverse()", "the list in place", "method")


async def _draft_colouring(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    store = open_default_store()
    conversation = store.conversations.create_conversation("Drafted reply")
    question = store.tree.add_user_message(conversation.id, "How do I reverse a list?")
    reply = store.tree.begin_assistant_message(conversation.id, question.id, MODEL.name)
    # The first span as stored before the drafter was kept; the code by MTP heads (a model drafter's colour); "method"
    # the target's token where an n-gram draft was rejected.
    spans: list[list[int | str]] = [
        [DRAFTED_REPLY.index(part), DRAFTED_REPLY.index(part) + len(part)] for part in DRAFTED
    ]
    spans[1].append("draft-mtp")
    spans[2].append("ngram-mod")
    spans[3].append("target/ngram-mod")
    store.tree.finish_assistant_message(reply, DRAFTED_REPLY, "", "complete", {"draft_spans": spans}, 20)
    store.close()
    await loaded(pilot)
    chat = chat_of(app)
    await chat.conversations.open_conversation(conversation.id)
    await pilot.press("f7")
    await pilot.pause()
    app.clear_notifications()
    await pilot.pause()
    assert isinstance(chat.transcript.last_view(), MessageView)


@pytest.mark.usefixtures("seeded")
def test_draft_colouring_snapshot(snap_compare: Any) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_draft_colouring)


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_draft_pick_snapshot(snap_compare: Any, size: tuple[int, int], tiny_models: dict[str, Path]) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, LlmtuiApp)
        await loaded(pilot)
        app.model_path = str(tiny_models["qwen35"])
        app.speculation.draft_sidecars = tuple(find_sidecars(app.model_path, ()))
        await pilot.press("f9")
        await pilot.pause()
        await _types_read(pilot)
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: isinstance(app.screen, PickModal))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run)
