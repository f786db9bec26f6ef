"""Steering in the TUI: the panel (F6) with sliders and heat strip, the make dialog, live changes, the A/B view."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList, ProgressBar

from app.core.config import SamplingSettings, SpeculativeSettings, SteeringSettings, load_config
from app.core.model_paths import starter_model_path
from app.core.paths import steering_dir
from app.core.vectors import phase_eta, vector_progress_text
from app.tui.app import LlmtuiApp
from app.tui.messages import EngineMessage
from app.tui.modals.make_vector import MakeVectorModal, bar_steps
from app.tui.modals.text_prompt import PathPromptModal
from app.tui.screens.chat_screen import ChatScreen
from app.tui.screens.steering_ab import SteeringABScreen, acceptance_cost, side_readout
from app.tui.screens.steering_panel import (
    HeatStrip,
    SteeringPanel,
    VectorInfo,
    VectorSlider,
    parse_strength,
    snap_strength,
)
from app.tui.widgets.prompt_input import PromptInput
from engine_ext.protocol import SpeculativeStats, SteeringSet, VectorProgress
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from tests.fakes import engine_message
from tests.pilot import (  # noqa: F401 (seeded: fixture)
    MODEL,
    SIZES,
    assert_footer_fits,
    chat_of,
    loaded,
    make_app,
    ready,
    reply_done,
    seeded,
    send,
)
from tests.waits import wait_until

TINY_SET = {
    "name": "tiny-mood",
    "positive_label": "happy",
    "negative_label": "sad",
    "pairs": [
        ["I am so happy today", "I am so sad today"],
        ["What a joy", "What a pity"],
        ["A wonderful day", "An awful day"],
    ],
}


def synthetic_vector(name: str, n_embd: int, layers: range, scale: float = 1.0, folder: Path | None = None) -> Path:
    """A control vector in the user's steering folder, or `folder` (unit directions times `scale`, larger at later
    layers)."""
    rng = np.random.default_rng(7)
    directions = {}
    for il in layers:
        d = rng.standard_normal(n_embd).astype(np.float32)
        directions[il] = d / np.linalg.norm(d) * scale * (0.5 + il / (2 * layers.stop))
    metadata = {"llmtui.prompt_set": name, "llmtui.positive": "happy", "llmtui.negative": "sad"}
    return write_control_vector(
        ControlVector(directions, "llama", metadata), (folder or steering_dir()) / f"model-{name}.gguf"
    )


def user_prompt_set() -> Path:
    folder = steering_dir() / "prompts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny-mood.json"
    path.write_text(json.dumps(TINY_SET), encoding="utf-8")
    return path


# ----- the slider -----------------------------------------------------------------------------------


def test_snap_strength_clamps_and_rounds() -> None:
    assert snap_strength(0.07) == 0.05
    assert snap_strength(2.6) == 2.0 and snap_strength(-9) == -2.0
    assert snap_strength(0.1 + 0.2) == 0.3
    assert snap_strength(-0.0) == 0.0


class SliderHost(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.changes: list[float] = []

    def compose(self) -> ComposeResult:
        yield VectorSlider(VectorInfo("/x/happy.gguf", "happy-sad", 64, (1,), "happy", "sad", "tiny"))

    def on_vector_slider_changed(self, event: VectorSlider.Changed) -> None:
        self.changes.append(event.strength)


@pytest.mark.anyio
async def test_slider_keys_fine_coarse_reset_and_limits() -> None:
    app = SliderHost()
    async with app.run_test(size=(80, 3)) as pilot:
        slider = app.query_one(VectorSlider)
        slider.focus()
        await pilot.press("right", "right", "shift+right")
        assert slider.strength == 0.35
        await pilot.press("shift+left", "left")
        assert slider.strength == 0.05
        await pilot.press("0")
        assert slider.strength == 0.0
        await pilot.press(*["shift+right"] * 10)
        assert slider.strength == 2.0
        await pilot.pause()
        assert app.changes[:3] == [0.05, 0.1, 0.35] and app.changes[-1] == 2.0
        assert "+2.00" in slider.render().plain and "happy" in slider.render().plain


@pytest.mark.anyio
async def test_enter_on_a_slider_types_a_strength_past_its_range() -> None:
    app = SliderHost()
    async with app.run_test(size=(80, 12)) as pilot:
        slider = app.query_one(VectorSlider)
        slider.focus()
        assert slider.range == 2.0
        await type_strength(pilot, "7.5")
        assert slider.strength == 7.5 and app.changes[-1] == 7.5
        plain = slider.render().plain
        assert "+7.50" in plain and "±2" in plain and "▶" in plain  # the knob points past the end it went beyond
        await pilot.press("right")  # the keys do not push a typed strength further out…
        assert slider.strength == 7.5
        await pilot.press("left")  # …but move it back toward the range
        assert slider.strength == 7.45
        await type_strength(pilot, "-1000")
        assert slider.strength == -1000.0 and "◀" in slider.render().plain
        for bad in ("1001", "nan", "lots"):
            await type_strength(pilot, bad)
            assert slider.strength == -1000.0
        await wait_until(pilot, lambda: any("Strength not changed" in n.message for n in app._notifications))
        await type_strength(pilot, "-0.3")
        assert slider.strength == -0.3
    assert parse_strength("−4") == -4.0 and parse_strength("+4") == 4.0  # a typographic minus, a plus
    assert parse_strength("inf") == parse_strength("-1e4") == "a strength is a number from -1000 to 1000"


# ----- with the engine ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_make_dialog_makes_a_vector_with_progress_and_it_gets_a_slider(tiny_models: dict[str, Path]) -> None:
    user_prompt_set()
    progress: list[VectorProgress] = []
    app = LlmtuiApp(str(tiny_models["llama"]))

    def hook(message: Message) -> None:
        if isinstance(message, EngineMessage) and isinstance(message.event, VectorProgress):
            progress.append(message.event)

    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await ready(pilot)
        await pilot.press("f6")
        await pilot.pause()
        chat = chat_of(app)
        screen = chat.steering_panel
        assert screen.is_open and not screen.sliders
        await wait_until(pilot, lambda: app.steering.applied is not None)  # the opening probe: which layers steer
        assert app.steering.applied is not None and app.steering.applied.steered_layers == (1,)
        await pilot.press("m")
        await pilot.pause()
        await sets_listed(pilot)
        dialog = app.screen
        assert isinstance(dialog, MakeVectorModal)
        names = [path.stem for path in dialog.sets]
        assert {"happy-sad", "formal-casual", "tiny-mood"} <= set(names)
        dialog.query_one(OptionList).highlighted = names.index("tiny-mood")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.screen is chat and bool(screen.sliders))
        made = steering_dir() / "tiny-llama-tiny-mood.gguf"
        assert made.is_file()
        # The last word is the written file, at 100%; the phases came in order (a newer event may replace an older).
        assert progress and (progress[-1].phase, progress[-1].fraction) == ("writing", 1.0)
        phases = [p.phase for p in progress]
        assert phases == sorted(phases, key=["evaluating", "directions", "writing"].index)
        assert [p.fraction for p in progress] == sorted(p.fraction for p in progress)
        slider = screen.sliders[0]
        await wait_until(pilot, lambda: slider.has_focus)  # focus moves to the new slider after it mounts
        assert slider.vector.path == str(made) and slider.vector.name == "tiny-mood"
        assert load_config().steering.vectors == (str(made),)
        await wait_until(pilot, lambda: any("Made tiny-llama-tiny-mood.gguf" in n.message for n in app._notifications))


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_make_dialog_shows_each_phase_with_its_eta_and_no_full_bar_before_the_end(
    tiny_models: dict[str, Path],
) -> None:
    """The engine's progress events (as the bridge posts them) drive the dialog: the phase, its step and its ETA
    from the phase's measured rate; the bar is below 100% until the file is written."""
    user_prompt_set()
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        app.action_make_vector()
        await sets_listed(pilot)
        dialog = app.screen
        assert isinstance(dialog, MakeVectorModal)
        dialog.making = steering_dir() / "tiny-llama-tiny-mood.gguf"  # as start() sets it while the engine works
        dialog.query_one("#make-progress").display = True
        status, bar = dialog.query_one("#make-status", Label), dialog.query_one("#make-progress", ProgressBar)

        async def shown(event: VectorProgress, text: str) -> None:
            app.post_message(engine_message(app, event))
            await wait_until(pilot, lambda: text in str(status.render()), what=text)

        await shown(VectorProgress(0, 16, "evaluating", 0.0, 0.0), "Evaluating pair 1 of 16 · measuring the rate")
        await shown(VectorProgress(4, 16, "evaluating", 2.0, 4 / 46), "Evaluating pair 5 of 16 · about 6 s left")
        assert "in this phase" in str(status.render()) and (bar.progress, bar.total) == (87, 1000)
        assert "Making tiny-llama-tiny-mood.gguf" in str(dialog.query_one("#make-title", Label).render())
        # The pairs are done; the directions take most of the time on a wide model: layer by layer, with an ETA.
        await shown(VectorProgress(0, 29, "directions", 0.0, 16 / 46), "Computing directions: layer 1 of 29")
        await shown(VectorProgress(10, 29, "directions", 20.0, 26 / 46), "layer 11 of 29 · about 38 s left")
        await shown(VectorProgress(29, 29, "directions", 58.0, 45 / 46), "layer 29 of 29 · done")
        assert bar.progress == 978  # shown as 98%, not 100%, while the file is still to be written
        await shown(VectorProgress(0, 1, "writing", 0.0, 45 / 46), "Writing the file")
        await shown(VectorProgress(1, 1, "writing", 0.01, 1.0), "Written")
        assert bar.progress == 1000


