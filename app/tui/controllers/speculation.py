"""Speculative decoding: the user's settings, what the model loads with, the engine's answers and statistics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.config import SpeculativeSettings
from app.core.speculation_facts import NOISE_RUNS, effective_settings, load_options, spread

if TYPE_CHECKING:
    from app.tui.controllers.host import SpeculationHost
    from engine_ext.protocol import SpeculativeStats
    from models_catalog.drafts import DraftCandidate

SLOW_SPEEDUP = 0.9  # a fixed type below this share of plain decoding speed is said to slow replies down
SLOW_MIN_STEPS = 8  # verify steps a reply needs before its speed says anything


class SpeculationController:
    """F8 toggles speculation, F9's panel applies settings; the chat's meter and readouts show `drafters`/`stats`."""

    def __init__(self, host: SpeculationHost) -> None:
        self.host = host
        self.drafters: tuple[str, ...] = ()
        """The drafters the engine chained (empty: off or not confirmed yet)."""
        self.stats: SpeculativeStats | None = None
        """The latest speculative statistics."""
        self.loaded_with: tuple[bool, int] = (False, 0)
        """(load_mtp, n_rs_seq) the current model was loaded with."""
        self.slow_types_warned: frozenset[tuple[str, str]] = frozenset()
        """(model, type) pairs already said to have made a reply slower than plain decoding."""
        self.draft_sidecars: tuple[DraftCandidate, ...] = ()
        """The drafts the current model brings along (beside it, or from its paired repositories), found at load."""
        self.missing_drafts: tuple[tuple[str, str], ...] = ()
        """(kind, repository) of the drafts the catalog pairs with the current model that are not downloaded."""
        self.speedups: list[float] = []
        """Each finished reply's speed ratio to plain decoding, since the model loaded or the settings changed."""

    @property
    def settings(self) -> SpeculativeSettings:
        return self.host.config.speculative

    # ----- loading -----

    def load_options(self, path: str) -> dict[str, Any]:
        """bridge.load keywords for the model at `path` under the user's speculative settings (and the drafts it
        brings along, `draft_sidecars`, found first)."""
        load_mtp, n_rs_seq = load_options(path, self.engine_settings())
        self.loaded_with = (load_mtp, n_rs_seq)
        return {"load_mtp": load_mtp, "n_rs_seq": n_rs_seq}

    def needs_reload(self, settings: SpeculativeSettings) -> bool:
        """Whether `settings` need the current model loaded differently (MTP weights, rollback depth)."""
        path = self.host.model_path
        return bool(path) and load_options(path or "", self.engine_settings(settings)) != self.loaded_with

    def engine_settings(self, settings: SpeculativeSettings | None = None) -> SpeculativeSettings:
        """What the engine gets for `settings` (default: the user's): with no draft file named, the model's own
        sidecar for the type, as llama.cpp attaches a sidecar beside the model."""
        return effective_settings(self.host.model_path, settings or self.settings, self.draft_sidecars)

    def try_settings(self, settings: SpeculativeSettings | None = None) -> None:
        """Send the engine `settings` for the next generation without making them the user's (the speculation check
        runs a side with them); None: the user's own again."""
        self.host.bridge.set_speculative(self.engine_settings(settings).params())

    def forget_drafts(self) -> None:
        self.draft_sidecars, self.missing_drafts = (), ()

    def in_use(self) -> dict[str, object]:
        """What a reply records of the speculative decoding it was written with (its stats' "speculative"; the
        exports say it): the type, the drafters the engine chained, the draft lengths and how much was accepted;
        {} when off."""
        settings = self.settings
        if not settings.enabled or not self.drafters:
            return {}
        record: dict[str, object] = {
            "type": settings.spec_type,
            "drafters": list(self.drafters),
            "n_max": settings.n_max,
            "n_min": settings.n_min,
            "p_min": settings.p_min,
        }
        if settings.draft_model:
            record["draft_model"] = Path(settings.draft_model).name
        if self.stats is not None and self.stats.drafted:
            record["accepted"] = round(self.stats.acceptance_rate, 4)
        return {"speculative": record}

    def reset(self) -> None:
        """A fresh (or dead) engine, or new settings: nothing confirmed, no statistics."""
        self.drafters, self.stats = (), None
        self.speedups = []

    @property
    def speed_noise(self) -> float | None:
        """The run-to-run spread of the speed ratio over the last replies (`app.speculation.spread`); None until two
        replies measured it. A ratio inside it is no measurable difference, as the speculation check says."""
        return spread(self.speedups[-NOISE_RUNS:])

    def model_loaded(self) -> None:
        """A fresh local engine knows nothing of the user's choices yet."""
        if self.settings.enabled:
            self.host.bridge.set_speculative(self.engine_settings().params())

    # ----- the user's choices -----

    def apply(self, settings: SpeculativeSettings) -> None:
        """Use these settings from the next reply (reloading the model when it needs MTP weights or rollback)."""
        host = self.host
        host.config = replace(host.config, speculative=settings)
        host.save_config_quietly()
        self.reset()
        if host.model_path and host.model is not None:
            if self.needs_reload(settings):
                if host.reply_in_progress():
                    host.notify(
                        "This needs the model reloaded; stop the reply (Esc) and try again.", severity="warning"
                    )
                    return
                host.notify("Reloading the model for this speculative type (MTP weights / rollback depth).")
                host.load_model(Path(host.model_path))
            else:
                host.bridge.set_speculative(self.engine_settings(settings).params())
        host.features_changed()

    def toggle(self) -> None:
        settings = self.settings
        self.apply(replace(settings, enabled=not settings.enabled))
        if settings.enabled:
            self.host.notify("Speculative decoding off.")
        else:
            self.host.notify(f"Speculative decoding on ({settings.spec_type}); F9 picks the type.")

    def toggle_details(self) -> None:
        """Expand the meter into the details (counts, acceptance by position, time, drafters) or fold it."""
        host = self.host
        if not self.settings.enabled:
            host.notify("Speculative decoding is off: F8 turns it on, and its meter shows under the transcript.")
            return
        host.config = replace(host.config, spec_details=not host.config.spec_details)
        host.save_config_quietly()
        host.features_changed()

    # ----- the engine's answers -----

    def configured(self, drafters: tuple[str, ...], notices: tuple[str, ...]) -> None:
        self.drafters = drafters
        for notice in notices:
            self.host.notify(notice, severity="warning")
        self.host.features_changed()

    def stats_updated(self, stats: SpeculativeStats, final: bool) -> None:
        self.stats = stats
        if final and stats.speedup > 0:
            self.speedups.append(stats.speedup)
        if final:
            self._warn_if_slower(stats)
        self.host.features_changed()

    def _warn_if_slower(self, stats: SpeculativeStats) -> None:
        """Say once per model and type when a fixed type made a reply slower than plain decoding (auto pauses on its
        own and says why in the meter)."""
        settings = self.settings
        if settings.spec_type == "auto" or not settings.enabled:
            return
        if stats.steps < SLOW_MIN_STEPS or stats.plain_tps <= 0 or stats.speedup >= SLOW_SPEEDUP:
            return
        key = (self.host.model_path or "", settings.spec_type)
        if key in self.slow_types_warned:
            return
        self.slow_types_warned = self.slow_types_warned | {key}
        self.host.notify(
            f"{settings.spec_type} made this reply slower than plain decoding ({stats.speedup:.2f}×, "
            f"{stats.acceptance_rate:.0%} of drafted tokens accepted). auto (F9) pauses speculation "
            "when it does not pay; F8 turns it off.",
            severity="warning",
            timeout=12,
        )

    def refused(self) -> None:
        """The engine refused the settings: speculation is off (not saved: the user's choice stays on file)."""
        host = self.host
        if self.settings.enabled:
            host.config = replace(host.config, speculative=replace(self.settings, enabled=False))
            self.drafters = ()
