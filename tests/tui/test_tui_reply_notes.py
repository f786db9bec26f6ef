"""What the chat says about a reply (issue 49), on a scripted engine at 80x24: a reply waiting behind the API
server's requests says so (ctrl+k stops them; Esc stops the reply at once) and its time to the first token counts
from Enter; the chat's default reply limit, and a reply that repeats itself said so; why a failed reply failed,
kept with it in the transcript, the history and the exports; a constrained conversation marked in the header and the
model told its format; ctrl+e when the model is not thinking."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Select, TextArea

from app.core.engine_share import STOPPED_IN_THE_APP, SharedJob
from app.tui.app import LlmtuiApp
from app.tui.modals.conversation_settings import ConversationSettingsModal
from app.tui.screens.chat_screen import ChatScreen
from engine_ext.params import SamplingParams, SpeculativeParams
from engine_ext.protocol import (
    ChatMessage,
    Event,
    Failed,
    Finished,
    Generate,
    GenerationStats,
    SetSpeculative,
    SetSteering,
    TokenChunk,
)
from tests.fakes import ScriptedEngine, scripted_app
from tests.waits import wait_until

pytestmark = pytest.mark.anyio

STATS = GenerationStats(10, 0, 10, 5.0, 4, 20.0, 6.0, 4096, 14)
WHY = "llama_decode failed: the KV cache is full\n(see engine.log)"


class FailingEngine(ScriptedEngine):
    """Every reply: a few words, then it fails with WHY."""

    def stream(self, request: Generate) -> None:
        rid = request.request_id
        self.events.put(TokenChunk(rid, "Half a ", "", (1,), ("target",)))
        self.events.put(Failed(rid, "RuntimeError", WHY))


class SlowEngine(ScriptedEngine):
    """Every reply: answer text at once, then it waits for `release` (or a cancel) before it ends."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self.release = threading.Event()

    def stream(self, request: Generate) -> None:
        rid = request.request_id
        self.events.put(TokenChunk(rid, "An answer", "", (1,), ("target",)))
        while not self.release.wait(0.02) and rid not in self.cancelled and not self.stop.is_set():
            pass
        self.events.put(Finished(rid, "cancelled" if rid in self.cancelled else "eos", STATS))


class ApiFirstEngine(ScriptedEngine):
    """An API request ("api" asked) streams until it is cancelled; the app's replies answer at once."""

    def stream(self, request: Generate) -> None:
        rid = request.request_id
        self.events.put(TokenChunk(rid, "tok ", "", (1,), ("target",)))
        if request.messages[-1].content == "api":
            while rid not in self.cancelled and not self.stop.wait(0.02):
                pass
        self.events.put(Finished(rid, "cancelled" if rid in self.cancelled else "eos", STATS))


def api_request(app: LlmtuiApp) -> tuple[SharedJob, list[Event]]:
    """An API client's request, on the app's engine as F10's server puts it there (its events told to a list)."""
    told: list[Event] = []
    engine = app.bridge.shared_engine()
    assert engine is not None
    request = Generate(engine.request_id(), (ChatMessage("user", "api"),), sampling=SamplingParams(), max_tokens=64)
    job = SharedJob(request, SetSpeculative(SpeculativeParams(types=())), SetSteering(()), told.append)
    engine.serve(job)
    return job, told