def test_vector_progress_text_and_eta() -> None:
    assert vector_progress_text("evaluating", 0, 8, 0.0) == "evaluating pair 1 of 8 · measuring the rate…"
    assert vector_progress_text("evaluating", 2, 8, 3.0) == "evaluating pair 3 of 8 · about 9 s left in this phase"
    assert vector_progress_text("directions", 30, 120, 45.0).endswith("about 2 min 15 s left in this phase")
    assert phase_eta(0, 8, 1.0) is None and phase_eta(8, 8, 4.0) == 0.0
    assert bar_steps(0.996) == 990 and bar_steps(1.0) == 1000 and bar_steps(0.5) == 500


def regions_overlap(a: Region, b: Region) -> bool:
    return bool(a.intersection(b).area)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_panel_leaves_the_reply_in_view_and_a_slider_move_applies_while_it_streams(
    tiny_models: dict[str, Path], size: tuple[int, int]
) -> None:
    vector = synthetic_vector("mood", 64, range(1, 2))
    acknowledged_while_writing: list[SteeringSet] = []
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=4000))

    def hook(message: Message) -> None:
        if isinstance(message, EngineMessage) and isinstance(message.event, SteeringSet) and message.event.active:
            chat = app.chat
            if chat is not None and chat.generation is not None:
                acknowledged_while_writing.append(message.event)

    async with app.run_test(size=size, message_hook=hook) as pilot:
        chat = await ready(pilot)
        await send(pilot, "tell me a long story")
        await wait_until(pilot, lambda: chat.generation is not None and chat.generation.recorder.tokens > 0)
        await pilot.press("f6")
        await pilot.pause()
        await vectors_listed(pilot)
        panel = chat.steering_panel
        assert app.screen is chat and panel.is_open  # a panel of the chat, not a dialog over it
        # Beside the transcript at 120 columns, below it at 80: the reply stays in view, no cell of it covered.
        transcript = chat.transcript
        assert transcript.region.height >= 5 and transcript.region.width >= 40, transcript.region
        assert not regions_overlap(transcript.region, panel.region), (transcript.region, panel.region)
        beside = size[0] >= 110
        if beside:
            assert panel.region.x >= transcript.region.right and panel.region.height > transcript.region.height // 2
        else:
            assert panel.region.y >= transcript.region.bottom and panel.region.width == size[0]
        slider = panel.sliders[0]
        assert slider.has_focus and slider.vector.path == str(vector)
        assert slider.range == 3.0  # norm 0.75 on a 64-wide model: ±3 (a quarter of sqrt(64) / 0.75, rounded up)
        tokens_before = chat.generation.recorder.tokens if chat.generation else 0
        await pilot.press("shift+right", "right")
        # Two changes (0.375, then 0.45): steps of 3/8 and 3/40; each answered; the layer-1 direction has norm 0.75.
        heat = panel.query_one(HeatStrip)
        await wait_until(pilot, lambda: len(heat.layer_norms) == 1 and abs(heat.layer_norms[0] - 0.45 * 0.75) < 1e-6)
        assert acknowledged_while_writing, "no SteeringSet arrived while the reply was being written"
        applied = acknowledged_while_writing[-1]
        assert (applied.layer_start, applied.layer_end, applied.steered_layers) == (1, 1, (1,))
        assert "Applied on layers 1–1" in str(panel.query_one("#steering-status").render())
        assert app.config.steering.strengths == (0.45,)
        # The reply kept streaming into the visible transcript while the slider moved.
        await wait_until(pilot, lambda: chat.generation is not None and chat.generation.recorder.tokens > tokens_before)
        assert not regions_overlap(transcript.region, panel.region)
        # ... and the view still shows the reply's end: opening the panel made the view shorter under a reader who
        # followed the reply, and at 80x24 the view stayed where it was, the new text below it (issue 22, tmux walk).
        await pilot.pause()
        # (On a busy machine the tiny model may have finished the reply meanwhile: then its end is the view's end.)
        in_view = (
            transcript._following() if transcript.live is not None else transcript.scroll_y == transcript.max_scroll_y
        )
        assert in_view, (transcript.live is not None, transcript.scroll_y, transcript._live_target())
        # A typed strength goes past the slider's ±3: Enter, 12, Enter; the engine applies it.
        await type_strength(pilot, "12")
        await wait_until(pilot, lambda: len(heat.layer_norms) == 1 and abs(heat.layer_norms[0] - 12 * 0.75) < 1e-4)
        assert slider.has_focus and slider.strength == 12.0 and app.config.steering.strengths == (12.0,)
        await pilot.press("escape")  # close the panel: the steering stays, the reply goes on
        await pilot.pause()
        assert not panel.is_open and chat.prompt.has_focus
        assert chat_of(app).stats.extras.get("steer") == "mood +12.00"
        await pilot.press("f6")  # F6 opens it again on its slider, F6 closes it
        await wait_until(pilot, lambda: panel.is_open and not panel.listing and panel.sliders[0].has_focus)
        assert panel.sliders[0].strength == 12.0
        await pilot.press("f6")
        await wait_until(pilot, lambda: not panel.is_open and chat.prompt.has_focus)
        await pilot.press("escape")  # stop the reply (if it is still being written)
        await reply_done(pilot)
        assert load_config().steering == SteeringSettings((str(vector),), (12.0,))


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_quitting_with_the_panel_open_keeps_the_mix(tiny_models: dict[str, Path]) -> None:
    vector = synthetic_vector("mood", 64, range(1, 2))
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        panel = await panel_on_tiny_model(pilot, app, tiny_models["llama"])
        assert panel.is_open and panel.sliders[0].has_focus
        await pilot.press("down", "down", "down")  # ↑/↓ go round the panel: the layer fields, back to the slider
        assert panel.sliders[0].has_focus
        await pilot.press("shift+right")
        await wait_until(pilot, lambda: app.config.steering.strengths == (0.375,))
        await pilot.press("ctrl+q")
    assert load_config().steering == SteeringSettings((str(vector),), (0.375,))


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_keyboard_focus_in_the_panel_at_80x24(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """Issue 37 item 1: a vector added with `a` (its path completed with Tab) is selected, so ←/→ act at once; Tab
    goes to the message box and back; a layer range is applied only when complete, valid and entered."""
    folder = tmp_path / "vectors"
    folder.mkdir()
    vector = synthetic_vector("calm", 64, range(1, 2), folder=folder)
    (folder / "model-notes.txt").write_text("not a vector", encoding="utf-8")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        panel = await panel_on_tiny_model(pilot, app, tiny_models["llama"])
        chat = chat_of(app)
        assert panel.is_open and not panel.sliders and panel.has_focus  # no vector yet: the panel's keys work
        await pilot.press("a")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), what="the add-file prompt")
        prompt = app.screen
        assert isinstance(prompt, PathPromptModal)
        await pilot.press(*f"{folder}/mo", "tab")
        await wait_until(pilot, lambda: prompt.completions == 1, what="the path completed in a thread")
        assert prompt.query_one(Input).value == str(vector)  # the one .gguf starting so (notes.txt is not offered)
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(panel.sliders) and panel.sliders[0].has_focus, what="the new slider")
        slider = panel.sliders[0]
        assert slider.vector.path == str(vector)
        await pilot.press("right")  # acts at once, no ↓ first
        await wait_until(pilot, lambda: slider.strength > 0, what="the strength moved")
        strength = slider.strength
        # Tab: the message box in one key, the panel staying open; Tab from there comes back to the slider.
        await pilot.press("tab")
        assert chat.prompt.has_focus and panel.is_open
        await pilot.press("tab")
        await wait_until(pilot, lambda: slider.has_focus, what="Tab back to the slider")
        await pilot.press("shift+tab")
        assert chat.prompt.has_focus
        await pilot.press("tab")
        await wait_until(pilot, lambda: slider.has_focus, what="Tab back to the slider")
        assert slider.strength == strength  # no key went astray on the way
        # The layer fields (↓): a partial or invalid range is said, not applied; Enter applies a valid one.
        start = panel.query_one("#steering-layer-start", Input)
        await pilot.press("down")
        assert start.has_focus
        status = panel.query_one("#steering-status", Label)
        start.value = ""
        await pilot.pause()
        assert "Layers not applied: both layer fields need a number" in str(status.render())
        await pilot.press("9", "9")
        await pilot.pause()
        assert "Layers not applied: this model's layers are 1 to" in str(status.render())
        await pilot.press("enter")
        await pilot.pause()
        assert (app.config.steering.layer_start, app.config.steering.layer_end) == (0, 0)
        start.value = ""
        await pilot.press("1")
        await pilot.pause()
        assert "Layers 1 to the last: Enter applies them." in str(status.render())
        assert app.config.steering.layer_start == 0  # not applied while typed
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.config.steering.layer_start == 1, what="the range applied on Enter")
        # The footer says which key reaches the message box.
        await pilot.press("up")
        assert slider.has_focus
        assert "Message" in assert_footer_fits(app, 80)
        # A second vector added while the first is selected: the new one is selected, so → acts on it.
        second = synthetic_vector("brave", 64, range(1, 2), folder=folder)
        await pilot.press("a")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), what="the add-file prompt")
        await pilot.press(*str(second), "enter")
        await wait_until(pilot, lambda: len(panel.sliders) == 2, what="the second slider")
        [added] = [s for s in panel.sliders if s.vector.path == str(second)]
        await wait_until(pilot, lambda: added.has_focus, what="the added slider selected")
        await pilot.press("right")
        await wait_until(pilot, lambda: added.strength > 0, what="the added vector's strength moved")
        assert [s.strength for s in panel.sliders if s is not added] == [strength]


