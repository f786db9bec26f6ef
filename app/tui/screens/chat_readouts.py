"""The chat screen's readouts of the engine and the features: the header's and the stats bar's engine state, model
and backend; the speculation meter and the stats bar's spec, steer and api notes; the steering panel's applied mix
and a vector just made. Each is redrawn when the App publishes a change (`engine_version`, `features_version`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.css.query import NoMatches
from textual.widget import Widget

from app.core.speculation_facts import short_summary
from app.tui.screens.chat_view import ChatView
from app.tui.widgets.spec_meter import SpecMeter

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell


class ChatReadouts:
    """Copies what the App and its controllers know into the chat's widgets; it remembers what it showed last (the
    loaded model, the steering mix and the last vector made), so a change is drawn once."""

    def __init__(self, view: ChatView, model_loaded: Callable[[str], None]) -> None:
        self._view = view
        self._model_loaded = model_loaded
        """Told the path of each model loaded since (the replies' figures start over)."""
        self.model_shown: object = None
        """The loaded model the stats bar was last told of."""
        self._steering_shown: tuple[object, tuple[int, str]] = (None, (0, ""))  # the panel's applied mix, new vector

    @property
    def app(self) -> LlmtuiShell:
        return self._view.app

    def features_changed(self) -> None:
        """The meter under the transcript (while speculation is on) and the stats bar's spec/steer readouts."""
        try:
            stats_bar = self._view.stats
        except NoMatches:
            return
        speculation = self.app.speculation
        settings = self.app.config.speculative
        container = stats_bar.parent
        meters = list(container.query(SpecMeter)) if isinstance(container, Widget) else []  # (mounted only there)
        if settings.enabled and not meters and isinstance(container, Widget):
            meter = SpecMeter(id="spec-meter")
            container.mount(meter, before=stats_bar)
            meters = [meter]
        elif not settings.enabled:
            for meter in meters:
                meter.remove()
            meters = []
        for meter in meters:
            meter.expanded = self.app.config.spec_details
            meter.spec_type = settings.spec_type
            meter.drafters = speculation.drafters
            meter.noise = speculation.speed_noise
            meter.stats = speculation.stats
        extras = {k: v for k, v in stats_bar.extras.items() if k not in ("spec", "steer", "api")}
        if settings.enabled:
            extras["spec"] = (
                short_summary(speculation.stats, speculation.speed_noise) if speculation.stats else settings.spec_type
            )
        name, strength = self.app.steering.readout_parts()
        if name:
            extras["steer"] = name + strength
        trims = {"steer": name} if name else {}
        where, requests = self.app.server.readout_parts()
        if where or requests:
            extras["api"] = where + requests
        if requests:
            trims["api"] = where  # at 80 columns the address and client are cut, "1 running" stays
        if trims != stats_bar.trims:
            stats_bar.trims = trims
        spares = frozenset({"spec"} if meters else ())  # the meter above says it: at 80 columns api stays in view
        if spares != stats_bar.spares:
            stats_bar.spares = spares
        if extras != stats_bar.extras:
            stats_bar.extras = extras
        self._sync_steering_panel()

    def _sync_steering_panel(self) -> None:
        """What the steering controller learnt since: the mix the engine applies now, a vector just made (listed,
        focused, when the panel is open)."""
        steering, panel = self.app.steering, self._view.steering_panel
        applied_shown, made_shown = self._steering_shown
        self._steering_shown = (steering.applied, steering.vectors_made)
        if steering.applied is not None and steering.applied is not applied_shown:
            panel.show_applied(steering.applied)
        if steering.vectors_made != made_shown and steering.vectors_made[0] and panel.is_open:
            self._view.call_later(panel.refresh_vectors, focus_path=steering.vectors_made[1])

    def engine_changed(self) -> None:
        """Copy the app's engine state into the header and the stats bar."""
        try:
            header, stats = self._view.header, self._view.stats
        except NoMatches:  # not composed yet (on_mount syncs) or closing
            return
        app = self.app
        model = app.model
        if model is not None and model is not self.model_shown:  # a model was loaded
            self.model_shown = model
            self._model_loaded(model.path)
            stats.n_ctx = model.n_ctx
        for widget in (header, stats):
            widget.engine_state = app.engine_state
            # "vision": the model loaded with its projector, so it sees attached images
            widget.backend = (f"{model.backend} · vision" if model.sees_images else model.backend) if model else ""
        header.model_name = model.name if model else ""
        if model is not None and not stats.n_ctx:
            stats.n_ctx = model.n_ctx
        stats.progress = app.load_progress
        self._view.refresh_bindings()
