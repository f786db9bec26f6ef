"""What the app starts with, read in a thread before the first screen: the settings, the history (opened, migrated,
old deletions purged) and the model or remote engine to start with, with the notices to show once it has started."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from textual.message import Message
from textual.notifications import SeverityLevel

from app.core.config import Config, ConfigError, load_config
from app.core.model_paths import ModelNotFound, resolve_model, starter_model_path
from app.core.owner_only_dirs import secure_app_dirs, take_notice
from app.core.remote_engine import REMOTE_PREFIX, RemoteChoice
from app.core.store import Store, StoreError, open_default_store

Notice = tuple[str, SeverityLevel, float]
"""A notification to show once the app has started: (message, severity, seconds)."""


@dataclass
class StartUp:
    """What the start-up thread read for the app: its settings, its history, the model to start with."""

    config: Config = field(default_factory=Config)
    store: Store | None = None
    failure: str = ""  # why the history could not be opened (the app exits saying so)
    remote: RemoteChoice | None = None
    model: Path | None = None
    notices: list[Notice] = field(default_factory=list)


class StartUpRead(Message):
    """The start-up thread has read what the app starts with."""

    def __init__(self, start: StartUp) -> None:
        super().__init__()
        self.start = start


# A deleted conversation can be brought back (u) only in the session that deleted it; a start removes for good those
# deleted a day or more before (and the image files only they used), leaving a session running beside it its undo.
PURGE_DELETED_AFTER = timedelta(days=1)


def read_start_up(requested_model: str | None) -> StartUp:
    """Everything the app starts with (file reads, maybe a Hugging Face cache scan: call it in a thread).
    `requested_model`: a path or 'starter' (default: the last model used, else the starter)."""
    start = StartUp()
    try:
        secure_app_dirs()
    except OSError as error:
        start.notices.append((f"cannot make llmtui's folders owner-only: {error}", "warning", 15))
    try:
        start.config = load_config()
    except ConfigError as error:
        start.notices.append((f"{error}. Using default settings until you save new ones (F3).", "error", 15))
    try:
        start.store = open_default_store()
    except StoreError as error:
        start.failure = f"llmtui: {error}"
    else:
        if start.store.startup_notice:
            start.notices.append((start.store.startup_notice, "warning", 20))
        try:
            start.store.conversations.purge_deleted(PURGE_DELETED_AFTER)
        except (StoreError, OSError) as error:
            start.notices.append((f"could not remove deleted conversations: {error}", "warning", 10))
        tightened = take_notice()  # said once: after tightening, the modes are right
        if tightened:
            start.notices.append((tightened, "warning", 20))
        start.remote = initial_remote(requested_model, start.config)
        if start.remote is None:
            start.model = initial_model(requested_model, start.config, start.notices)
    return start


def initial_remote(requested_model: str | None, config: Config) -> RemoteChoice | None:
    """The remote engine's model used last, when no model was asked for and that endpoint is still configured."""
    if requested_model or not config.last_model.startswith(REMOTE_PREFIX):
        return None
    name, _, model = config.last_model.removeprefix(REMOTE_PREFIX).partition("/")
    remote = next((r for r in config.remotes if r.name == name), None)
    return RemoteChoice(remote, model) if remote is not None else None


def initial_model(requested_model: str | None, config: Config, notices: list[Notice]) -> Path | None:
    """The model asked for (else a notice why not), the last one used, or the starter model (file reads and
    maybe a Hugging Face cache scan: in the start-up thread)."""
    if requested_model:
        try:
            return resolve_model(requested_model)
        except ModelNotFound as error:
            notices.append((str(error), "error", 15))
    if config.last_model and Path(config.last_model).is_file():
        return Path(config.last_model)
    return starter_model_path()