async def run_ab_at_full_strength(pilot: Pilot[Any], app: LlmtuiApp) -> SteeringABScreen:
    """F6, the first vector's strength typed as 1 (Enter on its slider), then `b` and Enter: the A/B view once its
    run is done."""
    await pilot.press("f6")
    await pilot.pause()
    await vectors_listed(pilot)
    await type_strength(pilot, "1")
    await wait_until(pilot, lambda: app.steering.applied is not None and app.steering.applied.active)
    await pilot.press("b")
    await pilot.pause()
    ab = app.screen
    assert isinstance(ab, SteeringABScreen)
    await pilot.press("enter")
    await wait_until(pilot, lambda: ab.runs_done == 1)
    return ab


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_ab_view_runs_the_prompt_without_then_with_steering(tiny_models: dict[str, Path]) -> None:
    synthetic_vector("strong", 64, range(1, 2), scale=40.0)
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        ab = await run_ab_at_full_strength(pilot, app)
        assert ab.query_one(PromptInput).text == "How was your day?"
        assert ab.texts["a"] and ab.texts["b"] and ab.texts["a"] != ab.texts["b"]
        assert "strong +1.00" in str(ab.query_one("#ab-b-title").render())
        # B left the user's steering applied.
        assert app.steering.applied is not None and app.steering.applied.active
        # The chat was not touched.
        assert chat_of(app).conversation_id is None


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_ab_view_shows_what_steering_costs_in_acceptance(tiny_models: dict[str, Path]) -> None:
    # draft-simple with the model itself as its draft: unsteered, the draft agrees with the target on every token;
    # steered, the target's distribution moves and the (unsteered) draft context is rejected more often.
    synthetic_vector("strong", 64, range(1, 2), scale=40.0)
    llama = str(tiny_models["llama"])
    app = LlmtuiApp(llama)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        app.speculation.apply(SpeculativeSettings(enabled=True, spec_type="draft-simple", draft_model=llama))
        await wait_until(pilot, lambda: bool(app.speculation.drafters))
        ab = await run_ab_at_full_strength(pilot, app)
        base, steered = ab.side_stats["a"], ab.side_stats["b"]
        assert base.drafted > 0 and base.accepted == base.drafted  # a perfect drafter without steering
        assert steered.drafted > 0 and steered.acceptance_rate < 1.0
        assert "tok/s · 100% accepted" in str(ab.query_one("#ab-a-readout").render())
        cost = str(ab.query_one("#ab-cost").render())
        assert cost.startswith("Steering with draft-simple: 100% → ")
        assert ab.query_one("#ab-cost").display
        # The chat's own speculative statistics were not replaced by the A/B runs'.
        stats = app.speculation.stats
        assert stats is None or stats.request_id not in (base.request_id, steered.request_id)


