"""Where each engine event goes: one table, event type → the handler on the controller or subscriber that owns it.

The engines (app/tui/bridge.py, app/tui/remote_bridge.py) post their events (app/core/engine.py's `EngineEvent`: the
engine protocol's, under their own names) to the App in `EngineMessage`s; the App (a subclass of `EngineEvents`) hands
every one to its entry in `routes`. Generation events go to the request's owner as the
generation controller's router names it (the chat for its replies, an A/B view for its runs); speculation and steering
events to their controllers, which publish (`features_changed`); the engine's own state to the App, which publishes it
too (`engine_changed`). Nothing here reaches into a screen: screens subscribe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import cached_property
from inspect import isawaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from textual import on
from textual.screen import Screen

from app.core.engine import LoadStarted, Recovering, ReplyHeld, ReplyStats, Starting
from app.core.model_paths import record_use
from app.core.remote_engine import REMOTE_PREFIX
from app.tui.messages import EngineMessage
from app.tui.shell import LlmtuiShell
from engine_ext.protocol import (
    Crashed,
    Failed,
    Finished,
    Hello,
    Loaded,
    LoadProgress,
    PromptProgress,
    SpeculativeSet,
    SpeculativeUpdate,
    SteeringSet,
    TokenChunk,
    VectorMade,
    VectorProgress,
)
from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from engine_ext.protocol import SpeculativeStats

_S = TypeVar("_S", bound=Screen[Any])
Handler = Callable[[Any, EngineMessage], Awaitable[None] | None]


class EngineEvents(LlmtuiShell):
    """The App's engine-event routing (a base of LlmtuiApp): `routes` is the table, `_engine_event` applies it; what
    it calls on the App is the shell's (app/tui/shell.py)."""

    engine_overrides: dict[str, Any]

    @cached_property
    def routes(self) -> dict[type[Any], Handler]:
        """Event type → its handler (each takes the event and the message that carried it)."""
        generation = self.generation.router

        def to_owner(event: Any, message: EngineMessage) -> Awaitable[None] | None:
            owner = generation.owner(event.request_id)
            if owner is None:
                return None
            if isinstance(event, TokenChunk):
                return owner.generation_tokens(event)
            owner.generation_progress(event)
            return None

        return {
            Starting: lambda event, message: self.set_engine_state("starting"),
            Hello: lambda event, message: self.set_engine_state("loading"),
            LoadStarted: self._load_started,
            LoadProgress: self._load_progress,
            Loaded: self._model_loaded,
            Recovering: self._recovering,
            Crashed: self._crashed,
            TokenChunk: to_owner,
            PromptProgress: to_owner,
            ReplyStats: to_owner,
            ReplyHeld: to_owner,
            Finished: self._generation_finished,
            Failed: self._failed,
            SpeculativeSet: lambda event, message: self.speculation.configured(event.drafters, event.notices),
            SpeculativeUpdate: lambda event, message: self._speculative_stats(event.stats, final=False),
            SteeringSet: self._steering_applied,
            VectorProgress: self._vector_progressed,
            VectorMade: self._vector_created,
        }

    @on(EngineMessage)
    async def _engine_event(self, message: EngineMessage) -> None:
        result = self.routes[type(message.event)](message.event, message)
        if isawaitable(result):
            await result

    def open_screen(self, kind: type[_S]) -> _S | None:
        """The open screen of this kind, if any."""
        return next((s for s in self.screen_stack if isinstance(s, kind)), None)

    # ----- the engine and its model -----

    def _load_started(self, event: LoadStarted, message: EngineMessage) -> None:
        self.load_progress = 0.0
        self.set_engine_state("loading")

    def _load_progress(self, event: LoadProgress, message: EngineMessage) -> None:
        self.load_progress = event.fraction
        self.engine_changed()

    def _model_loaded(self, event: Loaded, message: EngineMessage) -> None:
        if message.engine is not self.bridge:  # the engine switched away from (a load finishing after a switch)
            return
        model = self.model = message.engine.describe(event.info)
        self.load_progress = None
        # A reply sent again after an automatic restart is still being written.
        self.set_engine_state("generating" if self.generation.active is not None else "ready")
        if not self.bridge.capabilities.loads_files:
            context = f", context {model.n_ctx}" if model.n_ctx else ""
            self.notify(f"Using {model.name} ({model.backend}{context}).")
        else:
            placement = f" {model.placement.removeprefix('-ngl auto: ')}." if model.placement else ""
            self.notify(
                f"Loaded {model.name} ({model.backend}, context {model.n_ctx}) "
                f"in {model.load_ms / 1000:.1f} s.{placement}"
            )
            self.record_model_use(Path(model.path))
        if self.config.last_model != model.path:
            self.config = replace(self.config, last_model=model.path)
            self.save_config_quietly()
        # A fresh engine knows nothing of the user's choices yet.
        self.speculation.reset()
        self.steering.reset()
        if self.bridge.capabilities.speculation:  # a remote server drafts on its own and takes no vectors
            self.speculation.model_loaded()
            self.steering.model_loaded()
            if self.config.server.enabled and not self.server.running and not self.server.starting:
                self.action_toggle_server()  # [server] enabled: serve from the first model loaded
        self.features_changed()

    def record_model_use(self, model_path: Path) -> None:
        """The model chosen (F4's u) or loaded for the chat is remembered as used (F4 and `llmtui models list` say
        when); a file is written, so in a thread."""

        def record() -> None:
            if (failed := record_use(model_path)) is not None:
                self.call_from_thread(self.notify, one_line(failed), severity="warning")

        self.run_worker(record, name="record-use", group="record-use", thread=True, exit_on_error=False)

    def _model_load_failed(self, event: Failed, message: EngineMessage) -> None:
        if message.engine is not self.bridge:
            return
        self.model = None
        self.load_progress = None
        self.set_engine_state("error")
        path = message.engine.model_path or ""
        what = path.removeprefix(REMOTE_PREFIX) if path.startswith(REMOTE_PREFIX) else Path(path).name
        self.notify(
            f"Could not load {what}: {event.message}. Press ctrl+l to pick another model (F5 retries).",
            severity="error",
            timeout=20,
        )

    def _recovering(self, event: Recovering, message: EngineMessage) -> None:
        """Restarted without the CPU extra buffer type that crashed (the engine client remembers it), or as it was
        (the watchdog ended a stuck worker, or a request crashed it)."""
        self.model = None
        self.set_engine_state("loading")
        if event.notice:  # a restart as it was says why in the reply it ended
            self.notify(event.notice, severity="warning", timeout=20)

    async def _crashed(self, event: Crashed, message: EngineMessage) -> None:
        from app.tui.modals.crash import RESTART, EngineCrashedModal

        self.model = None
        self.load_progress = None
        await self.generation.crashed(event.description)  # the chat's reply ends as failed, the A/B runs are told
        self.set_engine_state("crashed")

        def restart(choice: str | None) -> None:
            fallback = next((f for f in event.fallbacks if f.key == choice), None)
            if fallback is not None:
                self.engine_overrides[fallback.field] = fallback.value
                self.notify(
                    f"Restarting with {fallback.what} ({fallback.flag}) for this session; F3 settings keep "
                    "it for good.",
                    timeout=15,
                )
            if choice == RESTART or fallback is not None:
                self.action_restart_engine()

        self.push_screen(
            EngineCrashedModal(event.description, event.log_tail, event.log_path, event.fallbacks), restart
        )
        self.speculation.reset()
        self.steering.reset()

    # ----- generation -----

    async def _generation_finished(self, event: Finished, message: EngineMessage) -> None:
        if event.speculative is not None:  # the reply's final speculative statistics first
            self._speculative_stats(event.speculative, final=True)
        owner = self.generation.router.owner(event.request_id)
        if owner is not None:
            await owner.generation_finished(event)

    async def _failed(self, event: Failed, message: EngineMessage) -> None:
        """A request failed: a model's load, a setting or a vector (`message.answers` says), or a reply."""
        if message.answers == "load":
            self._model_load_failed(event, message)
        elif message.answers:
            self._request_failed(message.answers, event.message)
        else:
            await self._generation_failed(event)

    async def _generation_failed(self, event: Failed) -> None:
        router = self.generation.router
        owner = router.owner(event.request_id)
        if owner is None:
            self.notify(f"Engine error: {event.message}", severity="error")
            return
        await owner.generation_failed(event)
        if owner is not router.default:  # said as the chat says its own
            self.notify(f"Generation failed: {event.message}", severity="error", timeout=10)

    # ----- speculation and steering -----

    def _speculative_stats(self, stats: SpeculativeStats, *, final: bool) -> None:
        """Live (or, with `final`, a finished reply's) speculative statistics."""
        side_run = self.generation.router.side_owner(stats.request_id)
        if side_run is not None:  # an A/B view's run: its statistics are the view's, not the chat's meter's
            side_run.generation_stats(stats)
            return
        self.speculation.stats_updated(stats, final)

    def _steering_applied(self, event: SteeringSet, message: EngineMessage) -> None:
        self.steering.engine_applied(event)  # the panel shows it (it watches features_version)
        self.features_changed()

    def _vector_progressed(self, event: VectorProgress, message: EngineMessage) -> None:
        from app.tui.modals.make_vector import MakeVectorModal

        dialog = self.open_screen(MakeVectorModal)
        if dialog is not None:
            dialog.show_progress(event.phase, event.done, event.total, event.phase_seconds, event.fraction)

    def _vector_created(self, event: VectorMade, message: EngineMessage) -> None:
        from app.tui.modals.make_vector import MakeVectorModal

        self.steering.vector_created(event.path, event.layers, event.pairs, event.seconds)
        dialog = self.open_screen(MakeVectorModal)
        if dialog is not None:
            dialog.finished(event.path, event.pairs, event.seconds)
        self.features_changed()  # the panel lists the new vector, focused

    def _request_failed(self, kind: str, error: str) -> None:
        """A speculative, steering or make-vector request (`kind`) was refused; `error` says why."""
        from app.tui.modals.make_vector import MakeVectorModal
        from app.tui.screens.spec_check import SpecCheckScreen

        what = {"speculative": "Speculative decoding", "steering": "Steering", "vector": "Making the vector"}
        self.notify(f"{what.get(kind, kind)} failed: {error}", severity="error", timeout=12)
        check = self.open_screen(SpecCheckScreen)
        if kind == "speculative" and check is not None:
            check.speculation_refused(error)
        if kind == "speculative":
            self.speculation.refused()
        elif kind == "vector":
            dialog = self.open_screen(MakeVectorModal)
            if dialog is not None:
                dialog.failed(error)
        self.features_changed()
