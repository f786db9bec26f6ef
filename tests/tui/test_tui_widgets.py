"""Widgets on their own, each in a throwaway host app: live transcript, draft colouring, prompt input, stats bar."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from rich.console import Console
from rich.markdown import Markdown as RichMarkdown
from rich.segment import Segment
from rich.style import Style
from textual._compositor import Compositor
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.message import Message
from textual.pilot import Pilot
from textual.strip import Strip
from textual.widgets import Static

from app.core.store import Message as StoredMessage
from app.tui.bridge import EngineBridge
from app.tui.messages import EngineMessage
from app.tui.streaming import chunk_draft_spans
from app.tui.textual_internals.compositor import CroppedCompositor
from app.tui.widgets.draft_provenance import (
    MODEL_DRAFT,
    NGRAM_DRAFT,
    REJECTED_DRAFT,
    draft_spans_from_stats,
    mark_provenance,
)
from app.tui.widgets.live_body import LiveBody, LiveMessage, changed_lines, freeze_point
from app.tui.widgets.markdown_render import LIVE_HIGHLIGHT_MAX_LINES, code_blocks
from app.tui.widgets.markdown_render import markdown_renderable as _markdown
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status import AppHeader, StatsBar
from app.tui.widgets.transcript import Transcript
from engine_ext.client import EngineClient
from engine_ext.protocol import Generate, TokenChunk, rejected_by
from tests.fakes import ScriptedEngine, scripted_app
from tests.waits import wait_until

if TYPE_CHECKING:
    from app.tui.app import LlmtuiApp
    from app.tui.screens.chat_screen import ChatScreen

pytestmark = pytest.mark.anyio


def test_freeze_point_never_cuts_inside_a_code_fence() -> None:
    text = "para one\n\n```\ncode\n\nmore code\n```\n\nnext paragraph"
    cut = freeze_point(text, 0)
    assert text[:cut].count("```") % 2 == 0 and text[cut:] == "next paragraph"
    assert freeze_point("only one paragraph so far", 0) == -1
    assert freeze_point("a\n\nb\n\nc\n", 4) == 6
    # Not before a block whose start is still unknown: "1" may become "1. an item" (the list goes on) or "1999".
    assert freeze_point("- an item\n\n1", 0) == -1 and freeze_point("- an item\n\n1999 was a year", 0) == 11
    assert freeze_point("- an item\n\n1. another item", 0) == -1
    assert code_blocks("x\n```py\nprint(1)\n```\n") == ["print(1)\n"]


class TranscriptHost(App[None]):
    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")


def test_changed_lines_finds_the_rows_to_repaint() -> None:
    a, b, c, d = (Strip([Segment(t)]) for t in ("a", "b", "c", "d"))
    assert changed_lines([a, b, c], [a, b, c]) == (3, 3)  # nothing to repaint
    assert changed_lines([a, b, c], [a, b, d]) == (2, 3)
    assert changed_lines([a, b], [a, b, c, d]) == (2, 4)  # new lines
    assert changed_lines([a, b, c, d], [a, b]) == (2, 4)  # lines gone: repainted blank
    assert changed_lines([a, b, c], [a, d, c]) == (1, 2)
    assert changed_lines([a, b, c], [d, b, c], start=1) == (3, 3)  # rows before `start` are not looked at


def test_shared_parser_markdown_draws_as_rich_markdown_does() -> None:
    console = Console(width=60, color_system="truecolor")
    text = (
        "# Title\n\nSome *emphasis*, `code`, ~~struck~~ and a table:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "```python\nprint('hi')\n```\n\n- item https://example.com\n\n```rust\nfn main() {}\n```\n\n"
        "```no-such-language\nplain\ttext\n```\n\n```\nno language\n```\n\n    indented code\n"
    )
    for dark, theme in ((True, "monokai"), (False, "default")):
        ours = console.render_lines(_markdown(text, dark=dark), console.options)
        rich = console.render_lines(RichMarkdown(text, code_theme=theme, hyperlinks=False), console.options)
        assert ours == rich
    assert _markdown("one", dark=True).markup == "one" and _markdown("two", dark=True).markup == "two"


async def test_live_message_freezes_finished_blocks_and_keeps_every_character() -> None:
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(1, "model")
        paragraphs = [f"Paragraph {n}: " + "word " * 60 for n in range(12)]
        text = "\n\n".join(paragraphs) + "\n\n```python\nprint('hi')\n```\n"
        for index, start in enumerate(range(0, len(text), 37)):
            transcript.write_live(text[start : start + 37], "")
            if index % 8 == 7:  # drawn as it streams
                await wait_until(pilot, lambda: not live.body.render_pending, "the streamed text drawn")
        transcript.write_live("", "thinking hard")
        await wait_until(pilot, lambda: not live.body.render_pending, "the whole text drawn")
        segments = live.body.segments
        assert segments, "finished blocks were not frozen"
        assert "".join(s.markdown for s in segments) + live.body.tail == text
        assert live.text == text
        # Drawn block by block, the reply looks as it does drawn whole (so the finished message can reuse it).
        width = live.body.size.width
        options = app.console_options.update_width(width)
        whole = app.console.render_lines(RichMarkdown(text, hyperlinks=False), options)
        drawn = [strip.text.rstrip() for strip in live.body._strips]
        assert len(segments) > 3 and drawn == ["".join(s.text for s in line).rstrip() for line in whole]
        reasoning = live.query_one(".live-reasoning")
        assert reasoning.display
        transcript.scroll_home(animate=False)
        await pilot.pause()
        await pilot.click(".live-reasoning")
        assert live.show_reasoning
        live.stop()


MIXED_MARKDOWN = (
    "# A heading\n\nA paragraph with *emphasis*, `code` and a [link](https://example.com) that wraps over more "
    "than one line of the transcript.\n\n- a tight item\n- another item\n\n- a loose item\n\n  its second "
    "paragraph\n\n- the last item\n\n1. first\n2. second\n\n> a quote\n> that continues\n\n> another "
    "quote\n\n---\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nSetext heading\n---\n\n```python\ndef f(x):\n\n"
    "    return x * 2\n```\n\n    indented code\n\n    after a blank line\n\nThe end, **bold** at last.\n"
)


@pytest.mark.parametrize("chunk", [1, 3, 7, 29])
async def test_streamed_markdown_of_every_kind_draws_as_the_whole_text_does(chunk: int) -> None:
    """Frozen block by block as it streams (each finished block at once), the reply's lines, styles included,
    are the lines of the whole text rendered in one piece."""
    app = TranscriptHost()
    async with app.run_test(size=(70, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(1, "model")
        for index, start in enumerate(range(0, len(MIXED_MARKDOWN), chunk)):
            transcript.write_live(MIXED_MARKDOWN[start : start + chunk], "")
            live.body.flush()  # drawn after every chunk, as if each came in a frame of its own
            if index % 5 == 4:
                await pilot.pause()
        await pilot.pause()
        assert len(live.body.segments) > 4  # blocks were frozen one by one
        width = live.body.size.width
        options = app.console_options.update_width(width).update(highlight=False)
        whole = app.console.render_lines(_markdown(MIXED_MARKDOWN, dark=live.body.dark), options, pad=False)
        expected = [Strip(line).adjust_cell_length(width) for line in whole]
        assert live.body._strips == expected
        live.stop()


def _marked_text(strips: list[Strip]) -> str:
    """The characters drawn underlined (the draft style in these tests), runs joined by single spaces."""
    words: list[str] = []
    for strip in strips:
        run = ""
        for segment in strip:
            if segment.style is not None and segment.style.underline:
                run += segment.text
            elif run:
                words.append(run)
                run = ""
        if run:
            words.append(run)
    return " ".join(" ".join(words).split())


def test_mark_provenance_colours_the_rendered_words_of_the_spans_only() -> None:
    source = (
        "Plain words then **bold drafted** words.\n\n- first item\n- drafted item\n\n```python\nx = 1\ny = 2\n```\n"
    )
    drafted = {"bold drafted": "ngram-mod", "drafted item": "draft-mtp", "y = 2": ""}
    spans = [(source.index(part), source.index(part) + len(part), drafter) for part, drafter in drafted.items()]
    console = Console(width=60, force_terminal=True, color_system="truecolor")
    lines = console.render_lines(RichMarkdown(source), console.options, pad=False)
    styles = {NGRAM_DRAFT: Style(underline=True), MODEL_DRAFT: Style(underline=True, italic=True)}
    marked = [Strip(line) for line in mark_provenance(lines, source, spans, styles)]
    assert _marked_text(marked) == "bold drafted drafted item y = 2"
    # Each drafter's kind has its own style: a model drafter's text apart from an n-gram drafter's (or unknown).
    italic = "".join(s.text for strip in marked for s in strip if s.style and s.style.italic and s.style.underline)
    assert italic.split() == ["drafted", "item"]
    assert mark_provenance(lines, source, [], styles) is lines  # off or nothing drafted: the same lines
    # The target's token where a draft was rejected has a style of its own.
    start = source.index("words.")
    styles[REJECTED_DRAFT] = Style(strike=True)
    marked = [
        Strip(line) for line in mark_provenance(lines, source, [(start, start + 5, rejected_by("ngram-mod"))], styles)
    ]
    assert "".join(s.text for strip in marked for s in strip if s.style and s.style.strike) == "words"


def test_chunk_draft_spans_from_provenance_and_text_ends() -> None:
    chunk = TokenChunk(1, "The cat sat.", "", (1, 2, 3, 4), ("target", "ngram", "ngram", "target"), (3, 7, 11, 12))
    assert chunk_draft_spans(chunk) == [(3, 11, "ngram")]
    assert chunk_draft_spans(TokenChunk(1, "abc", "", (1,), ("target",), (3,))) == []
    # An engine that does not say where each token's text ends: all drafted, or nothing.
    assert chunk_draft_spans(TokenChunk(1, "abc", "", (1, 2), ("mtp", "mtp"))) == [(0, 3, "mtp")]
    assert chunk_draft_spans(TokenChunk(1, "abc", "", (1, 2), ("mtp", "target"))) == []
    # Two drafters one after the other: two spans, not merged.
    two = TokenChunk(1, "abcdef", "", (1, 2, 3), ("ngram-mod", "draft-mtp", "draft-mtp"), (2, 4, 6))
    assert chunk_draft_spans(two) == [(0, 2, "ngram-mod"), (2, 6, "draft-mtp")]
    # The target's token where a draft was rejected: a span of its own, after the accepted part of the draft.
    broken = TokenChunk(1, "abcdef", "", (1, 2, 3), ("ngram-mod", rejected_by("ngram-mod"), "target"), (2, 4, 6))
    assert chunk_draft_spans(broken) == [(0, 2, "ngram-mod"), (2, 4, "target/ngram-mod")]
    assert chunk_draft_spans(TokenChunk(1, "ab", "", (1, 2), (rejected_by("mtp"), "mtp"))) == []  # no text ends
    # Stored spans: [start, end, drafter], or [start, end] as stored before the drafter was kept.
    stored = {"draft_spans": [[3, 11], [20, 9], "x", [12, 15, "draft-mtp"], [16, 18, 5]]}
    assert draft_spans_from_stats(stored) == ((3, 11, ""), (12, 15, "draft-mtp"))


def test_bridge_batches_draft_spans_relative_to_the_batched_text(tmp_path: Path) -> None:
    posted: list[Message] = []

    class Target:
        def post_message(self, message: Message) -> bool:
            posted.append(message)
            return True

    bridge = EngineBridge(Target(), tmp_path / "engine.log", client_factory=lambda path: cast(EngineClient, None))
    bridge._tokens(TokenChunk(3, "Hello ", "", (1, 2), ("target", "ngram-mod"), (2, 6)))
    bridge._tokens(TokenChunk(3, "world", "", (3,), ("ngram-mod",), (5,)))
    bridge._tokens(TokenChunk(3, "!", "", (4,), ("target",), (1,)))
    bridge._flush_tokens(force=True)
    arrived = [m.event for m in posted if isinstance(m, EngineMessage) and isinstance(m.event, TokenChunk)]
    assert len(arrived) == 1 and arrived[0].text == "Hello world!" and arrived[0].token_ids == (1, 2, 3, 4)
    assert chunk_draft_spans(arrived[0]) == [(2, 11, "ngram-mod")] and arrived[0].text[2:11] == "llo world"


async def test_draft_colouring_of_the_live_reply_and_the_finished_message() -> None:
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(7, "model")
        transcript.write_live("Target text first, ", "")
        transcript.write_live("drafted words here", "", ((0, 18, "ngram-mod"),))
        transcript.write_live(" and the end.", "")
        body = live.query_one(LiveBody)
        await wait_until(
            pilot, lambda: not body.render_pending and "the end." in body._strips[0].text, "the text drawn"
        )
        assert body.draft_spans == [(19, 37, "ngram-mod")]
        assert _marked_text(body._strips) == ""  # off by default
        transcript.set_colour_drafts(True)
        await pilot.pause()
        body.render_line(0)
        assert _marked_text(body._strips) == "drafted words here"
        message = StoredMessage(
            7,
            1,
            None,
            "assistant",
            live.text,
            "",
            "complete",
            "",
            "",
            "model",
            {"draft_spans": [list(span) for span in body.draft_spans]},
            3,
        )
        view = await transcript.freeze_live(message)
        assert view is not None
        await wait_until(pilot, lambda: _marked_text(view._strips) == "drafted words here", "the drafts coloured")
        assert _marked_text(view._strips) == "drafted words here"
        transcript.set_colour_drafts(False)
        await wait_until(pilot, lambda: _marked_text(view._strips) == "", "the drafts no longer coloured")
        assert _marked_text(view._strips) == ""
        assert isinstance(transcript.last_view(), MessageView)


async def test_your_messages_keep_their_line_breaks_and_replies_are_markdown() -> None:
    text = "Names:\nAda Lovelace\nAlan Turing\n\n```\ncode stays code\n```"
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        for role in ("user", "assistant"):
            await transcript.append(
                StoredMessage(1 if role == "user" else 2, 1, None, role, text, "", "complete", "", "", "model", {}, 3)
            )
        await pilot.pause()
        mine, reply = (
            ["".join(s.text for s in line).strip() for line in view.body_lines(60)] for view in transcript.views()
        )
        assert mine[:3] == ["Names:", "Ada Lovelace", "Alan Turing"]  # as written
        assert reply[0] == "Names: Ada Lovelace Alan Turing"  # Markdown joins a paragraph's lines
        assert any("code stays code" in line for line in mine)


async def test_the_reply_header_says_how_much_of_a_long_prompt_is_read() -> None:
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(11, "model")
        header = live.query_one(".live-header", Static)
        live.reading(1024, 2307)
        await pilot.pause()
        assert "[reading the prompt: 1,024 of 2,307 tokens]" in str(header.render())
        transcript.write_live("The reply starts.", "")
        await pilot.pause()
        assert "[writing…]" in str(header.render()) and "reading" not in str(header.render())


def _code_colours(strips: list[Strip], marker: str) -> set[object]:
    """The foreground colours of the text on the rows that show `marker` (lines of a code block)."""
    return {
        segment.style.color
        for strip in strips
        if marker in strip.text
        for segment in strip
        if segment.text.strip() and segment.style is not None
    }


async def test_a_long_code_block_being_written_is_highlighted_once_complete() -> None:
    code = "\n".join(f"def step_{i}(x):  # note {i}\n    return x + {i}" for i in range(LIVE_HIGHLIGHT_MAX_LINES))
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(9, "model")
        transcript.write_live(f"Here:\n\n```python\n{code}\n", "")
        live.body.flush()  # drawn now
        await pilot.pause()
        # Open and longer than LIVE_HIGHLIGHT_MAX_LINES: one colour for all of it, and the finished message will not
        # reuse these lines.
        assert len(_code_colours(live.body._strips, "step_")) == 1
        assert live.body.plain_lines(live.body.size.width) is None
        transcript.write_live("```\n", "")
        message = StoredMessage(9, 1, None, "assistant", live.text, "", "complete", "", "", "model", {}, 3)
        view = await transcript.freeze_live(message)
        assert view is not None
        await wait_until(pilot, lambda: len(_code_colours(view._strips, "step_")) > 2, "the finished block drawn")
        assert len(_code_colours(view._strips, "step_")) > 2  # highlighted: keywords, names, comments
        # A short block is highlighted while it is written.
        live = await transcript.start_live(10, "model")
        transcript.write_live("Short:\n\n```python\ndef f(x):  # note\n    return x\n", "")
        live.body.flush()  # drawn now
        await pilot.pause()
        assert len(_code_colours(live.body._strips, "return")) > 1
        assert live.body.plain_lines(live.body.size.width) is not None


async def test_a_tail_slow_to_render_is_drawn_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tail whose render takes 60 ms is drawn at most every 60 / RENDER_SHARE ms; a quick one every
    RENDER_INTERVAL_S (whatever comes meanwhile waits for that render, nothing is dropped)."""
    app = TranscriptHost()
    async with app.run_test(size=(80, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(7, "model")
        transcript.write_live("quick text", "")
        body = live.query_one(LiveBody)
        await wait_until(pilot, lambda: not body.render_pending, "the quick text drawn")
        assert body.render_interval == LiveBody.RENDER_INTERVAL_S
        render = LiveBody.render_strips

        def slow(self: LiveBody, width: int) -> list[Strip]:
            time.sleep(0.06)
            return render(self, width)

        monkeypatch.setattr(LiveBody, "render_strips", slow)
        await wait_until(
            pilot, lambda: time.monotonic() >= body._rendered_at + body.render_interval, "a render interval to pass"
        )
        transcript.write_live(" and more", "")  # drawn now: the last render was long enough ago
        assert 0.06 / LiveBody.RENDER_SHARE <= body.render_interval < 0.5
        transcript.write_live(" and the end", "")
        assert body.render_pending  # waits for the longer interval
        await wait_until(pilot, lambda: not body.render_pending)
        assert "the end" in "".join(strip.text for strip in body._strips)


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


async def test_a_burst_of_keys_keeps_the_new_lines_where_they_were_typed() -> None:
    """Keys that arrive together (fast typing while a reply streams, a terminal sending a burst) keep their order:
    the new-line binding's action used to run after the characters typed behind it."""
    from textual import events

    app = PromptHost()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        for key, character in (
            ("l", "l"),
            ("i", "i"),
            ("ctrl+j", None),
            ("t", "t"),
            ("w", "w"),
            ("shift+enter", None),
            ("o", "o"),
        ):
            app.post_message(events.Key(key, character))
        await wait_until(pilot, lambda: len(prompt.text) == len("li\ntw\no"), "the burst of keys typed")
        assert prompt.text == "li\ntw\no"


async def test_ctrl_a_selects_all_of_the_message_so_typing_replaces_it() -> None:
    """Issue 37, 6: ctrl+a in the message box selects all (TextArea's own ctrl+a went to the line start); home still
    goes to the line start. In a burst, the keys after ctrl+a replace the selection, in order."""
    from textual import events
    from textual.widgets.text_area import Selection

    app = PromptHost()
    async with app.run_test(size=(80, 24)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press(*"one", "ctrl+j", *"two")
        await pilot.press("ctrl+a")
        assert prompt.selection == Selection((0, 0), prompt.document.end) and prompt.selected_text == "one\ntwo"
        await pilot.press("backspace")
        assert prompt.text == ""
        await pilot.press(*"long line", "home")
        assert prompt.cursor_location == (0, 0) and prompt.selected_text == ""
        for key, character in (("ctrl+a", None), ("n", "n"), ("e", "e"), ("w", "w")):
            app.post_message(events.Key(key, character))
        await wait_until(pilot, lambda: prompt.text == "new", "the burst replaced the selection")
        await pilot.press("enter")
        assert app.sent == ["new"]


def test_the_help_lists_the_message_box_keys_but_those_the_chat_takes_first() -> None:
    from app.tui.app import LlmtuiApp
    from app.tui.screens.help_keys import key_sections

    [editing] = [entries for section, entries in key_sections(LlmtuiApp) if section == "Message box"]
    listed = {key: entry.what for entry in editing for key in entry.keys}
    assert listed["ctrl+a"].startswith("Select all") and listed["ctrl+z"] == "Undo" and listed["ctrl+y"] == "Redo"
    assert listed["enter"] == "Send the message" and listed["ctrl+j"] == listed["shift+enter"] == "New line"
    # TextArea's f6 (select line), f7 (select all) and ctrl+e (line end) are the App's and the chat's first.
    assert "f6" not in listed and "f7" not in listed and "ctrl+e" not in listed


class StatsHost(App[None]):
    def compose(self) -> ComposeResult:
        yield StatsBar()


REPLY_STATS = {
    "decode_tps": 41.5,
    "ttft_ms": 120.4,
    "prompt_tokens": 31,
    "generated_tokens": 8,
    "n_ctx": 4096,
    "n_ctx_used": 2048,
}


def ready_stats_bar(app: StatsHost) -> StatsBar:
    """The host's stats bar showing REPLY_STATS, the engine ready on CUDA."""
    bar = app.query_one(StatsBar)
    bar.set_stats(REPLY_STATS)
    bar.engine_state, bar.backend = "ready", "CUDA"
    return bar


async def test_stats_bar_shows_speed_ttft_prompt_and_context() -> None:
    app = StatsHost()
    async with app.run_test(size=(120, 3)) as pilot:
        bar = ready_stats_bar(app)
        bar.extras = {"spec": "72%"}
        await pilot.pause()
        line = bar.render().plain
        for part in ("41.5 tok/s", "TTFT 120 ms", "prompt 31", "█████░░░░░ 2.0k/4.1k", "spec 72%", "ready", "CUDA"):
            assert part in line


@pytest.mark.parametrize(
    ("width", "parts"),
    [
        (84, ("41.5 tok/s  TTFT 120 ms  prompt 31  reply 8  ctx █████░░░░░ 2.0k/4.1k  ready · CUDA",)),
        (72, ("41.5 tok/s  TTFT 120 ms  prompt 31  reply 8  ctx █████░░░░░ 2.0k/4.1k",)),  # the header has the rest
        (62, ("41.5 tok/s TTFT 120ms prompt 31 reply 8 ctx ██░░ 2.0k/4.1k",)),
        (56, ("41.5 tok/s TTFT 120ms ctx ██░░ 2.0k/4.1k",)),  # about 80 columns less the sidebar
    ],
)
async def test_a_narrow_stats_bar_keeps_every_number(width: int, parts: tuple[str, ...]) -> None:
    app = StatsHost()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = ready_stats_bar(app)
        await pilot.pause()
        drawn = bar.render_line(0).text
        assert "…" not in drawn
        for part in parts:
            assert part in drawn


THOUGHT_STATS = REPLY_STATS | {"generated_tokens": 400, "reasoning_tokens": 312, "reasoning_ms": 5120.0}


@pytest.mark.parametrize(
    ("width", "parts"),
    [
        (120, ("41.5 tok/s  TTFT 120 ms  prompt 31  think 312 · answer 88  ctx █████░░░░░ 2.0k/4.1k  ready · CUDA",)),
        (66, ("41.5 tok/s TTFT 120ms think 312 · answer 88 ctx ██░░ 2.0k/4.1k",)),  # the prompt's count went first
        (56, ("41.5 tok/s think 312 · answer 88 ctx ██░░ 2.0k/4.1k",)),  # 80 columns less the sidebar: TTFT goes
    ],
)
async def test_the_stats_bar_separates_thinking_and_answer_tokens(width: int, parts: tuple[str, ...]) -> None:
    app = StatsHost()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = ready_stats_bar(app)
        bar.set_stats(THOUGHT_STATS)
        await pilot.pause()
        drawn = bar.render_line(0).text
        assert "…" not in drawn and "reply" not in drawn
        for part in parts:
            assert part in drawn
        bar.set_stats(REPLY_STATS | {"reasoning_tokens": 0})  # a reply that did not think: its count as before
        await pilot.pause()
        assert "think" not in bar.render_line(0).text


class HeaderHost(App[None]):
    def compose(self) -> ComposeResult:
        yield AppHeader()


LONG_TITLE = "Tell me a long story about a lighthouse keeper and his daughter"


@pytest.mark.parametrize(
    ("width", "parts"),
    [
        (140, (f" llmtui  {LONG_TITLE}  │ SmolLM2-135M-Instruct.Q4_1 · CPU · generating",)),
        (80, (" llmtui  Tell me a long story …  │ SmolLM2-135M-Instruct.Q4_1 · CPU · generating",)),
        (50, (" llmtui  │ SmolLM2-135M-Instru… · CPU · generating",)),  # no room for the title
        (36, (" llmtui  │ SmolL… · CPU · generating",)),  # the model name gives way to the state
    ],
)
async def test_the_header_keeps_the_model_backend_and_state_when_narrow(width: int, parts: tuple[str, ...]) -> None:
    app = HeaderHost()
    async with app.run_test(size=(width, 3)) as pilot:
        header = app.query_one(AppHeader)
        header.conversation_title = LONG_TITLE
        header.model_name = "SmolLM2-135M-Instruct.Q4_1"
        header.backend = "CPU"
        header.engine_state = "generating"
        await pilot.pause()
        drawn = header.render_line(0).text
        assert len(drawn.rstrip()) <= width
        for part in parts:
            assert part in drawn


class CroppedHost(App[None]):
    """A transcript inside containers with a sidebar and a footer line, on a screen with the cropped compositor."""

    CSS = "#side { width: 20; } #bar { height: 1; }"

    def compose(self) -> ComposeResult:
        from textual.containers import Horizontal, Vertical
        from textual.widgets import Static

        with Horizontal():
            yield Static("side\n" * 30, id="side")
            with Vertical():
                yield Transcript(id="transcript")
                yield Static("stats", id="bar")

    def on_mount(self) -> None:
        self.screen._compositor = CroppedCompositor()
        self.screen.refresh(layout=True)


async def reply_followed(pilot: Pilot[None], transcript: Transcript) -> None:
    """Once the live reply's text is drawn and the view has followed it (and one more frame is drawn); a reply that
    has finished: one frame."""
    live = transcript.live
    if live is not None:
        await wait_until(
            pilot,
            lambda: transcript.live is not live or not (live.body.render_pending or transcript._follow_pending),
            lambda: (
                f"the reply drawn and followed (render pending: {live.body.render_pending}, "
                f"follow pending: {transcript._follow_pending}, laid out: {live.outer_size})"
            ),
        )
    await pilot.pause()


async def _streamed_into(
    app: CroppedHost, pilot: Pilot[None]
) -> tuple[Transcript, LiveMessage, CroppedCompositor, Compositor]:
    """A live reply filling the host's view; the screen's compositor and a stock one laid out the same."""
    transcript = app.query_one(Transcript)
    live = await transcript.start_live(1, "model")
    transcript.write_live("Paragraph one " * 30 + "\n\n```python\nx = 1\n```\n\nand a tail " * 3, "")
    await reply_followed(pilot, transcript)
    cropped = app.screen._compositor
    assert isinstance(cropped, CroppedCompositor)
    stock = Compositor()
    stock.reflow(app.screen, app.screen.size)
    return transcript, live, cropped, stock


async def test_cropped_compositor_draws_the_same_rows_and_renders_only_those() -> None:
    from textual.widget import Widget

    app = CroppedHost()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript, live, cropped, stock = await _streamed_into(app, pilot)
        screen = app.screen
        heights: list[int] = []
        rendered: set[Widget] = set()
        original = Widget.render_lines

        def spy(widget: Widget, crop):  # type: ignore[no-untyped-def]
            heights.append(crop.height)
            rendered.add(widget)
            return original(widget, crop)

        assert live.body.region.contains(30, 10)  # the streamed text fills the view
        # One band of rows, then two bands far apart (the live reply's line and the stats bar): widgets render
        # only the rows of each band, not everything between them.
        for bands in (((10, 1),), ((11, 2),), ((0, 3),), ((22, 2),), ((10, 2), (22, 1))):
            rows = {y for y, height in bands for y in range(y, y + height)}
            crop = Region(0, min(rows), 80, max(rows) + 1 - min(rows))
            heights.clear()
            Widget.render_lines = spy  # type: ignore[method-assign, assignment]
            try:
                ours = cropped._render_chops(crop, rows.__contains__)
            finally:
                Widget.render_lines = original  # type: ignore[method-assign]
            assert heights and max(heights) <= max(height for _, height in bands)
            theirs = stock._render_chops(crop, rows.__contains__)
            for row in rows:
                assert Strip.join(ours[row].values()).text == Strip.join(theirs[row].values()).text
                assert Strip.join(ours[row].values()) == Strip.join(theirs[row].values())
        assert live.body in rendered
        # A line of the live reply: the containers behind it (screen, transcript, …) are hidden there.
        rendered.clear()
        Widget.render_lines = spy  # type: ignore[method-assign, assignment]
        try:
            cropped._render_chops(Region(0, 10, 80, 1), {10}.__contains__)
        finally:
            Widget.render_lines = original  # type: ignore[method-assign]
        assert live.body in rendered and transcript not in rendered and screen not in rendered
        # The same line updated only within the live reply's columns (what its refresh asks for): widgets
        # beside it (the sidebar, the scrollbar) or behind it there are not rendered, and every cell the
        # update writes is the stock compositor's.
        body = live.body.region
        crop = Region(body.x, 10, body.width, 1)
        rendered.clear()
        Widget.render_lines = spy  # type: ignore[method-assign, assignment]
        try:
            ours = cropped._render_chops(crop, {10}.__contains__)
        finally:
            Widget.render_lines = original  # type: ignore[method-assign]
        assert rendered == {live.body}
        theirs = stock._render_chops(crop, {10}.__contains__)
        ends = dict(zip(theirs[10], stock.cuts[10][1:], strict=True))
        written = [x for x in theirs[10] if x < crop.right and ends[x] > crop.x]
        assert written and all(ours[10][x] == theirs[10][x] for x in written)
        live.stop()


class _ScriptedClient(ScriptedEngine):
    """Streams `REPLY` in chunks of 7 characters, one per release of `gate`: the test lets it go a step at a time."""

    SPECULATIVE_EVERY = 0
    """Live speculative statistics after every this many chunks (0: none)."""

    REPLY = (
        "A first paragraph that wraps over more than one line of the transcript, word after word, " * 3
        + "\n\n- an item\n- another item\n\n```python\ndef f(x):\n    return x * 2\n```\n\n"
        + "".join(f"The end of the reply, part {n}, " for n in range(20))  # not a loop (repeats.py would say)
    )

    def __init__(self, log_path: Path) -> None:
        import threading

        super().__init__(log_path)
        self.gate = threading.Semaphore(0)  # one release per chunk

    def stream(self, request: Generate) -> None:
        import time

        from engine_ext.protocol import Finished, GenerationStats

        request_id = request.request_id
        text = self.REPLY
        for start in range(0, len(text), 7):
            self.gate.acquire()
            if request_id in self.cancelled:
                break
            piece = text[start : start + 7]
            self.events.put(TokenChunk(request_id, piece, "", (start,), ("target",), (len(piece),)))
            if self.SPECULATIVE_EVERY and (start // 7) % self.SPECULATIVE_EVERY == 0:
                self.events.put(_speculative_update(request_id, start // 7))
            time.sleep(0.001)
        stats = GenerationStats(10, 0, 10, 1.0, len(text) // 7, 1000.0, 5.0, 4096, 10 + len(text) // 7)
        self.events.put(Finished(request_id, "cancelled" if request_id in self.cancelled else "max_tokens", stats))


def _speculative_update(request_id: int, step: int) -> object:
    """Live speculative statistics that change at every step (the meter's line is drawn again each time)."""
    from engine_ext.protocol import SpeculativeStats, SpeculativeUpdate

    drafted = 4 * (step + 1)
    accepted = (3 * step) % drafted
    return SpeculativeUpdate(
        SpeculativeStats(
            request_id,
            step + 1,
            drafted,
            accepted,
            accepted / drafted,
            1 + accepted / (step + 1),
            (0.8, 0.5, 0.25),
            tuple(((step + i) % 5) / 4 for i in range(8)),
            1.0 * step,
            2.0 * step,
            50.0 + step,
            40.0,
            (),
            n_max=16,
        )
    )


class _SpeculativeScriptedClient(_ScriptedClient):
    SPECULATIVE_EVERY = 3


def _scripted_app(model: Path, client: type[_ScriptedClient] = _ScriptedClient) -> LlmtuiApp:
    return scripted_app(model, client)


class _Terminal:
    """The screen a terminal would show: every update the app sends is applied, as the terminal applies it.

    Each grapheme takes the cells Rich measures for it (rich.cells.split_graphemes, the widths the app lays out
    with): a wide glyph (⚡, CJK) fills its cell and the next one, which holds no character of its own (`WIDE`),
    and writing over either half of a wide glyph blanks the other half, as terminals do."""

    WIDE = ""  # the second cell of a wide glyph

    def __init__(self, width: int, height: int) -> None:
        self.rows = [[" "] * width for _ in range(height)]
        self.updates = 0

    def apply(self, console: Console, update: object) -> None:
        from rich.cells import split_graphemes
        from rich.segment import ControlType

        x = y = 0
        for segment in console.render(update):  # type: ignore[arg-type]
            if segment.control:
                for control in segment.control:
                    if control[0] == ControlType.CURSOR_MOVE_TO:
                        x, y = int(control[1]), int(control[2])  # type: ignore[misc]
                continue
            for line_no, line in enumerate(segment.text.split("\n")):
                if line_no:
                    x, y = 0, y + 1
                spans, _ = split_graphemes(line)
                for start, end, width in spans:
                    if width:
                        self._put(x, y, line[start:end], width)
                    elif x:  # a zero-width character joins the grapheme before it
                        self._join(x - 1, y, line[start:end])
                    x += width
        self.updates += 1

    def _put(self, x: int, y: int, grapheme: str, width: int) -> None:
        if not 0 <= y < len(self.rows):
            return
        row = self.rows[y]
        for cell in range(x, min(x + width, len(row))):
            if row[cell] == self.WIDE and cell > 0:  # writing over the right half of a wide glyph
                row[cell - 1] = " "
            if cell + 1 < len(row) and row[cell + 1] == self.WIDE:  # over the left half
                row[cell + 1] = " "
        if 0 <= x < len(row):
            row[x] = grapheme
            if width == 2 and x + 1 < len(row):
                row[x + 1] = self.WIDE

    def _join(self, x: int, y: int, characters: str) -> None:
        if 0 <= y < len(self.rows) and 0 <= x < len(self.rows[y]):
            if self.rows[y][x] == self.WIDE and x > 0:
                x -= 1
            self.rows[y][x] += characters

    def lines(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.rows]


def _clear_cell_width_caches() -> None:
    """Forget every cell width Rich measured (they are cached by character and by the unicode version in use)."""
    import rich._unicode_data
    import rich.cells

    rich._unicode_data.load.cache_clear()
    rich.cells.get_character_cell_size.cache_clear()
    rich.cells.cached_cell_len.cache_clear()
    Segment._split_cells.cache_clear()


@pytest.fixture(params=[("8.0.0", 1), ("latest", 2)], ids=["bolt-1-cell", "bolt-2-cells"])
def bolt_cells(request: pytest.FixtureRequest) -> Iterator[int]:
    """Rich's cell widths as on a machine where ⚡ (U+26A1) takes one cell, or two; the width. Rich measures it from
    the Unicode version in $UNICODE_VERSION (latest when unset): wide from Unicode 9.0 on, narrow before, so the
    same app draws it in 1 or 2 cells depending on the machine's environment."""
    version, cells = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("UNICODE_VERSION", version)
        _clear_cell_width_caches()
        yield cells
    _clear_cell_width_caches()


async def test_partial_updates_while_streaming_leave_the_screen_a_full_render_draws(
    lone_llama: Path, bolt_cells: int
) -> None:
    """What a terminal shows after the chat screen's partial updates (cropped rows, skipped hidden widgets) is
    what a full render of the screen draws, during and after a streamed reply; with the speculative meter's wide
    ⚡ on screen and its line drawn again as live statistics arrive, whether the machine measures ⚡ as one cell or
    two."""
    from dataclasses import replace

    from rich.cells import cell_len

    from app.core.config import Config, SpeculativeSettings, save_config

    assert cell_len("⚡") == bolt_cells
    save_config(replace(Config(), speculative=SpeculativeSettings(enabled=True)))  # the meter, with its ⚡
    app = _scripted_app(lone_llama, _SpeculativeScriptedClient)
    terminal = _Terminal(100, 30)
    display = app._display

    def capture(screen: object, renderable: object) -> None:
        display(screen, renderable)  # type: ignore[arg-type]
        if renderable is not None and not app._batch_count:
            terminal.apply(app.console, renderable)

    app._display = capture  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to be ready", 30, 0.01)
        chat = app.chat
        assert chat is not None

        def full_render() -> list[str]:
            # From scratch: no widget's cached lines (a line never repainted would be stale in the cache too).
            for widget in app.screen.walk_children(with_self=True):
                widget._styles_cache.clear()
            return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]

        client = app.bridge._client
        assert isinstance(client, _ScriptedClient)
        await chat.replies.send("Tell me something")
        reply = _ScriptedClient.REPLY
        chunks = (len(reply) + 6) // 7
        sent = steps = 0
        while sent < chunks:
            steps += 1
            # A few chunks (a frame's worth or several), then let every update land: the terminal must show
            # exactly what a full render of the screen draws now.
            step = min(chunks - sent, 1 + sent % 17)
            client.gate.release(step)
            sent += step
            shown = min(len(reply), sent * 7)

            def arrived(shown: int = shown) -> bool:
                live = chat.transcript.live
                return chat.generation is None or (live is not None and len(live.text) >= shown)

            await wait_until(pilot, arrived)
            await reply_followed(pilot, chat.transcript)
            assert terminal.lines() == full_render()
            # The newest line of the reply is in view (the view follows the text, not the room kept below it).
            live, transcript = chat.transcript.live, chat.transcript
            if live is not None and live.body.content_height:
                assert newest_line_on_screen(transcript)
        await wait_until(pilot, lambda: chat.generation is None)
        await pilot.pause(0.2)  # the finished message drawn in place of the live reply
        assert terminal.lines() == full_render()
        assert "The end of the reply" in "\n".join(terminal.lines())
        # The wide glyph was drawn, then what follows it, with the latest statistics.
        assert any("⚡ auto" in line and "accepted" in line for line in terminal.lines())
        # Most steps drew (a step adding only blank lines to the tail changes nothing drawn): what the terminal
        # shows came from many partial updates, not only from the final full one.
        assert terminal.updates > steps // 2


def newest_line_on_screen(transcript: Transcript) -> bool:
    """Whether the streamed reply's last line of text is drawn inside the transcript's view, from where the screen
    put the reply's body (not from the transcript's own follow arithmetic)."""
    live = transcript.live
    assert live is not None
    y = live.body.region.y + live.body.content_height - 1
    view = transcript.scrollable_content_region
    return view.y <= y < view.bottom


async def _scripted_reply(app: LlmtuiApp, pilot: Pilot[None]) -> tuple[ChatScreen, _ScriptedClient]:
    """Once the scripted engine is ready, a reply started in a new conversation (the reply is all there is to
    scroll through); the chat screen and the client that streams it."""
    await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to be ready", 30, 0.01)
    chat = app.chat
    assert chat is not None
    client = app.bridge._client
    assert isinstance(client, _ScriptedClient)
    await chat.conversations.open_conversation(None)
    await chat.replies.send("Tell me something")
    return chat, client


async def test_the_view_follows_the_reply_only_while_the_user_is_at_its_end(lone_llama: Path) -> None:
    app = _scripted_app(lone_llama)
    async with app.run_test(size=(60, 16)) as pilot:
        chat, client = await _scripted_reply(app, pilot)
        transcript = chat.transcript
        chunks = (len(_ScriptedClient.REPLY) + 6) // 7

        async def stream(n: int) -> None:
            live = transcript.live
            assert live is not None
            before = len(live.text)
            client.gate.release(n)
            await wait_until(pilot, lambda: len(live.text) >= before + 7 * n)
            await reply_followed(pilot, transcript)

        def newest_line_in_view() -> bool:
            return newest_line_on_screen(transcript)

        await stream(chunks // 2)
        assert transcript.scroll_y > 0 and newest_line_in_view()
        transcript.scroll_home(animate=False)  # the user scrolls up to read: the view stays there
        await wait_until(pilot, lambda: transcript.scroll_y == 0, "the view at the top")
        await stream(chunks // 4)
        assert transcript.scroll_y == 0 and not newest_line_in_view()
        transcript.scroll_end(animate=False)  # back at the end (past the text, into the room kept below it)
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, "the view at the end")
        await stream(2)
        assert newest_line_in_view()
        client.gate.release(chunks)
        await wait_until(pilot, lambda: chat.generation is None)


PLAIN_PARAGRAPH = (
    "The keeper climbed the stairs every evening and counted them as his father had done before him, "
    "twenty - thirty - forty steps, then 1. the lamp and 2. the log; a word too long for any line: "
    + "x"
    * 150
    + " and on it went, the ships passing far out in the grey water while the lamp warmed "
    "and the gulls settled on the rail for the night, "
)


@pytest.mark.parametrize("chunk", [1, 5, 23])
async def test_a_growing_plain_paragraph_draws_as_rendered_whole_at_every_step(chunk: int) -> None:
    """A paragraph of plain text re-renders only from its last line on as it grows: after every chunk its lines
    are those of the tail rendered whole, including lines that start with "- " or "1." (not plain on their own),
    a word folded over several lines, and once an emphasis or a line break makes the paragraph not plain."""
    app = TranscriptHost()
    text = PLAIN_PARAGRAPH * 3 + "and then *at last* it was morning,\nwith a soft break. " + PLAIN_PARAGRAPH
    async with app.run_test(size=(60, 30)) as pilot:
        transcript = app.query_one(Transcript)
        live = await transcript.start_live(1, "model")
        body = live.body
        await wait_until(pilot, lambda: body.size.width > 0, "the live body laid out")  # (late on a busy machine)
        rendered: list[int] = []  # characters of Markdown rendered by each step
        render = body.render_renderable

        def counting(renderable: object, width: int) -> object:
            rendered.append(len(getattr(renderable, "markup", "")))
            return render(renderable, width)  # type: ignore[arg-type]

        body.render_renderable = counting  # type: ignore[assignment,method-assign]
        partial = plain = 0
        for index, start in enumerate(range(0, len(text), chunk)):
            transcript.write_live(text[start : start + chunk], "")
            rendered.clear()
            body.flush()
            width = body.size.width
            options = app.console_options.update_width(width).update(highlight=False)
            whole = app.console.render_lines(_markdown(body.tail, dark=body.dark), options, pad=False)
            assert body._tail_lines == whole, (index, body.tail[-40:])
            if "*" not in body.tail and "\n" not in body.tail and len(whole) > 2:
                plain += 1
                partial += bool(rendered) and max(rendered) < len(body.tail)
            if index % 25 == 24:
                await pilot.pause()
        # The plain paragraph's steps rendered only its end (but where a line starts with "- " or "1.").
        assert partial > plain * 0.9
        live.stop()


async def test_stats_of_a_reply_that_failed_show_as_not_measured() -> None:
    app = StatsHost()
    async with app.run_test(size=(120, 3)) as pilot:
        bar = ready_stats_bar(app)
        bar.set_stats({"error": "the engine process was killed by SIGKILL"})
        await pilot.pause()
        line = bar.render().plain
        assert "– tok/s  TTFT –  prompt –  ctx ░░░░░░░░░░ 0/4.1k" in line and "reply" not in line


async def test_a_repaint_of_the_whole_view_skips_the_containers_behind_the_reply() -> None:
    """A follow-scroll repaints the whole view: the widgets the reply's parts hide (its own container, the
    transcript, the screen) are not rendered, and every row is what the stock compositor draws."""
    from textual.widget import Widget

    app = CroppedHost()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript, live, cropped, stock = await _streamed_into(app, pilot)
        screen = app.screen
        rendered: set[Widget] = set()
        original = Widget.render_lines

        def spy(widget: Widget, crop):  # type: ignore[no-untyped-def]
            rendered.add(widget)
            return original(widget, crop)

        view = transcript.region
        for crop in (Region(0, view.y, 80, view.height), screen.region):  # the view's rows; the whole screen
            rendered.clear()
            rows = set(range(crop.y, crop.bottom))
            Widget.render_lines = spy  # type: ignore[method-assign, assignment]
            try:
                ours = cropped._render_chops(crop, rows.__contains__)
            finally:
                Widget.render_lines = original  # type: ignore[method-assign]
            assert live.body in rendered
            assert live not in rendered and transcript not in rendered and screen not in rendered
            theirs = stock._render_chops(crop, rows.__contains__)
            for row in rows:
                assert Strip.join(ours[row].values()) == Strip.join(theirs[row].values())
        live.stop()


async def test_the_reply_grows_when_the_view_scrolls_and_the_screen_is_laid_out_once_per_change(
    lone_llama: Path,
) -> None:
    """The reply's room grows in the frame that scrolls to follow it (one repaint of the view, not two), and a
    change of its height lays the screen out once (Textual would lay it out a second time for the new size)."""
    app = _scripted_app(lone_llama)
    async with app.run_test(size=(60, 16)) as pilot:
        chat, client = await _scripted_reply(app, pilot)
        transcript = chat.transcript
        await wait_until(pilot, lambda: transcript.live is not None, "the live reply")
        await pilot.pause()
        live = transcript.live
        assert live is not None
        screen = app.screen
        layouts: list[bool] = []  # each layout of the screen that the reply asked for: whether the view scrolled
        scrolled = [False]
        refresh_layout, scroll_to = screen._refresh_layout, transcript.scroll_to

        def layout_spy(*args: Any, **kwargs: Any) -> None:
            if live in screen._layout_widgets or live.body in screen._layout_widgets:
                layouts.append(scrolled[0])
            scrolled[0] = False
            refresh_layout(*args, **kwargs)

        def scroll_spy(*args: Any, **kwargs: Any) -> None:
            scrolled[0] = True
            scroll_to(*args, **kwargs)

        screen._refresh_layout = layout_spy  # type: ignore[method-assign]
        transcript.scroll_to = scroll_spy  # type: ignore[method-assign]
        heights = {live.outer_size.height}
        for _ in range((len(_ScriptedClient.REPLY) + 6) // 7):
            client.gate.release(1)
            before = len(live.text)
            await wait_until(pilot, lambda before=before: len(live.text) > before)  # type: ignore[misc]
            await reply_followed(pilot, transcript)
            heights.add(live.outer_size.height)
        assert len(heights) >= 3  # the reply grew more than once
        assert len(layouts) <= len(heights)  # one layout per change of height (Textual's own would be two)
        assert layouts.count(False) <= 1  # and each but the first came with a scroll
        client.gate.release(100)
        await wait_until(pilot, lambda: chat.generation is None)


def test_code_fence_lexers_are_looked_up_without_scanning_plugins_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fence being streamed names no lexer yet ("```pyth"): Pygments' own lookup scans every installed package's
    entry points for each such name (tens of ms, once per frame); ours scans them once."""
    from pygments.lexers import CppLexer, PythonLexer

    from app.tui.widgets import markdown_render as transcript

    scans: list[int] = []
    find_plugins = transcript.find_plugin_lexers

    def counting() -> Any:
        scans.append(1)
        return find_plugins()

    monkeypatch.setattr(transcript, "find_plugin_lexers", counting)
    transcript._lexer_aliases.cache_clear()
    transcript._lexer.cache_clear()
    try:
        for partial in ("p", "py", "pyt", "pyth", "pytho", "python", "Python", "c++", "rus", "no-such-language"):
            transcript._lexer(partial)
        assert len(scans) == 1
        assert isinstance(transcript._lexer("python"), PythonLexer)
        assert isinstance(transcript._lexer("PY"), PythonLexer)
        assert isinstance(transcript._lexer("c++"), CppLexer)
        assert transcript._lexer("pyth") is None and transcript._lexer("") is None
        python = transcript._lexer("python")
        assert python is not None and python.tabsize == 4  # what Rich's Syntax would use
    finally:
        transcript._lexer_aliases.cache_clear()
        transcript._lexer.cache_clear()


async def test_the_footer_offers_stop_while_a_reply_is_written_and_continue_after_it_stopped(lone_llama: Path) -> None:
    from textual.widgets._footer import FooterKey

    app = _scripted_app(lone_llama)

    async def footer() -> set[str]:
        await pilot.pause(0.1)  # the footer redrawn for the bindings of now
        return {key.description for key in app.screen.query(FooterKey)}

    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to be ready", 30, 0.01)
        assert app.chat is not None
        await app.chat.conversations.open_conversation(None)
        shown = await footer()  # a new conversation: nothing to stop, continue or regenerate
        assert "New" in shown and not shown & {"Stop", "Go on"}  # Continue is "Go on"; Regenerate is in F1
        chat, client = await _scripted_reply(app, pilot)
        client.gate.release(3)
        await wait_until(pilot, lambda: chat.transcript.live is not None and bool(chat.transcript.live.text))
        shown = await footer()
        assert "Stop" in shown and "Go on" not in shown and not chat.check_action("regenerate", ())
        await pilot.press("escape")
        await wait_until(pilot, lambda: bool(client.cancelled))  # the cancel reached the engine
        client.gate.release(1)
        await wait_until(pilot, lambda: chat.generation is None)
        shown = await footer()  # the reply was stopped: it can be continued
        assert "Stop" not in shown and "Go on" in shown and chat.check_action("regenerate", ())
        await chat.conversations.open_conversation(None)
        assert not (await footer()) & {"Stop", "Go on"}


async def test_the_transcript_scrollbar_draws_what_textuals_does_at_every_position() -> None:
    """The transcript's scrollbar makes its lines once per position, bypassing Textual's per-line style cache."""
    from textual.scrollbar import ScrollBar

    app = CroppedHost()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript, live, _, _ = await _streamed_into(app, pilot)
        transcript.write_live("more text " * 400, "")
        await reply_followed(pilot, transcript)
        bar = transcript.vertical_scrollbar
        assert type(bar) is not ScrollBar and bar.display
        height = bar.outer_size.height
        positions = set()
        for y in (0, transcript.max_scroll_y // 3, transcript.max_scroll_y):
            transcript.scroll_to(y=y, animate=False, immediate=True)
            await wait_until(pilot, lambda y=y: bar.position == y, f"the scrollbar at {y}")
            positions.add(bar.position)
            for crop in (Region(0, 0, 1, height), Region(0, 3, 1, 5)):
                ours = bar.render_lines(crop)
                bar._styles_cache.clear()
                assert ours == ScrollBar.render_lines(bar, crop)
        assert len(positions) == 3
        live.stop()


def chat_laid_out(app: LlmtuiApp) -> bool:
    """The chat screen has mounted (its prompt has the focus) and its transcript has a size."""
    chat = app.chat
    return chat is not None and app.focused is chat.prompt and chat.transcript.size.height > 0


async def _open_seeded(app: LlmtuiApp, pilot: Pilot[None], turns: int, answer: str) -> ChatScreen:
    """A conversation of `turns` questions, each answered "answer N" + `answer`, opened in the chat screen (and
    scrolled to its end)."""
    await wait_until(pilot, lambda: app.chat is not None and app.focused is app.chat.prompt, "the chat's first mount")
    chat = app.chat
    assert chat is not None
    store = app.store
    conversation = store.conversations.create_conversation("seeded")
    for index in range(turns):
        user = store.tree.add_user_message(conversation.id, f"question {index}")
        reply = store.tree.begin_assistant_message(conversation.id, user.id, "model")
        store.tree.finish_assistant_message(reply, f"answer {index}{answer}", "", "complete", {})
    await chat.conversations.open_conversation(conversation.id)
    transcript = chat.transcript
    await wait_until(
        pilot, lambda: transcript.views() and transcript.scroll_y == transcript.max_scroll_y > 0, "the end in view"
    )
    return chat


async def test_scrolling_to_the_top_of_a_long_conversation_loads_earlier_messages_in_place() -> None:
    from textual.widgets import Static

    from app.tui.app import LlmtuiApp
    from app.tui.widgets.transcript import PAGE_SIZE

    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        # 40 messages: the last PAGE_SIZE are mounted at first
        chat = await _open_seeded(app, pilot, 20, "\n\n" + "a line of the answer\n\n" * 3)
        transcript = chat.transcript
        views = transcript.views()
        assert len(views) == PAGE_SIZE and views[0].message.content == "question 12"
        assert transcript.scroll_y == transcript.max_scroll_y > 0  # opened at the end
        earlier = transcript.query(".earlier").first(Static)
        assert "24 earlier messages" in str(earlier.render())
        first = views[0]
        transcript.scroll_home(animate=False)
        await wait_until(pilot, lambda: len(transcript.views()) == 2 * PAGE_SIZE)
        await wait_until(pilot, lambda: first.region.y == transcript.region.y + 2, "the first message back in place")
        # The message that was first is where it was on screen when the view reached the top (below the "earlier"
        # line and its top margin): the new page went above it, out of view.
        assert transcript.views()[PAGE_SIZE] is first
        assert first.region.y == transcript.region.y + 2
        transcript.scroll_home(animate=False)
        await wait_until(pilot, lambda: len(transcript.views()) == 40)
        await wait_until(pilot, lambda: not transcript.query(".earlier"), "the earlier-messages line removed")
        assert not transcript.query(".earlier")  # every message is mounted now


async def test_the_end_of_the_conversation_stays_in_view_when_the_view_gets_shorter() -> None:
    from app.tui.app import LlmtuiApp

    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await _open_seeded(app, pilot, 4, " " + "words " * 60)
        transcript = chat.transcript
        assert transcript.scroll_y == transcript.max_scroll_y > 0
        height = transcript.size.height
        chat.prompt.load_text("a prompt\nof three\nlines")  # the prompt grows: the transcript gets shorter
        await wait_until(pilot, lambda: transcript.size.height < height, "the transcript made shorter")
        await wait_until(pilot, lambda: transcript.scroll_y == transcript.max_scroll_y, "the end kept in view")
        assert transcript.size.height < height
        assert transcript.scroll_y == transcript.max_scroll_y
        transcript.scroll_home(animate=False)  # a user reading above: the view stays where they are
        await wait_until(pilot, lambda: transcript.scroll_y == 0, "the view at the top")
        chat.prompt.load_text("")
        await wait_until(pilot, lambda: transcript.size.height == height, "the transcript back to its height")
        await pilot.pause()
        assert transcript.scroll_y == 0


async def test_t_unfolds_a_finished_replys_reasoning_and_folds_it_again() -> None:
    from app.tui.app import LlmtuiApp

    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: chat_laid_out(app), "the chat, mounted and laid out")
        chat = app.chat
        assert chat is not None
        store = app.store
        conversation = store.conversations.create_conversation("thinking")
        user = store.tree.add_user_message(conversation.id, "Why is the sky blue?")
        reply = store.tree.begin_assistant_message(conversation.id, user.id, "model")
        store.tree.finish_assistant_message(
            reply, "Rayleigh scattering.", "Short light scatters more. Say so briefly.", "complete", {}
        )
        await chat.conversations.open_conversation(conversation.id)
        await wait_until(pilot, lambda: chat.transcript.views() and chat.transcript.views()[-1].outer_size.height)
        view = chat.transcript.views()[-1]
        folded = view.outer_size.height

        def drawn() -> str:
            return "\n".join(view.render_line(y).text for y in range(view.outer_size.height))

        assert "Reasoning (7 words)" in drawn() and "Short light" not in drawn()
        view.focus()
        await pilot.press("t")
        await wait_until(pilot, lambda: view.outer_size.height > folded, "t to unfold the reasoning")
        assert view.outer_size.height > folded and "Short light scatters more" in drawn()
        await pilot.press("t")
        await wait_until(pilot, lambda: view.outer_size.height == folded, "t to fold it again")
        assert view.outer_size.height == folded and "Short light" not in drawn()


def test_code_blocks_keep_each_lines_rows_and_draw_what_rich_draws() -> None:
    """_LineCachedSyntax renders a line's rows once; the result is Rich's Syntax's, line for line, at any width,
    with long wrapped lines, tabs, blank lines, with and without a final newline, in either theme."""
    from rich.syntax import Syntax

    from app.tui.widgets import markdown_render as transcript

    code = (
        "def f(x):\n\tif x:  # a tab\n\n        return 'a long string that will have to wrap "
        + "x" * 90
        + "'\n    return None\n"
    )
    for theme in ("monokai", "default"):
        for width in (30, 61, 120):
            console = Console(width=width, force_terminal=True, color_system="truecolor")
            for text in (code, code.rstrip("\n"), code[:37], "", "\n\n"):
                lexer = transcript._lexer("python")
                ours = transcript._LineCachedSyntax(text, lexer, theme=theme, word_wrap=True, padding=1)
                rich = Syntax(text, lexer, theme=theme, word_wrap=True, padding=1)
                assert console.render_lines(ours) == console.render_lines(rich), (theme, width, text)
    # Drawing the same block again renders no line again: every row comes from the cache.
    console = Console(width=61, force_terminal=True, color_system="truecolor")
    before = len(transcript._SYNTAX_ROWS)
    rendered = console.render_lines(
        transcript._LineCachedSyntax(
            code + "y = 1\n", transcript._lexer("python"), theme="monokai", word_wrap=True, padding=1
        )
    )
    assert len(transcript._SYNTAX_ROWS) == before + 1  # only the new line
    assert rendered == console.render_lines(
        Syntax(code + "y = 1\n", transcript._lexer("python"), theme="monokai", word_wrap=True, padding=1)
    )
