"""F10 with `[server] router = true`: `llmtui serve` without -m (every local model, each loaded on demand in a worker
of its own: app/server/model_router.py) as a child process of the app, on the [server] address, key, host names and
origins; which models it has loaded read from its GET /v1/models. No Textual."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from app.core.config import RemoteSettings
from app.core.remote_http import RemoteError, RemoteModel, list_models
from app.server.api_errors import ApiError
from app.server.shared import ServerAddress
from engine_ext.private_files import private_dir
from engine_ext.untrusted_text import one_line

_STOP_WAIT_S = 10.0  # after Ctrl+C (SIGINT) the router ends its workers; past this it is killed
_POLL_S = 0.2


class RouterProcess:
    """`llmtui serve` (no -m) started by the app; `start` waits until it answers, `stop` ends it and its workers."""

    def __init__(
        self,
        address: ServerAddress,
        log_path: Path,
        *,
        api_key_env: str = "",
        allowed_hosts: tuple[str, ...] = (),
        cors: tuple[str, ...] = (),
    ) -> None:
        self.address = address
        self.log_path = log_path
        self.args = ["--host", address.host, "--port", str(address.port)]
        self.args += [arg for name in allowed_hosts for arg in ("--allowed-host", name)]
        self.args += [arg for origin in cors for arg in ("--cors", origin)]
        if api_key_env:
            self.args += ["--api-key-env", api_key_env]
        self.remote = RemoteSettings("the router", address.url(), api_key_env=api_key_env)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start it and wait until it lists its models; ApiError(500, one line: its own last words) when not."""
        private_dir(self.log_path.parent)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "app", "serve", *self.args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ApiError(500, f"llmtui serve stopped: {self._last_words()}")
            try:
                list_models(self.remote, timeout=1.0)
                return
            except RemoteError:
                time.sleep(_POLL_S)
        self.stop()
        raise ApiError(500, f"llmtui serve did not answer within {timeout_s:.0f} s (its log: {self.log_path})")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def models(self) -> list[RemoteModel]:
        """Its models, each saying whether it is loaded (GET /v1/models: a request, call it in a thread)."""
        return list_models(self.remote, timeout=2.0)

    def stop(self) -> threading.Thread | None:
        """Ctrl+C to it now (it cancels its requests and ends its workers); a thread kills it if it is still there
        after a while (returned, for those who wait: the app does not)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return None
        process.send_signal(signal.SIGINT)

        def reap() -> None:
            try:
                process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_WAIT_S)

        thread = threading.Thread(target=reap, name="llmtui-router-stop", daemon=True)
        thread.start()
        return thread

    def _last_words(self) -> str:
        try:
            lines = self.log_path.read_bytes()[-4096:].decode("utf-8", "replace").strip().splitlines()
        except OSError:
            lines = []
        return one_line(lines[-1], 240) if lines else f"see {self.log_path}"
