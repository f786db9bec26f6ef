"""The worker's fresh target context (issue 24), on the CPU.

With the target on a device, llama.cpp's graph re-reserved in a context that had decoded crashed the engine on Mesa
22.3's lavapipe: the worker replaces the target context instead when a layer-input drafter (or auto) is turned on or
off, on any device, and when steering changes, on lavapipe (engine_ext/worker.py, _fresh_context). The device tests
(tests/device/test_fresh_context.py) run that on a device; these run the same paths in every normal run: the worker
here is told its target is on a Vulkan device (factory.target_backends), lavapipe or a GPU
(worker.steering_replaces_context), so it replaces the context on the CPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine_ext import worker as worker_module
from engine_ext.gguf import inspect_gguf
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    Event,
    Failed,
    Finished,
    Generate,
    LoadModel,
    Request,
    SetSpeculative,
    SetSteering,
    SpeculativeSet,
    SteeringSet,
    TokenChunk,
)
from engine_ext.spec_catalog import load_plan
from engine_ext.speculative import factory
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from engine_ext.worker import Worker
from tests.tiny_models import N_EMBD

PROMPTS = ("Once upon a time", "1 2 3 4 5 6 7 8 9 10 11 12")
N_MAX = 4


class Pipe:
    """The worker's end of the pipe, in this process: what it sends is kept; `incoming` is what it reads while it
    generates (a request the client sent meanwhile)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.incoming: deque[Request] = deque()

    def send(self, event: Event) -> None:
        self.events.append(event)

    def poll(self, _timeout: float = 0.0) -> bool:
        return bool(self.incoming)

    def recv(self) -> Request:
        return self.incoming.popleft()

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        failed = [e for e in events if isinstance(e, Failed)]
        assert not failed, failed
        return events


def handle(worker: Worker, pipe: Pipe, request: Any) -> list[Event]:
    worker.handle(request)
    return pipe.take()


def generate(prompt: str, request_id: int = 1, *, speculative: bool) -> Generate:
    return Generate(
        request_id=request_id, prompt=prompt, sampling=GREEDY, max_tokens=32, ignore_eos=True, speculative=speculative
    )


def greedy(worker: Worker, pipe: Pipe, *, speculative: bool) -> tuple[list[list[int]], list[Finished]]:
    outputs, finished = [], []
    for i, prompt in enumerate(PROMPTS, 1):
        events = handle(worker, pipe, generate(prompt, i, speculative=speculative))
        outputs.append([t for e in events if isinstance(e, TokenChunk) for t in e.token_ids])
        finished += [e for e in events if isinstance(e, Finished)]
    return outputs, finished


def steering_entry(target: Path, tmp_path: Path) -> SteeringEntry:
    info = inspect_gguf(target)
    n_layer = (info.block_count or 0) - (info.n_layer_nextn or 0)  # the MTP heads take no control vector
    rng = np.random.default_rng(24)
    vector = ControlVector({il: rng.normal(scale=0.25, size=N_EMBD).astype(np.float32) for il in range(1, n_layer)})
    return SteeringEntry(str(write_control_vector(vector, tmp_path / "steer.gguf")))


def steering_set(events: list[Event]) -> SteeringSet:
    (applied,) = [e for e in events if isinstance(e, SteeringSet)]
    return applied


@pytest.fixture
def on_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker takes the target's layers to be on a Vulkan device, Mesa's lavapipe."""
    monkeypatch.setattr(factory, "target_backends", lambda model: ("Vulkan",))
    monkeypatch.setattr(worker_module, "steering_replaces_context", lambda model: True)


@pytest.fixture
def on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker takes the target's layers to be on a Vulkan GPU (not lavapipe)."""
    monkeypatch.setattr(factory, "target_backends", lambda model: ("Vulkan",))
    monkeypatch.setattr(worker_module, "steering_replaces_context", lambda model: False)


