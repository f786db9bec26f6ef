"""Pilot flows of the chat app with the tiny random-weight model (and a few with the starter model)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.config import SamplingSettings, load_config
from app.core.model_paths import starter_model_path
from app.core.store import open_default_store
from app.tui.app import LlmtuiApp
from app.tui.screens.chat_screen import ChatScreen
from app.tui.widgets.live_body import LiveMessage
from app.tui.widgets.message_view import BACKGROUND_RENDER_CHARS, MessageView
from tests.pilot import chat_of, line_text, press_and_start, press_to_cancel, ready, reply_done, send, stop_mid_reply
from tests.waits import wait_until

pytestmark = pytest.mark.usefixtures("app_dirs")

SHORT = SamplingSettings(temperature=0.0, max_tokens=12)
LONG = SamplingSettings(temperature=0.0, max_tokens=3000)


def path_roles_and_states(chat: ChatScreen) -> list[tuple[str, str]]:
    assert chat.conversation_id is not None
    return [(m.role, m.state) for m in chat.app.store.tree.active_path(chat.conversation_id)]


@pytest.mark.anyio
async def test_send_streams_a_reply_and_saves_both_messages(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        assert app.model is not None and app.model.backend
        await send(pilot, "hello there")
        await reply_done(pilot)
        assert path_roles_and_states(chat) == [("user", "complete"), ("assistant", "complete")]
        views = chat.transcript.views()
        assert [v.message.role for v in views] == ["user", "assistant"]
        assert not chat.query(LiveMessage)
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.content == views[-1].message.content and reply.token_count
        assert reply.stats["generated_tokens"] == 12
        assert chat.stats.prompt_tokens and chat.stats.n_ctx_used > 0
        assert chat.header.conversation_title == "hello there"
        # Up recalls the message sent.
        chat.prompt.focus()
        await pilot.press("up")
        assert chat.prompt.text == "hello there"


@pytest.mark.anyio
async def test_escape_stops_keeping_the_partial_reply_then_continue(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=LONG)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "tell me a long story")
        await stop_mid_reply(pilot)
        stopped = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert stopped.state == "stopped" and stopped.content
        assert stopped.stats["stop_reason"] == "cancelled"
        assert "-stopped" in chat.transcript.views()[-1].classes
        # Continue the same reply: the text grows from where it stopped, no new branch.
        await press_and_start(pilot, "ctrl+g")
        await stop_mid_reply(pilot)
        continued = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert continued.id == stopped.id
        assert continued.content.startswith(stopped.content) and len(continued.content) > len(stopped.content)
        assert len(app.store.tree.siblings(continued.id).messages) == 1


@pytest.mark.anyio
async def test_the_stats_bar_follows_the_reply_being_written(tiny_models: dict[str, Path]) -> None:
    """While a reply streams the bar shows its own numbers: the context in use grows from this prompt's size
    (not the last reply's), and the last reply's speed and TTFT are not shown as this one's."""
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=LONG)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "first question")
        await stop_mid_reply(pilot)
        await reply_done(pilot)
        stats = chat.stats
        first_used = stats.n_ctx_used
        assert first_used > 0 and stats.ttft_ms is not None and stats.decode_tps is not None
        await chat.replies.send("second question")  # the request goes out after the next refresh
        assert stats.ttft_ms is None and stats.decode_tps is None and stats.generated_tokens == 0
        await wait_until(pilot, lambda: chat.generation is None or bool(stats.ttft_ms and stats.generated_tokens))
        pid = app.bridge.pid or 0
        os.kill(pid, signal.SIGSTOP)
        try:
            assert chat.generation is not None, "the reply ended before its stats were seen"
            prompt = stats.prompt_tokens
            assert prompt is not None and prompt > first_used  # the first exchange is in this prompt
            assert stats.n_ctx_used == prompt + (stats.generated_tokens or 0)
            await press_to_cancel(pilot, "escape")
        finally:
            os.kill(pid, signal.SIGCONT)
        await reply_done(pilot)
        assert app.store.tree.active_path(chat.conversation_id or 0)[-1].stats["prompt_tokens"] == prompt


