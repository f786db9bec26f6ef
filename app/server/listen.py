"""How the API server listens, for `llmtui serve` and the app's F10 alike: uvicorn on h11, with time limits and a
bound on connections that uvicorn lacks, and a log that says each kind of trouble in one line.

- A request's line and headers must arrive within `header_timeout_s` of the connection (or of the previous
  response): a client that sends nothing, or a byte at a time (slowloris), is closed then.
- A body that stops arriving for `body_idle_s` ends its connection; between requests a connection is kept
  `keep_alive_s` (uvicorn's keep-alive timeout).
- At most `max_connections` (512) are open, fewer under a low open-file limit (`file_bounds`): a new one closes
  the connection idle the longest, so `/health` is answered whatever idle clients hold; when none is idle it gets
  a 503 and is closed. The listening backlog is small too, so the files never run out and asyncio never loops over
  failed accepts.
- The log (uvicorn's and the event loop's) has one line per kind of trouble and at most one per `LOG_EVERY_S`
  for each, with a count of those left out: no traceback, no flood.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server.api_errors import ApiError
from engine_ext.untrusted_text import one_line

MAX_CONNECTIONS = 512
MAX_BACKLOG = 256
MAX_HEADER_BYTES = 64 * 1024  # the request line and headers
LOG_EVERY_S = 10.0
_LOGGER = "uvicorn.error"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_idle_s: float = 30.0
    keep_alive_s: int = 5
    max_connections: int = MAX_CONNECTIONS


def file_bounds(wanted: int = MAX_CONNECTIONS) -> tuple[int, int]:
    """The listening backlog and the most connections, within the process's open-file limit (ulimit -n): asyncio
    accepts up to a backlog of connections in one turn of its loop, before any is counted, and the rest of the
    process (the engine's pipe, logs, the history, MCP servers) keeps a quarter of the files, up to 128."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_BACKLOG, wanted
    backlog = max(16, min(MAX_BACKLOG, soft // 8))
    return backlog, min(wanted, max(8, soft - backlog - min(128, soft // 4)))


def server(
    app: Any, host: str, port: int, *, log_level: str, limits: ConnectionLimits = ConnectionLimits(), **extra: Any
) -> uvicorn.Server:
    """A uvicorn server for `app` on host:port with the limits above (`extra`: more of uvicorn.Config's options)."""
    backlog, max_connections = file_bounds(limits.max_connections)
    limits = ConnectionLimits(limits.header_timeout_s, limits.body_idle_s, limits.keep_alive_s, max_connections)
    protocol = type("GuardedH11", (GuardedH11,), {"limits": limits})
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        log_level=log_level,
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        backlog=backlog,
        lifespan="off",
        **extra,
    )
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, OneLineLog) for f in logger.filters):
        logger.addFilter(OneLineLog())
    return GuardedServer(config)


class GuardedServer(uvicorn.Server):
    """uvicorn's server whose event loop reports its errors (an accept that failed for want of files) through the
    one-line log."""

    async def serve(self, sockets: Any = None) -> None:
        asyncio.get_running_loop().set_exception_handler(_loop_error)
        await super().serve(sockets)


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    error = context.get("exception")
    message = str(context.get("message", "event loop error"))
    logging.getLogger(_LOGGER).error("%s", message, exc_info=error)


class OneLineLog(logging.Filter):
    """Each record as one line (an exception as its type and message), and of each kind (logger and message
    template) at most one every LOG_EVERY_S, the next saying how many were left out."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        last, left_out = self._last.get(key, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._last[key] = (last, left_out + 1)
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = (now, 0)
        text = record.getMessage().strip()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text += f": {type(error).__name__}" + (f": {error}" if str(error) else "")
        if left_out:
            text += f" ({left_out} more like it in the last {now - last:.0f} s)"
        record.msg, record.args = one_line(text), ()
        record.exc_info = record.exc_text = None
        record.__dict__.pop("color_message", None)
        return True


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for the request's headers, a time limit between body chunks, and the
    connection bound (closing the connection idle the longest)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._close_oldest_idle():
            self._refuse(ApiError(503, "the server has as many connections as it takes; try again shortly"))
            return
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow(fresh=False)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        self._follow(fresh=True)

    @property
    def idle(self) -> bool:
        """No request under way: waiting for one (its headers may have begun), or done with the last."""
        cycle = self.cycle
        return self.conn.their_state is h11.IDLE and (cycle is None or cycle.response_complete)

    def _follow(self, *, fresh: bool) -> None:
        """Set the deadline for what the client owes now: headers (from the connection or the last response; data
        does not move it), the next body chunk, or nothing while the server answers."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if fresh or self._deadline is None:
                self._arm(self.limits.header_timeout_s)
        elif state is h11.SEND_BODY:
            self._arm(self.limits.body_idle_s)
        else:
            self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        state = self.conn.their_state
        if state is h11.SEND_BODY and self.flow.read_paused:  # the server is behind, not the client
            self._arm(self.limits.body_idle_s)
        elif state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()  # the request's handler, if any, sees a disconnect

    def _close_oldest_idle(self) -> bool:
        idle = [
            c
            for c in self.connections
            if c is not self and isinstance(c, GuardedH11) and c.idle and not c.transport.is_closing()
        ]
        if not idle:
            return False
        min(idle, key=lambda c: c.idle_since).transport.close()
        return True

    def _refuse(self, error: ApiError) -> None:
        body = json.dumps(error.body()).encode()
        head = (
            f"HTTP/1.1 {error.status} Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: 2\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()
