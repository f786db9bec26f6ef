"""What a controller may ask of the app, as Protocols: the engine, the settings and their saving, notices, a redraw.

Each controller names the narrowest one it needs, so none imports the App (app.tui.app) nor any screen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from app.core.config import Config, RemoteSettings
    from app.core.engine import Engine, ModelSummary


class Host(Protocol):
    """The App as the steering controller sees it (and what every controller gets)."""

    config: Config
    bridge: Engine
    model: ModelSummary | None
    model_path: str | None

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...

    def save_config_quietly(self) -> None:
        """Save `config`, saying so when it cannot be written."""

    def features_changed(self) -> None:
        """Redraw what shows the speculation and steering state (the meter, the stats bar's readouts)."""


class SpeculationHost(Host, Protocol):
    """What the speculation controller needs besides: whether a reply is being written, and a model reload."""

    def reply_in_progress(self) -> bool:
        """Whether the chat is writing a reply."""

    def load_model(self, path: Path) -> None:
        """Load a model file (the local engine)."""


class WorkerHost(Host, Protocol):
    """A host that runs work in a thread (Textual's run_worker) and hands results back to the event loop."""

    def run_worker(
        self,
        work: Callable[[], Any],
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
        thread: bool = False,
    ) -> Any: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


class ModelsHost(WorkerHost, Protocol):
    """What the models controller needs besides: new bridges, the engine state, a worker thread."""

    engine_overrides: dict[str, Any]
    """Engine settings for this session over the saved ones, by field name."""
    start_engine: bool

    def set_engine_state(self, state: str) -> None: ...

    def local_bridge(self) -> Engine:
        """A new local engine bridge posting to the app."""

    def remote_bridge(self, remote: RemoteSettings, model: str) -> Engine:
        """A new remote engine bridge posting to the app."""


class SteeringHost(WorkerHost, Protocol):
    """What the steering controller needs besides: a worker thread to read control-vector files in, and where the
    chat's reply being written is (its strength changes are kept with it)."""

    def reply_position(self) -> tuple[int, int] | None:
        """The chat's reply being written: its message id and the tokens it has so far; None when none."""
        ...