def _stats(steps: int, drafted: int, accepted: int, speedup: float = 0.0) -> SpeculativeStats:
    return SpeculativeStats(
        1,
        steps,
        drafted,
        accepted,
        accepted / drafted if drafted else 0.0,
        1 + accepted / steps if steps else 1.0,
        (),
        (),
        0.0,
        0.0,
        50.0 * speedup,
        50.0,
        (),
    )


def test_acceptance_cost_lines() -> None:
    base, steered = _stats(10, 40, 32, 2.0), _stats(10, 40, 12, 1.1)
    assert acceptance_cost(base, steered, "draft-mtp") == (
        "Steering with draft-mtp: 80% → 30% of drafted tokens accepted (50 points fewer), 4.20 → 2.20 tokens per step, "
        "speculation 45% slower (2.00× → 1.10× plain)"
    )
    # A gain reads as one: "more", "faster" (the view said "cost" for it)
    assert acceptance_cost(steered, base, "draft-mtp") == (
        "Steering with draft-mtp: 30% → 80% of drafted tokens accepted (50 points more), 2.20 → 4.20 tokens per step, "
        "speculation 1.82× faster (1.10× → 2.00× plain)"
    )
    assert acceptance_cost(None, steered, "ngram-mod") == ""
    assert acceptance_cost(_stats(0, 0, 0), steered, "ngram-mod") == (
        "ngram-mod drafted nothing on A: no acceptance to compare"
    )
    assert acceptance_cost(_stats(0, 0, 0), _stats(0, 0, 0), "ngram-mod").endswith(
        "on either side: no acceptance to compare"
    )
    assert side_readout(41.23, base) == "41.2 tok/s · 80% accepted, 4.20 tok/step"
    assert side_readout(41.23, None) == side_readout(41.23, _stats(0, 0, 0)) == "41.2 tok/s"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_make_a_vector_on_the_starter_model_from_a_few_pairs() -> None:
    starter = starter_model_path()
    if starter is None:
        pytest.skip("the starter model is not installed")
    user_prompt_set()
    app = LlmtuiApp(str(starter), default_sampling=SamplingSettings(temperature=0.0, max_tokens=16))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await app.action_steering()
        await pilot.pause()
        chat = chat_of(app)
        screen = chat.steering_panel
        app.action_make_vector()
        await pilot.pause()
        await sets_listed(pilot)
        dialog = app.screen
        assert isinstance(dialog, MakeVectorModal)
        dialog.start(next(p for p in dialog.sets if p.stem == "tiny-mood"))
        await wait_until(pilot, lambda: app.screen is chat and bool(screen.sliders), timeout_s=300)  # type: ignore[attr-defined]
        assert app.model is not None
        assert (steering_dir() / f"{Path(app.model.path).stem}-tiny-mood.gguf").is_file()
        # A PCA direction is a unit vector; on the 576-wide starter its slider spans ±6 (steps of 0.15 and 0.75).
        assert screen.sliders[0].range == 6.0
        await pilot.press("shift+right", "shift+right", "shift+right", "shift+right")
        await wait_until(pilot, lambda: app.steering.applied is not None and app.steering.applied.active)
        assert app.steering.applied is not None and app.steering.applied.layer_end == 29
        await pilot.press("escape")
        await pilot.pause()
        await send(pilot, "How was your day?")
        await reply_done(pilot)
        assert chat_of(app).stats.extras.get("steer") == "tiny-mood +3.00"


