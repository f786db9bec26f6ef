"""Widgets on their own, each in a throwaway host app: live transcript, prompt input, stats bar."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from app.widgets.prompt_input import PromptInput
from app.widgets.status import StatsBar
from app.widgets.transcript import FrozenSegment, Transcript, code_blocks, freeze_point

pytestmark = pytest.mark.anyio


def test_freeze_point_never_cuts_inside_a_code_fence() -> None:
    text = "para one\n\n```\ncode\n\nmore code\n```\n\nnext para"
    cut = freeze_point(text, 0)
    assert text[:cut].count("```") % 2 == 0 and text[cut:] == "next para"
    assert freeze_point("only one paragraph so far", 0) == -1
    assert freeze_point("a\n\nb\n\nc", 4) == 6
    assert code_blocks("x\n```py\nprint(1)\n```\n") == ["print(1)\n"]


class TranscriptHost(App[None]):
    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")


async def test_live_message_freezes_finished_blocks_and_keeps_every_character() -> None:
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(1, "model")
        paragraphs = [f"Paragraph {n}: " + "word " * 60 for n in range(12)]
        text = "\n\n".join(paragraphs) + "\n\n```python\nprint('hi')\n```\n"
        for start in range(0, len(text), 37):
            await transcript.write_live(text[start : start + 37], "")
        await transcript.write_live("", "thinking hard")
        await pilot.pause(0.2)
        segments = list(live.query(FrozenSegment))
        assert segments, "finished blocks were not frozen"
        assert "".join(s.markdown for s in segments) + live.markdown.source == text
        assert live.text == text
        reasoning = live.query_one(".live-reasoning")
        assert reasoning.display
        transcript.scroll_home(animate=False)
        await pilot.pause()
        await pilot.click(".live-reasoning")
        assert live.show_reasoning
        await live.stop()


class PromptHost(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield PromptInput(id="prompt")

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        self.sent.append(event.text)
        event.prompt_input.remember(event.text)


async def test_prompt_input_enter_sends_and_ctrl_j_adds_a_line() -> None:
    app = PromptHost()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("h", "i", "ctrl+j", "y", "o")
        assert prompt.text == "hi\nyo"
        await pilot.press("enter")
        assert app.sent == ["hi\nyo"] and prompt.text == ""
        await pilot.press("enter")  # blank: nothing is sent
        assert app.sent == ["hi\nyo"]
        await pilot.press("up")
        assert prompt.text == "hi\nyo"
        await pilot.press("down", "down")
        assert prompt.text == ""


class StatsHost(App[None]):
    def compose(self) -> ComposeResult:
        yield StatsBar()


async def test_stats_bar_shows_speed_ttft_prompt_and_context() -> None:
    app = StatsHost()
    async with app.run_test(size=(120, 3)) as pilot:
        bar = app.query_one(StatsBar)
        bar.set_stats({"decode_tps": 41.5, "ttft_ms": 120.4, "prompt_tokens": 31, "generated_tokens": 8,
                       "n_ctx": 4096, "n_ctx_used": 2048})
        bar.engine_state, bar.backend = "ready", "CUDA"
        bar.extras = {"spec": "72%"}
        await pilot.pause()
        line = bar.render().plain
        for part in ("41.5 tok/s", "TTFT 120 ms", "prompt 31", "█████░░░░░ 2.0k/4.1k", "spec 72%", "ready", "CUDA"):
            assert part in line
