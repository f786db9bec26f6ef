"""Issue 49's dialogs and 80 columns, as a new user meets them: the conversation settings (ctrl+s) focus their first
field and say what a save changed, the settings (F3) name the API server's start-up switch apart from its live
state, F4's keys work from its search box, one toast per notice, images that agree with the engine, the make-vector
dialog's estimate and folder, and the chat at 80 columns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, Input, Label, Select, TextArea

from app.core import paths
from app.tui.app import LlmtuiApp
from app.tui.modals.conversation_settings import ConversationSettingsModal, fitted_label
from tests.tui.test_tui_images import pictures, vision_llama  # noqa: F401 (fixtures)
from tests.tui.test_tui_spec import _without_engine
from tests.waits import wait_until


def screen_text(app: LlmtuiApp) -> str:
    """The whole screen as drawn, a line a row."""
    update = app.screen._compositor.render_full_update()  # noqa: SLF001 (what the terminal is sent)
    return "\n".join("".join(segment.text for segment in strip) for strip in update.strips)


def messages(app: LlmtuiApp) -> list[str]:
    return [notification.message for notification in app._notifications]  # noqa: SLF001


def in_view(body: Any, field: Any) -> Any:
    """Whether `field` lies inside the scrolled `body`'s region, to wait on."""
    return lambda: body.region.contains_region(field.region)


async def open_conversation_settings(pilot: Any, app: LlmtuiApp) -> ConversationSettingsModal:
    await pilot.press("ctrl+s")
    await wait_until(pilot, lambda: isinstance(app.screen, ConversationSettingsModal), what="the settings dialog")
    await pilot.pause()
    assert isinstance(app.screen, ConversationSettingsModal)
    return app.screen


# ----- the conversation settings (items 4, 7 and 20) ---------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_ctrl_s_focuses_the_system_prompt_reaches_every_field_at_80x24_and_says_what_changed() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        dialog = await open_conversation_settings(pilot, app)
        prompt = dialog.query_one("#system-prompt", TextArea)
        assert app.focused is prompt, "typing right after ctrl+s goes into the first field"
        assert prompt.styles.background_tint.a > 0, "the focused compact field is marked"
        await pilot.press(*"Be brief.")
        assert prompt.text == "Be brief."
        body = dialog.query_one("#conversation-settings-body")
        save = dialog.query_one("#save", Button)
        # Tab reaches the reasoning and output format fields: each is scrolled into view, Save stays in view.
        for wanted in ("sampling-reasoning_effort", "sampling-output_format"):
            for _ in range(20):
                if app.focused is not None and app.focused.id == wanted:
                    break
                await pilot.press("tab")
            await pilot.pause()
            focused = app.focused
            assert focused is not None and focused.id == wanted
            await wait_until(pilot, in_view(body, focused), what=f"{wanted} scrolled into view")
            assert app.screen.region.contains_region(save.region)
        dialog.query_one("#sampling-temperature", Input).value = "0.5"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), what="saved")
        [saved] = [message for message in messages(app) if message.startswith("Conversation settings saved")]
        assert saved == "Conversation settings saved: system prompt edited; Temperature 0.8 → 0.5."
        await open_conversation_settings(pilot, app)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), what="saved again")
        assert "Conversation settings saved: nothing changed." in messages(app)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_tools_for_a_model_without_them_in_its_template_say_the_generic_format_where_they_are_set() -> None:
    folder = Path(paths.config_path()).parent / ("a-rather-long-folder-name-" * 4) / "notes"
    folder.mkdir(parents=True)
    config = paths.config_path()
    config.write_text(f'[tools]\nread_folder = "{folder}"\n', encoding="utf-8")
    async with _without_engine((80, 24)) as (app, pilot):
        assert app.model is not None
        app.model = replace(app.model, tool_format="generic")
        dialog = await open_conversation_settings(pilot, app)
        note = dialog.query_one("#tools-note", Label)
        assert not note.display, "no tools chosen: nothing to say"
        tools = dialog.query_one("#tools-select", Select)
        assert tools.region.height == 1, "a long read_file folder keeps the choice on one line"
        tools.value = "builtin"
        await wait_until(pilot, lambda: note.display, what="the tools' note")
        assert "generic tool format" in str(note.render())
        await pilot.pause()
        assert tools.region.height == 1


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_tools_with_a_json_output_format_are_refused_where_they_are_set_not_at_send() -> None:
    """The walk's ctrl+s with built-in tools and output format json saved both, and the next reply failed with the
    engine's "give tools or a grammar/JSON schema, not both"."""
    async with _without_engine((80, 24)) as (app, pilot):
        assert app.model is not None
        app.model = replace(app.model, tool_format="generic")
        dialog = await open_conversation_settings(pilot, app)
        tools = dialog.query_one("#tools-select", Select)
        tools.value = "builtin"
        dialog.query_one("#sampling-output_format", Select).value = "json"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is dialog, "not saved: the reply would fail"
        [refused] = [message for message in messages(app) if "cannot go together" in message]
        assert refused == (
            "Tools and output format json cannot go together: a reply with tools keeps to the tool call format. "
            "Choose Tools none or output format text."
        )
        assert app.focused is tools, "the focus is on the choice to change"
        tools.value = "none"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), what="saved")
        assert "Conversation settings saved: Output format text → json." in messages(app)


