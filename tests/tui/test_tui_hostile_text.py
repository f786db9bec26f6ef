"""Escape codes never reach the terminal from the app (issue 42, item 9): an imported conversation whose title, text,
reasoning, model, tool-call records and image format hold ESC, CSI, OSC, DCS, C1 and bidirectional controls (among
them terminal status queries, which make the terminal type into the app), and a model whose GGUF names itself with
them, drawn on every screen that shows them. What is checked is what is drawn: the segments of the screen's whole
render (what export_screenshot draws too) and the bytes Textual writes for it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.segment import Segment
from textual.pilot import Pilot
from textual.strip import Strip
from textual.widgets import Input

from app.tui.app import LlmtuiApp
from app.tui.screens.chat_screen import ChatScreen
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.tool_call_block import ToolCallBlock
from tests.pilot import chat_of
from tests.tui.test_tui_hostile import assert_up, open_models_screen
from tests.unit.test_gguf_fuzz import _STR, _write_edited
from tests.waits import wait_until

pytestmark = pytest.mark.usefixtures("app_dirs")

QUERIES = "\x1b[6n\x1b[c\x1b]52;c;cm0gLXJmIH4K\x07\x1bP+q544e\x1b\\\x9b6n\x1b]0;PWNED\x1b\\"
"""A cursor-position and a device-attributes query (answered by typing into the app), a clipboard write (OSC 52), a
DCS terminfo query, a C1 CSI (0x9b), a title change ended by ST."""
HOSTILE = f"Evil{QUERIES}\u202eright-to-left\u2066\x00\x7f"
RAW = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
SEQUENCES = ("\x1b[6n", "\x1b[c", "\x1b]52", "\x1bP", "\x9b", "PWNED\x1b", "\u202e", "\u2066")
"""What the hostile texts would write if they reached the terminal (Textual's own output never holds them)."""


def hostile_export() -> str:
    """An export as a hostile file would be: every text the app draws holds HOSTILE."""
    call = {
        "id": "c1",
        "name": f"tool{HOSTILE}",
        "arguments": json.dumps({"q": HOSTILE}),
        "source": f"mcp{HOSTILE}",
        "allowed": True,
        "result": f"result{HOSTILE}",
        "failed": False,
        "seconds": 0.5,
        "at": 0,
    }
    image = {"sha256": "ab" * 32, "name": "c\x1b[6n.png", "format": "PNG\x1b[6n\x9b6n", "width": 8, "height": 8}
    when = "2026-01-02T03:04:05+00:00"
    message = {"created_at": when, "updated_at": when, "state": "complete", "reasoning": "", "stats": {}}
    return json.dumps(
        {
            "format": "llmtui.conversation",
            "version": 1,
            "conversation": {
                "title": f"Title{HOSTILE}",
                "created_at": when,
                "updated_at": when,
                "system_prompt": f"system{HOSTILE}",
                "settings": {"preset": f"preset{HOSTILE}"},
                "model": f"model{HOSTILE}",
                "active_leaf": 1,
            },
            "messages": [
                message
                | {"id": 0, "parent": None, "role": "user", "content": f"findme {HOSTILE}", "model": ""}
                | {"images": [image | {"size": 100}]},
                message
                | {"id": 1, "parent": 0, "role": "assistant", "model": f"model{HOSTILE}", "token_count": 3}
                | {"content": f"Reply {HOSTILE}\n\n```\ncode{HOSTILE}\n```\n", "reasoning": f"thought{HOSTILE}"}
                | {"stats": {"tool_calls": [call]}},
            ],
        }
    )


def drawn(app: LlmtuiApp) -> tuple[str, str]:
    """The current screen as drawn: the text of its segments, and the bytes Textual writes to the terminal for it."""
    update = app.screen._compositor.render_update(full=True)
    assert update is not None
    strips: list[Strip] = [strip for line in update.strips for strip in line]
    text = "\n".join("".join(segment.text for segment in strip) for strip in strips)
    return text, update.render_segments(app.console)


def assert_drawn_safely(app: LlmtuiApp, *visible: str) -> str:
    """No control character in the screen's text, no hostile sequence in its bytes; `visible` each drawn."""
    text, terminal = drawn(app)
    found = RAW.search(text.replace("\n", " "))  # (the lines are joined here with new lines)
    assert found is None, f"{found.group()!r} drawn: {text[max(0, found.start() - 60) : found.start() + 60]!r}"
    assert not [s for s in SEQUENCES if s in terminal], [s for s in SEQUENCES if s in terminal]
    screenshot = app.export_screenshot()
    assert not RAW.search(screenshot.replace("\n", "").replace("\t", ""))
    for words in visible:
        assert words in text, f"{words!r} not drawn in:\n{text}"
    return text


async def import_and_open(pilot: Pilot[Any], app: LlmtuiApp, tmp_path: Path) -> ChatScreen:
    path = tmp_path / "hostile.json"
    path.write_text(hostile_export(), encoding="utf-8")
    app.conversations.import_file(path)
    await wait_until(pilot, lambda: any("Imported" in n.message for n in app._notifications), "the import")
    chat = chat_of(app)
    await wait_until(pilot, lambda: chat.conversation_id is not None, "the imported conversation opened")
    await pilot.pause()
    return chat


@pytest.mark.anyio
async def test_an_imported_conversations_escapes_never_reach_the_terminal(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 60)) as pilot:
        chat = await import_and_open(pilot, app, tmp_path)
        # the transcript (message, reply, code block, tool call, image), the header, the list and the toasts
        chat.transcript.query(ToolCallBlock).first().action_fold()
        await pilot.pause()
        assert_drawn_safely(
            app, "TitleEvil␛[6n", "modelEvil␛[6n", "codeEvil␛[6n", "c␛[6n.png", "toolEvil␛[6n", "resultEvil␛[6n"
        )
        chat.transcript.query(MessageView).last().action_toggle_reasoning()
        await pilot.pause()
        assert_drawn_safely(app, "thoughtEvil␛[6n", "PNG␛[6n<U+009B>6n 8×8")

        # search results: the title and the snippet of the message found
        search = chat.query_one("#conversation-search", Input)
        search.value = "findme"
        options = chat.conversation_list.options
        await wait_until(pilot, lambda: "findme" in str(options.get_option_at_index(0).prompt), "the search hit")
        await pilot.pause()
        assert_drawn_safely(app, "findme")
        search.value = ""
        await pilot.pause()

        # the export's notice, a rename prompt holding the title, a toast quoting the title
        chat.action_export_conversation()
        await wait_until(pilot, lambda: any("Exported" in n.message for n in app._notifications), "the export")
        app.notify(f"quoting {HOSTILE}", title=HOSTILE, timeout=30)
        await pilot.pause()
        assert_drawn_safely(app)
        # (a headless app draws no toasts: what each would draw is checked)
        notices = [n.title + n.message for n in app._notifications]
        assert any("quoting Evil␛[6n" in notice for notice in notices), notices
        assert not [notice for notice in notices if RAW.search(notice.replace("\n", " "))], notices
        await pilot.press("escape")
        assert_up(app)


