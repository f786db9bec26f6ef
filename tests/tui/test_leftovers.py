"""Issue 22's leftovers (found in its acceptance walk): where early keys go, an honest speculation ratio, F4's
progress at 80×24, the Search tab's detail pane, the check dialog's prompt line, the heat strip's scale."""

from __future__ import annotations

import pytest
from textual import events
from textual.widgets import Input

from app.tui import LlmtuiApp
from tests.pilot import chat_of, seeded  # noqa: F401 (seeded: fixture)
from tests.waits import wait_until


def _post_keys(app: LlmtuiApp, text: str) -> None:
    """Keys as the terminal driver posts them: queued on the App at once, before it drew anything."""
    for character in text:
        key = "space" if character == " " else character
        event = events.Key(key, character)
        event.set_sender(app)
        app.post_message(event)


class _TypedAhead(LlmtuiApp):
    """The app with keys already waiting when it starts (typed while it was launching): the terminal driver
    queues them on the App before the App's own mount handler has pushed the chat."""

    def on_mount(self) -> None:  # Textual calls this before LlmtuiApp.on_mount (a subclass's handler runs first)
        _post_keys(self, "hello there")


@pytest.mark.anyio
@pytest.mark.usefixtures("seeded")
async def test_keys_typed_before_the_first_screen_land_in_the_prompt() -> None:
    app = _TypedAhead("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = chat_of(app)
        search = chat.query_one("#conversation-search", Input)
        await wait_until(
            pilot, lambda: chat.prompt.text == "hello there", what="the early keys in the prompt", timeout_s=10
        )
        assert search.value == ""
        assert app.focused is chat.prompt
