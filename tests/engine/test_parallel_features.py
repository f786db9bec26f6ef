"""Every feature of a reply per sequence (engine_ext.parallel): reasoning budgets, "stop thinking now", lazy grammars
after thinking, tool calls, images (at the sequence's own positions, the projector's cache shared) and threads that
follow a busy machine each give, under two sequences, the greedy output of the single-sequence path, alone and with
another request running (n-gram drafting on one of them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine_ext.client import EngineClient
from engine_ext.cpu import CpuLoad
from engine_ext.generate import Session
from engine_ext.model import set_threads
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams
from engine_ext.protocol import FORCED, ChatMessage, Event, Finished, Generate, ImageRef, ThreadsChanged, TokenChunk
from engine_ext.router import RequestRouter
from engine_ext.threads import ThreadGovernor
from engine_ext.vision import Vision
from tests.engine.test_parallel import Run, alone, greedy, open_session
from tests.engine.test_reasoning import LONG_THINKER, PICK, PROMPTS, THINKING_END, THINKING_TEMPLATE, ask
from tests.engine.test_tools import ASK, TOOLS
from tests.engine.test_vision import NO_MTMD, image, mmproj, vision_session
from tests.tiny_mmproj import IMAGE_TOKENS
from tests.tiny_models import write_tiny_model
from tests.tool_templates import QWEN25_TEMPLATE
from tests.unit.test_threads import Clock, FakeContention

__all__ = ["mmproj"]  # a fixture of test_vision's, shared
NGRAM = SpeculativeParams(types=("ngram-simple",), n_max=8)
Reply = tuple[list[int], list[str], Finished, str]  # ids, provenance, Finished, the answer's text


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model("qwen3", tmp_path_factory.mktemp("thinker") / "t.gguf", chat_template=THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model("llama", tmp_path_factory.mktemp("tools") / "q.gguf", chat_template=QWEN25_TEMPLATE)


def single(path: Path, requests: list[Generate]) -> list[Reply]:
    """Each request on the single-sequence path, from a fresh cache."""
    replies: list[Reply] = []
    with open_session(path, n_ctx=4096) as session:
        for request in requests:
            session.reset_cache()
            events: list[Event] = []
            done = session.generate(request, events.append, no)
            replies.append(_reply([e for e in events if isinstance(e, TokenChunk)], done))
    return replies


def no() -> bool:
    return False


def _reply(chunks: list[TokenChunk], done: Finished) -> Reply:
    ids = [t for c in chunks for t in c.token_ids]
    return ids, [s for c in chunks for s in c.provenance], done, "".join(c.text for c in chunks)


def reply(run: Run, request_id: int) -> Reply:
    chunks = [e for e in run.events if isinstance(e, TokenChunk) and e.request_id == request_id]
    return _reply(chunks, run.finished(request_id))


def parallel(path: Path, requests: list[Generate], drafted: int, *, together: bool) -> list[Reply]:
    """The requests on two sequences: all submitted at once, or each alone; request `drafted` with n-gram drafts."""
    with open_session(path, n_seq=2, n_ctx=4096) as session:
        run = Run(session)
        for i, request in enumerate(requests):
            run.submit(request, speculative=NGRAM if i == drafted else None)
            if not together:
                run.drain()
        run.drain()
        return [reply(run, r.request_id) for r in requests]


@pytest.mark.parametrize("together", [False, True])
def test_reasoning_budgets_and_lazy_grammars_per_sequence_equal_the_single_path(thinker: Path, together: bool) -> None:
    requests = [
        replace(ask(PROMPTS[0], 40, reasoning_budget=4), request_id=1),
        replace(ask(PROMPTS[1], 40, reasoning_budget=0), request_id=2),
        replace(ask(PROMPTS[2], 40, reasoning_budget=9), request_id=3),
        replace(ask(PROMPTS[0], 80, reasoning_budget=6, json_schema=PICK), request_id=4, ignore_eos=False),
        replace(ask(PROMPTS[1], 30), request_id=5),  # no budget: thinks freely
    ]
    want = single(thinker, requests)
    got = parallel(thinker, requests, drafted=2, together=together)
    for request, (ids, sources, done, _), (want_ids, want_sources, want_done, _) in zip(
        requests, got, want, strict=True
    ):
        assert ids == want_ids, request
        assert sources.count(FORCED) == want_sources.count(FORCED), request
        assert done.stats.reasoning_tokens == want_done.stats.reasoning_tokens
    assert FORCED in got[0][1] and got[0][2].stats.reasoning_tokens == 4
    assert isinstance(json.loads(got[3][3])["ok"], bool)  # the schema's answer, after the forced end of thinking


@pytest.mark.parametrize("together", [False, True])
def test_tool_calls_per_sequence_equal_the_single_path(tool_model: Path, together: bool) -> None:
    requests = [
        Generate(1, ASK, sampling=GREEDY, max_tokens=300, tools=TOOLS, tool_choice="required"),
        Generate(2, ASK, sampling=GREEDY, max_tokens=60, tools=TOOLS),  # auto: the lazy grammar never triggers
        Generate(3, ASK, sampling=GREEDY, max_tokens=160, tools=TOOLS, tool_choice="required"),
        Generate(4, ASK, sampling=GREEDY, max_tokens=30),
    ]
    want = single(tool_model, requests)
    got = parallel(tool_model, requests, drafted=2, together=together)
    for (ids, _, done, _), (want_ids, _, want_done, _) in zip(got, want, strict=True):
        assert ids == want_ids and calls(done) == calls(want_done)
        assert done.stop_reason == want_done.stop_reason and done.notices == want_done.notices
    (call,) = got[0][2].tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo", "Lima")
    assert not got[1][2].tool_calls and not got[3][2].tool_calls


def calls(done: Finished) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in done.tool_calls]  # a call's id is random


def test_stop_thinking_now_forces_one_sequences_end_at_its_next_token(thinker: Path) -> None:
    thinking = replace(ask(LONG_THINKER, 60), request_id=1)
    other = replace(ask(PROMPTS[2], 60), request_id=2)
    (free, *_), (other_alone, *_) = single(thinker, [thinking, other])
    with open_session(thinker, n_seq=2) as session:
        run = Run(session)
        run.submit(thinking)
        run.submit(other)
        for _ in range(200):
            run.scheduler.step()
            job = next((s.job for s in run.scheduler.slots if s.job is not None and s.job.request_id == 1), None)
            if job is not None and job.n_generated >= 3:
                break
        assert job is not None
        n = job.n_generated
        assert 3 <= n < 60 and run.scheduler.end_thinking(1)
        run.drain()
        forced = session.model.tokenize(THINKING_END, add_special=False, parse_special=True)
        ids, sources, *_ = reply(run, 1)
    assert ids[:n] == free[:n] and ids[n : n + len(forced)] == forced
    assert sources[n : n + len(forced)] == [FORCED] * len(forced) and FORCED not in sources[:n]
    assert reply(run, 2)[0] == other_alone  # the other sequence thinks on, as alone
    assert not run.scheduler.end_thinking(1)  # ended: nothing to stop


@pytest.fixture(scope="module")
def engine(thinker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path_factory.mktemp("engine-log") / "engine.log")
    client.start()
    client.load(str(thinker), ModelParams(), ContextParams(n_ctx=4096, n_threads=2, n_seq_max=2))
    yield client
    client.close()


def test_end_thinking_reaches_a_parallel_request_through_the_worker(engine: EngineClient) -> None:
    router = RequestRouter(engine)
    try:
        message = (ChatMessage("user", LONG_THINKER),)
        request_id = router.submit(Generate(0, message, sampling=GREEDY, max_tokens=1000, ignore_eos=True))
        sources: list[str] = []
        answer = ""
        last: Event | None = None
        for last in router.events(request_id, timeout=120):
            if isinstance(last, TokenChunk):
                if not sources:
                    engine.end_thinking(request_id)
                sources.extend(last.provenance)
                answer += last.text
                if answer.strip():
                    router.cancel(request_id)
        assert isinstance(last, Finished) and last.stop_reason == "cancelled"
        assert FORCED in sources and answer.strip()
    finally:
        router.close()


@pytest.mark.skipif(bool(NO_MTMD), reason=NO_MTMD)
@pytest.mark.parametrize("together", [False, True])
def test_images_per_sequence_equal_the_single_path(tiny_models: dict[str, Path], mmproj: Path, together: bool) -> None:
    def looking(request_id: int, *images: ImageRef) -> Generate:
        turn = (ChatMessage("user", "the picture, twice: the picture", images=images),)
        return Generate(request_id, turn, sampling=GREEDY, max_tokens=16, ignore_eos=True)

    requests = [looking(1, image(0)), looking(2, image(1), image(0)), looking(3), looking(4, image(0))]
    with vision_session(tiny_models["llama"], mmproj) as session:
        want = []
        for request in requests:
            session.reset_cache()
            want.append(ask_ids(session, request))
    with open_session(tiny_models["llama"], n_seq=2) as session:
        session.vision = Vision(mmproj, session.model, n_threads=2, use_gpu=False)
        try:
            run = Run(session)
            for i, request in enumerate(requests):
                run.submit(request, speculative=NGRAM if i == 1 else None)
                if not together:
                    run.drain()
            run.drain()
        finally:
            session.vision.close()
    assert [run.tokens(r.request_id) for r in requests] == want
    stats = [run.finished(r.request_id).stats for r in requests]
    assert [s.image_tokens for s in stats] == [IMAGE_TOKENS, 2 * IMAGE_TOKENS, 0, IMAGE_TOKENS]
    assert sum(s.images_encoded for s in stats) == 2  # each image encoded once: the projector's cache is shared
    assert want[0] != want[2] and want[0] != want[1]  # the images reach the model


def ask_ids(session: Session, request: Generate) -> list[int]:
    events: list[Event] = []
    session.generate(request, events.append, no)
    return [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids]


class Ticking(Clock):
    """A clock SAMPLE_S on at every reading: the governor samples the load at every step."""

    def __call__(self) -> float:
        self.step()
        return self.now


@pytest.mark.all_cpus
@pytest.mark.parametrize("together", [False, True])
def test_threads_follow_the_load_between_steps_and_output_stays(tiny_models: dict[str, Path], together: bool) -> None:
    requests = [greedy(1, "go", 40), greedy(2, "the end", 40)]
    with open_session(tiny_models["llama"]) as session:
        want = [alone(session, r) for r in requests]
    with open_session(tiny_models["llama"], n_seq=2) as session:
        contention = FakeContention()
        busy, quiet = [CpuLoad(1.4, 2)] * 4, [CpuLoad(0.1, 2)] * 1000
        contention.loads = [*busy, *quiet]  # others use 1.4 of the 2 CPUs, then leave
        session.governor = ThreadGovernor(2, set_threads, contention, pids=(1, 2), clock=Ticking())  # type: ignore[arg-type]
        run = Run(session)
        for request in requests:
            run.submit(request)
            if not together:
                run.drain()
        run.drain()
        assert session.ctx.n_threads == 2
    assert [run.tokens(r.request_id) for r in requests] == want
    changes = [e for e in run.events if isinstance(e, ThreadsChanged)]
    assert [e.threads for e in changes if e.request_id == 1] == [1, 2]  # fewer while others ran, then back
    assert all(e.others_cpus > 0 and e.cpus == 2 for e in changes)
    if together:
        assert [e.threads for e in changes if e.request_id == 2] == [1, 2]
