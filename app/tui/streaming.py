"""How streamed tokens reach the screen: batched once, at one rate, with one set of constants.

The engine worker coalesces its chunks (engine_ext/generate.py, 15 a second down the pipe); the bridges
(app/tui/bridge.py, and app/tui/remote_bridge.py for a server's stream) merge what came for each request into one
`TokensArrived` per flush with `TokenBatches`, at most `FLUSH_INTERVAL_S` apart and held while the App's message queue
is longer than `BACKLOG_LIMIT`; the live reply (app/tui/widgets/live_body.py) draws each batch as it comes, deferring a
draw only when drawing takes more than `RENDER_SHARE` of a core at that rate. Nothing else batches or delays a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from app.tui.messages import DraftSpan, TokensArrived, add_span
from engine_ext.protocol import FORCED, REJECTED_PREFIX, TokenChunk

FLUSH_INTERVAL_S: Final = 1 / 20
"""Tokens reach the UI at most 20 times a second (batched in order, never dropped). The worker sends them 15 times a
second, so each batch is passed on as it arrives (no added delay); the gap only holds back bursts (a backlog drained
from the pipe at once)."""
STATS_INTERVAL_S: Final = 0.5
"""The stats bar's tok/s twice a second."""
BACKLOG_LIMIT: Final = 24
"""UI messages waiting: token batches are held (the pipe still read) until the App's queue drains below this."""
RENDER_SHARE: Final = 0.25
"""The most of a core re-rendering the live reply may take: a tail slow to render (a long code block or table) is
drawn less often than FLUSH_INTERVAL_S, so the event loop stays responsive and the engine keeps its cores."""


@dataclass
class _Pending:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    n_tokens: int = 0
    text_chars: int = 0
    draft_spans: list[DraftSpan] = field(default_factory=list)  # relative to the batch's text


class TokenBatches:
    """The tokens of each request not yet posted, merged in order; `take` empties them into one message each.

    Used from one thread (a bridge's reader); times are `time.monotonic()` seconds passed in.
    """

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}
        self.since: float | None = None
        """When the tokens not yet posted began to arrive (None: nothing is pending)."""
        self.flushed_at = -FLUSH_INTERVAL_S
        """When tokens were last taken."""

    def add(
        self, request_id: int, text: str, reasoning: str, n_tokens: int, spans: list[DraftSpan], now: float
    ) -> None:
        """Tokens of `request_id`; `spans` are relative to `text`."""
        pending = self._pending.setdefault(request_id, _Pending())
        if text:
            for start, end, source in spans:
                add_span(pending.draft_spans, pending.text_chars + start, pending.text_chars + end, source)
            pending.text.append(text)
            pending.text_chars += len(text)
        if reasoning:
            pending.reasoning.append(reasoning)
        pending.n_tokens += n_tokens
        if self.since is None:
            self.since = now

    def wait_s(self, now: float) -> float | None:
        """How long the reader may sleep before a flush is due (None: nothing pending)."""
        if self.since is None:
            return None
        return max(0.002, self.flushed_at + FLUSH_INTERVAL_S - now)

    def due(self, now: float, backlog: int, *, force: bool = False) -> bool:
        """Whether to post now: something is pending and (`force`, or the interval has passed and the App keeps up)."""
        if self.since is None:
            return False
        return force or (now - self.flushed_at >= FLUSH_INTERVAL_S and backlog <= BACKLOG_LIMIT)

    def take(self, now: float) -> list[TokensArrived]:
        """One message per request with pending tokens, in the order they first came; nothing is left pending."""
        batches = [
            TokensArrived(
                request_id,
                "".join(pending.text),
                "".join(pending.reasoning),
                pending.n_tokens,
                tuple(pending.draft_spans),
            )
            for request_id, pending in self._pending.items()
        ]
        self._pending.clear()
        self.since = None
        self.flushed_at = now
        return batches


_NOT_DRAFTED: Final = frozenset({"target", FORCED})  # the target's own tokens and the engine's forced ones


def chunk_draft_spans(chunk: TokenChunk) -> list[DraftSpan]:
    """The character ranges of `chunk.text` that came from accepted draft tokens, with their drafter, and of the
    target's tokens where a draft was rejected, with `rejected_by(drafter)` (merged, in order).

    Without per-token text ends (an older engine) a chunk counts as drafted only when all its tokens were.
    """
    if all(source in _NOT_DRAFTED for source in chunk.provenance) or not chunk.text:
        return []
    spans: list[DraftSpan] = []
    if len(chunk.text_ends) == len(chunk.provenance):
        start = 0
        for source, end in zip(chunk.provenance, chunk.text_ends, strict=True):
            if source not in _NOT_DRAFTED:
                add_span(spans, start, min(end, len(chunk.text)), source)
            start = end
    elif not any(source in _NOT_DRAFTED or source.startswith(REJECTED_PREFIX) for source in chunk.provenance):
        sources = set(chunk.provenance)
        spans.append((0, len(chunk.text), sources.pop() if len(sources) == 1 else ""))
    return spans
