"""Snapshots of every screen and dialog at 80×24 and 120×40 (pytest-textual-snapshot; --snapshot-update)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from app.core.config import RemoteSettings
from app.tui.app import LlmtuiApp
from tests.pilot import SIZES, loaded, make_app, seeded, started  # noqa: F401 (seeded: a fixture)
from tests.waits import wait_until


def then(*steps: Callable[[Pilot[Any]], Awaitable[None]]) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run(pilot: Pilot[Any]) -> None:
        await loaded(pilot)
        for step in steps:
            await step(pilot)
        await pilot.pause()

    return run


def keys(*pressed: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def press(pilot: Pilot[Any]) -> None:
        await pilot.press(*pressed)
        await pilot.pause()

    return press


async def crash_dialog(pilot: Pilot[Any]) -> None:
    from app.tui.modals.crash import EngineCrashedModal

    log = "\n".join(f"llama_model_load: line {n} of the engine log" for n in range(1, 31))  # a real tail is long
    from engine_ext.params import ContextParams, ModelParams
    from engine_ext.recovery import fallbacks

    tries = fallbacks(ModelParams(use_extra_bufts=False), ContextParams(), n_threads=2, gpu_devices=1)
    pilot.app.push_screen(
        EngineCrashedModal(
            "the engine process was killed by SIGSEGV", log, "/home/user/.local/state/llmtui/log/engine.log", tries
        )
    )
    await pilot.pause()


async def code_picker(pilot: Pilot[Any]) -> None:
    from app.tui.modals.pick import PickModal

    pilot.app.push_screen(PickModal("Copy which code block?", ["1. def reverse(text: str) -> str:", "2. xs[::-1]"]))
    await pilot.pause()


async def rename_dialog(pilot: Pilot[Any]) -> None:
    await pilot.press("f2")
    await pilot.pause()


REMOTES = (
    RemoteSettings("gpu-box", "http://192.168.1.20:8080/v1", api_key_env="GPU_BOX_KEY", model="qwen3-8b"),
    RemoteSettings("cloud", "https://api.example.com/v1", api_key="sk-never-shown-0123456789"),
)


async def with_remotes(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    app.config = replace(app.config, remotes=REMOTES)


async def settings_remotes(pilot: Pilot[Any]) -> None:
    from textual.widgets import Static

    await with_remotes(pilot)
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    app.config = replace(app.config, cache=replace(app.config.cache, budget_mib=1024))  # the default is the disk's
    await pilot.press("f3")
    usage = app.screen.query_one("#settings-cache-usage", Static)
    await wait_until(pilot, lambda: "saved" in str(usage.render()), "the prompt cache's size, read in a thread")
    app.screen.query_one("#settings-body").scroll_end(animate=False)
    await pilot.pause()


async def remote_dialog(pilot: Pilot[Any]) -> None:
    from app.tui.screens.settings_screen import SettingsScreen

    await settings_remotes(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, SettingsScreen)
    screen.edit_remote(1)
    await pilot.pause()
    from textual.widgets import Input

    for field in pilot.app.screen.query(Input):  # a steady cursor: a blinking one is drawn or not by timing
        field.cursor_blink = False
    await pilot.pause()


async def switcher_remotes(pilot: Pilot[Any]) -> None:
    """The switcher with two remote engines: one lists its models, one cannot be reached (shown inline)."""
    from app.core.model_list import local_models
    from app.core.remote_http import RemoteError, RemoteModel
    from app.tui.modals.model_switcher import ModelSwitcherModal

    def lister(remote: RemoteSettings) -> list[RemoteModel]:
        if remote.name == "gpu-box":
            return [RemoteModel("qwen3-8b", 40960), RemoteModel("llama-3.1-8b-instruct", 131072)]
        raise RemoteError(
            f"cannot connect to {remote.name} at {remote.base_url}: connection refused (is the server running?)"
        )

    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    modal = ModelSwitcherModal(local_models(()), "remote:gpu-box/qwen3-8b", REMOTES, lister=lister)
    app.push_screen(modal)
    await wait_until(pilot, lambda: len(modal.remote_models) == len(REMOTES), "every remote's listing")
    await pilot.pause()


async def switcher_scanned(pilot: Pilot[Any]) -> None:
    """The switcher once its scan of the model folders (in a thread) is done."""
    from app.tui.modals.model_switcher import ModelSwitcherModal

    switcher = pilot.app.screen
    if isinstance(switcher, ModelSwitcherModal):
        await wait_until(
            pilot, lambda: not switcher.scanning and not switcher.describing, "the models, scanned in a thread"
        )
        await pilot.pause()


async def long_message(pilot: Pilot[Any]) -> None:
    """A pasted log as the last message of the conversation: shown folded, and focused (the footer's "t Show all")."""
    from app.tui.widgets.message_view import MessageView

    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    chat = app.chat
    assert chat is not None and chat.conversation_id is not None
    log = "\n".join(f"    12:00:{i:02d} worker {i} finished job {i * 7}" for i in range(60))
    app.store.tree.add_user_message(chat.conversation_id, f"Why does worker 3 stop?\n\n{log}")
    await chat.conversations.open_conversation(chat.conversation_id)
    await pilot.pause()
    views = [v for v in chat.transcript.views() if isinstance(v, MessageView)]
    views[-1].focus()
    await pilot.pause()


async def tool_consent(pilot: Pilot[Any]) -> None:
    from app.tui.modals.tool_consent import ToolConsentModal
    from engine_ext.protocol import ToolCall

    call = ToolCall("call00001", "get_weather", '{"city": "Paris", "units": "metric"}')
    pilot.app.push_screen(ToolConsentModal(call, "mcp:weather"))
    await pilot.pause()


async def reply_with_tool_call(pilot: Pilot[Any]) -> None:
    """A reply that called a tool: its call folded under it (one allowed, one denied)."""
    from app.core.tools.loop import REFUSED_RESULT, CallRecord, record_to_json
    from engine_ext.protocol import ToolCall

    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    chat = app.chat
    assert chat is not None and chat.conversation_id is not None
    question = app.store.tree.add_user_message(chat.conversation_id, "Weather in Paris and Oslo?")
    reply = app.store.tree.begin_assistant_message(chat.conversation_id, question.id, "Qwen3-4B")
    paris = CallRecord(ToolCall("c1", "get_weather", '{"city": "Paris"}'), "mcp:weather", True, "18 °C", False, 0.4)
    oslo = CallRecord(ToolCall("c2", "get_weather", '{"city": "Oslo"}'), "mcp:weather", False, REFUSED_RESULT, True, 0)
    stats = {"tool_calls": [record_to_json(paris, 0), record_to_json(oslo, 0)]}
    app.store.tree.finish_assistant_message(reply, "Paris has 18 °C; Oslo was not looked up.", "", "complete", stats)
    await chat.conversations.open_conversation(chat.conversation_id)
    await pilot.pause()


async def image_attached(pilot: Pilot[Any]) -> None:
    """A vision model loaded (its projector beside it) and an image waiting above the message box."""
    from engine_ext.image_input import check_image
    from tests.pilot import MODEL
    from tests.tiny_mmproj import png_bytes

    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    app.model = replace(MODEL, mmproj="/models/mmproj-SmolLM2-135M-f16.gguf")
    app.set_engine_state("ready")
    chat = app.chat
    assert chat is not None
    chat.attachments.add(app.store.images.keep_image(check_image(png_bytes(64, 48, seed=5)), "diagram.png"))
    await pilot.pause()


async def message_with_image(pilot: Pilot[Any]) -> None:
    """A question of yours with a picture (drawn in half blocks under tests), and the reply about it."""
    from app.tui.widgets.image_block import ImageBlock
    from engine_ext.image_input import check_image
    from tests.tiny_mmproj import png_bytes

    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    chat = app.chat
    assert chat is not None and chat.conversation_id is not None
    kept = app.store.images.keep_image(check_image(png_bytes(32, 24, seed=7)), "noise.png")
    question = app.store.tree.add_user_message(chat.conversation_id, "What is in this picture?", (kept,))
    reply = app.store.tree.begin_assistant_message(chat.conversation_id, question.id, "SmolVLM-256M")
    app.store.tree.finish_assistant_message(reply, "Coloured noise: random pixels.", "", "complete", {})
    await chat.conversations.open_conversation(chat.conversation_id)
    blocks = list(chat.transcript.query(ImageBlock))
    await wait_until(pilot, lambda: all(b.state == "shown" for b in blocks), "the picture decoded in a thread")
    await pilot.pause()


SCENES: dict[str, Callable[[Pilot[Any]], Awaitable[None]]] = {
    "chat": then(),
    "chat_message_focused": then(keys("ctrl+up")),
    "chat_long_message_folded": then(long_message),
    "chat_new_conversation": then(keys("ctrl+n")),
    "chat_no_sidebar_light": then(keys("ctrl+b", "ctrl+t")),
    "help": then(keys("f1")),
    "settings": then(keys("f3")),
    "settings_remote_engines": then(settings_remotes),
    "remote_engine_dialog": then(remote_dialog),
    "model_switcher": then(keys("ctrl+l"), switcher_scanned),
    "model_switcher_remote": then(switcher_remotes),
    "conversation_settings": then(keys("ctrl+s")),
    "rename": then(rename_dialog),
    "code_picker": then(code_picker),
    "engine_crashed": then(crash_dialog),
    "tool_consent": then(tool_consent),
    "chat_tool_call_folded": then(reply_with_tool_call),
    "chat_image_attached": then(image_attached),
    "chat_message_with_image": then(message_with_image),
}


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", list(SCENES))
def test_screen(snap_compare: Any, scene: str, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=SCENES[scene])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_first_run_screen(
    snap_compare: Any, app_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    monkeypatch.setattr("app.tui.start_up.starter_model_path", lambda: None)
    app = LlmtuiApp(start_engine=False)
    app.requested_model = None
    assert snap_compare(app, terminal_size=size, run_before=started)
