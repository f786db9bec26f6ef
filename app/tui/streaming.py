"""How streamed tokens reach the screen: batched once, at one rate, with one set of constants.

The engine worker coalesces its chunks (engine_ext/generate.py, 15 a second down the pipe); the bridges
(app/tui/bridge.py, and app/tui/remote_bridge.py for a server's stream) merge what came for each request into one
`TokenChunk` per flush with `TokenBatches`, at most `FLUSH_INTERVAL_S` apart and held while the App's message queue
is longer than `BACKLOG_LIMIT`, and measure each reply's live figures (`ReplyInFlight.stats`, every
`STATS_INTERVAL_S`); the live reply (app/tui/widgets/live_body.py) draws each batch as it comes, deferring a
draw only when drawing takes more than `RENDER_SHARE` of a core at that rate. Nothing else batches or delays a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from app.core.engine import ReplyStats
from app.tui.messages import DraftSpan, add_span
from engine_ext.cpu import CpuLoad
from engine_ext.protocol import FORCED, REJECTED_PREFIX, Generate, TokenChunk

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
    token_ids: list[int] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    text_ends: list[int] = field(default_factory=list)  # per token, relative to the batch's text
    text_chars: int = 0


class TokenBatches:
    """The token chunks of each request not yet posted, merged in order; `take` empties them into one chunk each.

    Used from one thread at a time (a bridge's reader); times are `time.monotonic()` seconds passed in.
    """

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}
        self.since: float | None = None
        """When the tokens not yet posted began to arrive (None: nothing is pending)."""
        self.flushed_at = -FLUSH_INTERVAL_S
        """When tokens were last taken."""

    def add(self, chunk: TokenChunk, now: float) -> None:
        """A chunk of `chunk.request_id`'s reply, after the ones before it."""
        pending = self._pending.setdefault(chunk.request_id, _Pending())
        # a chunk without per-token text ends (an older engine) ends each token where the chunk's text ends
        ends = (
            chunk.text_ends
            if len(chunk.text_ends) == len(chunk.token_ids)
            else (len(chunk.text),) * len(chunk.token_ids)
        )
        pending.text_ends.extend(pending.text_chars + end for end in ends)
        pending.token_ids.extend(chunk.token_ids)
        pending.provenance.extend(chunk.provenance)
        if chunk.text:
            pending.text.append(chunk.text)
            pending.text_chars += len(chunk.text)
        if chunk.reasoning:
            pending.reasoning.append(chunk.reasoning)
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

    def take(self, now: float) -> list[TokenChunk]:
        """One chunk per request with pending tokens, in the order they first came; nothing is left pending."""
        batches = [
            TokenChunk(
                request_id,
                "".join(pending.text),
                "".join(pending.reasoning),
                tuple(pending.token_ids),
                tuple(pending.provenance),
                tuple(pending.text_ends),
            )
            for request_id, pending in self._pending.items()
        ]
        self._pending.clear()
        self.since = None
        self.flushed_at = now
        return batches


@dataclass
class ReplyInFlight:
    """A reply a bridge has sent and not yet seen end, and its live figures."""

    request_id: int
    sent_at: float
    first_token_at: float | None = None
    n_tokens: int = 0
    stats_posted_at: float = 0.0
    prompt_tokens: int | None = None  # once the prompt is evaluated
    n_ctx: int | None = None
    request: Generate | None = None  # what was sent (sent again when the engine is restarted after an early crash)
    held_s: float = 0.0  # how long it waited to be sent (behind the API server's requests): `sent_at` is the ask

    def took(self, chunk: TokenChunk, now: float) -> None:
        """Count a chunk of this reply's tokens."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.n_tokens += len(chunk.token_ids)

    def stats_due(self, now: float) -> bool:
        """Whether its live figures are due (every STATS_INTERVAL_S); if so, from now on they are not."""
        if now - self.stats_posted_at < STATS_INTERVAL_S:
            return False
        self.stats_posted_at = now
        return True

    def stats(self, now: float, cpu: CpuLoad | None = None) -> ReplyStats:
        """Its figures now: the decode speed after the first token (None before it) and the time to it."""
        first = self.first_token_at
        rate: float | None = None
        ttft_ms: float | None = None
        if first is not None:
            elapsed = now - first
            rate = (self.n_tokens - 1) / elapsed if elapsed > 0 and self.n_tokens > 1 else 0.0
            ttft_ms = (first - self.sent_at) * 1000
        return ReplyStats(self.request_id, self.n_tokens, rate, ttft_ms, self.prompt_tokens, self.n_ctx, cpu)


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
