"""What the TUI's owners of a generate request take (the chat, an A/B view): the core's `GenerationOwner` and the
handlers of the request's events, as the routing table (app/tui/engine_events.py) delivers them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from app.core.generation import GenerationOwner

if TYPE_CHECKING:
    from app.core.engine import ReplyHeld, ReplyStats
    from engine_ext.protocol import Failed, Finished, PromptProgress, TokenChunk


class ReplyOwner(GenerationOwner, Protocol):
    """Whoever sent a generate request in the app and takes its events."""

    async def generation_tokens(self, event: TokenChunk) -> None:
        """The reply's next text (chunks merged in order: app/tui/streaming.py)."""

    async def generation_finished(self, event: Finished) -> None: ...

    async def generation_failed(self, event: Failed) -> None: ...

    def generation_progress(self, event: PromptProgress | ReplyStats | ReplyHeld) -> None:
        """How far the prompt is read, the reply's speed so far, or what it waits for before it starts."""
