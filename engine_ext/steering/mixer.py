"""Mixing control vectors (strength, layer range, per-layer weights) and applying them to a context."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine_ext.archs import FFN_ONLY_CONTROL_VECTOR_ARCHS, NO_CONTROL_VECTOR_ARCHS
from engine_ext.bindings import C
from engine_ext.model import Context, Model
from engine_ext.params import EngineError, SteeringEntry
from engine_ext.steering.cvec_file import ControlVector, check_steerable, read_control_vector


def steered_layers(model: Model) -> list[int]:
    """The layers a control vector acts on for this model ([] when the architecture ignores them)."""
    arch = model.architecture
    if arch in NO_CONTROL_VECTOR_ARCHS:
        return []
    layers = list(range(1, model.n_layer))
    if arch in FFN_ONLY_CONTROL_VECTOR_ARCHS:
        from engine_ext.gguf import inspect_gguf

        kinds = inspect_gguf(model.path).layer_kinds
        layers = [il for il in layers if il < len(kinds) and ("moe" in kinds[il] or "ffn" in kinds[il])]
    return layers


def default_layer_range(model: Model) -> tuple[int, int]:
    """Upstream's default (1..n_layer-1), narrowed to the layers this architecture steers."""
    layers = steered_layers(model)
    return (layers[0], layers[-1]) if layers else (1, max(1, model.n_layer - 1))


@dataclass
class ActiveSteering:
    """What is applied now: the entries and the composed per-layer data."""

    entries: tuple[SteeringEntry, ...]
    layer_start: int
    layer_end: int
    layer_norms: tuple[float, ...]  # norm of the applied direction per layer 1..n_layer-1 (the heat strip)


class SteeringMixer:
    """Loads vectors once, composes the mix in numpy and hands it to llama_set_adapter_cvec."""

    def __init__(self, model: Model, ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self.n_embd = model.n_embd
        self.n_layer = model.n_layer
        self._vectors: dict[str, ControlVector] = {}
        self._data: np.ndarray | None = None  # kept alive while llama.cpp holds the pointer
        self.active: ActiveSteering | None = None

    def vector(self, path: str) -> ControlVector:
        if path not in self._vectors:
            self._vectors[path] = read_control_vector(Path(path), n_embd=self.n_embd, n_layer=self.n_layer)
        return self._vectors[path]

    def compose(self, entries: Sequence[SteeringEntry]) -> tuple[np.ndarray, int, int]:
        """The flat (n_layer-1) × n_embd array llama.cpp reads (row il-1 = layer il) and its layer range."""
        data = np.zeros((max(1, self.n_layer - 1), self.n_embd), dtype=np.float32)
        default_start, default_end = default_layer_range(self.model)
        start, end = self.n_layer, 0
        for entry in entries:
            entry.validate()
            if entry.strength == 0.0:
                continue
            vector = self.vector(entry.path)
            lo = entry.layer_start or default_start
            hi = min(entry.layer_end or default_end, self.n_layer - 1)
            for il, direction in vector.directions.items():
                if lo <= il <= hi:
                    weight = entry.layer_weights[il - 1] if il - 1 < len(entry.layer_weights) else 1.0
                    data[il - 1] += np.float32(entry.strength * weight) * direction
            start, end = min(start, lo), max(end, hi)
        for il, row in enumerate(data, start=1):
            check_steerable(row, f"the steering mix at layer {il}")
        return data, start, end

    def apply(self, entries: Sequence[SteeringEntry]) -> ActiveSteering | None:
        """Apply a mix (between two decode steps is fine); no entries or all zero: back to the base model."""
        data, start, end = self.compose(entries)
        if end < start or not np.any(data):
            self.clear()
            return None
        flat = np.ascontiguousarray(data.reshape(-1))
        rc = C.llama_set_adapter_cvec(
            self.ctx.handle,
            flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            flat.size,
            self.n_embd,
            start,
            end,
        )
        if rc != 0:
            raise EngineError("llama.cpp refused the control vector (embedding size or layer range)")
        self._data = flat
        norms = tuple(float(np.linalg.norm(row)) for row in data)
        self.active = ActiveSteering(tuple(entries), start, end, norms)
        return self.active

    def clear(self) -> None:
        C.llama_set_adapter_cvec(self.ctx.handle, None, 0, self.n_embd, -1, -1)
        self._data = None
        self.active = None
