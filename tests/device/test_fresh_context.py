"""The fresh target context on the device (issue 24), through the real engine worker.

With the target's layers on a device, llama.cpp's graph re-reserved in a context that has decoded crashed the engine
on Mesa 22.3's lavapipe: turning a drafter that reads the target's layer inputs (DFlash, DSpark, EAGLE3), or `auto`,
on or off, and on lavapipe changing steering, make the worker replace the target context by one that has never
decoded (engine_ext/worker.py, _fresh_context). These tests show, on the device, that

- steering changes after decoding (and one sent while a reply streams) do not crash the engine, and steer;
- steering applied before a replacement still steers after it: greedy output with steering and speculation is the
  greedy output with steering alone (and not the unsteered output), and clearing steering afterwards acts on the
  new context, with the drafters built on it again;
- `auto` with a DFlash, DSpark or EAGLE3 draft paired to the llama target picks that drafter (after ngram-mod), the
  worker takes the fresh-context path, and the output is plain greedy output.

Every wait on the worker is bounded (STEP_TIMEOUT_S); a native crash ends the worker, not the test run, and fails
the test with the log's tail. Only the dense llama and qwen35 targets (the MoE models need patch 0002 on lavapipe).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from engine_ext.client import EngineClient
from engine_ext.doctor import is_lavapipe
from engine_ext.gguf import inspect_gguf
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    Crashed,
    Event,
    Failed,
    Finished,
    Generate,
    Loaded,
    LoadModel,
    SetSpeculative,
    SetSteering,
    SpeculativeSet,
    SteeringSet,
    TokenChunk,
)
from engine_ext.spec_catalog import LAYER_INPUT_TYPES, load_plan
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from engine_ext.worker import FRESH_CONTEXT_LOG
from tests.device.devices import GpuDevice
from tests.tiny_models import N_EMBD

# One load (lavapipe compiles ggml's shaders on a cold cache: about 30 s), one set-up or one 32-token generation.
STEP_TIMEOUT_S = 240.0
PROMPTS = ("Once upon a time", "1 2 3 4 5 6 7 8 9 10 11 12")
N_TOKENS = 32
N_MAX = 4
# A vector this strong changes the tiny models' greedy replies (checked by every test before it relies on it) without
# making them one token repeated (from 0.5 up, llama's and qwen35's replies are, on the CPU).
STEERING_SCALE = 0.25

_E = TypeVar("_E")


class WorkerDied(AssertionError):
    def __init__(self, crashed: Crashed, stage: str) -> None:
        tail = " | ".join(line for line in crashed.log_tail.splitlines()[-4:] if line.strip())
        super().__init__(f"the engine crashed while {stage}: {crashed.description}; log: {tail}")


class Worker:
    """The engine worker, driven with a bounded wait on every answer."""

    def __init__(self, client: EngineClient, log_path: Path, backend: str) -> None:
        self.client = client
        self.log_path = log_path
        self.backend = backend  # the device's, e.g. Vulkan
        # Lavapipe: steering changes get a fresh context too, and wait for a streaming reply's end (on a GPU they act
        # in the context, at the next token: engine_ext/worker.py, steering_replaces_context).
        self.fresh_steering = False

    def answer(self, kind: type[_E], stage: str) -> tuple[_E, list[Event]]:
        """Events until the first of `kind` (and the ones before it); Failed and Crashed fail the test."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        seen: list[Event] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {STEP_TIMEOUT_S:g} s while {stage}")
            event = self.client.next_event(timeout=min(left, 5.0))
            if event is None:
                continue
            if isinstance(event, kind):
                return event, seen
            if isinstance(event, Crashed):
                raise WorkerDied(event, stage)
            if isinstance(event, Failed):
                raise AssertionError(f"the engine failed while {stage}: {event.error}: {event.message}")
            seen.append(event)

    def load(self, path: Path, ngl: int, context: ContextParams, *, load_mtp: bool = False) -> None:
        self.client.send(LoadModel(str(path), ModelParams(n_gpu_layers=ngl, load_mtp=load_mtp), context))
        info = self.answer(Loaded, f"loading {path.name}")[0].info
        assert info.backend == self.backend and info.n_gpu_layers != 0, info  # on the device

    def steer(self, entries: tuple[SteeringEntry, ...]) -> SteeringSet:
        self.client.send(SetSteering(entries))
        return self.answer(SteeringSet, "setting steering")[0]

    def speculate(self, params: SpeculativeParams) -> SpeculativeSet:
        self.client.send(SetSpeculative(params))
        return self.answer(SpeculativeSet, f"turning on {', '.join(params.types)}")[0]

    def greedy(self, *, speculative: bool) -> tuple[list[list[int]], list[Finished]]:
        """Each prompt's greedy tokens, and each generation's Finished (its speculative statistics)."""
        outputs, finished = [], []
        for prompt in PROMPTS:
            request_id = self.client.new_request_id()
            self.client.send(
                Generate(
                    request_id=request_id,
                    prompt=prompt,
                    sampling=GREEDY,
                    max_tokens=N_TOKENS,
                    ignore_eos=True,
                    speculative=speculative,
                )
            )
            done, events = self.answer(Finished, f"generating ({'speculative' if speculative else 'plain'})")
            assert done.request_id == request_id
            outputs.append([t for e in events if isinstance(e, TokenChunk) for t in e.token_ids])
            finished.append(done)
        assert all(len(ids) == N_TOKENS for ids in outputs), [len(ids) for ids in outputs]
        return outputs, finished

    def fresh_contexts(self) -> int:
        """How many times the worker has replaced the target context (its log says so each time)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace").count(FRESH_CONTEXT_LOG)


@contextmanager
def worker(tmp_path: Path, device: GpuDevice) -> Iterator[Worker]:
    log_path = tmp_path / "engine.log"
    with EngineClient(log_path, start_timeout_s=STEP_TIMEOUT_S) as client:
        client.start()
        engine = Worker(client, log_path, device.backend)
        engine.fresh_steering = is_lavapipe(device.description)
        yield engine


def steering_vector(path: Path, tmp_path: Path) -> SteeringEntry:
    info = inspect_gguf(path)
    n_layer = (info.block_count or 0) - (info.n_layer_nextn or 0)  # the MTP heads take no control vector
    rng = np.random.default_rng(24)
    vector = ControlVector(
        {il: rng.normal(scale=STEERING_SCALE, size=N_EMBD).astype(np.float32) for il in range(1, n_layer)},
        model_hint=path.stem,
    )
    return SteeringEntry(str(write_control_vector(vector, tmp_path / "steer.gguf")))


def proposed_by(finished: list[Finished], name: str) -> int:
    return sum(d.proposed for f in finished if f.speculative for d in f.speculative.drafters if d.name == name)


def context_for(target: Path, types: tuple[str, ...], draft: Path | None) -> tuple[ContextParams, bool]:
    info = inspect_gguf(target)
    plan = load_plan(
        types,
        architecture=info.architecture or "",
        n_layer_nextn=info.n_layer_nextn or 0,
        draft_model=str(draft) if draft else None,
        n_max=N_MAX,
    )
    return ContextParams(n_ctx=512, n_batch=256, n_threads=2, n_rs_seq=plan.n_rs_seq), plan.load_mtp


# (speculative type, target kind, draft kind or None, the model drafter it must run): the three layer-input drafters
# on the llama target, and auto on qwen35 with its MTP heads (a hybrid target; auto takes the fresh-context path too).
STEERED = (
    ("draft-dflash", "llama", "dflash", "draft-dflash"),
    ("draft-dspark", "llama", "dspark", "draft-dspark"),
    ("draft-eagle3", "llama", "eagle3", "draft-eagle3"),
    ("auto", "qwen35_mtp", None, "draft-mtp"),
)


@pytest.mark.parametrize(("spec_type", "target", "draft", "drafter"), STEERED, ids=[f"{s[0]}-{s[1]}" for s in STEERED])
def test_steering_survives_the_fresh_context(
    spec_type: str,
    target: str,
    draft: str | None,
    drafter: str,
    tiny_models: dict[str, Path],
    tmp_path: Path,
    gpu_device: GpuDevice,
) -> None:
    target_path = tiny_models[target]
    draft_path = tiny_models[draft] if draft else None
    context, load_mtp = context_for(target_path, (spec_type,), draft_path)
    entry = steering_vector(target_path, tmp_path)
    with worker(tmp_path, gpu_device) as engine:
        engine.load(target_path, -1, context, load_mtp=load_mtp)
        unsteered, _ = engine.greedy(speculative=False)
        assert engine.steer((entry,)).active
        assert engine.fresh_contexts() == engine.fresh_steering, "steering changed in the context that had decoded"
        steered, _ = engine.greedy(speculative=False)
        assert steered != unsteered, "the vector does not change the greedy output: the test could not fail"

        configured = engine.speculate(
            SpeculativeParams(types=(spec_type,), draft_model=str(draft_path) if draft_path else None, n_max=N_MAX)
        )
        assert drafter in configured.drafters, configured
        assert engine.fresh_contexts() == engine.fresh_steering + 1, "the worker did not replace the target context"
        steered_spec, finished = engine.greedy(speculative=True)
        assert proposed_by(finished, drafter) > 0, [f.speculative for f in finished]
        assert steered_spec == steered, "steering is not applied as before after the fresh context"

        assert not engine.steer(()).active  # clearing: a third context, the drafters built on it again
        assert engine.fresh_contexts() == 2 * engine.fresh_steering + 1
        unsteered_spec, finished = engine.greedy(speculative=True)
        assert proposed_by(finished, drafter) > 0, [f.speculative for f in finished]
        assert unsteered_spec == unsteered


@pytest.mark.parametrize("draft", ["dflash", "dspark", "eagle3"])
def test_auto_picks_a_layer_input_drafter(
    draft: str, tiny_models: dict[str, Path], tmp_path: Path, gpu_device: GpuDevice
) -> None:
    target_path, draft_path = tiny_models["llama"], tiny_models[draft]
    drafter = f"draft-{draft}"
    assert drafter in LAYER_INPUT_TYPES
    context, load_mtp = context_for(target_path, ("auto",), draft_path)
    with worker(tmp_path, gpu_device) as engine:
        engine.load(target_path, -1, context, load_mtp=load_mtp)
        plain, _ = engine.greedy(speculative=False)
        configured = engine.speculate(SpeculativeParams(types=("auto",), draft_model=str(draft_path), n_max=N_MAX))
        assert configured.drafters == ("ngram-mod", drafter), configured
        assert engine.fresh_contexts() == 1, "the worker did not replace the target context"
        spec, finished = engine.greedy(speculative=True)
        assert proposed_by(finished, drafter) > 0, [f.speculative for f in finished]
        assert spec == plain


@pytest.mark.parametrize("target", ["llama", "qwen35"])
def test_steering_changes_after_decoding_do_not_crash(
    target: str, tiny_models: dict[str, Path], tmp_path: Path, gpu_device: GpuDevice
) -> None:
    """Each change (on, reversed, off) comes after the context has decoded, and one while a reply streams: each
    re-reserved llama.cpp's graph in the decoded context and crashed the engine on lavapipe (7 of 9 runs, issue 24)
    before the worker replaced the context instead; there a change sent mid-reply waits for the reply's end."""
    path = tiny_models[target]
    entry = steering_vector(path, tmp_path)
    context, _ = context_for(path, (), None)
    with worker(tmp_path, gpu_device) as engine:
        engine.load(path, -1, context)
        unsteered, _ = engine.greedy(speculative=False)
        assert engine.steer((entry,)).active
        steered, _ = engine.greedy(speculative=False)
        assert steered != unsteered
        assert engine.steer((replace(entry, strength=-1.0),)).active
        reversed_, _ = engine.greedy(speculative=False)
        assert reversed_ != steered
        assert not engine.steer(()).active
        assert engine.greedy(speculative=False)[0] == unsteered
        assert engine.fresh_contexts() == 3 * engine.fresh_steering

        request_id = engine.client.new_request_id()
        engine.client.send(
            Generate(request_id=request_id, prompt=PROMPTS[0], sampling=GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
        )
        engine.answer(TokenChunk, "waiting for the reply to stream")
        engine.client.send(SetSteering((entry,)))
        done, events = engine.answer(Finished, "generating while the steering changes")
        assert done.request_id == request_id
        applied = [e for e in events if isinstance(e, SteeringSet)]
        if engine.fresh_steering:
            assert not applied, "a steering change replaced the context in the middle of a reply"
        if not applied:
            applied = [engine.answer(SteeringSet, "applying the steering sent mid-reply")[0]]
        assert applied[0].active
        if engine.fresh_steering:
            assert engine.fresh_contexts() == 4
            assert engine.greedy(speculative=False)[0] == steered  # the next prompt evaluated in full, steered


@pytest.mark.parametrize("then", [(), ("ngram-mod",)], ids=["off", "ngram-mod"])
def test_a_layer_input_drafter_turned_off_does_not_crash(
    then: tuple[str, ...], tiny_models: dict[str, Path], tmp_path: Path, gpu_device: GpuDevice
) -> None:
    """Closing the drafter turns the target's layer inputs off, a graph re-reserve: in the context that had decoded
    it crashed the engine on lavapipe (off: 3 of 3 runs, ngram-mod: 1 of 3; issue 24)."""
    target_path, draft_path = tiny_models["llama"], tiny_models["dflash"]
    context, _ = context_for(target_path, ("draft-dflash",), draft_path)
    with worker(tmp_path, gpu_device) as engine:
        engine.load(target_path, -1, context)
        plain, _ = engine.greedy(speculative=False)
        engine.speculate(SpeculativeParams(types=("draft-dflash",), draft_model=str(draft_path), n_max=N_MAX))
        assert engine.greedy(speculative=True)[0] == plain
        assert engine.speculate(SpeculativeParams(types=then, n_max=N_MAX)).drafters == then
        assert engine.fresh_contexts() == 2, "the layer inputs went off in the context that had decoded"
        assert engine.greedy(speculative=True)[0] == plain
        assert engine.greedy(speculative=True)[0] == plain