def test_a_long_tool_label_keeps_its_folders_end() -> None:
    label = "built-in (current_datetime, read_file under /home/someone/a/very/long/path/to/the/notes/folder)"
    short = fitted_label(label, 64)
    assert len(short) == 64 and short.startswith("built-in (current_datetime, read_file under …")
    assert short.endswith("/notes/folder)")
    assert fitted_label("MCP server weather", 56) == "MCP server weather"


# ----- the settings (F3): focus, what a save changed, the API server's switch and state (items 7, 11, 20) ------


@pytest.mark.anyio
async def test_f3_names_the_api_servers_start_up_switch_and_shows_its_live_state(lone_llama: Path) -> None:
    from app.core.app_settings_schema import SERVER_ENABLED
    from app.tui.screens.settings_screen import FIELD_ORDER, SettingsScreen
    from tests.engine.test_serve import free_port
    from tests.fakes import scripted_app
    from tests.tui.test_tui_server import EchoEngine, write_config

    port = free_port()
    write_config(port)
    app = scripted_app(lone_llama, EchoEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("f10")
        await wait_until(pilot, lambda: app.server.running, "the API server to listen")
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        await pilot.pause()
        assert app.focused is not None and app.focused.id == f"setting-{FIELD_ORDER[0]}", "the first field focused"
        state = app.screen.query_one("#server-state")
        assert str(state.render()) == f"Now: serving at http://127.0.0.1:{port}/v1. F10 stops it."
        assert SERVER_ENABLED.plain_label == "Start with the app"
        body = app.screen.query_one("#settings-body")
        body.scroll_to(y=body.max_scroll_y, animate=False)
        await pilot.pause()
        text = screen_text(app)
        assert "Start with the app" in text and "Enabled" not in text
        # The section headers wrap at 80 columns: their ends are shown.
        assert "applies at once)" in text and "[cache] in" in text and "list|clear`)" in text
        await pilot.press("f10")
        await wait_until(pilot, lambda: not app.server.running, "the API server to stop")
        await wait_until(pilot, lambda: str(state.render()) == "Now: off. F10 starts it.", what="the state to follow")
        app.screen.query_one("#setting-n_ctx", Input).value = "8192"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen), what="saved")
        [saved] = [message for message in messages(app) if message.startswith("Settings saved")]
        assert saved.startswith("Settings saved: context size 4096 → 8192.")


# ----- F4's keys and its search box (item 6) -----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_f4s_tab_keys_and_slash_work_from_an_empty_search_box_and_esc_there_stays_on_f4() -> None:
    from textual.widgets import TabbedContent, Tabs

    from app.tui.screens.models_screen import ModelsScreen

    async with _without_engine((80, 24)) as (app, pilot):
        await pilot.press("f4")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), what="F4")
        screen = app.screen
        tabs = screen.query_one("#models-tabs", TabbedContent)
        box = screen.query_one("#search-query", Input)
        await pilot.press("slash")
        await wait_until(pilot, lambda: app.focused is box, what="the search box focused")
        await pilot.press("slash")
        assert box.value == "" and app.focused is box, "/ in the empty box is not typed"
        await pilot.press("3")
        await wait_until(pilot, lambda: tabs.active == "local", what="3: the Local tab from the empty box")
        assert box.value == ""
        await pilot.press("2")
        await wait_until(pilot, lambda: tabs.active == "search" and app.focused is box, what="2: back to the box")
        await pilot.press(*"qwen3", "slash", "1")
        assert box.value == "qwen3/1" and tabs.active == "search", "a box holding text takes digits and /"
        box.value = ""
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen), "Esc in the box moves the focus, F4 stays"
        assert isinstance(app.focused, Tabs)
        await pilot.press("1")
        await wait_until(pilot, lambda: tabs.active == "catalog", what="1: the Catalog tab")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ModelsScreen), what="Esc elsewhere: the chat")


