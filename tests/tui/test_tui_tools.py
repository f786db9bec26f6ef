"""Tools in the chat (issue 35): a scripted engine's reply ends with a tool call, the consent dialog asks, the call
runs (the built-in datetime tool, or a tool of an MCP server written with the SDK), its result goes back to the
engine and the reply goes on; denied, the model is told so; Esc during a call stops the reply; the calls are kept
with the reply and shown folded under it after a restart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from textual.pilot import Pilot

from app.core import paths
from app.core.tools.loop import REFUSED_RESULT
from app.tui.app import LlmtuiApp
from app.tui.modals.tool_consent import ToolConsentModal
from app.tui.screens.chat_screen import ChatScreen
from app.tui.widgets.tool_call_block import ToolCallBlock
from engine_ext.protocol import Finished, Generate, GenerationStats, TokenChunk, ToolCall
from tests.fakes import ScriptedEngine, scripted_app
from tests.waits import wait_until

pytestmark = pytest.mark.anyio

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
STATS = GenerationStats(10, 0, 10, 5.0, 4, 20.0, 6.0, 4096, 14)


class ToolEngine(ScriptedEngine):
    """To a user's message: a sentence, then a Hermes call of `CALL` (its markup streamed as a model writes it); to
    the call's result: an answer that quotes it. Each request is kept in `self.generates`."""

    CALL = ToolCall("call00001", "current_datetime", "{}")

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self.generates: list[Generate] = []

    def stream(self, request: Generate) -> None:
        self.generates.append(request)
        rid = request.request_id
        last = request.messages[-1]
        if last.role == "tool":
            self.events.put(TokenChunk(rid, f"The tool said: {last.content[:40]}", "", (1,), ("target",)))
            self.events.put(Finished(rid, "eos", STATS))
            return
        call = self.CALL
        markup = f'<tool_call>{{"name": "{call.name}", "arguments": {call.arguments}}}</tool_call>'
        self.events.put(TokenChunk(rid, "Let me look. ", "", (1,), ("target",)))
        self.events.put(TokenChunk(rid, markup, "", (2,), ("target",)))
        self.events.put(Finished(rid, "eos", STATS, tool_calls=(call,)))


class WeatherEngine(ToolEngine):
    CALL = ToolCall("call00002", "get_weather", '{"city": "Paris"}')


class HangEngine(ToolEngine):
    CALL = ToolCall("call00003", "hang", "{}")


def configure_weather_server() -> None:
    """config.toml (the test's own config dir) names the tests' MCP server, as a user's would."""
    config = paths.config_path()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f"[mcp.servers.weather]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(SERVER)}]\n"
        "call_timeout_s = 30\n",
        encoding="utf-8",
    )


async def chat_with_tools(pilot: Pilot[None], app: LlmtuiApp, choice: str) -> ChatScreen:
    """A conversation whose tools setting is `choice`, open in the chat."""
    await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
    chat = app.chat
    assert chat is not None
    conversation = app.generation.ensure_conversation(None)
    app.store.conversations.update_settings(conversation.id, settings=dict(conversation.settings, tools=choice))
    chat.conversation_id = conversation.id
    return chat


async def answer_the_call(pilot: Pilot[None], app: LlmtuiApp, chat: ChatScreen, text: str, key: str) -> None:
    """Send `text`; once the reply's call asks for consent, answer with `key` (o, c, a, d)."""
    await chat.replies.send(text)
    await consent_asked(pilot, app)
    await pilot.press(key)
    await wait_until(pilot, lambda: not isinstance(app.screen, ToolConsentModal), "the dialog to close")


def engine_of(app: LlmtuiApp) -> ToolEngine:
    engine = app.bridge._client  # type: ignore[union-attr]
    assert isinstance(engine, ToolEngine)
    return engine


async def consent_asked(pilot: Pilot[None], app: LlmtuiApp) -> ToolConsentModal:
    await wait_until(pilot, lambda: isinstance(app.screen, ToolConsentModal), "the consent dialog")
    assert isinstance(app.screen, ToolConsentModal)
    return app.screen


