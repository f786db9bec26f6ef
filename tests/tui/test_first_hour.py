"""Issue 22's "Everywhere" fixes, as a new user meets them: checkboxes that read apart without colour, a stats bar
without stale figures, a command palette of the app's own commands, and a footer that fits 80 columns."""

from __future__ import annotations

import ast
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.command import CommandList, CommandPalette
from textual.geometry import Region

from app.core.config import SamplingSettings, load_config, save_config
from app.core.store import open_default_store
from app.tui.app import LlmtuiApp
from app.tui.modals.model_switcher import ModelSwitcherModal
from app.tui.modals.speculative import SpeculativeModal
from app.tui.palette import GROUPS
from app.tui.screens.spec_check import Side, verdict
from app.tui.widgets.spec_meter import SpecMeter
from app.tui.widgets.tick_box import TICKED, UNTICKED, TickBox
from engine_ext.protocol import DrafterReport
from tests.pilot import (  # noqa: F401 (seeded: fixture)
    assert_footer_fits,
    footer_items,
    loaded,
    make_app,
    ready,
    reply_done,
    seeded,
    send,
)
from tests.tui.test_tui_spec import STATS, MeterHost, _types_read, _without_engine
from tests.waits import wait_until

APP = Path(__file__).resolve().parents[2] / "app"


def plain_text(widget: Any) -> str:
    """What the widget draws, without any colour or style."""
    return widget.render().plain


def drawn(widget: Any) -> str:
    """The widget's first line as drawn (styles applied), as plain text."""
    return widget.render_lines(Region(0, 0, widget.size.width, 1))[0].text


# ----- checkboxes -------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_f9_checkbox_reads_on_and_off_without_colour() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        await pilot.press("f9")
        await _types_read(pilot)
        panel = app.screen
        assert isinstance(panel, SpeculativeModal)
        box = panel.query_one("#spec-enabled", TickBox)
        on = plain_text(box)
        assert box.value and on.startswith(TICKED)
        box.focus()
        await pilot.press("space")  # the keyboard unticks it
        await wait_until(pilot, lambda: not box.value, what="the box unticked by space")
        off = plain_text(box)
        assert off.startswith(UNTICKED) and off != on
        assert off.replace(UNTICKED, TICKED, 1) == on  # the same label: only the box differs
        # What is drawn on the screen, colour stripped: the two states are different characters.
        await pilot.press("space")
        await wait_until(pilot, lambda: box.value, what="the box ticked again by space")
        drawn_on = drawn(box)
        await pilot.press("space")
        await wait_until(pilot, lambda: not box.value and drawn(box) != drawn_on, what="the box drawn unticked")
        assert TICKED in drawn_on and UNTICKED in drawn(box)


def test_every_checkbox_of_the_app_is_a_tick_box() -> None:
    """Textual's Checkbox and SelectionList (▐X▌ both ways) are not used directly anywhere in app/."""
    offenders = []
    for path in APP.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in {
                "Checkbox",
                "SelectionList",
            }:
                offenders.append(f"{path.relative_to(APP.parent)}:{node.lineno}")
    assert not offenders


def test_the_boxes_are_one_cell_per_character() -> None:
    from rich.cells import cell_len

    assert TICKED != UNTICKED and TICKED.isascii() and UNTICKED.isascii()
    assert cell_len(TICKED) == cell_len(UNTICKED) == len(TICKED) == 3


# ----- the stats bar ----------------------------------------------------------------------------------------

EARLIER_SESSION = {
    "decode_tps": 42.5,
    "ttft_ms": 120.0,
    "prompt_tokens": 31,
    "generated_tokens": 48,
    "n_ctx": 4096,
    "n_ctx_used": 79,
}


def earlier_session() -> None:
    """A conversation whose reply an earlier session measured (another model, another machine load)."""
    store = open_default_store()
    conversation = store.conversations.create_conversation("From yesterday")
    question = store.tree.add_user_message(conversation.id, "hello")
    reply = store.tree.begin_assistant_message(conversation.id, question.id, "Some-Other-Model")
    store.tree.finish_assistant_message(reply, "Hi there.", "", "complete", EARLIER_SESSION, 3)
    store.close()


