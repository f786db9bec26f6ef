"""Steering: the user's control vectors and strengths, the layer range, what the engine applies, making vectors."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.config import SteeringSettings
from app.core.vectors import VectorInfo, known_vector_info, vector_info, vector_name

MAX_CHANGES = 64
"""Strength changes kept with one reply (the first ones and the last)."""
Mix = tuple[dict[str, object], ...]
"""The vectors that steer, as a reply records them: name, file and strength of each."""

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
        """What the engine last said it applies."""
        self.vectors_made: tuple[int, str] = (0, "")
        """How many vectors were made in this session, and the last one's path (the panel lists it, focused)."""
        self._changes: list[tuple[int, int, Mix]] = []
        """The mix as it changed while the chat's reply was written: (its message id, its tokens then, the mix);
        the first is the mix it began with."""
        self._first_load = True
        """No model has loaded yet in this session: the mix kept from the last one is said once it steers."""

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
        vector that steered with its strength, and the layer range applied; with "changes" when the mix changed
        while it was written (from which of its tokens each mix steered: issue 49, 17); {} when nothing steered."""
        position = self.host.reply_position()
        changes = [c for c in self._changes if position is not None and c[0] == position[0]]
        self._changes = []
        model, applied = self.host.model, self.applied
        if model is None or model.architecture == "remote" or applied is None:
            return {}
        vectors = list(self._mix())
        if not (vectors and applied.active) and len(changes) < 2:
            return {}
        steering: dict[str, object] = {"vectors": vectors, "layers": [applied.layer_start, applied.layer_end]}
        if len(changes) > 1:
            steering["changes"] = [{"at": at, "vectors": list(mix)} for _, at, mix in changes]
        return {"steering": steering}

    def _mix(self) -> Mix:
        return tuple(
            {"name": vector_name(e.path), "file": Path(e.path).name, "strength": e.strength} for e in self.entries()
        )

    def _note_change(self, position: tuple[int, int], before: Mix) -> None:
        """The mix changed while the reply at `position` was written: kept with the token it steers from."""
        message_id, tokens = position
        changes = [c for c in self._changes if c[0] == message_id] or [(message_id, 0, before)]
        after = self._mix()
        if changes[-1][2] == after:
            return
        if changes[-1][1] == tokens:  # moved again before the next token: that token has the last mix
            changes[-1] = (message_id, tokens, after)
            if len(changes) > 1 and changes[-2][2] == after:
                changes.pop()
        else:
            changes.append((message_id, tokens, after))
        if len(changes) > MAX_CHANGES:
            del changes[MAX_CHANGES - 2]  # the first ones and the latest kept
        self._changes = changes

    def readout(self) -> str:
        """The stats bar's short readout: the first vector and its strength, and how many more (empty: none)."""
        name, rest = self.readout_parts()
        return name + rest

    def readout_parts(self) -> tuple[str, str]:
        """The readout as the first vector's name (which a narrow stats bar may cut) and what follows it, its
        strength and how many more (which it keeps); ("", "") when nothing steers."""
        entries = self.entries()
        if not entries:
            return "", ""
        first = entries[0]
        rest = f" {first.strength:+.2f}" + (f" +{len(entries) - 1}" if len(entries) > 1 else "")
        return vector_name(first.path)[:14], rest

    def reset(self) -> None:
        self.applied = None

    def model_loaded(self) -> None:
        """A fresh local engine knows nothing of the user's mix yet. The first model of the session steers with the
        mix kept from the last one: said once it is sent, so it does not steer unseen (issue 49, 17)."""
        self._send(always=False, restored=self._first_load)
        self._first_load = False

    def _send(self, *, always: bool, restored: bool = False) -> None:
        """Send the mix to the engine (`always`: even an empty one, whose answer says which layers steer;
        `restored`: the mix kept from the last session, said in a notice). The vectors' files no worker has read
        yet are read in a thread first: never on the event loop."""
        unread = tuple(e.path for e in self.settings.entries() if known_vector_info(e.path) is None)
        if not unread:
            self._send_entries(always, restored)
            return
        self.host.run_worker(
            partial(self._read_then_send, unread, always, restored),
            name="read-vectors",
            group="steering-read",
            thread=True,
            exit_on_error=False,
        )

    def _read_then_send(self, paths: tuple[str, ...], always: bool, restored: bool = False) -> None:
        try:
            for path in paths:
                vector_info(path)
        except Exception as error:  # noqa: BLE001 - a file no reader expected: said in one line, the app goes on
            text = " ".join(f"The control vectors could not be read: {type(error).__name__}: {error}".split())
            self.host.call_from_thread(self.host.notify, text[:300], severity="error", timeout=10)
            return
        self.host.call_from_thread(self._send_entries, always, restored)

    def _send_entries(self, always: bool, restored: bool = False) -> None:
        entries = self.entries()
        if entries or always:
            self.host.bridge.set_steering(entries)
        if entries and restored:
            self.host.notify(
                f"Steering from last time is on: {self.mix_summary()}. F6 to change it (0 turns a vector off).",
                severity="warning",
                timeout=10,
            )
        self.host.features_changed()  # the readouts name the vectors just read

    def _steer(self, settings: SteeringSettings) -> None:
        host = self.host
        before = self._mix()
        host.config = replace(host.config, steering=settings)
        position = host.reply_position()
        if position is not None:
            self._note_change(position, before)
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