# ----- one toast per notice (item 10) ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_toast_shows_once_while_a_dialog_is_open_and_at_the_same_place() -> None:
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:  # toasts drawn, as in the terminal
        app.notify("Only once, please.", timeout=30)
        await pilot.pause()

        def shown_racks() -> list[Any]:
            return [
                rack
                for screen in app.screen_stack
                for rack in screen.query("ToastRack")
                if rack.display and rack.query("Toast")
            ]

        await wait_until(pilot, lambda: len(shown_racks()) == 1, what="the chat's toast")
        [chat_rack] = shown_racks()
        top = chat_rack.query_one("Toast").region.y
        await open_conversation_settings(pilot, app)
        await wait_until(pilot, lambda: app.screen.query("Toast"), what="the dialog's toast")
        await pilot.pause()
        [rack] = shown_racks()
        assert rack.screen is app.screen, "the chat under the dialog hides its toast"
        assert rack.query_one("Toast").region.y == top, "at the top right, where it was"
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), what="closed")
        await wait_until(pilot, lambda: [r.screen for r in shown_racks()] == [app.screen], what="the chat's again")


# ----- images: one list of what the engine reads (item 15) ---------------------------------------------------


def test_the_image_messages_list_what_the_engine_reads() -> None:
    from engine_ext.image_input import ImageRefused, check_image

    with pytest.raises(ImageRefused) as refused:
        check_image(b"not a picture", "notes.png")
    assert str(refused.value) == "notes.png: not an image llmtui reads (it takes PNG, JPEG, GIF, BMP)"


@pytest.mark.anyio
async def test_f12_offers_no_webp_and_keeps_the_prompt_open_with_the_error_of_a_wrong_path(
    request: pytest.FixtureRequest,
) -> None:
    from app.tui.modals.text_prompt import PathPromptModal
    from tests.fakes import scripted_app
    from tests.pilot import chat_of
    from tests.tui.test_tui_images import PictureEngine

    folder: Path = request.getfixturevalue("pictures")  # test_tui_images' fixtures
    app = scripted_app(request.getfixturevalue("vision_llama"), PictureEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        chat = chat_of(app)
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), what="the attach prompt")
        prompt = app.screen
        assert isinstance(prompt, PathPromptModal)
        assert "WebP" not in prompt.title_text
        field = prompt.query_one("#text-prompt-input", Input)
        hint = prompt.query_one("#text-prompt-hint", Label)
        field.value = f"{folder}/photo"
        await pilot.press("tab")
        await wait_until(pilot, lambda: prompt.completions == 1, what="the completion")
        assert field.value == f"{folder}/photo", "Tab does not offer photo.webp: the engine does not read it"
        for typed, said in (
            (f"{folder}/photo.webp", "photo.webp: WebP is not decoded by the engine's projector; convert it to PNG"),
            (f"{folder}/gone.png", f"Nothing at {folder}/gone.png: check the path (Tab completes it)."),
            (f"{folder}/notes.png", "notes.png: not an image llmtui reads (it takes PNG, JPEG, GIF, BMP)"),
        ):
            field.value = typed
            await pilot.press("enter")
            await wait_until(pilot, lambda: str(hint.render()) == said, what=f"the error of {typed}")  # noqa: B023
            assert app.screen is prompt and hint.has_class("error"), "the prompt stays open with the path typed"
            assert field.value == typed
        field.value = f"{folder}/red square.png"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(chat.attachments.images) == 1, what="the image attached")
        assert not isinstance(app.screen, PathPromptModal)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_path_prompts_error_wraps_whole_at_80x24() -> None:
    """The walk's F12 with a wrong path showed "Nothing at …/no-such-image.png: check the path (Tab comple": the
    error line was cut at the dialog's width."""
    from app.tui.modals.text_prompt import PathPromptModal

    wrong = "/tmp/" + "a-folder-with-a-long-name/" * 2 + "no-such-image.png"
    async with _without_engine((80, 24)) as (app, pilot):
        prompt = PathPromptModal(
            "Attach", check=lambda typed: f"Nothing at {typed}: check the path (Tab completes it)."
        )
        app.push_screen(prompt)
        await wait_until(pilot, lambda: app.screen is prompt, what="the path prompt")
        await pilot.pause()
        prompt.query_one("#text-prompt-input", Input).value = wrong
        await pilot.press("enter")
        hint = prompt.query_one("#text-prompt-hint", Label)
        await wait_until(pilot, lambda: hint.has_class("error"), what="the error")
        await pilot.pause()
        assert hint.region.height > 2, "the error wraps (below its blank line)"
        assert "(Tab completes it)." in screen_text(app), "its end is on the screen"