@pytest.mark.anyio
async def test_the_request_goes_out_once_the_reply_is_drawn_and_escape_before_it_still_stops(
    tiny_models: dict[str, Path],
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=LONG)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        sent_when: list[bool] = []
        generate = app.bridge.generate

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            live = chat.transcript.live
            sent_when.append(live is not None and live.region.height > 0)  # laid out and on screen
            return generate(*args, **kwargs)

        app.bridge.generate = spy  # type: ignore[method-assign]
        chat.prompt.load_text("tell me a long story")
        await chat.replies.send("tell me a long story")
        assert chat.generation is not None and chat.generation.request_id == 0 and not sent_when
        chat.action_stop()  # Esc before the request went out: it is sent and cancelled at once
        await reply_done(pilot)
        assert sent_when == [True]
        stopped = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert stopped.state == "stopped" and stopped.stats["stop_reason"] == "cancelled"
        # Stopped at once: while the chat template rendered or the prompt was read (no token, no count), or after
        # the first tokens.
        assert (stopped.token_count or 0) < LONG.max_tokens


@pytest.mark.anyio
async def test_regenerate_keeps_the_old_reply_as_a_branch(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(max_tokens=8, seed=1))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "first question")
        await reply_done(pilot)
        first = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        await press_and_start(pilot, "ctrl+r")
        await reply_done(pilot)
        second = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert second.id != first.id and second.parent_id == first.parent_id
        last_view = chat.transcript.views()[-1]
        assert last_view.branch is not None and (last_view.branch.position, last_view.branch.total) == (2, 2)
        # Branch navigation on the message: left shows the first reply again.
        last_view.focus()
        await pilot.press("left")
        await pilot.pause()
        assert chat.transcript.views()[-1].message.id == first.id
        await pilot.press("right")
        await pilot.pause()
        assert chat.transcript.views()[-1].message.id == second.id


@pytest.mark.anyio
async def test_edit_and_resend_keeps_the_old_branch_reachable(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "original question")
        await reply_done(pilot)
        original_path = app.store.tree.active_path(chat.conversation_id or 0)
        user_view = chat.transcript.views()[0]
        user_view.focus()
        await pilot.press("e")
        assert chat.edit_banner.target == user_view.message.id and chat.prompt.text == "original question"
        assert chat.prompt.has_focus
        chat.prompt.load_text("edited question")
        await press_and_start(pilot, "enter")
        await reply_done(pilot)
        edited_path = app.store.tree.active_path(chat.conversation_id or 0)
        assert [m.content for m in edited_path][0] == "edited question"
        assert edited_path[0].parent_id == original_path[0].parent_id
        views = chat.transcript.views()
        assert views[0].branch is not None and views[0].branch.total == 2
        # The old branch (question and its reply) is one key away, and the stats bar shows its reply's numbers.
        assert chat.stats.prompt_tokens == edited_path[-1].stats["prompt_tokens"]
        views[0].focus()
        await pilot.press("left")
        await pilot.pause()
        assert [v.message.id for v in chat.transcript.views()] == [m.id for m in original_path]
        assert chat.stats.n_ctx_used == original_path[-1].stats["n_ctx_used"]
        assert (
            chat.stats.prompt_tokens
            == original_path[-1].stats["prompt_tokens"]
            != edited_path[-1].stats["prompt_tokens"]
        )


