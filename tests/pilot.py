"""What the Pilot tests share: bounded waits for the app's states, sending a message, and the scripted scene of the
snapshots (a seeded history, a model shown as loaded without an engine)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from app.core.engine import ModelSummary
from app.core.store import open_default_store
from app.tui.app import LlmtuiApp
from app.tui.screens.chat_screen import ChatScreen
from engine_ext.protocol import Cancel
from tests.waits import wait_until


def line_text(line: list[Any]) -> str:
    """The text of one of Rich's rendered lines (a list of Segments)."""
    return "".join(segment.text for segment in line).rstrip()


def chat_of(app: LlmtuiApp) -> ChatScreen:
    chat = app.chat
    assert chat is not None
    return chat


async def started(pilot: Pilot[Any]) -> None:
    """Once the app has read its settings and history (in its start-up thread) and shown its first screen, or has
    ended because it could not."""
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    await wait_until(
        pilot,
        lambda: app.started or app.return_code is not None,
        "the app's start-up: its settings, history and model read",
    )
    if app.started:
        await pilot.pause()


async def ready(pilot: Pilot[None]) -> ChatScreen:
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    await wait_until(pilot, lambda: app.engine_state == "ready")
    return chat_of(app)


async def send(pilot: Pilot[None], text: str) -> None:
    chat = chat_of(pilot.app)  # type: ignore[arg-type]
    chat.prompt.focus()
    started = chat.replies.replies_started
    chat.prompt.load_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: chat.replies.replies_started > started)


async def press_and_start(pilot: Pilot[None], *keys: str) -> None:
    """Press keys that start a reply and wait until it has started."""
    chat = chat_of(pilot.app)  # type: ignore[arg-type]
    started = chat.replies.replies_started
    await pilot.press(*keys)
    await wait_until(pilot, lambda: chat.replies.replies_started > started)


async def reply_done(pilot: Pilot[None]) -> None:
    chat = chat_of(pilot.app)  # type: ignore[arg-type]
    await wait_until(pilot, lambda: chat.generation is None and pilot.app.engine_state == "ready")
    await pilot.pause()


async def stop_mid_reply(pilot: Pilot[None]) -> None:
    """Once some tokens arrived, press Esc while the engine is paused (SIGSTOP), so the tiny model, which is
    fast, cannot finish first; then let it see the cancel."""
    chat = chat_of(pilot.app)  # type: ignore[arg-type]
    await wait_until(pilot, lambda: chat.generation is None or chat.generation.recorder.tokens > 0)
    assert chat.generation is not None, "the reply ended before it could be stopped"
    pid = pilot.app.bridge.pid or 0  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGSTOP)
    try:
        await press_to_cancel(pilot, "escape")
    finally:
        os.kill(pid, signal.SIGCONT)
    await reply_done(pilot)


async def press_to_cancel(pilot: Pilot[Any], *keys: str) -> None:
    """Press keys that cancel the reply being written, and wait until the bridge's thread has written the Cancel
    to the engine's pipe (where an engine paused with SIGSTOP reads it once it runs again)."""
    client = pilot.app.bridge._client  # type: ignore[attr-defined]
    cancels: list[Cancel] = []
    send = client.send

    def spy(request: object) -> None:
        send(request)
        if isinstance(request, Cancel):
            cancels.append(request)

    client.send = spy
    try:
        await pilot.press(*keys)
        await wait_until(pilot, lambda: bool(cancels), f"{'+'.join(keys)}'s Cancel written to the engine's pipe")
    finally:
        del client.send  # the class's method again


SIZES = [(80, 24), (120, 40)]
MODEL = ModelSummary(
    path="/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    name="SmolLM2-135M-Instruct.Q4_1",
    architecture="llama",
    backend="CPU",
    n_ctx=4096,
    n_params=134_515_008,
    size_bytes=98_000_000,
    load_ms=300.0,
)
REPLY = """\
Here is a function that reverses a string:

```python
def reverse(text: str) -> str:
    return text[::-1]
```

- It works on **any** string.
- Slicing makes a copy.
"""


@pytest.fixture
def seeded(app_dirs: tuple[Path, Path]) -> None:
    """A history with one conversation: two branches of a question, reasoning, a stopped reply."""
    store = open_default_store()
    older = store.conversations.create_conversation("Shopping list")
    store.tree.add_user_message(older.id, "Milk, eggs, bread")
    conversation = store.conversations.create_conversation("Reverse a string")
    first = store.tree.add_user_message(conversation.id, "How do I reverse a string in Python?")
    reply = store.tree.begin_assistant_message(conversation.id, first.id, "SmolLM2-135M-Instruct.Q4_1")
    store.tree.finish_assistant_message(reply, "Use slicing.", "", "complete", {})
    edited = store.tree.edit_user_message(first.id, "How do I reverse a string in Python? Show code.")
    reply = store.tree.begin_assistant_message(conversation.id, edited.id, "SmolLM2-135M-Instruct.Q4_1")
    stats = {
        "decode_tps": 42.5,
        "ttft_ms": 120.0,
        "prompt_tokens": 31,
        "generated_tokens": 48,
        "n_ctx": 4096,
        "n_ctx_used": 79,
    }
    store.tree.finish_assistant_message(
        reply, REPLY, "The user wants code. Slicing is simplest.", "complete", stats, 48
    )
    question = store.tree.add_user_message(conversation.id, "And for a list?")
    stopped = store.tree.begin_assistant_message(conversation.id, question.id, "SmolLM2-135M-Instruct.Q4_1")
    store.tree.finish_assistant_message(stopped, "Lists have a `reverse()` method, and", "", "stopped", {})
    store.close()


def make_app() -> LlmtuiApp:
    return LlmtuiApp("starter", start_engine=False)


async def loaded(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, LlmtuiApp)
    await started(pilot)
    app.model = MODEL
    app.set_engine_state("ready")
    await pilot.pause()
    chat = app.chat
    assert chat is not None
    chat.prompt.cursor_blink = False
    await pilot.pause()


def footer_items(app: LlmtuiApp) -> list[tuple[int, int, str]]:
    """(x, width, text as drawn) of each footer key of the chat, left to right, the palette key last."""
    footer = app.screen.query_one(Footer)
    keys = sorted(footer.query(FooterKey), key=lambda key: ("-command-palette" in key.classes, key.region.x))
    return [
        (key.region.x, key.region.width, key.render_lines(Region(0, 0, key.region.width, 1))[0].text) for key in keys
    ]


def assert_footer_fits(app: LlmtuiApp, width: int) -> list[str]:
    """Every footer key is drawn whole, left of the palette key, inside `width`; their labels, in order."""
    items = footer_items(app)
    *keys, palette = items
    assert palette[2].strip().endswith("palette") and palette[0] + palette[1] <= width
    right = 0
    for x, cells, text in keys:
        assert x >= right and x + cells <= palette[0], f"{text!r} at {x}+{cells} is cut by the palette at {palette[0]}"
        right = x + cells
    return [text.split(maxsplit=1)[1].strip() for _, _, text in keys]
