"""What screens, modals and widgets may use of the app, beyond Textual's App: its state and its controllers.

LlmtuiApp (app.tui.app) is the one subclass. Screens type `self.app` as `LlmtuiShell`, so they never import the App
module (which imports them): screens talk to controllers and to this, never to app.tui.app. The methods are declared
abstract: mypy refuses to create an App that lacks one, and tests/unit/test_import_hygiene.py checks LlmtuiApp has
them all.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App

if TYPE_CHECKING:
    from app.core.config import Config
    from app.core.engine import Engine, ModelSummary
    from app.core.generation import GenerationController
    from app.core.store import Store
    from app.tui.controllers import (
        ConversationsController,
        ModelsController,
        SpeculationController,
        SteeringController,
    )
    from app.tui.controllers.server import ServerController
    from app.tui.reply_owner import ReplyOwner


class LlmtuiShell(App[None]):
    """llmtui's App as its screens see it: its state and its abstract methods (LlmtuiApp implements every one)."""

    config: Config
    store: Store
    bridge: Engine
    model: ModelSummary | None
    model_path: str | None
    engine_state: str
    load_progress: float | None
    speculation: SpeculationController
    steering: SteeringController
    models: ModelsController
    generation: GenerationController[ReplyOwner]
    conversations: ConversationsController
    server: ServerController

    @abstractmethod
    def set_engine_state(self, state: str) -> None:
        """The engine's state ("starting", "loading", "ready", "generating", "error", "crashed"), published."""

    @abstractmethod
    def engine_changed(self) -> None:
        """Publish a change of the engine's state, its model or the load's progress (the App's `engine_version`)."""

    @abstractmethod
    def features_changed(self) -> None:
        """Publish a change of speculation or steering state (the App's `features_version`, the server's readout)."""

    @abstractmethod
    def reply_in_progress(self) -> bool:
        """Whether the chat is writing a reply."""

    @abstractmethod
    def open_model(self, path: Path) -> None:
        """Load a model file and show the chat (the model switcher and the models screen's "use" call this)."""

    @abstractmethod
    def record_model_use(self, model_path: Path) -> None:
        """Remember that the model was chosen or loaded for the chat (F4 and `llmtui models list` say when)."""

    @abstractmethod
    def remember_sidebar(self, shown: bool) -> None:
        """Keep whether the conversation list is shown in the settings file."""

    @abstractmethod
    def default_conversation_settings(self) -> dict[str, object]:
        """A new conversation's settings (its sampling)."""

    @abstractmethod
    def save_config_quietly(self) -> None:
        """Save the App's `config` as it is now; a failure is a toast, not an exception."""

    @abstractmethod
    def save_settings(self, config: Config, changes: tuple[str, ...] | None = None) -> None:
        """Save new settings (ConfigError when invalid or unwritable) and apply them; `changes`: what the settings
        screen changed, said in the toast."""

    @abstractmethod
    def action_toggle_server(self) -> None:
        """F10: the API server on or off."""

    @abstractmethod
    def action_switch_model(self) -> None:
        """ctrl+l: pick the model (or a remote server) to chat with."""

    @abstractmethod
    def action_restart_engine(self) -> None:
        """F5: restart the engine with the model last asked for."""

    @abstractmethod
    def action_make_vector(self) -> None:
        """Open the dialog that makes a control vector on the loaded model."""

    @abstractmethod
    def action_steering_ab(self) -> None:
        """Open the steering A/B view: one prompt without and with the vectors."""