@pytest.mark.anyio
async def test_edit_a_reply_in_place_then_continue_it(tiny_models: dict[str, Path]) -> None:
    """e on a reply puts its text in the prompt; Enter changes it in place (no branch, no engine needed) and ctrl+g
    continues it from the new end."""
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "question")
        await reply_done(pilot)
        conversation = chat.conversation_id or 0
        reply = app.store.tree.active_path(conversation)[-1]
        assert reply.stats["stop_reason"] == "max_tokens" and reply.can_continue  # cut short: ctrl+g goes on
        assert chat.check_action("continue_reply", ())
        chat.transcript.views()[-1].focus()
        await pilot.press("e")
        assert chat.edit_banner.target == reply.id and chat.edit_banner.is_reply and chat.prompt.text == reply.content
        assert "Editing a reply" in str(chat.query_one("#edit-banner").render())
        chat.prompt.load_text("A better start")
        await pilot.press("enter")
        await pilot.pause()
        edited = app.store.tree.active_path(conversation)[-1]
        assert (edited.id, edited.content, edited.state) == (reply.id, "A better start", "complete")
        assert edited.stats["edited"] and "draft_spans" not in edited.stats
        assert app.store.tree.siblings(reply.id).messages == [edited]  # changed in place: no new branch
        assert chat.edit_banner.target is None and chat.prompt.text == ""
        assert chat.transcript.views()[-1].message.content == "A better start"
        assert any("ctrl+g continues it" in n.message for n in app._notifications)
        await press_and_start(pilot, "ctrl+g")
        await reply_done(pilot)
        continued = app.store.tree.active_path(conversation)[-1]
        assert continued.id == reply.id and continued.content.startswith("A better start")
        assert len(continued.content) > len("A better start") and continued.state == "complete"


@pytest.mark.anyio
async def test_edit_mode_escape_gives_back_the_draft(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "question")
        await reply_done(pilot)
        chat.prompt.load_text("half-written draft")
        chat.transcript.views()[0].focus()
        await pilot.press("e")
        assert chat.prompt.text == "question"
        await pilot.press("escape")
        assert chat.edit_banner.target is None and chat.prompt.text == "half-written draft"


@pytest.mark.anyio
async def test_switch_conversations_delete_and_undo(tiny_models: dict[str, Path]) -> None:
    store = open_default_store()
    for title in ("alpha", "beta"):
        conversation = store.conversations.create_conversation(title)
        store.tree.add_user_message(conversation.id, f"about {title}")
    store.close()
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        chat = chat_of(app)
        assert chat.header.conversation_title == "beta"  # most recent first
        options = chat.conversation_list.options
        assert options.option_count == 2
        options.focus()
        options.highlighted = 1
        await pilot.press("enter")
        await pilot.pause()
        assert chat.header.conversation_title == "alpha"
        assert chat.transcript.views()[0].message.content == "about alpha"
        # Delete the highlighted conversation from the list, then undo.
        options.focus()
        options.highlighted = 0
        await pilot.press("d")
        await pilot.pause()
        assert [c.title for c in app.store.conversations.list_conversations()] == ["alpha"]
        assert options.option_count == 1
        await pilot.press("u")
        await pilot.pause()
        assert sorted(c.title for c in app.store.conversations.list_conversations()) == ["alpha", "beta"]
        assert chat.conversation_list.options.option_count == 2
        # Search finds message contents.
        await pilot.press("ctrl+f")
        await pilot.press(*"about al")
        await pilot.pause()
        assert chat.conversation_list.options.option_count == 1
        # Esc clears the search (every conversation is listed again), a second Esc goes back to the prompt.
        await pilot.press("escape")
        await pilot.pause()
        assert chat.conversation_list.search_text == "" and chat.conversation_list.options.option_count == 2
        await pilot.press("escape")
        assert chat.prompt.has_focus


