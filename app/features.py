"""Speculative decoding and steering in the app: keys, panels, the meter and readouts, and the engine's answers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App, SystemCommand
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget

from app.config import ConfigError, SpeculativeSettings, SteeringSettings, save_config
from app.messages import (
    EngineCrashed,
    EngineRequestFailed,
    GenerationFailed,
    GenerationFinished,
    ModelLoaded,
    SpeculativeConfigured,
    SpeculativeStatsUpdated,
    SteeringApplied,
    TokensArrived,
    VectorCreated,
    VectorProgressed,
)
from app.speculation import ModelFacts, effective_settings, load_options, model_facts, short_summary
from app.widgets.spec_meter import SpecMeter
from engine_ext.params import SteeringEntry
from engine_ext.protocol import SpeculativeStats, SteeringSet

if TYPE_CHECKING:
    from app.bridge import EngineBridge
    from app.config import Config
    from app.messages import ModelSummary
    from app.remote import RemoteBridge
    from app.screens.ab_run import ABRunScreen
    from app.screens.chat import ChatScreen
    from models_catalog.drafts import DraftCandidate

    _AppBase = App[None]
else:
    _AppBase = object


SLOW_SPEEDUP = 0.9  # a fixed type below this share of plain decoding speed is said to slow replies down
SLOW_MIN_STEPS = 8  # verify steps a reply needs before its speed says anything


class FeaturesMixin(_AppBase):
    """Mixed into LlmtuiApp (before App): F8 toggles speculation, F9 opens its panel, F6 opens steering."""

    if TYPE_CHECKING:
        config: Config
        bridge: EngineBridge | RemoteBridge
        model: ModelSummary | None
        model_path: str | None
        engine_state: str

        @property
        def chat(self) -> ChatScreen | None: ...

        def load_model(self, path: Path) -> None: ...

    spec_drafters: tuple[str, ...] = ()
    """The drafters the engine chained (empty: off or not confirmed yet)."""
    spec_stats: SpeculativeStats | None = None
    """The latest speculative statistics."""
    steering_applied: SteeringSet | None = None
    """What the engine last said it applies."""
    loaded_with: tuple[bool, int] = (False, 0)
    """(load_mtp, n_rs_seq) the current model was loaded with."""
    slow_types_warned: frozenset[tuple[str, str]] = frozenset()
    """(model, type) pairs already said to have made a reply slower than plain decoding."""
    draft_sidecars: tuple[DraftCandidate, ...] = ()
    """The drafts the current model brings along (beside it, or from its paired repositories), found at load."""
    missing_drafts: tuple[tuple[str, str], ...] = ()
    """(kind, repository) of the drafts the catalog pairs with the current model that are not downloaded."""

    # ----- loading -----

    def speculative_load_options(self, path: str) -> dict[str, Any]:
        """bridge.load keywords for the model at `path` under the user's speculative settings (and the drafts it
        brings along, `draft_sidecars`, found first)."""
        load_mtp, n_rs_seq = load_options(path, self.engine_speculative())
        self.loaded_with = (load_mtp, n_rs_seq)
        return {"load_mtp": load_mtp, "n_rs_seq": n_rs_seq}

    def engine_speculative(self, settings: SpeculativeSettings | None = None) -> SpeculativeSettings:
        """What the engine gets for `settings` (default: the user's): with no draft file named, the model's own
        sidecar for the type, as llama.cpp attaches a sidecar beside the model."""
        return effective_settings(self.model_path, settings or self.config.speculative, self.draft_sidecars)

    def model_facts(self) -> ModelFacts | None:
        return model_facts(self.model.path) if self.model is not None else None

    def on_model_loaded(self, event: ModelLoaded) -> None:
        # Runs after LlmtuiApp's handler: a fresh engine knows nothing of the user's choices yet.
        self.spec_drafters, self.spec_stats, self.steering_applied = (), None, None
        if event.model.architecture == "remote":  # a remote server drafts on its own and takes no vectors
            self.refresh_feature_readouts()
            return
        if self.config.speculative.enabled:
            self.bridge.set_speculative(self.engine_speculative().params())
        entries = self.steering_entries()
        if entries:
            self.bridge.set_steering(entries)
        self.refresh_feature_readouts()

    async def on_engine_crashed(self, event: EngineCrashed) -> None:
        self.spec_drafters, self.spec_stats, self.steering_applied = (), None, None
        for screen in self._ab_runs():
            screen.engine_crashed()

    # ----- speculative decoding -----

    def apply_speculative(self, settings: SpeculativeSettings) -> None:
        """Use these settings from the next reply (reloading the model when it needs MTP weights or rollback)."""
        self.config = replace(self.config, speculative=settings)
        self._save_features()
        self.spec_drafters, self.spec_stats = (), None
        if self.model_path and self.model is not None:
            if load_options(self.model_path, self.engine_speculative(settings)) != self.loaded_with:
                chat = self.chat
                if chat is not None and chat.generation is not None:
                    self.notify("This needs the model reloaded; stop the reply (Esc) and try again.",
                                severity="warning")
                    return
                self.notify("Reloading the model for this speculative type (MTP weights / rollback depth).")
                self.load_model(Path(self.model_path))
            else:
                self.bridge.set_speculative(self.engine_speculative(settings).params())
        self.refresh_feature_readouts()

    def action_toggle_speculation(self) -> None:
        settings = self.config.speculative
        self.apply_speculative(replace(settings, enabled=not settings.enabled))
        if settings.enabled:
            self.notify("Speculative decoding off.")
        else:
            self.notify(f"Speculative decoding on ({settings.spec_type}); F9 picks the type.")

    def action_toggle_spec_details(self) -> None:
        """Expand the meter into the details (counts, acceptance by position, time, drafters) or fold it."""
        if not self.config.speculative.enabled:
            self.notify("Speculative decoding is off: F8 turns it on, and its meter shows under the transcript.")
            return
        self.config = replace(self.config, spec_details=not self.config.spec_details)
        self._save_features()
        self.refresh_feature_readouts()

    def action_speculative_panel(self) -> None:
        from app.modals.speculative import SpeculativePanel

        if isinstance(self.screen, SpeculativePanel):
            return

        name = self.model.name if self.model else ""
        panel = SpeculativePanel(self.config.speculative, self.model_path, name, self.draft_sidecars,
                                 self.missing_drafts)

        def chosen(settings: SpeculativeSettings | None) -> None:
            if settings is not None:
                self.apply_speculative(settings)
                if panel.check_after:
                    self.action_spec_check(settings)

        self.push_screen(panel, chosen)

    def on_speculative_configured(self, event: SpeculativeConfigured) -> None:
        self.spec_drafters = event.drafters
        for notice in event.notices:
            self.notify(notice, severity="warning")
        self.refresh_feature_readouts()

    def on_speculative_stats_updated(self, event: SpeculativeStatsUpdated) -> None:
        side_run = self._side_run(event.stats.request_id)
        if side_run is not None:  # an A/B view's run: its statistics are the view's, not the chat's meter's
            side_run.speculative_stats(event.stats)
            return
        self.spec_stats = event.stats
        if event.final:
            self._warn_if_slower(event.stats)
        self.refresh_feature_readouts()

    def _warn_if_slower(self, stats: SpeculativeStats) -> None:
        """Say once per model and type when a fixed type made a reply slower than plain decoding (auto pauses on its
        own and says why in the meter)."""
        settings = self.config.speculative
        if settings.spec_type == "auto" or not settings.enabled:
            return
        if stats.steps < SLOW_MIN_STEPS or stats.plain_tps <= 0 or stats.speedup >= SLOW_SPEEDUP:
            return
        key = (self.model_path or "", settings.spec_type)
        if key in self.slow_types_warned:
            return
        self.slow_types_warned = self.slow_types_warned | {key}
        self.notify(f"{settings.spec_type} made this reply slower than plain decoding ({stats.speedup:.2f}×, "
                    f"{stats.acceptance_rate:.0%} of drafted tokens accepted). auto (F9) pauses speculation when it "
                    "does not pay; F8 turns it off.", severity="warning", timeout=12)

    def action_spec_check(self, settings: SpeculativeSettings | None = None) -> None:
        """Open the speculation check: the prompt decoded plainly and with `settings` (default: the user's)."""
        from app.remote import RemoteBridge
        from app.screens.spec_check import DEFAULT_PROMPT, SpecCheckScreen

        if self.model_path is None or isinstance(self.bridge, RemoteBridge):  # (a model may be loading)
            self.notify("Load a local model first (ctrl+l): the check runs on llmtui's own engine.",
                        severity="warning")
            return
        if self._spec_check_screen() is not None:
            return
        self.push_screen(SpecCheckScreen(settings or self.config.speculative, self._last_user_message(DEFAULT_PROMPT)))

    def _spec_check_screen(self) -> Any:
        from app.screens.spec_check import SpecCheckScreen

        return next((s for s in self.screen_stack if isinstance(s, SpecCheckScreen)), None)

    # ----- steering -----

    def steering_entries(self) -> tuple[SteeringEntry, ...]:
        """The user's mix, limited to the vectors that fit the loaded model."""
        from app.screens.steering import VectorInfo, vector_info

        facts = self.model_facts()
        entries = []
        for entry in self.config.steering.entries():
            info = vector_info(entry.path)
            if isinstance(info, VectorInfo) and (facts is None or info.n_embd == facts.n_embd):
                entries.append(entry)
        return tuple(entries)

    def _steer(self, settings: SteeringSettings) -> None:
        self.config = replace(self.config, steering=settings)
        if self.model is not None:
            self.bridge.set_steering(self.steering_entries())
        self.refresh_feature_readouts()

    def set_vector_strength(self, path: str, strength: float) -> None:
        """Set one vector's strength (adding it to the list); applied at the next token."""
        settings = self.config.steering
        vectors, strengths = list(settings.vectors), list(settings.strengths)
        if path in vectors:
            strengths[vectors.index(path)] = strength
        else:
            vectors.append(path)
            strengths.append(strength)
        self._steer(replace(settings, vectors=tuple(vectors), strengths=tuple(strengths)))

    def set_steering_range(self, layer_start: int, layer_end: int) -> None:
        self._steer(replace(self.config.steering, layer_start=layer_start, layer_end=layer_end))

    def remember_steering(self) -> None:
        self._save_features()

    def action_steering(self) -> None:
        from app.screens.steering import SteeringScreen

        if isinstance(self.screen, SteeringScreen):
            self.screen.action_close()
            return
        if self.model is None:
            self.notify("Load a model first (ctrl+l): steering acts on the loaded model.", severity="warning")
            return
        self.push_screen(SteeringScreen())

    def _steering_screen(self) -> Any:
        from app.screens.steering import SteeringScreen

        return next((s for s in self.screen_stack if isinstance(s, SteeringScreen)), None)

    def on_steering_applied(self, event: SteeringApplied) -> None:
        self.steering_applied = event.applied
        for notice in event.applied.notices:
            self.notify(notice, severity="warning")
        screen = self._steering_screen()
        if screen is not None:
            screen.show_applied(event.applied)
        self.refresh_feature_readouts()

    def action_make_vector(self) -> None:
        from app.modals.make_vector import MakeVectorModal

        if self.model is None:
            self.notify("Load a model first (ctrl+l): a vector is made for one model.", severity="warning")
            return

        self.push_screen(MakeVectorModal(Path(self.model.path).stem))

    def make_vector(self, prompt_set_path: str, output_path: str, method: str) -> None:
        self.bridge.make_vector(prompt_set_path, output_path, method)

    def _make_dialog(self) -> Any:
        from app.modals.make_vector import MakeVectorModal

        return next((s for s in self.screen_stack if isinstance(s, MakeVectorModal)), None)

    def on_vector_progressed(self, event: VectorProgressed) -> None:
        dialog = self._make_dialog()
        if dialog is not None:
            dialog.show_progress(event.done, event.total)

    async def on_vector_created(self, event: VectorCreated) -> None:
        self.notify(f"Made {Path(event.path).name}: {event.layers} layers from {event.pairs} pairs in "
                    f"{event.seconds:.1f} s. Move its slider to steer.", timeout=8)
        if event.path not in self.config.steering.vectors:
            self.set_vector_strength(event.path, 0.0)
            self._save_features()
        dialog = self._make_dialog()
        if dialog is not None:
            dialog.finished(event.path, event.pairs, event.seconds)
        screen = self._steering_screen()
        if screen is not None:
            await screen.refresh_vectors(focus_path=event.path)

    def action_steering_ab(self) -> None:
        from app.screens.steering_ab import DEFAULT_PROMPT, SteeringABScreen

        if self.model is None:
            self.notify("Load a model first (ctrl+l).", severity="warning")
            return
        prompt = self._last_user_message(DEFAULT_PROMPT)
        from app.screens.steering import vector_name

        mix = ", ".join(f"{vector_name(e.path)} {e.strength:+.2f}" for e in self.steering_entries())
        if not mix:
            self.notify("Every strength is 0: B will be the same as A. Move a slider first.")
        self.push_screen(SteeringABScreen(prompt, mix))

    def _last_user_message(self, default: str) -> str:
        """The open conversation's last message from the user (what the A/B views run by default)."""
        chat = self.chat
        if chat is None or chat.conversation_id is None:
            return default
        path = self.store.active_path(chat.conversation_id)  # type: ignore[attr-defined]
        return next((m.content for m in reversed(path) if m.role == "user"), default)

    def _ab_runs(self) -> list[ABRunScreen]:
        """The open A/B views (steering A/B, speculation check)."""
        from app.screens.ab_run import ABRunScreen

        return [s for s in self.screen_stack if isinstance(s, ABRunScreen)]

    def _side_run(self, request_id: int | None) -> ABRunScreen | None:
        """The A/B view that asked for this generation, if one did."""
        return next((s for s in self._ab_runs() if s.owns(request_id)), None)

    async def on_tokens_arrived(self, event: TokensArrived) -> None:
        screen = self._side_run(event.request_id)
        if screen is not None:
            screen.tokens(event)

    async def on_generation_finished(self, event: GenerationFinished) -> None:
        screen = self._side_run(event.request_id)
        if screen is not None:
            screen.finished(event)

    async def on_generation_failed(self, event: GenerationFailed) -> None:
        screen = self._side_run(event.request_id)
        if screen is not None:
            screen.finished(event)

    def on_engine_request_failed(self, event: EngineRequestFailed) -> None:
        what = {"speculative": "Speculative decoding", "steering": "Steering", "vector": "Making the vector"}
        self.notify(f"{what.get(event.kind, event.kind)} failed: {event.error}", severity="error", timeout=12)
        check = self._spec_check_screen()
        if event.kind == "speculative" and check is not None:
            check.speculation_refused(event.error)
        if event.kind == "speculative" and self.config.speculative.enabled:
            self.config = replace(self.config, speculative=replace(self.config.speculative, enabled=False))
            self.spec_drafters = ()
        elif event.kind == "vector":
            dialog = self._make_dialog()
            if dialog is not None:
                dialog.failed(event.error)
        self.refresh_feature_readouts()

    # ----- readouts -----

    def refresh_feature_readouts(self) -> None:
        """The meter under the transcript (while speculation is on) and the stats bar's spec/steer readouts."""
        chat = self.chat
        if chat is None:
            return
        try:
            stats_bar = chat.stats
        except NoMatches:
            return
        settings = self.config.speculative
        meters = list(chat.query(SpecMeter))
        container = stats_bar.parent
        if settings.enabled and not meters and isinstance(container, Widget):
            meter = SpecMeter(id="spec-meter")
            container.mount(meter, before=stats_bar)
            meters = [meter]
        elif not settings.enabled:
            for meter in meters:
                meter.remove()
            meters = []
        for meter in meters:
            meter.expanded = self.config.spec_details
            meter.spec_type = settings.spec_type
            meter.drafters = self.spec_drafters
            meter.stats = self.spec_stats
        extras = {k: v for k, v in stats_bar.extras.items() if k not in ("spec", "steer")}
        if settings.enabled:
            extras["spec"] = short_summary(self.spec_stats) if self.spec_stats else settings.spec_type
        entries = self.steering_entries()
        if entries:
            first = entries[0]
            from app.screens.steering import vector_name

            extras["steer"] = f"{vector_name(first.path)[:14]} {first.strength:+.2f}"
            if len(entries) > 1:
                extras["steer"] += f" +{len(entries) - 1}"
        if extras != stats_bar.extras:
            stats_bar.extras = extras

    def _save_features(self) -> None:
        try:
            save_config(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="error")

    def feature_commands(self, screen: Screen[Any]) -> list[SystemCommand]:
        """Command-palette entries for speculation and steering."""
        return [
            SystemCommand("Toggle speculative decoding", "Turn speculation on or off (F8)",
                          self.action_toggle_speculation),
            SystemCommand("Speculative decoding settings", "Type, draft model, n_max/n_min/p_min (F9)",
                          self.action_speculative_panel),
            SystemCommand("Speculative details", "Expand the meter: counts, acceptance by draft position, time, "
                          "drafters (ctrl+o)", self.action_toggle_spec_details),
            SystemCommand("Speculation check", "One prompt, greedy, without and with speculation: the same text? "
                          "(ctrl+b in F9)", self.action_spec_check),
            SystemCommand("Steering", "Control-vector sliders, layer range, heat strip (F6)", self.action_steering),
            SystemCommand("Make a control vector", "From a prompt set, on the loaded model", self.action_make_vector),
            SystemCommand("Steering A/B", "One prompt without and with steering, side by side",
                          self.action_steering_ab),
        ]