# ----- the make-vector dialog (item 18) ----------------------------------------------------------------------


def test_the_vector_estimate_counts_down_and_outlasts_no_step() -> None:
    from app.core.vectors import vector_progress_text

    assert vector_progress_text("evaluating", 2, 3, 10.0) == "evaluating pair 3 of 3 · about 5 s left in this phase"
    assert vector_progress_text("evaluating", 2, 3, 10.0, 3.0).endswith("about 2 s left in this phase")
    # The last pair runs three times as long as those before it: no "about 5 s left" for 15 s.
    assert vector_progress_text("evaluating", 2, 3, 10.0, 15.0) == (
        "evaluating pair 3 of 3 · finishing: 15 s on this step so far"
    )
    # A step longer than the ones before it, with more to go: the steps left are counted as long as it.
    assert vector_progress_text("directions", 4, 10, 4.0, 3.0).endswith("about 15 s left in this phase")


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_make_vector_dialog_names_the_real_folder_and_updates_its_estimate() -> None:
    import time

    from app.core.paths import prompt_set_folders
    from app.tui.modals.make_vector import MakeVectorModal

    async with _without_engine((80, 24)) as (app, pilot):
        app.action_make_vector()
        await wait_until(pilot, lambda: isinstance(app.screen, MakeVectorModal), what="the make-vector dialog")
        dialog = app.screen
        assert isinstance(dialog, MakeVectorModal)
        await wait_until(pilot, lambda: not dialog.listing, what="the prompt sets listed")
        folder = dialog.query_one("#make-folder", Label)
        assert str(folder.render()) == f"Your own sets: {prompt_set_folders()[0]}/*.json"
        assert "<data>" not in screen_text(app)
        status = dialog.query_one("#make-status", Label)
        dialog.making = Path("tiny-happy-sad.gguf")
        dialog.show_progress("evaluating", 2, 3, 10.0, 0.5)
        assert str(status.render()) == "Evaluating pair 3 of 3 · about 5 s left in this phase"
        assert dialog.progress is not None
        dialog.progress = (*dialog.progress[:4], time.monotonic() - 15)  # no report for 15 s
        await wait_until(
            pilot,
            lambda: str(status.render()).startswith("Evaluating pair 3 of 3 · finishing: 1"),
            what="the estimate updated between reports",
        )


# ----- the chat at 80 columns (item 20) ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_first_start_at_80_columns_shows_no_empty_list_and_the_toast_leaves_the_welcome_in_view() -> None:
    from app.tui.widgets.prompt_input import PLACEHOLDER

    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        chat = app.chat
        assert chat is not None
        sidebar = chat.query_one("#sidebar")
        assert not sidebar.display, "no conversation yet: no empty list taking 21 of 80 columns"
        assert chat.prompt.placeholder == PLACEHOLDER and chat.prompt.content_size.width > len(PLACEHOLDER)
        app.notify("No model yet: pick one with ctrl+l, or F4 for the catalog and downloads.", timeout=30)
        await wait_until(pilot, lambda: chat.query("Toast"), what="the toast")
        await pilot.pause()
        toast = chat.query_one("Toast").region
        rows = screen_text(app).splitlines()
        welcome = [y for y, row in enumerate(rows) if "Type a message below" in row or "finds any action" in row]
        assert welcome and all(not toast.y <= y < toast.bottom for y in welcome), "the toast covers no welcome line"
        # The first conversation made (the first message sent): the list shows.
        conversation = app.store.conversations.create_conversation("First")
        await chat.conversations.open_conversation(conversation.id)
        await wait_until(pilot, lambda: sidebar.display, what="the list, once it lists a conversation")


