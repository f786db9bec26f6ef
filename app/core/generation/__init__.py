"""The generation controller (a reply's lifecycle, `core`) and the router that takes each request's events to whoever
asked for it (`routing`). Neither imports Textual: the TUI, the CLI and an API server drive the same code."""

from app.core.generation.core import (
    ActiveReply,
    GenerationController,
    GenerationHost,
    conversation_sampling,
    end_state,
    engine_messages,
)
from app.core.generation.routing import GenerationOwner, GenerationRouter

__all__ = [
    "ActiveReply",
    "GenerationController",
    "GenerationHost",
    "GenerationOwner",
    "GenerationRouter",
    "conversation_sampling",
    "end_state",
    "engine_messages",
]
