"""What the chat says about a reply (issue 49), on a scripted engine at 80x24: why a failed reply failed, kept with
it in the transcript, the history and the exports; ctrl+e when the model is not thinking."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from textual.pilot import Pilot

from app.tui.app import LlmtuiApp
from app.tui.screens.chat_screen import ChatScreen
from engine_ext.protocol import Failed, Finished, Generate, GenerationStats, TokenChunk
from tests.fakes import ScriptedEngine, scripted_app
from tests.pilot import line_text
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
        drawn = [line_text(strip) for strip in view.render_strips(76)]
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
        assert any("✗ llama_decode failed" in line_text(s) for s in view.render_strips(76))


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
        engine = app.bridge._client  # type: ignore[union-attr]
        assert isinstance(engine, SlowEngine)
        await wait_until(pilot, lambda: chat.generation is not None and chat.generation.answering, "the answer")
        chat.transcript.focus()
        await pilot.press("ctrl+e")
        await wait_until(pilot, lambda: len(toasts(app)) == 2, "the second line")
        assert toasts(app)[-1] == "The model is not thinking: it is answering (Esc stops the reply)."
        engine.release.set()
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end")
