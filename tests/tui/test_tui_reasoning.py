"""Reasoning in the app at 80x24, on a tiny model whose template opens <think>: the conversation's reasoning budget
and effort (conversation settings) reach the engine, and ctrl+e while the model thinks ends its thinking and it
answers; elsewhere ctrl+e stays the prompt's end of line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Label, Select
from textual.widgets.select import InvalidSelectValueError

from app.core.config import SamplingSettings
from app.tui.app import LlmtuiApp
from app.tui.modals.conversation_settings import ConversationSettingsModal
from engine_ext.protocol import EndThinking, Generate
from tests.engine.test_reasoning import LONG_THINKER, PICK, THINKING_TEMPLATE
from tests.pilot import chat_of, ready, reply_done, send
from tests.tiny_models import write_tiny_model
from tests.waits import wait_until

pytestmark = pytest.mark.usefixtures("app_dirs")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        "qwen3", tmp_path_factory.mktemp("thinker") / "thinker.gguf", chat_template=THINKING_TEMPLATE
    )


async def open_settings(pilot: Any, app: LlmtuiApp) -> ConversationSettingsModal:
    await pilot.press("ctrl+s")
    await wait_until(pilot, lambda: isinstance(app.screen, ConversationSettingsModal), "the conversation settings")
    assert isinstance(app.screen, ConversationSettingsModal)
    return app.screen


def spy_requests(app: LlmtuiApp) -> list[object]:
    """What the bridge writes to the engine's pipe from now on."""
    client = app.bridge._client
    sent: list[object] = []
    send = client.send

    def spy(request: object) -> None:
        sent.append(request)
        send(request)

    client.send = spy  # type: ignore[method-assign]
    return sent


@pytest.mark.anyio
async def test_the_conversations_budget_and_effort_reach_the_engine_and_it_answers(thinker: Path) -> None:
    app = LlmtuiApp(str(thinker), default_sampling=SamplingSettings(temperature=0.0, max_tokens=48))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        modal = await open_settings(pilot, app)
        hint = str(modal.query_one("#thinking-controls", Label).render())
        assert "reads enable_thinking." in hint  # the loaded model's template (reasoning_effort it does not read)
        effort = modal.query_one("#sampling-reasoning_effort", Select)
        with pytest.raises(InvalidSelectValueError):
            effort.value = "extreme"  # refused: not an effort (a Select of default, low, medium, high)
        assert app.screen is modal and effort.value == "default"
        effort.value = "low"
        modal.query_one("#sampling-reasoning_budget", Input).value = "6"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is chat, "the settings saved")
        sent = spy_requests(app)
        await send(pilot, "think briefly")
        await reply_done(pilot)
        request = next(r for r in sent if isinstance(r, Generate))
        assert request.reasoning_budget == 6 and request.reasoning_effort == "low"
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.reasoning.strip() and reply.content.strip() and reply.state == "complete"
        # The stats bar tells the thinking tokens from the answer's, in 80 columns (the sidebar beside it).
        thought, generated = reply.stats["reasoning_tokens"], reply.stats["generated_tokens"]
        assert isinstance(thought, int) and isinstance(generated, int) and 0 < thought < generated
        assert f"think {thought} · answer {generated - thought}" in chat.stats.render_line(0).text


@pytest.mark.anyio
async def test_ctrl_e_while_the_model_thinks_ends_its_thinking_and_it_answers(thinker: Path) -> None:
    app = LlmtuiApp(str(thinker), default_sampling=SamplingSettings(temperature=0.0, max_tokens=1000))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        chat.prompt.load_text("ab")
        chat.prompt.move_cursor((0, 0))
        await pilot.press("ctrl+e")  # no reply: the prompt's end of line
        assert chat.prompt.cursor_location == (0, 2)
        chat.prompt.load_text("")
        sent = spy_requests(app)
        pid = app.bridge.pid or 0
        # The tiny model is fast: the engine waits (SIGSTOP) until ctrl+e's request is written behind the reply's,
        # and reads it while the prompt is read. Unasked, this prompt thinks for all its 1000 tokens.
        os.kill(pid, signal.SIGSTOP)
        try:
            await send(pilot, LONG_THINKER)
            reply = chat.generation
            assert reply is not None and not reply.answering
            await pilot.press("ctrl+e")
            await wait_until(pilot, lambda: any(isinstance(r, EndThinking) for r in sent), "EndThinking written")
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_until(pilot, lambda: reply.answering, "the answer after the forced end of thinking")
        await pilot.press("escape")  # Esc still stops the whole reply
        await reply_done(pilot)
        message = app.store.tree.active_path(chat_of(app).conversation_id or 0)[-1]
        assert not message.reasoning.strip() and message.content.strip() and message.state == "stopped"


