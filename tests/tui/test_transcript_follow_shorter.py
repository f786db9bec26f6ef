from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from app.tui.widgets.transcript import Transcript
from tests.waits import wait_until


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield Transcript(id="t")
        panel = Static("sliders", id="panel")
        panel.styles.height = 9
        panel.display = False
        yield panel


@pytest.mark.anyio
async def test_a_followed_reply_stays_in_view_when_a_panel_makes_the_view_shorter() -> None:
    """Issue 22 (tmux walk, 80x24): F6's sliders opened below a reply being followed; the view kept its offset and
    the reply's new text went on below it, out of sight, for the rest of the reply."""
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = app.query_one(Transcript)
        await transcript.start_live(1, "model")
        text = ""
        for n in range(40):
            text += f"line {n}\n\n"
            transcript.write_live(text, "")
            await pilot.pause(0.02)  # streamed at a pace
        await wait_until(pilot, lambda: transcript.scroll_y > 0 and transcript._following(), what="following")
        app.query_one("#panel").display = True
        await pilot.pause()
        for n in range(40, 60):
            text += f"line {n}\n\n"
            transcript.write_live(text, "")
            await pilot.pause(0.02)  # streamed at a pace
        await wait_until(pilot, lambda: transcript._following(), what="the reply's end in the shorter view")
