"""The router: generation events go to the one who asked (owners register their request ids: the chat, an A/B
view); a request nobody registered goes to the default owner (the chat)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.tui.messages import (
        GenerationFailed,
        GenerationFinished,
        GenerationStatsUpdated,
        PromptProgressed,
        TokensArrived,
    )
    from engine_ext.protocol import SpeculativeStats


class GenerationOwner(Protocol):
    """Whoever sent a generate request and takes its events."""

    async def generation_tokens(self, event: TokensArrived) -> None: ...

    async def generation_finished(self, event: GenerationFinished) -> None: ...

    async def generation_failed(self, event: GenerationFailed) -> None: ...

    def generation_progress(self, event: PromptProgressed | GenerationStatsUpdated) -> None:
        """How far the prompt is read, or the reply's speed so far."""

    def generation_stats(self, stats: SpeculativeStats) -> None:
        """The speculative statistics of this owner's request."""

    def generation_lost(self) -> None:
        """The engine died: its requests will never end."""

    async def generation_crashed(self, description: str) -> None:
        """The engine died while this owner's reply (the default owner's) was being written."""


class GenerationRouter:
    """request id → owner. Events of a request nobody registered (or with no id) go to `default` (the chat)."""

    def __init__(self) -> None:
        self._owners: dict[int, GenerationOwner] = {}
        self.default: GenerationOwner | None = None

    def register(self, request_id: int, owner: GenerationOwner) -> None:
        self._owners[request_id] = owner

    def release(self, request_id: int | None) -> None:
        if request_id is not None:
            self._owners.pop(request_id, None)

    def owner(self, request_id: int | None) -> GenerationOwner | None:
        """Who asked for this request: its registered owner, else the default."""
        registered = self._owners.get(request_id) if request_id is not None else None
        return registered if registered is not None else self.default

    def side_owner(self, request_id: int | None) -> GenerationOwner | None:
        """The registered owner of this request when it is not the default (an A/B view's run)."""
        owner = self._owners.get(request_id) if request_id is not None else None
        return owner if owner is not None and owner is not self.default else None

    def lost(self) -> None:
        """The engine died: every registered owner but the default is told (the app tells the chat itself)."""
        owners = {id(o): o for o in self._owners.values() if o is not self.default}
        self._owners.clear()
        for owner in owners.values():
            owner.generation_lost()
