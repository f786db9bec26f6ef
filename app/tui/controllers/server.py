"""The app's API server (F10): the model the app has loaded, served to other programs while you chat, on the same
worker (app/server/shared.py; the bridge runs its requests between the chat's replies, app/core/engine_share.py);
or, with `[server] router = true`, every local model: `llmtui serve` without -m as a child process
(app/server/router_process.py), whose loaded models the model switcher marks.

What a request does not ask for is what the app uses now: its default sampling, its speculative settings and its
steering mix (a slider moved in the app steers the next API reply too); a request may name any vector in the
steering folder or the app's mix, and the n-gram speculative types (model drafters as the app has loaded them).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app.core.remote_http import RemoteError
from app.core.server_access import Access, api_key_refusal, loopback, split_names
from app.server.api_errors import ApiError
from app.server.backend import ServerSettings
from app.server.router_process import RouterProcess
from app.server.shared import AppServer, ServerAddress
from app.tui.controllers.host import WorkerHost

ROUTER_POLL_S = 2.0  # how often the router's loaded models are read while it runs

if TYPE_CHECKING:
    from app.core.config import SamplingSettings
    from app.tui.controllers.steering import SteeringController


class ServerHost(WorkerHost, Protocol):
    default_sampling: SamplingSettings
    steering: SteeringController


class ServerController:
    """Starts and stops the app's server, keeps what it answers with in step with the app, says what it serves."""

    def __init__(self, host: ServerHost) -> None:
        self.host = host
        self.server: AppServer | RouterProcess | None = None
        self.starting = False
        self.served: frozenset[str] = frozenset()
        """The router's loaded models, by their ids (app.core.model_presets.serve_id); empty without the router."""
        self._read_at = 0.0
        self._readout = ""
        self._vectors: dict[str, str] = {}  # the steering folder's vectors, read in a thread when the server starts
        self._answered_with: ServerSettings | None = None

    @property
    def running(self) -> bool:
        return self.server is not None

    def toggle(self) -> None:
        if self.server is not None:
            self.stop()
        elif not self.starting:
            self.start()

    def start(self) -> None:
        """Listen on the configured address (in a thread: binding waits up to a few seconds); one line if not."""
        host, config = self.host, self.host.config.server
        bridge = host.bridge.shared_engine()
        api_key = os.environ.get(config.api_key_env, "") if config.api_key_env else None
        if config.api_key_env and not api_key:
            host.notify(
                f"The API key variable {config.api_key_env} is not set or empty: "
                "set it, or clear it in F3 → API server.",
                severity="error",
            )
            return
        why = api_key_refusal(api_key) if api_key else None
        if why is not None:
            host.notify(f"The API key in {config.api_key_env} cannot be used: {why}.", severity="error")
            return
        if config.router:
            self._start_router()
            return
        if bridge is None:
            host.notify("The API server serves the app's own engine: ctrl+l back to it first.", severity="warning")
            return
        if host.model is None:
            host.notify("Load a model first (F4): the API server serves the model the app has loaded.")
            return
        access = Access(
            listen_host=config.host,
            allowed_hosts=split_names(config.allowed_hosts),
            cors=split_names(config.cors_origins),
            host_hint="add the name to F3 → API server → allowed host names",
            origin_hint="add the page's origin to F3 → API server → CORS origins",
        )
        server = AppServer(
            bridge,
            self.settings(),
            ServerAddress(config.host, config.port),
            api_key=api_key,
            access=access,
            on_error=lambda message: host.call_from_thread(self._failed, message),
        )
        self.starting = True

        def listen() -> None:
            vectors = steering_vectors()  # read again (vectors made since the last start), off the UI thread
            self._vectors = vectors
            settings = server.backend.settings
            server.backend.settings = replace(settings, vectors={**vectors, **settings.vectors})
            try:
                server.start()
            except ApiError as error:
                host.call_from_thread(self._failed, error.message)
            else:
                host.call_from_thread(self._started, server)

        host.run_worker(listen, thread=True, group="api-server", exit_on_error=False)

    def _start_router(self) -> None:
        """`llmtui serve` without -m, in a child process (its start waits for it to answer: in a thread)."""
        from app.core import paths

        host, config = self.host, self.host.config.server
        router = RouterProcess(
            ServerAddress(config.host, config.port),
            paths.log_dir() / "serve-router.log",
            api_key_env=config.api_key_env,
            allowed_hosts=split_names(config.allowed_hosts),
            cors=split_names(config.cors_origins),
        )
        self.starting = True

        def listen() -> None:
            try:
                router.start()
            except ApiError as error:
                host.call_from_thread(self._failed, error.message)
            else:
                host.call_from_thread(self._started, router)

        host.run_worker(listen, thread=True, group="api-server", exit_on_error=False)

    def _started(self, server: AppServer | RouterProcess) -> None:
        self.starting = False
        self.server = server
        note = "" if self.host.config.server.api_key_env else " (no API key: anyone on this machine can use it)"
        if not loopback(server.address.host) and not self.host.config.server.api_key_env:
            note = " (no API key: anyone who can reach this machine can use it)"
        what = "every local model" if isinstance(server, RouterProcess) else self.settings().model_id
        self.host.notify(f"Serving {what} at {server.address.url()}{note}. F10 stops it.")
        self.poll(force=True)

    def _failed(self, message: str) -> None:
        self.starting = False
        if self.server is not None:  # it stopped after it had started
            self.server = None
        self.host.notify(f"API server: {message}", severity="error")
        self.poll(force=True)

    def stop(self, *, quiet: bool = False) -> None:
        server, self.server = self.server, None
        self.served = frozenset()
        if server is None:
            return
        server.stop()  # the router: Ctrl+C to it now, its end awaited in a thread
        if not quiet:
            self.host.notify("The API server stopped.")
        self.poll(force=True)

    def config_changed(self) -> None:
        """The [server] settings were saved: a running server listens anew on the address, with the key."""
        if self.server is not None:
            self.stop(quiet=True)
            self.start()

    def settings(self) -> ServerSettings:
        """What requests get when they do not say: the app's current settings and loaded model."""
        host = self.host
        model = host.model
        entries = host.steering.entries()
        vectors = dict(self._vectors)
        vectors.update({Path(entry.path).stem: entry.path for entry in entries})
        return ServerSettings(
            model_id=Path(model.path).name if model is not None else "none",
            model_path=str(model.path) if model is not None else "",
            sampling=host.default_sampling.sampling_params(),
            speculative=host.config.speculative.params(),
            steering=entries,
            vectors=vectors,
            n_ctx=model.n_ctx if model is not None else 0,
        )

    def app_changed(self) -> None:
        """The app loaded another model or changed its settings: the next requests follow."""
        if isinstance(self.server, AppServer):
            settings = self.settings()
            if settings != self.server.backend.settings:
                self.server.backend.settings = settings

    def readout(self) -> str:
        """The stats bar's "api" readout: the address, the last client that asked for a reply (its User-Agent,
        shortened), and the requests running and waiting ('' when off)."""
        return "".join(self.readout_parts())

    def readout_parts(self) -> tuple[str, str]:
        """The readout as (where and who, the requests): the stats bar cuts the first at 80 columns so the
        requests running and waiting stay in view ("", "") when off."""
        server = self.server
        if server is None:
            return ("starting" if self.starting else "", "")
        address = (
            f":{server.address.port}"
            if loopback(server.address.host)
            else f"{server.address.host}:{server.address.port}"
        )
        if isinstance(server, RouterProcess):
            return address, f" {len(self.served)} loaded"
        agent = server.metrics.last_client
        if agent:
            address = f"{address} {agent}"
        running, waiting = server.in_flight()
        if not running and not waiting:
            return address, ""
        return address, f" {running} running" + (f" +{waiting}" if waiting else "")

    def poll(self, *, force: bool = False) -> None:
        """Redraw the readout when it changed (the app calls this every second while serving); the router's loaded
        models are read every ROUTER_POLL_S, in a thread."""
        router = self.server
        if isinstance(router, RouterProcess) and time.monotonic() - self._read_at >= ROUTER_POLL_S:
            self._read_at = time.monotonic()
            self.host.run_worker(
                lambda: self._read_models(router),
                thread=True,
                group="router-models",
                exclusive=True,
                exit_on_error=False,
            )
        readout = self.readout()
        if force or readout != self._readout:
            self._readout = readout
            self.host.features_changed()

    def _read_models(self, router: RouterProcess) -> None:
        """(A thread.) The router's loaded models, handed to the app's thread; nothing when it does not answer."""
        try:
            loaded = frozenset(model.id for model in router.models() if model.loaded)
        except RemoteError:
            return
        self.host.call_from_thread(self._models_read, router, loaded)

    def _models_read(self, router: RouterProcess, loaded: frozenset[str]) -> None:
        if self.server is router and loaded != self.served:
            self.served = loaded
            self.poll(force=True)


MAX_VECTORS = 1000  # the steering folder's vectors a request may name: listing stops here


def steering_vectors() -> dict[str, str]:
    """The control vectors in the steering folder, by name (a folder read: call it in a thread)."""
    from app.core import paths

    try:
        found = list(itertools.islice(paths.steering_dir().glob("*.gguf"), MAX_VECTORS))
    except OSError:
        return {}
    return {p.stem: str(p) for p in sorted(found)}
