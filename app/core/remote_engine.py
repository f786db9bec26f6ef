"""A remote OpenAI-compatible server as the engine: its names ("remote:NAME/MODEL"), a reply's limits and state."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Final

from app.core.config import RemoteSettings
from app.core.remote_http import SSE_LINE_TIME_S
from models_catalog.http_client import Guard

REMOTE_PREFIX: Final = "remote:"
# A reply's headers, once their first byte came (the server may think up to the read timeout before it answers),
# within this long however slowly they drip, as a stream line is.
HEADER_TIME_S: Final = SSE_LINE_TIME_S
# A reply is stopped (its text kept) past these, whatever was asked: tokens when neither max_tokens nor the server's
# context says (a server streaming one-token chunks without end grew the reply without bound), and characters of
# text and reasoning together in any case (a chunk may hold a megabyte).
MAX_REPLY_TOKENS: Final = 131_072
MAX_REPLY_CHARS: Final = 8 * 1024 * 1024
TOKEN_SLACK: Final = 16  # chunks a server may send past max_tokens (some send a token or two per chunk)
MAX_EVENT_ITEMS: Final = 50_000
STOP_REASONS: Final = {"stop": "eos", "length": "max_tokens", "eos": "eos"}

# Request ids far from the local bridge's (which count from 1), so a late event of one engine is never taken for
# the other's reply after a switch.
_request_ids = itertools.count(1 << 30)


@dataclass(frozen=True)
class RemoteChoice:
    """A remote endpoint and one of its models, as the model switcher returns it."""

    remote: RemoteSettings
    model: str

    @property
    def path(self) -> str:
        """How the app names this model where it would name a file ("remote:NAME/MODEL")."""
        return remote_path(self.remote.name, self.model)


def remote_path(name: str, model: str) -> str:
    return f"{REMOTE_PREFIX}{name}/{model}"


class _Cancelled(Exception):
    pass


@dataclass
class _Stream:
    """One streamed reply."""

    request_id: int
    sent_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    guard: Guard = field(default_factory=Guard)  # the request's; its abort() stops it at once
    cancelled: bool = False
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    n_pending: int = 0
    n_tokens: int = 0
    n_chars: int = 0  # of text and reasoning
    first_token_at: float | None = None
    last_token_at: float | None = None
    stats_posted_at: float = 0.0

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
        self.guard.abort()  # wakes a read blocked in the stream's thread at once, even before the headers


def draft_summary(stats: dict[str, Any]) -> str | None:
    """The stats bar's readout of a server's speculative decoding ("71% 45/63"), when it reported it."""
    drafted, accepted = stats.get("draft_n"), stats.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int) or drafted <= 0:
        return None
    return f"{accepted / drafted:.0%} {accepted}/{drafted}"
