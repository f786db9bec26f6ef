"""The one Textual message the engines post to the App: an engine event (app/core/engine.py's `EngineEvent`: the
engine protocol's events and the app side's own), under its own name, with the engine that said it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from textual.message import Message

from app.core.engine import EngineEvent, ReplyStats
from engine_ext.protocol import LoadProgress, SpeculativeUpdate, VectorProgress

if TYPE_CHECKING:
    from app.core.engine import Engine


class MessageTarget(Protocol):
    """What the bridges post their messages to (the App; a collector in tests)."""

    def post_message(self, message: Message) -> bool: ...


DraftSpan = tuple[int, int, str]
"""[start, end) of a text that came from accepted draft tokens, and the drafter that proposed them ("": not known)."""


def add_span(spans: list[DraftSpan], start: int, end: int, source: str = "") -> None:
    """Append [start, end) from drafter `source` to sorted, disjoint `spans`, merging it with the last one when they
    touch and came from the same drafter."""
    if end <= start:
        return
    if spans and spans[-1][1] >= start and spans[-1][2] == source:
        spans[-1] = (spans[-1][0], max(spans[-1][1], end), source)
    else:
        spans.append((start, end, source))


class EngineMessage(Message, bubble=False):
    """An engine event for the App. `engine`: the engine that said it (an event of one switched away from is stale);
    `answers`: the app's request an event answers when the event itself does not say ("load", "speculative",
    "steering" or "vector"; empty: its request id says, or it answers none).

    Token chunks (merged in order, `app/tui/streaming.py`) are never replaced; a newer progress or live figure
    (LoadProgress, ReplyStats of the same reply, SpeculativeUpdate, VectorProgress) replaces one not yet handled.
    """

    def __init__(self, event: EngineEvent, engine: Engine, answers: str = "") -> None:
        super().__init__()
        self.event = event
        self.engine = engine
        self.answers = answers

    def can_replace(self, message: Message) -> bool:
        if not isinstance(message, EngineMessage) or message.engine is not self.engine:
            return False
        old, new = self.event, message.event
        if isinstance(old, ReplyStats):
            return isinstance(new, ReplyStats) and new.request_id == old.request_id
        return isinstance(old, LoadProgress | SpeculativeUpdate | VectorProgress) and type(new) is type(old)
