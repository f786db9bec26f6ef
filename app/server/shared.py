"""The app's API server: requests run on the model the app has loaded, in its own worker, between the chat's replies
(the bridge schedules them: `app/core/engine_share.py`), each with its own speculative settings and steering mix.

`SharedBackend` is the dispatcher the HTTP side talks to; `AppServer` starts and stops uvicorn in a thread of the
app's process and says what it serves (address, requests in flight) to the status bar. No Textual here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.core.engine_share import SharedEngine, SharedJob
from app.core.server_access import Access
from app.server.api_errors import ApiError
from app.server.backend import Dispatcher, ServerSettings, Ticket
from app.server.metrics import Metrics
from engine_ext.params import SpeculativeParams
from engine_ext.protocol import Event, SetSpeculative, SetSteering

if TYPE_CHECKING:
    import uvicorn

_POLL_S = 0.05  # how often a waiting request looks at its cancel flag
_STOP_WAIT_S = 5.0


class SharedBackend(Dispatcher):
    """Tickets in arrival order, each handed to the app's engine and followed to its end."""

    def __init__(self, engine: SharedEngine, settings: ServerSettings, metrics: Metrics) -> None:
        self._engine = engine
        super().__init__(settings, metrics)

    def _serve(self, ticket: Ticket) -> None:
        ticket.request_id = request_id = self._engine.request_id()
        ended = threading.Event()

        def sink(event: Event) -> None:  # in the bridge's thread
            if self._event(ticket, event):
                ended.set()

        job = SharedJob(
            self._generate(ticket, request_id),
            SetSpeculative(ticket.spec if ticket.spec.types else SpeculativeParams(types=())),
            SetSteering(ticket.steering, reset_cache=True),
            sink,
        )
        self._engine.serve(job)
        cancel_sent = False
        while not ended.wait(_POLL_S):
            if ticket.cancelled.is_set() and not cancel_sent:
                cancel_sent = True
                self._engine.cancel_served(request_id)


@dataclass(frozen=True)
class ServerAddress:
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


class AppServer:
    """uvicorn in a thread of the app's process, serving `backend`; `start` says within a bounded wait whether it
    listens (a port in use is one line), `stop` stops it and fails what still waits."""

    def __init__(
        self,
        engine: SharedEngine,
        settings: ServerSettings,
        address: ServerAddress,
        *,
        api_key: str | None = None,
        access: Access | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.metrics = Metrics()
        self.backend = SharedBackend(engine, settings, self.metrics)
        self.address = address
        self._engine = engine
        self._api_key = api_key
        self._access = access or Access(listen_host=address.host)
        self._on_error = on_error
        self._server: uvicorn.Server | None = None  # it listens to no signal: not the main thread
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        """Listen; ApiError(500, one line) when it cannot (the port is taken, the address is not this machine's)."""
        from app.server import listen
        from app.server.asgi import build_app

        app = build_app(self.backend, self.metrics, api_key=self._api_key, access=self._access)
        server = listen.server(
            app,
            self.address.host,
            self.address.port,
            log_level="critical",
            timeout_graceful_shutdown=2,  # stop() waits on the app's thread: open connections get this long
        )
        failure: list[BaseException] = []

        def run() -> None:
            try:
                server.run()
            except BaseException as e:  # SystemExit when it cannot bind: said by start, or later by on_error
                failure.append(e)
            if not server.started and self._on_error is not None and failure:
                self._on_error(_bind_message(self.address, failure[0]))

        self._server = server
        self._thread = threading.Thread(target=run, name="llmtui-app-server", daemon=True)
        self._thread.start()
        deadline = timeout_s
        while deadline > 0 and not server.started and self._thread.is_alive():
            self._thread.join(0.05)
            deadline -= 0.05
        if not server.started:
            self.stop()
            raise ApiError(500, _bind_message(self.address, failure[0] if failure else None, timeout_s))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def in_flight(self) -> tuple[int, int]:
        """Requests generating and waiting now."""
        return self.metrics.queue_now()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(_STOP_WAIT_S)
        self._engine.stop_serving("the app's server stopped")
        # On the app's thread: no long wait for a request still ending (the dispatcher is a daemon thread; its
        # request was cancelled when uvicorn closed the connection).
        self.backend.close(timeout_s=0.5)


def _bind_message(address: ServerAddress, error: BaseException | None, timeout_s: float = 0.0) -> str:
    where = f"{address.host}:{address.port}"
    if error is None:
        return f"the server did not start listening on {where} within {timeout_s:.0f} s"
    if isinstance(error, SystemExit):  # uvicorn logs the OSError and exits: the usual cause
        return f"cannot listen on {where}: the port is in use or the address is not this machine's"
    return f"cannot listen on {where}: {type(error).__name__}: {str(error)[:200]}"