@pytest.mark.anyio
async def test_the_stats_bar_shows_this_sessions_figures_only(tiny_models: dict[str, Path]) -> None:
    """At startup the bar shows the loaded model's context but no tok/s or TTFT of an earlier session; a reply
    measured now is shown; after ctrl+l switches model the figures start over."""
    save_config(replace(load_config(), model_folders=(str(tiny_models["qwen3"].parent),)))
    earlier_session()
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await ready(pilot)
        stats = chat.stats
        assert chat.header.conversation_title == "From yesterday"  # the old conversation is on screen
        assert app.model is not None and stats.n_ctx == app.model.n_ctx > 0
        assert stats.decode_tps is None and stats.ttft_ms is None and stats.prompt_tokens is None
        line = drawn(stats)
        assert "42.5" not in line and "120" not in line and "– tok/s" in line and "TTFT –" in line
        assert f"/{app.model.n_ctx / 1000:.1f}k" in line and "ready · CPU" in line
        await send(pilot, "hi")
        await reply_done(pilot)
        assert stats.decode_tps is not None and stats.ttft_ms is not None and stats.n_ctx_used > 0
        await wait_until(pilot, lambda: "– tok/s" not in drawn(stats), what="this reply's tok/s drawn")
        # Another conversation and back: this session's reply keeps its figures.
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: stats.decode_tps is None, what="the new conversation's empty bar")
        # ctrl+l: another model; the figures measured on the first one are gone.
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), what="the model switcher")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning, what="the model folders, scanned in a thread")
        await pilot.press(*tiny_models["qwen3"].stem)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model is not None and app.model.path == str(tiny_models["qwen3"]))
        await ready(pilot)
        await chat.conversations.open_conversation(
            app.store.conversations.list_conversations()[0].id
        )  # the conversation replied to above
        await pilot.pause()
        assert stats.decode_tps is None and stats.ttft_ms is None and stats.n_ctx == app.model.n_ctx
        assert "– tok/s" in drawn(stats)


# ----- the command palette ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_command_palette_lists_the_apps_commands_grouped() -> None:
    async with _without_engine((120, 40)) as (app, pilot):
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the command palette")
        await wait_until(pilot, lambda: len(app.screen.query_one(CommandList).options) > 20, what="its entries")
        titles = [command.hit.text for command in app.screen.query_one(CommandList).options]  # type: ignore[attr-defined]
        assert titles == sorted(titles)  # listed by title, so group by group
        groups = {title.split(": ", 1)[0] for title in titles}
        assert groups == set(GROUPS)  # every entry is in a group
        assert titles[0].startswith("Chat: ") and titles[-1].startswith("llmtui: ")  # Enter at once does not quit
        for gone in ("Keys", "Maximize", "Minimize", "Screenshot", "Theme", "Quit"):  # Textual's own, ungrouped
            assert gone not in titles
        for wanted in (
            "Chat: New conversation",
            "Chat: Regenerate the last reply",
            "Models: Switch model",
            "Models: Browse and download models",
            "Speculation: Speculative settings",
            "Speculation: Check",
            "Steering: Steering panel",
            "View: Help",
            "View: Theme",
            "llmtui: Quit",
        ):
            assert wanted in titles
        # Typing a group's name narrows the list to that group; Enter runs the highlighted command.
        await pilot.press(*"steering panel")
        await wait_until(
            pilot,
            lambda: [c.hit.text for c in app.screen.query_one(CommandList).options][:1] == ["Steering: Steering panel"],  # type: ignore[attr-defined]
            what="Steering: Steering panel first",
        )
        await pilot.press("enter")
        chat = app.chat
        assert chat is not None
        await wait_until(pilot, lambda: chat.steering_panel.is_open, what="the steering panel")


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_palette_finds_repack_and_opens_settings_at_that_field() -> None:
    """Issue 37, 5: the crash toasts say "F3 → Repack weights: off"; typing "repack" in the palette finds it, and
    Enter opens Settings with that field focused (80×24)."""
    from app.tui.screens.settings_screen import SettingsScreen

    async with _without_engine((80, 24)) as (app, pilot):
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the command palette")
        await pilot.press(*"repack")
        await wait_until(
            pilot,
            lambda: (
                [c.hit.text for c in app.screen.query_one(CommandList).options][:1]  # type: ignore[attr-defined]
                == ["llmtui: Repack weights (CPU)"]
            ),
            what="Repack weights first",
        )
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        await wait_until(
            pilot,
            lambda: app.focused is not None and app.focused.id == "setting-use_extra_bufts",
            what="the repack field focused",
        )
        body = app.screen.query_one("#settings-body")
        await wait_until(
            pilot,
            lambda: app.focused is not None and body.region.contains_region(app.focused.region),
            what="the repack field scrolled into view at 80×24",
        )


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_ctrl_a_in_the_chat_message_box_selects_all_and_f1_lists_the_editing_keys() -> None:
    """Issue 37, 6, in the app at 80×24: ctrl+a then backspace clears a long message; F1 says the editor's keys."""
    import io

    from rich.console import Console
    from textual.widgets import Static

    from app.tui.screens.help import HelpScreen
    from app.tui.widgets.prompt_input import PromptInput

    async with _without_engine((80, 24)) as (app, pilot):
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"a long message", "ctrl+j", *"to rewrite")
        assert prompt.text == "a long message\nto rewrite"
        await pilot.press("ctrl+a", "backspace")
        assert prompt.text == ""
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        console = Console(width=76, record=True, file=io.StringIO())
        console.print(app.screen.query_one("#help-body Static", Static).content)
        text = console.export_text()
        assert (
            "Message box" in text and "Select all: then type" in text and "ctrl+z, super+z" in text and "Redo" in text
        )


