"""The engine interface: what the UI, the CLI and the server ask of an engine, the local worker or a remote server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.core.config import SamplingSettings
from engine_ext.protocol import ChatMessage


class Engine(Protocol):
    """What a reply needs of an engine (EngineBridge and RemoteBridge are two)."""

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        """Queue a generation; its request id (carried by every event of that request). `tools`: OpenAI-shaped
        definitions offered to the model (an engine that cannot take them refuses the request)."""

    def cancel(self, request_id: int) -> None:
        """Stop the request; it still ends with a finished event (stop reason "cancelled")."""

    def end_thinking(self, request_id: int) -> bool:
        """Stop the request's thinking now (it answers); whether this engine can."""