@pytest.mark.anyio
async def test_a_models_name_from_its_gguf_is_drawn_without_its_escapes(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    named = _write_edited(tiny_models["llama"], tmp_path / "named.gguf", [("general.name", _STR, -1, HOSTILE)])
    app = LlmtuiApp(str(named), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.started, "the start-up")
        await pilot.pause()
        chat_of(app).header.model_name = HOSTILE  # as a loaded model's general.name is put there
        await pilot.pause()
        assert_drawn_safely(app, "Evil␛[6n")
        await open_models_screen(pilot, app)
        await pilot.pause(0.5)
        assert_drawn_safely(app)
        assert_up(app)


def test_a_widget_that_forgets_still_writes_no_control_character() -> None:
    """The last check: whatever a widget draws, Textual's bytes for it hold no control character of its text."""
    from rich.console import Console

    from app.tui.textual_internals.terminal_text import drop_controls_from_terminal_output

    drop_controls_from_terminal_output()
    console = Console(color_system="truecolor")
    strip = Strip([Segment("a" + QUERIES + "\u202eb"), Segment("c\x07d")], 4)
    written = strip.render(console)
    assert written.startswith("a[6n[c]52;c;") and written.endswith("bcd")
    assert not RAW.search(written)


def test_the_last_check_keeps_textual_images_sixel_placement() -> None:
    """textual-image's Sixel widget places its picture with cursor moves in plain segments (Rich's Control.move_to):
    a segment that is exactly one cursor move reaches the terminal; one inside other text does not."""
    from rich.console import Console
    from rich.control import Control

    from app.tui.textual_internals.terminal_text import drop_controls_from_terminal_output

    drop_controls_from_terminal_output()
    move = Control.move_to(3, 4).segment.text
    written = Strip([Segment(move), Segment("x" + move)], 1).render(Console(color_system="truecolor"))
    assert written.startswith(move) and written.count("\x1b[5;4H") == 1


@pytest.mark.anyio
async def test_a_notice_quoting_broken_markup_is_shown_as_text(tiny_models: dict[str, Path]) -> None:
    """A name holding "[/x]" or a malformed link in a notice: Textual's toast would raise in its render (MarkupError)
    and end the app; the notice is kept as plain text, and one with good markup keeps it."""
    from textual.content import Content

    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.started, "the start-up")
        app.notify("loaded bad [/oops] name [link=javascript:1]x", timeout=30)
        app.notify("[b]bold[/b] is fine", timeout=30)
        await pilot.pause()
        broken, fine = list(app._notifications)[-2:]
        assert not broken.markup and fine.markup
        for notice in (broken, fine):  # what the toast renders, as Toast.render does
            assert (Content.from_markup(notice.message) if notice.markup else Content(notice.message)).plain
        assert_up(app)
