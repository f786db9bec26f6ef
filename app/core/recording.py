"""Writing a streamed reply into the history store: checkpoints every second or 256 tokens, then the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from app.core.store import JSONObject, MessageState, Store

CHECKPOINT_INTERVAL_S: Final = 1.0
CHECKPOINT_TOKENS: Final = 256


class ReplyRecorder:
    """Accumulates one reply's text and saves it by updating its row, so a crash loses at most a second."""

    def __init__(
        self,
        store: Store,
        message_id: int,
        *,
        content: str = "",
        reasoning: str = "",
        interval_s: float = CHECKPOINT_INTERVAL_S,
        max_tokens_between: int = CHECKPOINT_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.message_id = message_id
        self.interval_s = interval_s
        self.max_tokens_between = max_tokens_between
        self._clock = clock
        self._content: list[str] = [content] if content else []
        self._reasoning: list[str] = [reasoning] if reasoning else []
        self.tokens = 0
        """Tokens appended so far."""
        self._tokens_at_checkpoint = 0
        self._checkpoint_at = clock()
        self.finished = False

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def append(self, text: str, reasoning: str, n_tokens: int) -> bool:
        """Add streamed text; checkpoint when a second or 256 tokens passed since the last one. Whether it did."""
        if text:
            self._content.append(text)
        if reasoning:
            self._reasoning.append(reasoning)
        self.tokens += n_tokens
        now = self._clock()
        if (
            now - self._checkpoint_at >= self.interval_s
            or self.tokens - self._tokens_at_checkpoint >= self.max_tokens_between
        ):
            self.checkpoint()
            return True
        return False

    def checkpoint(self) -> None:
        """Save the text so far now (one row update)."""
        content, reasoning = self.content, self.reasoning
        self._content, self._reasoning = [content], [reasoning]
        self.store.tree.checkpoint_assistant_message(self.message_id, content, reasoning)
        self._tokens_at_checkpoint = self.tokens
        self._checkpoint_at = self._clock()

    def finish(self, state: MessageState, stats: JSONObject | None = None) -> None:
        """Record the final text and how the reply ended (idempotent)."""
        if self.finished:
            return
        self.finished = True
        self.store.tree.finish_assistant_message(
            self.message_id, self.content, self.reasoning, state, stats or {}, self.tokens or None
        )