# ----- snapshots ------------------------------------------------------------------------------------


async def sets_listed(pilot: Pilot[Any]) -> None:
    """Let the make dialog read its prompt sets (in a thread)."""
    await pilot.pause()
    dialog = pilot.app.screen
    if isinstance(dialog, MakeVectorModal):
        await wait_until(pilot, lambda: not dialog.listing, what="the prompt sets, read in a thread")
        await pilot.pause()


async def vectors_listed(pilot: Pilot[Any]) -> None:
    """Let the steering panel list its vectors (their files are read in a thread)."""
    await pilot.pause()
    panel = next(iter(pilot.app.query(SteeringPanel)), None) if isinstance(pilot.app.screen, ChatScreen) else None
    if panel is not None and panel.is_open:
        await wait_until(pilot, lambda: not panel.listing, what="the steering panel's vectors, read in a thread")
        await pilot.pause()


async def type_strength(pilot: Pilot[Any], text: str) -> None:
    """Enter on the focused slider, `text` typed into its input, Enter."""
    await pilot.press("enter")
    await wait_until(pilot, lambda: bool(pilot.app.screen.query("#text-prompt-input")), what="the strength input")
    pilot.app.screen.query_one("#text-prompt-input", Input).value = ""
    await pilot.press(*text, "enter")
    await wait_until(pilot, lambda: not pilot.app.screen.query("#text-prompt-input"), what="the input closed")