class LoopingEngine(ScriptedEngine):
    """Every reply: one line again and again, then (once released) it stops at its token limit."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self.release = threading.Event()
        self.generates: list[Generate] = []

    def stream(self, request: Generate) -> None:
        self.generates.append(request)
        rid = request.request_id
        self.events.put(TokenChunk(rid, "Sure.\n", "", (1,), ("target",)))
        for _ in range(6):
            self.events.put(TokenChunk(rid, "I am a happy little bot.\n", "", (2,), ("target",)))
        self.release.wait(30)
        self.events.put(Finished(rid, "max_tokens", STATS))


async def chat_ready(pilot: Pilot[None], app: LlmtuiApp) -> ChatScreen:
    await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
    chat = app.chat
    assert chat is not None
    return chat


def toasts(app: LlmtuiApp) -> list[str]:
    """The toasts that said the model is not thinking."""
    return [str(n.message) for n in app._notifications if "not thinking" in str(n.message)]


async def test_a_failed_replys_reason_stays_with_it_in_the_transcript_history_and_exports(lone_llama: Path) -> None:
    app = scripted_app(lone_llama, FailingEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, app)
        await chat.replies.send("Hello")
        await wait_until(pilot, lambda: chat.generation is None, "the reply to fail")
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.state == "error"
        assert reply.failure == "llama_decode failed: the KV cache is full (see engine.log)"
        view = chat.transcript.last_view()
        assert view is not None
        drawn = [strip.text.rstrip() for strip in view.render_strips(76)]
        assert "✗ llama_decode failed: the KV cache is full (see engine.log)" in drawn
        await app.workers.wait_for_complete()
        markdown = app.store.exports.export_markdown(chat.conversation_id or 0)
        assert "*Reply failed: llama\\_decode failed: the KV cache is full (see engine.log)*" in markdown
        exported = json.loads(app.store.exports.export_json(chat.conversation_id or 0))
        [failed] = [m for m in exported["messages"] if m["role"] == "assistant"]
        assert failed["state"] == "error" and failed["stats"]["error"] == WHY
    # After a restart: the history still says why.
    again = scripted_app(lone_llama, FailingEngine)
    async with again.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, again)
        conversation = again.store.conversations.list_conversations()[0]
        await chat.conversations.open_conversation(conversation.id)
        await pilot.pause()
        view = chat.transcript.last_view()
        assert view is not None
        assert any("✗ llama_decode failed" in s.text for s in view.render_strips(76))


async def test_ctrl_e_when_the_model_is_not_thinking_says_so_in_one_line(lone_llama: Path) -> None:
    app = scripted_app(lone_llama, SlowEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, app)
        chat.prompt.focus()
        await pilot.press("ctrl+e")  # no reply, an empty message box: nothing to think, nothing to move
        await wait_until(pilot, lambda: len(toasts(app)) == 1, "the one line")
        assert "ctrl+e ends its thinking while a reply thinks" in toasts(app)[-1]
        chat.prompt.load_text("ab")
        chat.prompt.move_cursor((0, 0))
        await pilot.press("ctrl+e")  # text in the box: the box's end of line, as before
        assert chat.prompt.cursor_location == (0, 2) and len(toasts(app)) == 1
        chat.prompt.load_text("")
        await chat.replies.send("Hello")
        engine = app.bridge._client  # type: ignore[attr-defined]
        assert isinstance(engine, SlowEngine)
        await wait_until(pilot, lambda: chat.generation is not None and chat.generation.answering, "the answer")
        chat.transcript.focus()
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: len(toasts(app)) == 2, "the second line")
        assert toasts(app)[-1] == "The model is not thinking: it is answering (Esc stops the reply)."
        engine.release.set()
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end")


async def test_a_reply_waiting_for_api_requests_says_so_ctrl_k_stops_them_and_ttft_counts_from_enter(
    lone_llama: Path,
) -> None:
    app = scripted_app(lone_llama, ApiFirstEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, app)
        job, told = api_request(app)
        await wait_until(pilot, lambda: any(isinstance(e, TokenChunk) for e in told), "the API request to stream")
        asked = time.monotonic()
        await chat.replies.send("Hello")
        await wait_until(pilot, lambda: chat.replies.held_behind == 1, "the reply to say it waits")
        live = chat.transcript.live
        assert live is not None
        header = str(live.query_one(".live-header").render())
        assert "[waiting for an API request to finish · ctrl+k stops it]" in header
        await pilot.pause(0.4)
        assert chat.generation is not None and not live.text  # still waiting: nothing written
        await pilot.press("ctrl+k")
        await wait_until(pilot, lambda: chat.generation is None, "the reply after the API request stopped")
        waited_ms = (time.monotonic() - asked) * 1000
        assert told[-1] == Failed(told[-1].request_id, "Cancelled", STOPPED_IN_THE_APP)  # its client is told why
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.state == "complete" and reply.content == "tok "
        # The time to the first token counts from Enter, the wait included (the engine's own said 6 ms).
        assert 400 <= reply.stats["ttft_ms"] <= waited_ms  # type: ignore[operator]
        assert chat.replies.held_behind == 0
        chat.prompt.load_text("ab")
        chat.prompt.move_cursor((0, 0))
        chat.prompt.focus()
        await pilot.press("ctrl+k")  # no reply waits: the message box's delete to the end of the line
        assert chat.prompt.text == ""
        # Esc on a reply that waits stops it at once: it never reaches the engine.
        api_request(app)
        await wait_until(pilot, lambda: app.bridge.serving_busy, "the second API request to run")  # type: ignore[attr-defined]
        await chat.replies.send("Again")
        await wait_until(pilot, lambda: chat.replies.held_behind == 1, "the second reply to wait")
        await pilot.press("escape")
        await wait_until(pilot, lambda: chat.generation is None, "the waiting reply to stop")
        assert app.store.tree.active_path(chat.conversation_id or 0)[-1].state == "stopped"
        assert app.bridge.serving_busy  # type: ignore[attr-defined]  # the API request goes on
        app.bridge.stop_served()
        await wait_until(pilot, lambda: not app.bridge.serving_busy, "the API request to stop")  # type: ignore[attr-defined]


async def test_the_chat_has_a_default_reply_limit_and_says_when_a_reply_repeats_itself(lone_llama: Path) -> None:

    app = scripted_app(lone_llama, LoopingEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, app)
        engine = app.bridge._client  # type: ignore[attr-defined]
        assert isinstance(engine, LoopingEngine)
        await chat.replies.send("Who are you?")
        repeated = "The reply repeats itself: the same line 6 times in a row. Esc stops it."
        await wait_until(pilot, lambda: repeated in [str(n.message) for n in app._notifications], "the toast")
        live = chat.transcript.live
        assert live is not None
        await wait_until(pilot, lambda: bool(live.query(".live-notice")), "the note under the reply")
        note = str(live.query_one(".live-notice").render())
        assert note == "↻ The reply repeats itself: the same line 6 times in a row. Esc stops it."
        assert engine.generates[0].max_tokens == 4096  # the chat's default reply limit
        engine.release.set()
        await wait_until(pilot, lambda: chat.generation is None, "the reply to stop at its limit")
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.stats["repeats"] == "The reply repeats itself: the same line 6 times in a row."
        view = chat.transcript.last_view()
        assert view is not None
        drawn = [strip.text.rstrip() for strip in view.render_strips(76)]
        assert "↻ The reply repeats itself: the same line 6 times in a row." in drawn
        toasts = [str(n.message) for n in app._notifications]
        assert any(t.startswith("The reply stopped at its limit of 4 tokens: ctrl+g continues it") for t in toasts)
        markdown = app.store.exports.export_markdown(chat.conversation_id or 0)
        assert "*The reply repeats itself: the same line 6 times in a row.*" in markdown
        # The limit is shown, and set, in the conversation settings.
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationSettingsModal), "the settings")
        field = app.screen.query_one("#sampling-max_tokens", Input)
        assert field.value == "4096"
        field.value = "256"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is chat, "the settings saved")
        await chat.replies.send("Again")
        await wait_until(pilot, lambda: chat.generation is None, "the second reply")
        assert engine.generates[1].max_tokens == 256


class JsonEngine(ScriptedEngine):
    """Every reply: a JSON object (the request is kept)."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self.generates: list[Generate] = []

    def stream(self, request: Generate) -> None:
        self.generates.append(request)
        self.events.put(TokenChunk(request.request_id, '{"ok": true}', "", (1,), ("target",)))
        self.events.put(Finished(request.request_id, "eos", STATS))


