"""Issue 22's "Everywhere" fixes, as a new user meets them: checkboxes that read apart without colour, a stats bar
without stale figures, a command palette of the app's own commands, and a footer that fits 80 columns."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from textual.geometry import Region

from app.modals.speculative import SpeculativePanel
from app.widgets.tick_box import TICKED, UNTICKED, TickBox
from tests.tui.test_tui_spec import _types_read, _without_engine
from tests.waits import wait_until

APP = Path(__file__).resolve().parents[2] / "app"


def plain_text(widget: Any) -> str:
    """What the widget draws, without any colour or style."""
    return widget.render().plain


def drawn(widget: Any) -> str:
    """The widget's first line as drawn (styles applied), as plain text."""
    return widget.render_lines(Region(0, 0, widget.size.width, 1))[0].text


# ----- checkboxes -------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_f9_checkbox_reads_on_and_off_without_colour() -> None:
    async with _without_engine((80, 24)) as (app, pilot):
        await pilot.press("f9")
        await _types_read(pilot)
        panel = app.screen
        assert isinstance(panel, SpeculativePanel)
        box = panel.query_one("#spec-enabled", TickBox)
        on = plain_text(box)
        assert box.value and on.startswith(TICKED)
        box.focus()
        await pilot.press("space")  # the keyboard unticks it
        await wait_until(pilot, lambda: not box.value, what="the box unticked by space")
        off = plain_text(box)
        assert off.startswith(UNTICKED) and off != on
        assert off.replace(UNTICKED, TICKED, 1) == on  # the same label: only the box differs
        # What is drawn on the screen, colour stripped: the two states are different characters.
        await pilot.press("space")
        await wait_until(pilot, lambda: box.value, what="the box ticked again by space")
        drawn_on = drawn(box)
        await pilot.press("space")
        await wait_until(pilot, lambda: not box.value and drawn(box) != drawn_on, what="the box drawn unticked")
        assert TICKED in drawn_on and UNTICKED in drawn(box)


def test_every_checkbox_of_the_app_is_a_tick_box() -> None:
    """Textual's Checkbox (▐X▌ both ways) is not used directly anywhere in app/."""
    offenders = []
    for path in APP.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Checkbox":
                offenders.append(f"{path.relative_to(APP.parent)}:{node.lineno}")
    assert not offenders


def test_the_boxes_are_one_cell_per_character() -> None:
    from rich.cells import cell_len

    assert TICKED != UNTICKED and TICKED.isascii() and UNTICKED.isascii()
    assert cell_len(TICKED) == cell_len(UNTICKED) == len(TICKED) == 3