@pytest.mark.anyio
async def test_a_json_schema_conversation_thinks_then_answers_valid_json(thinker: Path, tmp_path: Path) -> None:
    schema = tmp_path / "pick.json"
    schema.write_text(PICK)
    app = LlmtuiApp(str(thinker), default_sampling=SamplingSettings(temperature=0.0, max_tokens=80))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        modal = await open_settings(pilot, app)
        modal.query_one("#sampling-output_format", Select).value = "json_schema"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is modal  # refused: no schema file
        modal.query_one("#sampling-output_file", Input).value = str(schema)
        modal.query_one("#sampling-reasoning_budget", Input).value = "5"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.screen is chat, "the settings saved")
        for n in range(2):
            await send(pilot, f"pick {n}")
            await reply_done(pilot)
            reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
            assert reply.reasoning.strip() and isinstance(json.loads(reply.content)["ok"], bool)
        schema.unlink()  # a file gone: the reply fails in one line, the app goes on
        await send(pilot, "again")
        await reply_done(pilot)
        assert app.store.tree.active_path(chat.conversation_id or 0)[-1].state == "error"
        assert any("pick.json" in str(n.message) for n in app._notifications)


@pytest.mark.anyio
async def test_a_preset_keeps_the_reasoning_budget_effort_and_output_format(thinker: Path, tmp_path: Path) -> None:
    """Issue 34 "per conversation, in presets": a preset saved in the conversation settings keeps the reasoning
    budget, the effort and the output format (with its file), and applied to another conversation it sets them."""
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes"\n')
    app = LlmtuiApp(str(thinker), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        modal = await open_settings(pilot, app)
        modal.query_one("#sampling-reasoning_budget", Input).value = "200"
        modal.query_one("#sampling-reasoning_effort", Select).value = "high"
        modal.query_one("#sampling-output_format", Select).value = "grammar"
        modal.query_one("#sampling-output_file", Input).value = str(grammar)
        modal.query_one("#preset-name", Input).value = "deep"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), "the settings saved")
        [preset] = app.store.presets.list_presets()
        kept = SamplingSettings.from_json(preset.settings)
        assert (kept.reasoning_budget, kept.reasoning_effort) == (200, "high")
        assert (kept.output_format, kept.output_file) == ("grammar", str(grammar))

        await pilot.press("ctrl+n")  # another conversation, the defaults, then the preset applied
        await pilot.pause()
        modal = await open_settings(pilot, app)
        assert modal.query_one("#sampling-reasoning_effort", Select).value == "default"
        modal.query_one("#preset-select", Select).value = "deep"
        await pilot.pause()
        assert modal.query_one("#sampling-reasoning_budget", Input).value == "200"
        assert modal.query_one("#sampling-reasoning_effort", Select).value == "high"
        assert modal.query_one("#sampling-output_format", Select).value == "grammar"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConversationSettingsModal), "the settings saved")
        conversation = app.store.conversations.get_conversation(chat_of(app).conversation_id or 0)
        applied = SamplingSettings.from_json(conversation.settings["sampling"])
        assert applied == kept and conversation.settings["preset"] == "deep"


@pytest.mark.anyio
async def test_the_thinking_controls_line_wraps_at_80x24(lone_llama: Path) -> None:
    """A template that reads neither control is said in a line longer than the dialog: it wraps (it ran past the
    dialog's right edge, cut at "reasoning_effor")."""
    app = LlmtuiApp(str(lone_llama), start_engine=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        modal = await open_settings(pilot, app)
        hint = modal.query_one("#thinking-controls", Label)
        assert "reads neither enable_thinking nor reasoning_effort" in str(hint.render())
        body = modal.query_one("#conversation-settings-body")
        assert hint.region.right <= body.region.right and hint.region.height == 3  # its padding and two lines