async def panel_on_tiny_model(pilot: Pilot[Any], app: LlmtuiApp, model: Path) -> SteeringPanel:
    """The app (no engine) on a tiny model's facts, F6 pressed and the vectors listed: the open panel."""
    await loaded(pilot)
    _with_tiny_model(app, model)
    await pilot.press("f6")
    await vectors_listed(pilot)
    return chat_of(app).steering_panel


def _with_tiny_model(app: LlmtuiApp, path: Path) -> None:
    app.model = replace(MODEL, path=str(path), architecture="qwen35")
    app.model_path = str(path)


def _steering_scene(tiny: Path) -> Any:
    async def run(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, LlmtuiApp)
        await loaded(pilot)
        _with_tiny_model(app, tiny)
        happy = synthetic_vector("happy-sad", 64, range(1, 5))
        synthetic_vector("formal-casual", 64, range(1, 5))
        app.config = replace(app.config, steering=SteeringSettings((str(happy),), (1.25,)))
        app.steering.applied = SteeringSet(True, 1, 3, (0.8, 1.4, 1.9), (1, 2, 3))
        await app.action_steering()
        await pilot.pause()
        await vectors_listed(pilot)
        await pilot.pause()

    return run


def _make_scene(tiny: Path) -> Any:
    async def run(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, LlmtuiApp)
        await loaded(pilot)
        _with_tiny_model(app, tiny)
        app.steering.applied = SteeringSet(False, 0, 0, (), (1, 2, 3))
        await app.action_steering()
        await pilot.pause()
        await vectors_listed(pilot)
        app.action_make_vector()
        await pilot.pause()
        await sets_listed(pilot)
        dialog = app.screen
        assert isinstance(dialog, MakeVectorModal)
        dialog.making = Path("tiny-qwen35-happy-sad.gguf")
        dialog.query_one("#make-progress").display = True
        dialog.show_progress("evaluating", 5, 16, 10.0, 5 / 36)
        # The test's data folder changes from run to run: the folder line as a user's would read.
        dialog.query_one("#make-folder", Label).update("Your own sets: ~/.local/share/llmtui/steering/prompts/*.json")
        await pilot.pause()

    return run