def loaded(target: Path, types: tuple[str, ...], draft: str | None) -> Iterator[tuple[Worker, Pipe]]:
    info = inspect_gguf(target)
    plan = load_plan(
        types,
        architecture=info.architecture or "",
        n_layer_nextn=info.n_layer_nextn or 0,
        draft_model=draft,
        n_max=N_MAX,
    )
    pipe = Pipe()
    worker = Worker(pipe)  # type: ignore[arg-type]
    context = ContextParams(n_ctx=512, n_batch=256, n_threads=2, n_rs_seq=plan.n_rs_seq)
    try:
        handle(worker, pipe, LoadModel(str(target), ModelParams(n_gpu_layers=0, load_mtp=plan.load_mtp), context))
        yield worker, pipe
    finally:
        worker.unload()


@pytest.mark.parametrize(
    ("spec_type", "target", "draft", "drafter"),
    [
        ("draft-dflash", "llama", "dflash", "draft-dflash"),
        ("draft-dspark", "llama", "dspark", "draft-dspark"),
        ("draft-eagle3", "llama", "eagle3", "draft-eagle3"),
        ("auto", "qwen35_mtp", None, "draft-mtp"),
    ],
)
def test_steering_and_drafters_survive_each_fresh_context(
    spec_type: str,
    target: str,
    draft: str | None,
    drafter: str,
    tiny_models: dict[str, Path],
    tmp_path: Path,
    on_a_device: None,
) -> None:
    draft_path = str(tiny_models[draft]) if draft else None
    entry = steering_entry(tiny_models[target], tmp_path)
    for worker, pipe in loaded(tiny_models[target], (spec_type,), draft_path):
        unsteered, _ = greedy(worker, pipe, speculative=False)
        old = worker.ctx
        assert steering_set(handle(worker, pipe, SetSteering((entry,)))).active
        assert worker.ctx is not old, "a steering change on a device kept the context that had decoded"
        old = worker.ctx
        assert steering_set(handle(worker, pipe, SetSteering((entry,)))).active
        assert worker.ctx is old  # the same mix again: applied already
        steered, _ = greedy(worker, pipe, speculative=False)
        assert steered != unsteered, "the vector does not change the greedy output: the test could not fail"

        old = worker.ctx
        events = handle(worker, pipe, SetSpeculative(SpeculativeParams((spec_type,), draft_path, n_max=N_MAX)))
        (configured,) = [e for e in events if isinstance(e, SpeculativeSet)]
        assert drafter in configured.drafters
        assert worker.ctx is not old, "the worker kept the context"
        assert worker.session.ctx is worker.ctx and worker.mixer.ctx is worker.ctx
        steered_spec, finished = greedy(worker, pipe, speculative=True)
        proposed = [d.proposed for f in finished if f.speculative for d in f.speculative.drafters if d.name == drafter]
        assert sum(proposed) > 0
        assert steered_spec == steered, "steering is not applied as before after the fresh context"

        old, old_spec = worker.ctx, worker.session.spec
        assert not steering_set(handle(worker, pipe, SetSteering(()))).active
        assert worker.ctx is not old and worker.session.spec is not old_spec  # the drafters were built again
        unsteered_spec, finished = greedy(worker, pipe, speculative=True)
        assert unsteered_spec == unsteered  # clearing acts on the new context
        assert worker.session.spec.names == configured.drafters
        proposed = [d.proposed for f in finished if f.speculative for d in f.speculative.drafters if d.name == drafter]
        assert sum(proposed) > 0

        old = worker.ctx
        assert not steering_set(handle(worker, pipe, SetSteering(()))).active
        assert worker.ctx is old  # nothing to clear: llama.cpp is not touched


def test_a_steering_change_during_a_generation_waits_for_its_end_on_lavapipe(
    tiny_models: dict[str, Path], tmp_path: Path, on_a_device: None
) -> None:
    entry = steering_entry(tiny_models["llama"], tmp_path)
    for worker, pipe in loaded(tiny_models["llama"], (), None):
        plain = [
            t
            for e in handle(worker, pipe, generate(PROMPTS[0], speculative=False))
            if isinstance(e, TokenChunk)
            for t in e.token_ids
        ]
        pipe.incoming.append(SetSteering((entry,)))
        events = handle(worker, pipe, generate(PROMPTS[0], 2, speculative=False))
        assert not any(isinstance(e, SteeringSet) for e in events)  # not in the middle of the generation
        assert [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids] == plain
        assert isinstance(events[-1], Finished) and list(worker.backlog) == [SetSteering((entry,))]
        assert steering_set(handle(worker, pipe, worker.backlog.popleft())).active  # next, as the worker serves it