# ----- the footer at 80 columns -----------------------------------------------------------------------------

MOST_USEFUL = ["Help", "Model", "Models", "Spec", "Steer", "New"]
"""The footer's first keys on the chat, in this order (Stop comes first while a reply is written)."""


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
async def test_the_chat_footer_fits_80_columns_most_useful_keys_first() -> None:
    """80×24, a conversation whose last reply was stopped (so Continue is shown too): every key fits."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(footer_items(app)) > 5, what="the footer's keys")
        labels = assert_footer_fits(app, 80)
        assert labels[: len(MOST_USEFUL)] == MOST_USEFUL and "Go on" in labels and labels[-1] == "Quit"
        line = "".join(text for _, _, text in footer_items(app))
        assert "f1 Help" in line and "^l Model" in line and "f4 Models" in line and "^q Quit" in line
        # A message focused (ctrl+up): its own keys first, then what still fits; nothing is cut.
        await pilot.press("ctrl+up")
        await wait_until(pilot, lambda: "Copy" in drawn_labels(app), what="the message's keys in the footer")
        labels = assert_footer_fits(app, 80)
        assert labels[0] == "Copy" and labels.count("Help") <= 1
        # The steering panel (F6) focused: its keys first, Esc closing it, and nothing cut.
        await pilot.press("f6")
        await wait_until(pilot, lambda: "Close" in drawn_labels(app), what="the steering panel's keys in the footer")
        labels = assert_footer_fits(app, 80)
        assert labels[0] == "Close" and "Help" in labels
        await pilot.press("escape")
        # Wider: every key of the chat, in the same order.
        await pilot.resize_terminal(200, 50)
        await wait_until(pilot, lambda: "Quit" in drawn_labels(app), what="the footer at 200 columns")
        labels = assert_footer_fits(app, 200)
        assert [label for label in labels if label in MOST_USEFUL] == MOST_USEFUL and labels[-1] == "Quit"


@pytest.mark.anyio
async def test_stop_leads_the_footer_while_a_reply_is_written(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=3000))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "first question")
        await wait_until(pilot, lambda: chat.generation is None or chat.generation.recorder.tokens > 0)
        pid = app.bridge.pid or 0
        os.kill(pid, signal.SIGSTOP)  # the tiny model is fast: hold the reply while the footer is read
        try:
            assert chat.generation is not None, "the reply ended before the footer was read"
            await wait_until(pilot, lambda: "Stop" in drawn_labels(app), what="Stop in the footer")
            labels = assert_footer_fits(app, 80)
            assert labels[0] == "Stop" and labels[1 : 1 + len(MOST_USEFUL)] == MOST_USEFUL
            await pilot.press("escape")
        finally:
            os.kill(pid, signal.SIGCONT)
        await reply_done(pilot)


def drawn_labels(app: LlmtuiApp) -> str:
    return " ".join(text for _, _, text in footer_items(app))


# ----- speculation: proposed, drafted, accepted -------------------------------------------------------------

HELD_OUT = replace(
    STATS,
    drafted=59,
    accepted=41,
    acceptance_rate=41 / 59,
    drafters=(
        DrafterReport("ngram-mod", 12, 100, 30, (0.9, 0.5), 2.0),
        DrafterReport("ngram-map", 5, 38, 11, (0.7,), 1.0),
    ),
)
"""A run whose drafters proposed 138 tokens, of which 59 were verified (the rest followed an end-of-generation
token) and 41 accepted: the issue's held-out run."""