async def test_a_call_of_the_builtin_datetime_tool_runs_after_consent_and_the_reply_goes_on(lone_llama: Path) -> None:
    app = scripted_app(lone_llama, ToolEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_with_tools(pilot, app, "builtin")
        await chat.replies.send("What day is it?")
        dialog = await consent_asked(pilot, app)
        assert dialog.call.name == "current_datetime" and dialog.source == "built-in"
        assert "<tool_call>" not in (chat.transcript.live.text if chat.transcript.live else "")
        await pilot.press("c")  # for this conversation
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end after the tool round")
        engine = engine_of(app)
        first, second = engine.generates
        assert first.tools is not None and "current_datetime" in first.tools
        roles = [m.role for m in second.messages]
        assert roles == ["user", "assistant", "tool"]
        assert json.loads(second.messages[1].tool_calls)[0]["function"]["name"] == "current_datetime"
        assert second.messages[1].content == "Let me look. "
        assert second.messages[2].tool_call_id == "call00001"
        [reply] = [m for m in app.store.tree.active_path(chat.conversation_id or 0) if m.role == "assistant"]
        assert reply.content.startswith("Let me look. The tool said: ") and "<tool_call>" not in reply.content
        [stored] = reply.stats["tool_calls"]  # type: ignore[misc]
        assert stored["name"] == "current_datetime" and stored["allowed"] and stored["at"] == len("Let me look. ")
        [block] = chat.transcript.query(ToolCallBlock)
        assert block.summary(block.record).startswith("tool current_datetime · built-in ·")
        assert "tools 1 call" in chat.stats.render_line(0).text
        # Allowed for the conversation: the next call runs without asking.
        await chat.replies.send("And now?")
        await wait_until(pilot, lambda: chat.generation is None and len(engine.generates) == 4, "the second reply")
        assert not isinstance(app.screen, ToolConsentModal)
        # The next request carries the first reply's round as it was (text, call, result, then the answer).
        assert [m.role for m in engine.generates[2].messages] == ["user", "assistant", "tool", "assistant", "user"]


async def test_a_denied_call_is_refused_and_the_model_is_told(lone_llama: Path) -> None:
    app = scripted_app(lone_llama, ToolEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_with_tools(pilot, app, "builtin")
        await answer_the_call(pilot, app, chat, "What day is it?", "d")
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end after the refusal")
        second = engine_of(app).generates[1]
        assert second.messages[-1].role == "tool" and second.messages[-1].content == REFUSED_RESULT
        [block] = chat.transcript.query(ToolCallBlock)
        assert block.summary(block.record).endswith("· denied")


async def test_an_mcp_servers_tool_runs_and_its_result_is_used_then_kept_after_a_restart(lone_llama: Path) -> None:
    configure_weather_server()
    app = scripted_app(lone_llama, WeatherEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_with_tools(pilot, app, "mcp:weather")
        conversation_id = chat.conversation_id
        await chat.replies.send("Weather in Paris?")
        dialog = await consent_asked(pilot, app)
        assert dialog.source == "mcp:weather"
        await pilot.press("o")
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end after the MCP call", 60)
        tool_message = engine_of(app).generates[1].messages[-1]
        assert tool_message.role == "tool" and "Paris" in tool_message.content
    # A restart: the reply shows its call folded under it, from the history.
    again = scripted_app(lone_llama, WeatherEngine)
    async with again.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: again.engine_state == "ready", "the scripted engine to load")
        reopened = again.chat
        assert reopened is not None
        await reopened.conversations.open_conversation(conversation_id)
        await wait_until(pilot, lambda: bool(reopened.transcript.query(ToolCallBlock)), "the stored call's block")
        [block] = reopened.transcript.query(ToolCallBlock)
        assert block.record.call.name == "get_weather" and "Paris" in block.record.result
        block.focus()
        await pilot.press("enter")
        assert block.expanded


async def test_esc_while_a_tool_runs_stops_the_reply(lone_llama: Path) -> None:
    configure_weather_server()
    app = scripted_app(lone_llama, HangEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_with_tools(pilot, app, "mcp:weather")
        await answer_the_call(pilot, app, chat, "Hang, please", "o")
        await pilot.press("escape")
        await wait_until(pilot, lambda: chat.generation is None, "Esc to stop the reply during the call", 10)
        [reply] = [m for m in app.store.tree.active_path(chat.conversation_id or 0) if m.role == "assistant"]
        assert reply.state == "stopped" and len(engine_of(app).generates) == 1
        assert app.engine_state == "ready"


async def test_the_conversation_settings_choose_the_tools(lone_llama: Path) -> None:
    from textual.widgets import Select

    from app.tui.modals.conversation_settings import ConversationSettingsModal

    configure_weather_server()
    app = scripted_app(lone_llama, ToolEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationSettingsModal), "the settings dialog")
        select = app.screen.query_one("#tools-select", Select)
        values = [value for _, value in select._options]  # noqa: SLF001 (the choices offered)
        assert values == ["none", "builtin", "mcp:weather"] and select.value == "none"
        select.value = "mcp:weather"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), "the dialog to close")
        chat = app.chat
        assert chat is not None and chat.conversation_id is not None
        assert app.store.conversations.get_conversation(chat.conversation_id).settings["tools"] == "mcp:weather"
