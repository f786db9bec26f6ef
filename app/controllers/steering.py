"""Steering: the user's control vectors and strengths, the layer range, what the engine applies, making vectors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.config import SteeringSettings
from app.vectors import VectorInfo, vector_info, vector_name

if TYPE_CHECKING:
    from app.controllers.host import Host
    from app.controllers.models import ModelsController
    from engine_ext.params import SteeringEntry
    from engine_ext.protocol import SteeringSet


class SteeringController:
    """F6's sliders set strengths and the range here; the engine's answer (`applied`) is kept for the screen."""

    def __init__(self, host: Host, models: ModelsController) -> None:
        self.host = host
        self.models = models
        self.applied: SteeringSet | None = None
        """What the engine last said it applies."""

    @property
    def settings(self) -> SteeringSettings:
        return self.host.config.steering

    def entries(self) -> tuple[SteeringEntry, ...]:
        """The user's mix, limited to the vectors that fit the loaded model."""
        facts = self.models.facts()
        entries = []
        for entry in self.settings.entries():
            info = vector_info(entry.path)
            if isinstance(info, VectorInfo) and (facts is None or info.n_embd == facts.n_embd):
                entries.append(entry)
        return tuple(entries)

    def mix_summary(self) -> str:
        """'name +0.50, other -0.25' for the vectors that steer now (empty: none)."""
        return ", ".join(f"{vector_name(e.path)} {e.strength:+.2f}" for e in self.entries())

    def readout(self) -> str:
        """The stats bar's short readout: the first vector and its strength, and how many more (empty: none)."""
        entries = self.entries()
        if not entries:
            return ""
        first = entries[0]
        text = f"{vector_name(first.path)[:14]} {first.strength:+.2f}"
        if len(entries) > 1:
            text += f" +{len(entries) - 1}"
        return text

    def reset(self) -> None:
        self.applied = None

    def model_loaded(self) -> None:
        """A fresh local engine knows nothing of the user's mix yet."""
        entries = self.entries()
        if entries:
            self.host.bridge.set_steering(entries)

    def _steer(self, settings: SteeringSettings) -> None:
        host = self.host
        host.config = replace(host.config, steering=settings)
        if host.model is not None:
            host.bridge.set_steering(self.entries())
        host.features_changed()

    def set_strength(self, path: str, strength: float) -> None:
        """Set one vector's strength (adding it to the list); applied at the next token."""
        settings = self.settings
        vectors, strengths = list(settings.vectors), list(settings.strengths)
        if path in vectors:
            strengths[vectors.index(path)] = strength
        else:
            vectors.append(path)
            strengths.append(strength)
        self._steer(replace(settings, vectors=tuple(vectors), strengths=tuple(strengths)))

    def set_range(self, layer_start: int, layer_end: int) -> None:
        self._steer(replace(self.settings, layer_start=layer_start, layer_end=layer_end))

    def remember(self) -> None:
        self.host.save_config_quietly()

    def request_applied(self) -> None:
        """Ask the engine for what it applies (its answer says which layers steer)."""
        self.host.bridge.set_steering(self.entries())

    def engine_applied(self, applied: SteeringSet) -> None:
        self.applied = applied
        for notice in applied.notices:
            self.host.notify(notice, severity="warning")

    # ----- making a vector -----

    def make_vector(self, prompt_set_path: str, output_path: str, method: str) -> None:
        self.host.bridge.make_vector(prompt_set_path, output_path, method)

    def vector_created(self, path: str, layers: int, pairs: int, seconds: float) -> None:
        """Say so, and add the new vector to the list at strength 0 (remembered)."""
        self.host.notify(f"Made {Path(path).name}: {layers} layers from {pairs} pairs in "
                         f"{seconds:.1f} s. Move its slider to steer.", timeout=8)
        if path not in self.settings.vectors:
            self.set_strength(path, 0.0)
            self.remember()
