"""The consent dialog for a tool call and the folded call block, each in a throwaway host app (Pilot)."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from app.core.tools.loop import CallRecord
from app.tui.modals.tool_consent import ConsentAnswer, ToolConsentModal
from app.tui.widgets.tool_call_block import ToolCallBlock
from engine_ext.protocol import ToolCall
from tests.waits import wait_until

pytestmark = pytest.mark.anyio
CALL = ToolCall("abcdefghi", "get_weather", '{"city": "Paris\\u001b[2J"}')


class ConsentHost(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.answers: list[ConsentAnswer | None] = []

    def ask(self) -> None:
        self.push_screen(ToolConsentModal(CALL, "mcp:weather"), self.answers.append)


async def test_the_dialog_shows_the_call_and_gives_each_answer() -> None:
    app = ConsentHost()
    async with app.run_test(size=(80, 24)) as pilot:
        keys = (("o", "once"), ("c", "conversation"), ("a", "always"), ("d", "deny"), ("escape", "deny"))
        for n, (key, answer) in enumerate(keys, 1):
            app.ask()
            await wait_until(
                pilot,
                lambda: isinstance(app.screen, ToolConsentModal) and bool(app.screen.query("#tool-consent-arguments")),
                "the consent dialog",
            )
            shown = str(app.screen.query_one("#tool-consent-arguments", Static).render())
            assert '"city": "Paris' in shown and "\x1b" not in shown  # the escape made visible, not sent
            assert "mcp:weather" in str(app.screen.query_one("#tool-consent-source").render())
            await pilot.press(key)
            await wait_until(pilot, lambda: not isinstance(app.screen, ToolConsentModal), f"the answer to {key}")
            assert len(app.answers) == n and app.answers[-1] == answer


class BlockHost(App[None]):
    def __init__(self, record: CallRecord) -> None:
        super().__init__()
        self.record = record

    def compose(self) -> ComposeResult:
        yield ToolCallBlock(self.record, id="block")


async def test_the_block_is_folded_and_unfolds_with_a_key() -> None:
    record = CallRecord(CALL, "mcp:weather", True, "sunny, 24 C\nwind 3 m/s", False, 0.25)
    app = BlockHost(record)
    async with app.run_test(size=(80, 24)) as pilot:
        block = app.query_one("#block", ToolCallBlock)
        folded = str(block.render())
        assert folded.startswith("▸ tool get_weather · mcp:weather · 22 characters in 0.2 s") and "sunny" not in folded
        block.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: block.expanded, "the block unfolded")
        unfolded = str(block.render())
        assert "▾ tool get_weather" in unfolded and "sunny, 24 C\nwind 3 m/s" in unfolded and "arguments:" in unfolded
        await pilot.press("space")
        await wait_until(pilot, lambda: not block.expanded, "the block folded again")
    denied = CallRecord(CALL, "mcp:weather", False, "The user did not allow this call.", True, 0.0)
    assert ToolCallBlock.summary(denied).endswith("· denied")
