"""The request log of `llmtui serve`: one line per request once it is answered, as llama-server prints one (method,
path, status, tokens, time), to stderr unless `--no-request-log`. An ASGI middleware outside the gate, so refused
requests are logged too; the handlers note each reply's end (`note_finished`) in the request's scope, where the
line finds its tokens. What a client sent (its path) is shown harmless and bounded. A health check answered 200
is left out (monitors and `serve`'s own start poll it), as llama-server leaves it out."""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine_ext.protocol import Finished
from engine_ext.untrusted_text import one_line

_FINISHED: Final = "llmtui_finished"
"""The key, in the scope's `state`, of the replies the request was answered with."""
MAX_PATH_CHARS: Final = 120
QUIET_PATHS: Final = frozenset({"/health", "/v1/health"})
"""Paths not logged when answered 200."""


def note_finished(scope: MutableMapping[str, Any], finished: Finished) -> None:
    """Remember a reply of the request (a completion of several prompts has several) for its log line."""
    state = scope.setdefault("state", {})
    state.setdefault(_FINISHED, []).append(finished)


def log_line(
    method: str, path: str, client: str, status: int, finished: list[Finished], seconds: float, cut: bool = False
) -> str:
    """`127.0.0.1 POST /v1/chat/completions 200 · prompt 27 (12 cached) · 48 generated · drafts 20, 15 accepted
    · 1.93 s`; a request without a reply (GET /health, a refusal) has no token figures; an answer whose end was
    never sent (the client closed a stream) says `cut off`."""
    parts = [f"{client} {method} {one_line(path, MAX_PATH_CHARS)} {status or '-'}"]
    if finished:
        prompt = sum(f.stats.prompt_tokens for f in finished)
        cached = sum(f.stats.prompt_tokens_cached for f in finished)
        parts.append(f"prompt {prompt}" + (f" ({cached} cached)" if cached else ""))
        parts.append(f"{sum(f.stats.generated_tokens for f in finished)} generated")
        drafted = sum(f.speculative.drafted for f in finished if f.speculative is not None)
        if drafted:
            accepted = sum(f.speculative.accepted for f in finished if f.speculative is not None)
            parts.append(f"drafts {drafted}, {accepted} accepted")
    parts.append(f"{seconds:.2f} s")
    if cut:
        parts.append("cut off before its end (the client closed it, or the server stopped)")
    return " · ".join(parts)


class RequestLog:
    """ASGI middleware: each HTTP request, once its answer is sent (or it failed), as one line to `write`."""

    def __init__(self, app: ASGIApp, write: Callable[[str], None]) -> None:
        self.app = app
        self.write = write

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 0
        ended = False

        async def sending(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if status != 200 or scope["path"] not in QUIET_PATHS:
                client = scope.get("client")
                finished = scope.get("state", {}).get(_FINISHED, [])
                where = str(client[0]) if client else "-"
                seconds = time.monotonic() - started
                cut = bool(status) and not ended
                self.write(log_line(scope["method"], scope["path"], where, status, finished, seconds, cut))