@pytest.mark.anyio
async def test_settings_persist_across_a_restart_of_the_app(tiny_models: dict[str, Path]) -> None:
    from textual.widgets import Input, TextArea

    from app.tui.screens.settings_screen import SettingsScreen

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#setting-n_ctx", Input).value = "abc"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)  # refused: not a number
        screen.query_one("#setting-n_ctx", Input).value = "2048"
        screen.query_one("#setting-n_threads", Input).value = "1"
        screen.query_one("#setting-model-folders", TextArea).text = str(tiny_models["llama"].parent)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
    saved = load_config()
    assert saved.engine.n_ctx == 2048 and saved.engine.n_threads == 1
    assert saved.model_folders == (str(tiny_models["llama"].parent),)
    # A new app loads the model with the saved context size.
    second = LlmtuiApp(str(tiny_models["llama"]))
    async with second.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert second.config.engine.n_ctx == 2048
        assert second.model is not None and second.model.n_ctx == 2048


@pytest.mark.anyio
async def test_engine_crash_then_restart_keeps_the_conversation(tiny_models: dict[str, Path]) -> None:
    from app.tui.modals.crash import EngineCrashedModal

    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "before the crash")
        await reply_done(pilot)
        before = app.store.tree.active_path(chat.conversation_id or 0)
        pid = app.bridge.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await wait_until(pilot, lambda: isinstance(app.screen, EngineCrashedModal))
        assert app.engine_state == "crashed"
        assert "SIGKILL" in app.screen.description
        await pilot.press("r")
        await ready(pilot)
        assert app.bridge.pid != pid
        assert app.store.tree.active_path(chat.conversation_id or 0) == before
        assert len(chat.transcript.views()) == 2
        await send(pilot, "after the restart")
        await reply_done(pilot)
        assert [m.state for m in app.store.tree.active_path(chat.conversation_id or 0)][-1] == "complete"


@pytest.mark.anyio
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (60, 16)])
async def test_the_crash_dialog_shows_its_keys_whatever_the_log_length(size: tuple[int, int]) -> None:
    """A real engine log tail is long: the dialog must still show the line saying which key restarts."""
    from textual.widgets import Static

    from app.tui.modals.crash import EngineCrashedModal

    app = LlmtuiApp("starter", start_engine=False)
    log = "\n".join(
        f"sched_reserve: line {n} of a long engine log, long enough to wrap at 80 columns: " + "x" * 30
        for n in range(1, 60)
    )

    def laid_out(modal: EngineCrashedModal) -> bool:
        dialogs, hints, logs = modal.query("#crash-dialog"), modal.query(".dialog-hint"), modal.query("#crash-log")
        if not (dialogs and hints and logs):
            return False
        dialog, hint, log_view = dialogs.first(), hints.first(), logs.first()
        return dialog.region.contains_region(hint.region) and log_view.region.height >= 3 and log_view.max_scroll_y > 0

    async with app.run_test(size=size) as pilot:
        from engine_ext.params import ContextParams, ModelParams
        from engine_ext.recovery import fallbacks

        tries = fallbacks(ModelParams(), ContextParams(), n_threads=4, gpu_devices=1)  # all five, the longest list
        app.push_screen(
            EngineCrashedModal(
                "the engine process was killed by SIGKILL",
                log,
                "/home/someone/.local/state/llmtui/log/engine.log",
                tries,
            )
        )
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, EngineCrashedModal) and laid_out(app.screen),
            "the crash dialog laid out: its keys inside it, its log scrolling",
        )
        modal = app.screen
        hint = modal.query_one(".dialog-hint", Static)
        dialog = modal.query_one("#crash-dialog")
        assert "R restart" in str(hint.render())
        assert dialog.region.contains_region(hint.region) and modal.region.contains_region(dialog.region)
        assert hint.region.right <= dialog.region.right - 2  # the whole line fits inside the border
        assert "5 -c 2048" in str(hint.render())  # the fallbacks are keys too
        assert "The whole log: /home/someone/" in str(modal.query_one("#crash-log-text", Static).render())
        log_view = modal.query_one("#crash-log")
        assert log_view.region.height >= 3 and log_view.max_scroll_y > 0  # the rest of the log scrolls


