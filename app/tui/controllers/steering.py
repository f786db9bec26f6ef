"""Steering: the user's control vectors and strengths, the layer range, what the engine applies, making vectors."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.config import SteeringSettings
from app.core.vectors import VectorInfo, known_vector_info, vector_info, vector_name

if TYPE_CHECKING:
    from app.tui.controllers.host import SteeringHost
    from app.tui.controllers.model_in_use import ModelsController
    from engine_ext.params import SteeringEntry
    from engine_ext.protocol import SteeringSet


class SteeringController:
    """F6's sliders set strengths and the range here; the engine's answer (`applied`) is kept for the screen."""

    def __init__(self, host: SteeringHost, models: ModelsController) -> None:
        self.host = host
        self.models = models
        self.applied: SteeringSet | None = None
        self.vectors_made: tuple[int, str] = (0, "")
        """How many vectors were made in this session, and the last one's path (the panel lists it, focused)."""
        """What the engine last said it applies."""

    @property
    def settings(self) -> SteeringSettings:
        return self.host.config.steering

    def entries(self) -> tuple[SteeringEntry, ...]:
        """The user's mix, limited to the vectors that fit the loaded model."""
        # The width the engine reported when the model loaded: no header read here (this runs on the event loop,
        # e.g. for the stats bar's readout).
        model = self.host.model
        n_embd = model.n_embd if model is not None else 0
        entries = []
        for entry in self.settings.entries():
            # What a worker read of the file (before each send, the steering screen's listing): no I/O here, so a
            # file not read yet does not steer until it is.
            info = known_vector_info(entry.path)
            if isinstance(info, VectorInfo) and (not n_embd or info.n_embd == n_embd):
                entries.append(entry)
        return tuple(entries)

    def mix_summary(self) -> str:
        """'name +0.50, other -0.25' for the vectors that steer now (empty: none)."""
        return ", ".join(f"{vector_name(e.path)} {e.strength:+.2f}" for e in self.entries())

    def in_use(self) -> dict[str, object]:
        """What a reply records of the steering that shaped it (its stats' "steering"; the exports say it): each
        vector that steered with its strength, and the layer range applied; {} when nothing steered."""
        model, applied = self.host.model, self.applied
        if model is None or model.architecture == "remote" or applied is None or not applied.active:
            return {}
        vectors = [
            {"name": vector_name(e.path), "file": Path(e.path).name, "strength": e.strength} for e in self.entries()
        ]
        if not vectors:
            return {}
        return {"steering": {"vectors": vectors, "layers": [applied.layer_start, applied.layer_end]}}

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
        self._send(always=False)

    def _send(self, *, always: bool) -> None:
        """Send the mix to the engine (`always`: even an empty one, whose answer says which layers steer). The
        vectors' files no worker has read yet are read in a thread first: never on the event loop."""
        unread = tuple(e.path for e in self.settings.entries() if known_vector_info(e.path) is None)
        if not unread:
            self._send_entries(always)
            return
        self.host.run_worker(
            partial(self._read_then_send, unread, always),
            name="read-vectors",
            group="steering-read",
            thread=True,
            exit_on_error=False,
        )

    def _read_then_send(self, paths: tuple[str, ...], always: bool) -> None:
        try:
            for path in paths:
                vector_info(path)
        except Exception as error:  # noqa: BLE001 - a file no reader expected: said in one line, the app goes on
            text = " ".join(f"The control vectors could not be read: {type(error).__name__}: {error}".split())
            self.host.call_from_thread(self.host.notify, text[:300], severity="error", timeout=10)
            return
        self.host.call_from_thread(self._send_entries, always)

    def _send_entries(self, always: bool) -> None:
        entries = self.entries()
        if entries or always:
            self.host.bridge.set_steering(entries)
        self.host.features_changed()  # the readouts name the vectors just read

    def _steer(self, settings: SteeringSettings) -> None:
        host = self.host
        host.config = replace(host.config, steering=settings)
        if host.model is not None:
            self._send(always=True)
        host.features_changed()

    def try_unsteered(self, unsteered: bool) -> None:
        """Send the engine no mix (`unsteered`) or the user's for the next generation, changing no setting (the
        steering A/B view runs A without its mix)."""
        self.host.bridge.set_steering(() if unsteered else self.entries())

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
        self._send(always=True)

    def engine_applied(self, applied: SteeringSet) -> None:
        self.applied = applied
        for notice in applied.notices:
            self.host.notify(notice, severity="warning")

    # ----- making a vector -----

    def make_vector(self, prompt_set_path: str, output_path: str, method: str) -> None:
        self.host.bridge.make_vector(prompt_set_path, output_path, method)

    def vector_created(self, path: str, layers: int, pairs: int, seconds: float) -> None:
        """Say so, and add the new vector to the list at strength 0 (remembered)."""
        self.vectors_made = (self.vectors_made[0] + 1, path)
        self.host.notify(
            f"Made {Path(path).name}: {layers} layers from {pairs} pairs in {seconds:.1f} s. Move its slider to steer.",
            timeout=8,
        )
        if path not in self.settings.vectors:
            self.set_strength(path, 0.0)
            self.remember()
