"""What the TUI's owners of a generate request take (the chat, an A/B view): the core's `GenerationOwner` and the
handlers of the request's events, as the routing table (app/tui/engine_events.py) delivers them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from app.core.generation import GenerationOwner

if TYPE_CHECKING:
    from app.tui.messages import (
        GenerationFailed,
        GenerationFinished,
        GenerationStatsUpdated,
        PromptProgressed,
        TokensArrived,
    )


class ReplyOwner(GenerationOwner, Protocol):
    """Whoever sent a generate request in the app and takes its events."""

    async def generation_tokens(self, event: TokensArrived) -> None: ...

    async def generation_finished(self, event: GenerationFinished) -> None: ...

    async def generation_failed(self, event: GenerationFailed) -> None: ...

    def generation_progress(self, event: PromptProgressed | GenerationStatsUpdated) -> None:
        """How far the prompt is read, or the reply's speed so far."""