@pytest.mark.anyio
async def test_a_crash_while_streaming_keeps_the_partial_reply(tiny_models: dict[str, Path]) -> None:
    from app.tui.modals.crash import EngineCrashedModal

    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=LONG)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        pid = app.bridge.pid or 0
        os.kill(pid, signal.SIGSTOP)  # the tiny model is fast: let it run a few milliseconds at a time
        try:
            await send(pilot, "stream then crash")
            for _ in range(400):
                if chat.generation is not None and chat.generation.recorder.tokens > 0:
                    break
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.002)
                os.kill(pid, signal.SIGSTOP)
                await pilot.pause(0.06)  # the bridge delivers what the engine wrote
        finally:
            os.kill(pid, signal.SIGKILL)
        await wait_until(pilot, lambda: app.engine_state == "crashed")
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.role == "assistant" and reply.state == "error" and reply.content
        await wait_until(pilot, lambda: isinstance(app.screen, EngineCrashedModal))
        await pilot.press("escape")  # close the crash dialog; F5 restarts later
        await pilot.press("f5")
        await ready(pilot)


@pytest.mark.anyio
async def test_a_bad_model_file_shows_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    app = LlmtuiApp(str(bad))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "error")
        await wait_until(pilot, lambda: any("Could not load broken.gguf" in n.message for n in app._notifications))
        chat = chat_of(app)
        chat.prompt.load_text("hello")
        await pilot.press("enter")
        assert chat.generation is None and app.store.conversations.list_conversations() == []


@pytest.mark.anyio
async def test_first_run_screen_when_there_is_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.tui.screens.first_run import FirstRunScreen

    monkeypatch.setattr("app.tui.start_up.starter_model_path", lambda: None)
    monkeypatch.setattr("app.core.model_list.starter_model_path", lambda: None)
    app = LlmtuiApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FirstRunScreen)
        assert app.engine_state == "no model"
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.press("f3")
        await pilot.pause()
        assert type(app.screen).__name__ == "SettingsScreen"


@pytest.mark.anyio
async def test_model_switcher_loads_a_model_from_a_configured_folder(tiny_models: dict[str, Path]) -> None:
    from dataclasses import replace

    from app.core.config import save_config
    from app.tui.modals.model_switcher import ModelSwitcherModal

    save_config(replace(load_config(), model_folders=(str(tiny_models["qwen3"].parent),)))
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert isinstance(app.screen, ModelSwitcherModal)
        switcher = app.screen
        await wait_until(pilot, lambda: not switcher.scanning, what="the model folders, scanned in a thread")
        names = [m.name for m in app.screen.models]
        assert tiny_models["qwen3"].stem in names
        await pilot.press(*tiny_models["qwen3"].stem)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model is not None and app.model.path == str(tiny_models["qwen3"]))
        assert load_config().last_model == str(tiny_models["qwen3"])


@pytest.mark.anyio
async def test_help_screen_and_command_palette_entries(tiny_models: dict[str, Path]) -> None:
    from app.tui.screens.help import HelpScreen

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        chat = chat_of(app)
        chat.transcript.focus()
        chat.set_focus(None)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        titles = {command.title for command in app.get_system_commands(chat)}
        for wanted in (
            "Chat: New conversation",
            "Chat: Stop the reply",
            "Chat: Continue the reply from where it ends",
            "Chat: Regenerate the last reply",
            "Models: Switch model",
            "Chat: Conversation settings",
            "Chat: Delete the conversation",
            "Chat: Undo delete",
            "Chat: Export the conversation",
            "Chat: Import conversation",
            "Models: Restart the engine",
            "llmtui: Settings",
            "View: Help",
            "View: Dark / light theme",
            "Speculation: Draft colouring",
        ):
            assert wanted in titles
        # The palette's draft colouring entry toggles it like F7 does.
        toggle = next(c for c in app.get_system_commands(chat) if c.title == "Speculation: Draft colouring")
        toggle.callback()
        assert chat.transcript.colour_drafts and app.config.draft_colouring