@pytest.mark.parametrize("where", ["cpu", "gpu"])
def test_a_steering_change_acts_at_once_on_the_cpu_and_on_a_gpu(
    where: str, tiny_models: dict[str, Path], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "gpu":
        request.getfixturevalue("on_a_gpu")
    entry = steering_entry(tiny_models["llama"], tmp_path)
    for worker, pipe in loaded(tiny_models["llama"], (), None):
        assert worker.device_backends == (("Vulkan",) if where == "gpu" else ())
        pipe.incoming.append(SetSteering((entry,)))
        old = worker.ctx
        events = handle(worker, pipe, generate(PROMPTS[0], speculative=False))
        kinds = [type(e) for e in events]
        assert SteeringSet in kinds and kinds.index(SteeringSet) < kinds.index(Finished)  # mid-reply
        assert not worker.backlog
        assert not steering_set(handle(worker, pipe, SetSteering(()))).active
        assert worker.ctx is old  # steering changed in the context, as llama.cpp does it


def test_on_a_gpu_a_layer_input_drafter_still_gets_a_fresh_context(
    tiny_models: dict[str, Path], tmp_path: Path, on_a_gpu: None
) -> None:
    draft = str(tiny_models["eagle3"])
    for worker, pipe in loaded(tiny_models["llama"], ("draft-eagle3",), draft):
        plain, _ = greedy(worker, pipe, speculative=False)
        old = worker.ctx
        handle(worker, pipe, SetSpeculative(SpeculativeParams(("draft-eagle3",), draft, n_max=N_MAX)))
        assert worker.ctx is not old
        assert greedy(worker, pipe, speculative=True)[0] == plain


@pytest.mark.parametrize("then", [(), ("ngram-mod",)], ids=["off", "ngram-mod"])
def test_a_layer_input_drafter_turned_off_on_a_device_leaves_a_fresh_context(
    then: tuple[str, ...], tiny_models: dict[str, Path], on_a_device: None
) -> None:
    """Its layer inputs go off when it closes: that re-reserve, in the context that decoded, crashed on Vulkan."""
    draft = str(tiny_models["dflash"])
    for worker, pipe in loaded(tiny_models["llama"], ("draft-dflash",), draft):
        plain, _ = greedy(worker, pipe, speculative=False)
        handle(worker, pipe, SetSpeculative(SpeculativeParams(("draft-dflash",), draft, n_max=N_MAX)))
        assert greedy(worker, pipe, speculative=True)[0] == plain
        old = worker.ctx
        events = handle(worker, pipe, SetSpeculative(SpeculativeParams(then, n_max=N_MAX)))
        (configured,) = [e for e in events if isinstance(e, SpeculativeSet)]
        assert configured.drafters == then
        assert worker.ctx is not old, "the layer inputs went off in the context that had decoded"
        assert greedy(worker, pipe, speculative=True)[0] == plain


def test_on_lavapipe_a_bad_vector_is_refused_before_the_context_is_replaced(
    tiny_models: dict[str, Path], tmp_path: Path, on_a_device: None
) -> None:
    draft = str(tiny_models["dflash"])
    wrong = write_control_vector(ControlVector({1: np.ones(N_EMBD // 2, np.float32)}), tmp_path / "wrong.gguf")
    for worker, pipe in loaded(tiny_models["llama"], ("draft-dflash",), draft):
        plain, _ = greedy(worker, pipe, speculative=False)
        handle(worker, pipe, SetSpeculative(SpeculativeParams(("draft-dflash",), draft, n_max=N_MAX)))
        old, spec = worker.ctx, worker.session.spec
        worker.handle(SetSteering((SteeringEntry(str(wrong)),)))
        (failed,) = pipe.events
        pipe.events.clear()
        assert isinstance(failed, Failed) and "embedding size" in failed.message
        assert worker.ctx is old and worker.session.spec is spec  # nothing changed
        assert greedy(worker, pipe, speculative=True)[0] == plain
