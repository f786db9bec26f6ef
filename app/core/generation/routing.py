"""The router: generation events go to the one who asked (owners register their request ids: the chat, an A/B
view); a request nobody registered goes to the default owner (the chat)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from engine_ext.protocol import SpeculativeStats


class GenerationOwner(Protocol):
    """Whoever sent a generate request: what the router and the controller tell it. The surface that delivers the
    request's events adds their handlers (the TUI's `app.tui.reply_owner.ReplyOwner`)."""

    def generation_stats(self, stats: SpeculativeStats) -> None:
        """The speculative statistics of this owner's request."""

    def generation_lost(self) -> None:
        """The engine died: its requests will never end."""

    async def generation_crashed(self, description: str) -> None:
        """The engine died while this owner's reply (the default owner's) was being written."""


OwnerT = TypeVar("OwnerT", bound=GenerationOwner)


class GenerationRouter(Generic[OwnerT]):
    """request id → owner. Events of a request nobody registered (or with no id) go to `default` (the chat)."""

    def __init__(self) -> None:
        self._owners: dict[int, OwnerT] = {}
        self.default: OwnerT | None = None

    def register(self, request_id: int, owner: OwnerT) -> None:
        self._owners[request_id] = owner

    def release(self, request_id: int | None) -> None:
        if request_id is not None:
            self._owners.pop(request_id, None)

    def owner(self, request_id: int | None) -> OwnerT | None:
        """Who asked for this request: its registered owner, else the default."""
        registered = self._owners.get(request_id) if request_id is not None else None
        return registered if registered is not None else self.default

    def side_owner(self, request_id: int | None) -> OwnerT | None:
        """The registered owner of this request when it is not the default (an A/B view's run)."""
        owner = self._owners.get(request_id) if request_id is not None else None
        return owner if owner is not None and owner is not self.default else None

    def lost(self) -> None:
        """The engine died: every registered owner but the default is told (the app tells the chat itself)."""
        owners = {id(o): o for o in self._owners.values() if o is not self.default}
        self._owners.clear()
        for owner in owners.values():
            owner.generation_lost()