def test_the_model_is_told_the_format_its_reply_is_held_to() -> None:
    from app.core.output_format import MAX_SCHEMA_IN_PROMPT, format_instruction, instructed

    assert format_instruction("text", None) == "" and format_instruction("grammar", None) == ""
    assert "single JSON object" in format_instruction("json", '{"type": "object"}')
    told = format_instruction("json_schema", '{"type": "object",\n "required": ["ok"]}')
    assert told.endswith('JSON schema, and nothing else:\n{"type":"object","required":["ok"]}')
    big = json.dumps({"type": "object", "description": "x" * MAX_SCHEMA_IN_PROMPT})
    assert "schema your reply is held to" in format_instruction("json_schema", big) and "xxx" not in told
    user = ChatMessage("user", "Hi")
    assert instructed((user,), "") == (user,)
    assert instructed((user,), "JSON.") == (ChatMessage("system", "JSON."), user)
    system = ChatMessage("system", "Be brief.\n")
    assert instructed((system, user), "JSON.") == (ChatMessage("system", "Be brief.\n\nJSON."), user)


async def test_a_constrained_conversation_is_marked_in_the_header_and_the_model_told_its_schema(
    lone_llama: Path, tmp_path: Path
) -> None:
    schema = tmp_path / "pick.json"
    schema.write_text('{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}')
    app = scripted_app(lone_llama, JsonEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await chat_ready(pilot, app)
        engine = app.bridge._client  # type: ignore[attr-defined]
        assert isinstance(engine, JsonEngine)
        assert "[json" not in str(chat.header.render())
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationSettingsModal), "the settings")
        modal = app.screen
        modal.query_one("#system-prompt", TextArea).load_text("Be brief.")
        modal.query_one("#sampling-output_format", Select).value = "json_schema"
        modal.query_one("#sampling-output_file", Input).value = str(schema)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is chat, "the settings saved")
        await pilot.pause()
        header = str(chat.header.render())
        assert "[json schema]" in header and header.rstrip().endswith("ready")  # kept at 80 columns
        await chat.replies.send("Hi there!")
        await wait_until(pilot, lambda: chat.generation is None, "the reply")
        [request] = engine.generates
        system, user = request.messages
        assert system.role == "system" and system.content.startswith("Be brief.\n\nReply with JSON only")
        assert '"required":["ok"]' in system.content and user.content == "Hi there!"
        assert request.json_schema is not None and "required" in request.json_schema
        # The history keeps the system prompt as written: the instruction goes with each request only.
        conversation = app.store.conversations.get_conversation(chat.conversation_id or 0)
        assert conversation.system_prompt == "Be brief."
        await chat.conversations.open_conversation(None)  # a new conversation: free text, not marked
        assert "[json" not in str(chat.header.render())
        await chat.conversations.open_conversation(conversation.id)
        assert "[json schema]" in str(chat.header.render())