@pytest.mark.anyio
async def test_the_meter_details_name_proposed_drafted_and_accepted() -> None:
    async with MeterHost().run_test(size=(140, 8)) as pilot:
        meter = pilot.app.query_one(SpecMeter)
        meter.spec_type, meter.drafters, meter.stats, meter.expanded = (
            "auto",
            ("ngram-mod", "ngram-map"),
            HELD_OUT,
            True,
        )
        await pilot.pause()
        lines = meter.render().plain.split("\n")
        assert lines[1].startswith("   proposed 138  drafted 59  accepted 41 (69%)  steps 40")
        assert "accepted 30 of 100 proposed (30%)" in lines[4] and "accepted 11 of 38 proposed (29%)" in lines[5]
        assert meter.tooltip is not None and "n_drafted" in str(meter.tooltip)


def test_the_speculation_check_names_proposed_drafted_and_accepted() -> None:
    plain = Side("text", tokens=12, tokens_per_s=100.0, speeds=[100.0])
    _, line = verdict(plain, replace(plain, tokens_per_s=101.0), HELD_OUT, "auto")
    assert "proposed 138 · drafted 59 · accepted 41 (69%)" in line
    assert HELD_OUT.to_dict()["proposed"] == 138 and HELD_OUT.to_dict()["drafted"] == 59
    assert [d["proposed"] for d in HELD_OUT.to_dict()["drafters"]] == [100, 38]  # type: ignore[index]


@pytest.mark.anyio
async def test_the_download_dialogs_sidecar_list_reads_on_and_off_without_colour() -> None:
    """Issue 22: F4's download dialog listed its sidecars as `▐X▌ mtp` ticked and unticked alike (seen in tmux)."""
    from textual.app import App

    from app.tui.modals.model_actions import PullModal
    from app.tui.widgets.tick_box import TickList

    modal = PullModal("Download org/Tiny:Q8_0", [("Tiny-Q8_0.gguf", 1000)], {"mtp": "mtp-Tiny.gguf"}, {"mtp"})

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(modal)

    def first_line(widget: TickList[str]) -> str:
        return widget.render_line(0).text

    async with Host().run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: modal.is_current, what="the download dialog")
        sidecars = modal.query_one("#pull-sidecars", TickList)
        on = first_line(sidecars)
        assert on.startswith(TICKED) and "mtp" in on and "▐X▌" not in on
        await pilot.press("shift+tab", "space")  # the keyboard unticks it
        await wait_until(pilot, lambda: not sidecars.selected, what="the sidecar unticked by space")
        await pilot.pause()
        off = first_line(sidecars)
        assert off.startswith(UNTICKED) and off.replace(UNTICKED, TICKED, 1) == on
        await pilot.press("d")
        await wait_until(pilot, lambda: not modal.is_current, what="the dialog dismissed")


# ----- the conversation list from the keyboard (issue 37, item 2) -------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
async def test_the_conversation_list_is_reached_and_used_from_the_keyboard() -> None:
    """ctrl+b shows the list focused, so d works at once; ↓ goes from the search box into the results; a list
    focused with nothing highlighted highlights its first row, so Enter opens it. At 80×24."""
    from app.tui.widgets.sidebar import ConversationOptions

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        chat = app.chat
        assert chat is not None
        sidebar = chat.query_one("#sidebar")
        options = chat.conversation_list.options
        if sidebar.display:  # shown by default: hide it first, as a user who hid it did
            await pilot.press("ctrl+b")
            await wait_until(pilot, lambda: not sidebar.display, what="the list hidden")
        assert app.focused is chat.prompt
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: isinstance(app.focused, ConversationOptions), what="the list focused")
        assert sidebar.display and options.highlighted is not None
        # Search, then ↓ into the results, where Enter opens the first one.
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: app.focused is app.screen.query_one("#conversation-search"), what="search")
        await pilot.press(*"milk")
        await wait_until(pilot, lambda: options.option_count >= 1, what="the search's results")
        options.highlighted = None
        await pilot.press("down")
        await wait_until(pilot, lambda: isinstance(app.focused, ConversationOptions), what="the results focused")
        assert options.highlighted == 0
        await pilot.press("enter")
        shopping = next(c.id for c in app.store.conversations.list_conversations() if c.title == "Shopping list")
        await wait_until(pilot, lambda: chat.conversation_id == shopping, what="the searched conversation opened")
