"""Control vectors on offloaded layers steer as on the CPU: the change a vector makes to the logits is the same with
every layer on the device, with half of them there, and with none."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_ext.gguf import inspect_gguf
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams, ModelParams, SteeringEntry
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from engine_ext.steering.mixer import SteeringMixer
from tests.device.devices import GpuDevice
from tests.tiny_models import N_EMBD

CONTEXT = ContextParams(n_ctx=256, n_batch=64, n_threads=2)


def logits(model: Model, ctx: Context, tokens: list[int]) -> np.ndarray:
    ctx.clear()
    ctx.decode(tokens, 0)
    return np.ctypeslib.as_array(ctx.logits_row(-1), shape=(model.n_vocab,)).copy()


def steering_delta(path: Path, ngl: int, vector: Path) -> tuple[np.ndarray, np.ndarray]:
    """The logits without steering, and the change the vector makes, with `ngl` layers offloaded.

    Each logits row comes from a context that had not decoded before steering was set on it, as the engine worker
    does on lavapipe (engine_ext/worker.py): a control vector set in a context that has decoded crashed Mesa 22.3's
    lavapipe intermittently (issue 24; a driver bug, Mesa 25 runs it)."""
    model = Model(path, ModelParams(n_gpu_layers=ngl))
    try:
        tokens = model.tokenize("steer me", add_special=False, parse_special=False)

        def fresh_logits(entries: list[SteeringEntry], *, clear_after: bool = False) -> np.ndarray:
            ctx = Context(model, CONTEXT)
            try:
                mixer = SteeringMixer(model, ctx)
                mixer.apply(entries)
                if clear_after:
                    mixer.clear()
                return logits(model, ctx, tokens)
            finally:
                ctx.close()

        base = fresh_logits([])
        steered = fresh_logits([SteeringEntry(str(vector), 1.0, 1, model.n_layer - 1)])
        cleared = fresh_logits([SteeringEntry(str(vector), 1.0, 1, model.n_layer - 1)], clear_after=True)
        assert np.array_equal(cleared, base) or np.allclose(cleared, base)
        return base, steered - base
    finally:
        model.close()


@pytest.mark.parametrize("kind", ["llama", "qwen35", "qwen3next", "nemotron_h_moe"])
def test_vectors_on_offloaded_layers_steer_as_on_the_cpu(
    kind: str, tiny_models: dict[str, Path], tmp_path: Path, gpu_device: GpuDevice
) -> None:
    path = tiny_models[kind]
    n_layer = inspect_gguf(path).block_count or 0
    rng = np.random.default_rng(7)
    vector = ControlVector(
        {il: rng.normal(scale=0.5, size=N_EMBD).astype(np.float32) for il in range(1, n_layer)}, model_hint=kind
    )
    file = write_control_vector(vector, tmp_path / "v.gguf")
    _, cpu = steering_delta(path, 0, file)
    assert np.abs(cpu).max() > 1e-3  # the vector steers
    for ngl in (-1, (n_layer + 1) // 2):
        _, device = steering_delta(path, ngl, file)
        scale = max(1.0, float(np.abs(cpu).max()))
        assert np.abs(device - cpu).max() <= 1e-3 * scale, (ngl, np.abs(device - cpu).max(), scale)