@pytest.mark.anyio
async def test_theme_toggle_is_saved(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+t")
        assert app.theme == "textual-light"
    assert load_config().theme == "light"


@pytest.mark.anyio
async def test_conversation_settings_and_presets(tiny_models: dict[str, Path]) -> None:
    from textual.widgets import Input, TextArea

    from app.tui.modals.conversation_settings import ConversationSettingsModal

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConversationSettingsModal)
        modal.query_one("#system-prompt", TextArea).text = "You are terse."
        modal.query_one("#sampling-temperature", Input).value = "-1"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is modal  # refused: negative temperature
        modal.query_one("#sampling-temperature", Input).value = "0.3"
        modal.query_one("#sampling-top_k", Input).value = "20"
        modal.query_one("#preset-name", Input).value = "precise"
        await pilot.press("ctrl+s")
        await pilot.pause()
        chat = chat_of(app)
        conversation = app.store.conversations.get_conversation(chat.conversation_id or 0)
        assert conversation.system_prompt == "You are terse."
        assert conversation.settings["sampling"]["temperature"] == 0.3
        assert [p.name for p in app.store.presets.list_presets()] == ["precise"]
        assert app.store.presets.list_presets()[0].settings["top_k"] == 20


@pytest.mark.anyio
async def test_export_writes_markdown_and_json(tiny_models: dict[str, Path]) -> None:
    store = open_default_store()
    conversation = store.conversations.create_conversation("exported")
    store.tree.add_user_message(conversation.id, "a question")
    store.close()
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        chat = chat_of(app)
        chat.action_export_conversation()
        await wait_until(
            pilot,
            lambda: any("Exported to" in n.message for n in app._notifications),
            what="the export, written in a thread",
        )
        markdown, json_text = app.conversations.export(conversation.id)
        assert "a question" in markdown.read_text()
        assert app.store.exports.import_json(json_text.read_text()).conversation_id != conversation.id