@pytest.mark.anyio
async def test_at_80_columns_with_the_list_the_placeholder_and_the_branch_counter_are_whole(
    app_dirs: tuple[Path, Path],
) -> None:
    from app.core.store import open_default_store
    from tests.pilot import loaded, make_app

    store = open_default_store()
    conversation = store.conversations.create_conversation("Branches")
    question = store.tree.add_user_message(conversation.id, "Hello")
    model = "Qwen3.5-35B-A3B-Instruct-UD-Q4_K_XL"
    for text in ("First answer", "Second answer"):
        reply = store.tree.begin_assistant_message(conversation.id, question.id, model)
        store.tree.finish_assistant_message(reply, text, "", "stopped", {})
    store.close()
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        chat = app.chat
        assert chat is not None and chat.query_one("#sidebar").display
        prompt = chat.prompt
        await wait_until(pilot, lambda: prompt.content_size.width > len(prompt.placeholder), what="a whole placeholder")
        assert "Enter sends" in prompt.placeholder and "new line" in prompt.placeholder
        await pilot.pause()
        text = screen_text(app)
        header = next(row for row in text.splitlines() if "Assistant" in row)
        assert "[stopped]  ◀ 2/2 ▶" in header and "Qwen3.5" in header, "the model's name is shortened, not the counter"


@pytest.mark.anyio
async def test_at_80_columns_the_api_readout_outlasts_the_spec_one_the_meter_repeats() -> None:
    """The walk at 80x24 after F9 auto: F10 served, and the stats bar under the list ended "spec 33% ~×0.9 api
    :467…" (the port cut) though the speculation meter above it said the same 33% and ×0.87."""
    from tests.tui.test_tui_widgets import StatsHost, ready_stats_bar

    app = StatsHost()
    async with app.run_test(size=(58, 3)) as pilot:  # 80 columns less the conversation list
        bar = ready_stats_bar(app)
        bar.extras = {"spec": "33% ~×0.9", "api": ":46725 curl 1 running"}
        await pilot.pause()
        assert "api :46725" not in bar.render_line(0).text, "too wide for both: the port was cut"
        bar.spares = frozenset({"spec"})
        await pilot.pause()
        line = bar.render_line(0).text
        assert "api :46725 curl" in line and "spec" not in line
        bar.extras = {"spec": "33%"}
        await pilot.pause()
        assert "spec 33%" in bar.render_line(0).text, "kept where it fits"


@pytest.mark.anyio
async def test_at_80_columns_the_api_readout_keeps_its_running_count() -> None:
    """The walk at 80x24: once a reply's figures showed, the stats bar ended "api :8080 curl/8.5.0 1 r…"."""
    from tests.tui.test_tui_widgets import StatsHost, ready_stats_bar

    app = StatsHost()
    async with app.run_test(size=(58, 3)) as pilot:
        bar = ready_stats_bar(app)
        bar.extras = {"api": ":8080 curl/8.5.0 1 running"}
        await pilot.pause()
        assert not bar.render_line(0).text.rstrip().endswith("1 running"), "too wide: the count was cut"
        bar.trims = {"api": ":8080 curl/8.5.0"}
        await pilot.pause()
        line = bar.render_line(0).text.rstrip()
        assert line.endswith("… 1 running") and "api :" in line


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_chats_stats_bar_spares_its_spec_readout_while_the_meter_shows() -> None:
    from app.tui.widgets.spec_meter import SpecMeter
    from app.tui.widgets.status import StatsBar
    from tests.pilot import chat_of

    async with _without_engine((80, 24)) as (app, pilot):
        bar = chat_of(app).query_one(StatsBar)
        assert not bar.spares
        await pilot.press("f8")
        await wait_until(pilot, lambda: chat_of(app).query(SpecMeter), what="the speculation meter")
        await wait_until(pilot, lambda: bar.spares == {"spec"}, what="spec spared")
        await pilot.press("f8")
        await wait_until(pilot, lambda: not bar.spares, what="nothing spared without the meter")


def test_a_message_header_shortens_the_models_name_to_keep_the_branch_counter() -> None:
    from app.tui.widgets.message_view import BranchInfo, message_header

    model = "Qwen3.5-35B-A3B-Instruct-UD-Q4_K_XL"
    whole = message_header("assistant", "stopped", model, BranchInfo(2, 2))
    assert whole.plain == f"Assistant  {model}  [stopped]  ◀ 2/2 ▶"
    assert message_header("assistant", "stopped", model, BranchInfo(2, 2), 100).plain == whole.plain
    fitted = message_header("assistant", "stopped", model, BranchInfo(2, 2), 50)
    assert (
        fitted.cell_len <= 50
        and fitted.plain.endswith("  [stopped]  ◀ 2/2 ▶")
        and "Qwen3.5-35B-A3B-In…" in fitted.plain
    )
    assert message_header("assistant", "stopped", model, BranchInfo(2, 2), 30).plain == "Assistant  [stopped]  ◀ 2/2 ▶"