def _ab_scene(tiny: Path) -> Any:
    async def run(pilot: Pilot[Any]) -> None:
        from engine_ext.protocol import Finished, GenerationStats
        from tests.fakes import drafted_chunk

        app = pilot.app
        assert isinstance(app, LlmtuiApp)
        await loaded(pilot)
        _with_tiny_model(app, tiny)
        app.push_screen(SteeringABScreen("How was your day?", "happy-sad +1.25"))
        await pilot.pause()
        ab = app.screen
        assert isinstance(ab, SteeringABScreen)
        app.config = replace(app.config, speculative=SpeculativeSettings(enabled=True, spec_type="draft-mtp"))
        for side, text, stats in (
            ("a", "It was fine. I went to work and came home.", _stats(10, 40, 32, 2.0)),
            ("b", "It was wonderful! The sun was out and everyone smiled.", _stats(10, 40, 12, 1.1)),
        ):
            ab.running = side
            ab.tokens(drafted_chunk(1, text))
            ab.side_stats[side] = stats
            decoded = GenerationStats(0, 0, 0, 0.0, 101, 100_000 / (50.0 * stats.speedup), 0.0, 0, 0)  # 100 decodes
            ab.side_finished(side, Finished(1, "eos", decoded))
        ab.running = None
        ab.completed()
        await pilot.pause()

    return run


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", ["steering", "make_vector", "ab"])
def test_snapshot(snap_compare: Any, tiny_models: dict[str, Path], scene: str, size: tuple[int, int]) -> None:
    scenes = {"steering": _steering_scene, "make_vector": _make_scene, "ab": _ab_scene}
    assert snap_compare(make_app(), terminal_size=size, run_before=scenes[scene](tiny_models["qwen35"]))


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_reply_records_the_steering_and_speculation_it_was_written_with(tiny_models: dict[str, Path]) -> None:
    """Issue 37 item 5: the export said nothing of the steering mix and speculative settings used; the reply's stats
    record them (the controllers' `in_use`) and the Markdown export says them under the reply."""
    vector = synthetic_vector("mood", 64, range(1, 2))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=24))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        await pilot.press("f6")
        await vectors_listed(pilot)
        await pilot.press("shift+right")  # 0.375
        await wait_until(pilot, lambda: app.steering.applied is not None and app.steering.applied.active, "steered")
        await pilot.press("escape", "f8")
        await wait_until(pilot, lambda: bool(app.speculation.drafters), "speculation on")
        await send(pilot, "a b c a b c a b c a b c")
        await reply_done(pilot)
        assert chat.conversation_id is not None
        reply = app.store.tree.active_path(chat.conversation_id)[-1]
        assert reply.stats["steering"] == {
            "vectors": [{"name": "mood", "file": vector.name, "strength": 0.375}],
            "layers": [1, 1],
        }
        speculative = reply.stats["speculative"]
        assert speculative["type"] == "auto" and speculative["drafters"] == list(app.speculation.drafters)
        drafters = "+".join(app.speculation.drafters)
        note = f"*Steering: mood +0.38 on layers 1–1. Speculative decoding: auto ({drafters}), n_max 16"
        assert note in app.store.exports.export_markdown(chat.conversation_id)