@pytest.mark.anyio
async def test_copy_message_and_code_block(tiny_models: dict[str, Path]) -> None:
    store = open_default_store()
    conversation = store.conversations.create_conversation("code")
    user = store.tree.add_user_message(conversation.id, "show code")
    reply = store.tree.begin_assistant_message(conversation.id, user.id, "m")
    store.tree.finish_assistant_message(reply, "Here:\n\n```python\nprint('hi')\n```\n", "", "complete", {})
    store.close()
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        chat = chat_of(app)
        view = chat.transcript.views()[-1]
        assert isinstance(view, MessageView)
        view.focus()
        await pilot.press("c")
        await pilot.press("y")
        await pilot.pause()
        assert copied == ["Here:\n\n```python\nprint('hi')\n```\n", "print('hi')\n"]


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_long_message_of_yours_is_folded_until_t(tiny_models: dict[str, Path]) -> None:
    pasted = "Explain this log:\n" + "\n".join(f"12:00:{i % 60:02d} worker {i} finished job {i * 7}" for i in range(60))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=4))
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, pasted)
        await reply_done(pilot)
        view = next(v for v in chat.transcript.views() if v.message.role == "user")
        assert view.folded and view.fold_head is not None and view.fold_head.count("\n") == 11
        folded = [strip.text for strip in view.render_strips(96)]
        assert "▸ 61 lines, " in folded[-1] and "t to show all" in folded[-1]
        folded_height = view.size.height
        assert len(folded) < 20 and folded_height < 20
        view.focus()
        await pilot.press("t")
        await pilot.pause()
        shown = [strip.text for strip in view.render_strips(96)]
        assert not view.folded and any("worker 59 finished" in line for line in shown) and "t to fold" in shown[-1]
        assert view.size.height > folded_height + 10  # laid out again at its full height
        await pilot.press("c")  # copying takes the whole message, folded or not
        await pilot.press("t")
        await pilot.pause()
        assert view.folded and view.size.height == folded_height
        assert copied == [pasted]
        # A short message, and a reply, are never folded.
        assert all(v.fold_head is None for v in chat.transcript.views() if v is not view)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_very_long_reply_is_drawn_in_a_thread_and_the_view_stays_at_end(tiny_models: dict[str, Path]) -> None:
    code = "\n".join(f"def f{i}(x):\n    return x * {i}  # step {i}" for i in range(700))
    reply = f"Here is the module:\n\n```python\n{code}\n```\n\nThe end of the reply."
    assert len(reply) >= BACKGROUND_RENDER_CHARS
    store = open_default_store()
    conversation = store.conversations.create_conversation("module")
    user = store.tree.add_user_message(conversation.id, "write a module")
    message = store.tree.begin_assistant_message(conversation.id, user.id, "m")
    store.tree.finish_assistant_message(message, reply, "", "complete", {})
    store.close()
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = chat_of(app)
        await chat.conversations.open_conversation(conversation.id)
        view = chat.transcript.views()[-1]
        assert view.message.content == reply
        # Drawn in a thread: a note stands in for the body until its lines are ready, then the view is laid out
        # again at its full height and the transcript still shows the end of the conversation.
        await wait_until(pilot, lambda: view.size.height > 1400)
        await pilot.pause()
        assert chat.transcript.at_bottom
        assert "The end of the reply." in view.render_line(view.size.height - 1).text
        placeholder = view.body_lines(50)  # another width: drawn again, in a thread
        assert [line_text(line) for line in placeholder] == [f"drawing {len(reply):,} characters…"]

        def settled() -> bool:
            return view._rendering_width == -1 and view._body_width == view.outer_size.width - view.styles.gutter.width

        await wait_until(pilot, settled)
        await pilot.resize_terminal(140, 30)  # a wider view: drawn again at the new width, in a thread
        await wait_until(pilot, lambda: view.outer_size.width > 100 and settled())
        await pilot.pause()
        assert chat.transcript.at_bottom and "The end of the reply." in view.render_line(view.size.height - 1).text


@pytest.mark.skipif(starter_model_path() is None, reason="the starter model is not installed")
@pytest.mark.anyio
async def test_starter_model_send_cancel_continue_regenerate() -> None:
    app = LlmtuiApp("starter", default_sampling=SamplingSettings(temperature=0.0, max_tokens=6))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "What is the capital of France?")
        await reply_done(pilot)
        first = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert first.state == "complete" and first.content.strip()
        await press_and_start(pilot, "ctrl+r")
        await pilot.press("escape")
        await reply_done(pilot)
        stopped = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert stopped.state in ("stopped", "complete") and stopped.parent_id == first.parent_id
        if stopped.state == "stopped":
            await press_and_start(pilot, "ctrl+g")
            await reply_done(pilot)
            assert app.store.tree.active_path(chat.conversation_id or 0)[-1].state == "complete"


