"""F1's help at 80×24 (issue 49, 2): every entry reachable with PageDown and End, its hint in view, and its own keys
in the footer while it is open; the palette's keyed entries come from the same bindings (issue 43, 4)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from app.tui.app import LlmtuiApp
from app.tui.screens.help import HelpScreen
from app.tui.screens.help_keys import key_sections
from tests.pilot import assert_footer_fits, footer_items
from tests.tui.test_tui_spec import _without_engine
from tests.waits import wait_until


def help_text(app: LlmtuiApp, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(app.screen.query_one("#help-keys", Static).content)
    return console.export_text()


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_f1_at_80x24_reaches_every_entry_with_its_own_keys_in_the_footer() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        body = app.screen.query_one("#help-body", VerticalScroll)
        hint = app.screen.query_one(".dialog-hint", Label)
        await wait_until(pilot, lambda: body.max_scroll_y > 0, what="the help laid out, taller than the screen")
        # The footer is the help's: its keys, fitted in 80 columns, none of the chat's.
        items = footer_items(app)
        assert all(x + cells <= 80 for x, cells, _ in items)
        labels = [text.split(maxsplit=1)[1].strip() for _, _, text in items]
        assert labels[:3] == ["Close", "Page down", "Page up"] and "New" not in labels and "Model" not in labels
        assert hint.region.height and hint.region.bottom <= 23, "the hint is cut off"
        # PageDown, pressed until the body moves no more, ends at the last entry; the hint stays in view.
        last_y = -1.0
        presses = 0
        while body.scroll_y != last_y and presses < 60:
            last_y = body.scroll_y
            await pilot.press("pagedown")
            await pilot.pause()
            presses += 1
        assert body.scroll_y == body.max_scroll_y and presses > 2
        assert hint.region.bottom <= 23
        # End from the top reaches the end too; Home goes back.
        await pilot.press("home")
        await wait_until(pilot, lambda: body.scroll_y == 0, what="back at the top")
        await pilot.press("end")
        await wait_until(pilot, lambda: body.scroll_y == body.max_scroll_y, what="the end")
        # Every section of the generated keys, and the last word, are in the scrolled body.
        text = help_text(app, body.content_region.width)
        for title, entries in key_sections(LlmtuiApp):
            assert title in text and all(entry.key_text.split(", ")[0] in text for entry in entries), title
        assert text.rstrip().endswith("drafted tokens kept")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help closed")
        assert "New" in assert_footer_fits(app, 80)  # the chat's footer again


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_question_mark_opens_the_help_and_q_closes_it() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        app.screen.set_focus(None)  # in the message box, ? is typed
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), what="? opens the help")
        await pilot.press("q")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="q closes it")


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_palettes_keyed_entries_name_their_keys_and_run_their_actions() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        chat = app.chat
        assert chat is not None
        commands = {c.title: c for c in app.get_system_commands(chat)}
        assert commands["Chat: New conversation"].help == "ctrl+n"
        assert commands["Models: Switch model"].help == "every model on this machine · ctrl+l"
        assert "ctrl+e" in commands["Chat: Stop thinking"].help
        assert "d, del" in commands["Chat: Delete the conversation"].help  # the list's key, acting on the chat
        assert not any(title.endswith(("Next part", "Command palette")) for title in commands)
        sidebar = chat.query_one("#sidebar")
        shown = bool(sidebar.display)
        commands["View: Conversation list"].callback()
        await wait_until(pilot, lambda: bool(sidebar.display) != shown, what="the list shown or hidden, as ctrl+b does")
