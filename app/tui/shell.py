"""What screens, modals and widgets may use of the app, beyond Textual's App: its state and its controllers.

LlmtuiApp (app.tui.app) is the one subclass. Screens type `self.app` as `LlmtuiShell`, so they never import the App
module (which imports them): screens talk to controllers and to this, never to app.tui.app.
"""

from __future__ import annotations

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
    """llmtui's App as its screens see it (no behaviour here: LlmtuiApp implements every method)."""

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

    def set_engine_state(self, state: str) -> None:
        raise NotImplementedError

    def action_toggle_server(self) -> None:
        """F10: the API server on or off."""
        raise NotImplementedError

    def engine_changed(self) -> None:
        """Publish a change of the engine's state, its model or the load's progress (the App's `engine_version`)."""
        raise NotImplementedError

    def reply_in_progress(self) -> bool:
        """Whether the chat is writing a reply."""
        raise NotImplementedError

    def open_model(self, path: Path) -> None:
        raise NotImplementedError

    def record_model_use(self, model_path: Path) -> None:
        """Remember that the model was chosen or loaded for the chat (F4 and `llmtui models list` say when)."""
        raise NotImplementedError

    def remember_sidebar(self, shown: bool) -> None:
        raise NotImplementedError

    def default_conversation_settings(self) -> dict[str, object]:
        raise NotImplementedError

    def save_settings(self, config: Config, changes: tuple[str, ...] | None = None) -> None:
        raise NotImplementedError

    def action_switch_model(self) -> None:
        raise NotImplementedError

    def action_restart_engine(self) -> None:
        raise NotImplementedError

    def action_make_vector(self) -> None:
        raise NotImplementedError

    def action_steering_ab(self) -> None:
        raise NotImplementedError