def test_llmtui_with_no_subcommand_opens_the_tui(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import main

    opened: list[tuple[str | None, bool]] = []
    monkeypatch.setattr(
        "app.tui.app.run_tui", lambda model=None, no_repack=False: opened.append((model, no_repack)) or 0
    )
    assert main([]) == 0
    assert main(["-m", "starter"]) == 0
    assert main(["--no-repack"]) == 0
    assert opened == [(None, False), ("starter", False), (None, True)]


def test_only_the_bridge_imports_both_the_engine_client_and_textual() -> None:
    root = Path(__file__).resolve().parents[2] / "app"
    both = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        textual = "from textual" in text or "import textual" in text or "app.tui.messages" in text  # EngineMessage
        if "engine_ext.client" in text and textual:
            both.append(path.name)
    assert both == ["bridge.py"]


@pytest.mark.anyio
async def test_no_color_is_respected(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.no_color
        assert "nocolor" in app.pseudo_classes


@pytest.mark.anyio
async def test_gpu_layers_auto_says_where_the_layers_went(tiny_models: dict[str, Path]) -> None:
    from dataclasses import replace

    from app.core.config import save_config
    from engine_ext.params import GPU_LAYERS_AUTO

    config = load_config()
    save_config(replace(config, engine=replace(config.engine, n_gpu_layers=GPU_LAYERS_AUTO)))
    app = LlmtuiApp(str(tiny_models["llama"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.model is not None and app.model.placement.startswith("-ngl auto: ")
        # this CPU machine has no GPU device: the notice says so next to the load time
        await wait_until(
            pilot, lambda: any("no GPU device: all layers on the CPU" in n.message for n in app._notifications)
        )


@pytest.mark.anyio
async def test_the_notices_after_a_crash_recovery_leave_the_stream_and_the_stats_bar_visible_at_80x24(
    tiny_models: dict[str, Path],
) -> None:
    """Issue 37 item 4: the chat's toasts are at the top right (as on the models screen), so the recovery notice and
    the load notice after it no longer cover the reply's last lines, the message box and the stats bar."""
    from app.core.engine import Recovering
    from app.tui.widgets.status import StatsBar
    from engine_ext.recovery import retry_notice
    from tests.fakes import engine_message

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_until(pilot, lambda: app.started and app.screen is app.chat, "the chat shown")
        chat = chat_of(app)
        app.post_message(
            engine_message(app, Recovering(retry_notice("AMX", ("AVX512",), "F3 settings: Repack weights.")))
        )
        app.notify("Loaded tiny-llama (CPU, context 2048) in 0.1 s.")
        await wait_until(pilot, lambda: len(chat.query("Toast")) == 2, "the two notices shown")
        await pilot.pause()
        stats_bar = chat.query_one(StatsBar).region
        message_box = chat.prompt.region
        for toast in chat.query("Toast"):
            assert toast.region.bottom < message_box.y - 2, f"a toast at {toast.region} covers the reply's last lines"
            assert not toast.region.overlaps(stats_bar)


@pytest.mark.anyio
async def test_the_model_loaded_for_the_chat_is_recorded_as_used(tiny_models: dict[str, Path]) -> None:
    """Issue 37 item 5: F4 and `llmtui models list` said `used: -` for the model the user chatted with."""
    from app.core import paths
    from models_catalog.library import Library

    model = tiny_models["llama"]
    library = Library([model.parent], usage_file=paths.data_dir() / "model-usage.json")

    def last_used() -> float | None:
        return next(m.last_used for m in library.models(inspect=False) if m.path == model)

    assert last_used() is None
    app = LlmtuiApp(str(model), default_sampling=SHORT)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: last_used() is not None, "the use recorded")


@pytest.mark.anyio
async def test_f3_shows_the_prompt_caches_size_against_its_budget(tiny_models: dict[str, Path]) -> None:
    """Issue 47: F3 says what the prompt cache on disk holds (read in a thread) against its budget, or that it is
    off."""
    from textual.widgets import Static

    from app.core.paths import prompt_cache_dir
    from app.tui.screens.settings_screen import SettingsScreen

    folder = prompt_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.started, "the start-up")
        app.config = replace(app.config, cache=replace(app.config.cache, budget_mib=64))
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), "the settings")
        usage = app.screen.query_one("#settings-cache-usage", Static)
        await wait_until(pilot, lambda: "saved" in str(usage.render()), "the cache's size, read in a thread")
        assert "0 saved conversation state(s)" in str(usage.render()) and "64" in str(usage.render())
        await pilot.press("escape")
        app.config = replace(app.config, cache=replace(app.config.cache, disk=False))
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), "the settings again")
        assert "off" in str(app.screen.query_one("#settings-cache-usage", Static).render())
