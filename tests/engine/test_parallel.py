"""Parallel sequences (engine_ext.parallel): each sequence's greedy reply equals the same request run alone, with its
own steering mix and its own n-gram drafting; joining, leaving, cancelling, prefix sharing, the queue's bound; and
the worker and router end to end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from app.core.model_paths import starter_model_path
from engine_ext.bindings import C
from engine_ext.client import EngineClient
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.parallel import ParallelScheduler
from engine_ext.params import GREEDY, ContextParams, SamplingParams, SpeculativeParams, SteeringEntry
from engine_ext.protocol import (
    Busy,
    Event,
    Failed,
    Finished,
    Generate,
    PromptEvaluated,
    Submit,
    TokenChunk,
)
from engine_ext.router import RequestRouter
from engine_ext.seq_batch import SeqBatch, seq_remove
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from engine_ext.steering.mixer import SteeringMixer

MAX_STEPS = 5000  # every loop below is bounded: a scheduler that never drains fails the test instead of hanging
YES_NO = 'root ::= " yes" | " no"'  # a grammar: the reply is one of these, then the end of generation
PROMPTS = ("go", "word1 word2 word3", "a b c d e f", "the end")


@contextmanager
def open_session(path: Path, n_seq: int = 1, n_ctx: int = 1024, *, unified: bool = True) -> Iterator[Session]:
    model = Model(path)
    params = ContextParams(n_ctx=n_ctx, n_batch=256, n_threads=2, n_seq_max=n_seq, kv_unified=unified)
    ctx = Context(model, params)
    try:
        yield Session(model, ctx)
    finally:
        ctx.close()
        model.close()


def alone(session: Session, request: Generate, steering: tuple[SteeringEntry, ...] = ()) -> list[int]:
    """The request's tokens on the single-sequence path (a fresh cache, the mix applied to the whole context)."""
    session.reset_cache()
    mixer = SteeringMixer(session.model, session.ctx)
    mixer.apply(steering)
    tokens: list[int] = []
    try:
        session.generate(request, lambda e: tokens.extend(e.token_ids) if isinstance(e, TokenChunk) else None, no)
    finally:
        mixer.clear()
    return tokens


def no() -> bool:
    return False


class Run:
    """A scheduler over a session, stepped until it drains; events collected per request."""

    def __init__(self, session: Session) -> None:
        self.events: list[Event] = []
        self.scheduler = ParallelScheduler(session, self.events.append)
        self.scheduler.activate(())

    def submit(self, request: Generate, **kwargs: object) -> None:
        self.scheduler.submit(Submit(request, **kwargs))  # type: ignore[arg-type]

    def drain(self) -> None:
        for _ in range(MAX_STEPS):
            if not self.scheduler.busy:
                return
            self.scheduler.step()
        raise AssertionError(f"the scheduler still had work after {MAX_STEPS} steps")

    def tokens(self, request_id: int) -> list[int]:
        return [t for e in self.events if isinstance(e, TokenChunk) and e.request_id == request_id for t in e.token_ids]

    def finished(self, request_id: int) -> Finished:
        done = [e for e in self.events if isinstance(e, Finished) and e.request_id == request_id]
        assert len(done) == 1, self.events
        return done[0]


def greedy(request_id: int, prompt: str, n: int = 16) -> Generate:
    return Generate(request_id, prompt=prompt, sampling=GREEDY, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("kind", ["llama", "qwen35"])  # a KV cache, and a hybrid recurrent memory
def test_each_parallel_greedy_reply_equals_the_request_alone(tiny_models: dict[str, Path], kind: str) -> None:
    requests = [greedy(i + 1, p, 12 + 3 * i) for i, p in enumerate(PROMPTS)]
    with open_session(tiny_models[kind]) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(tiny_models[kind], n_seq=4) as session:
        run = Run(session)
        for r in requests:
            run.submit(r)
        run.drain()
        for r, want in zip(requests, expected, strict=True):
            assert run.tokens(r.request_id) == want
            done = run.finished(r.request_id)
            assert done.stop_reason == "max_tokens" and done.stats.generated_tokens == r.max_tokens
            assert done.stats.n_ctx == 1024 // 4  # each sequence holds its share of the cells


def test_on_the_starter_model(tmp_path: Path) -> None:
    path = starter_model_path()
    if path is None:
        pytest.skip("the starter model package is not installed")
    requests = [
        greedy(1, "The capital of France is", 10),
        greedy(2, "Once upon a time", 10),
        greedy(3, "def fibonacci(n):", 10),
        Generate(4, prompt="Is the sky blue? Answer:", sampling=GREEDY, max_tokens=10, grammar=YES_NO),
    ]
    with open_session(path) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(path, n_seq=4, n_ctx=2048) as session:
        run = Run(session)
        for r in requests:
            run.submit(r)
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        assert run.finished(4).stop_reason == "eos" and 1 <= len(expected[3]) <= 3  # the grammar held the reply


@pytest.mark.parametrize("unified", [True, False])  # the prefix's cells shared, or its sequence's stream copied
def test_requests_join_and_leave_between_steps_and_reuse_a_shared_prefix(
    tiny_models: dict[str, Path], unified: bool
) -> None:
    first, later = greedy(1, "word1 word2 word3 word4 word5", 30), greedy(2, "word1 word2 word3 word4 go", 8)
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, first), alone(single, later)]
    with open_session(tiny_models["llama"], n_seq=2, unified=unified) as session:
        run = Run(session)
        run.submit(first)
        for _ in range(6):
            run.scheduler.step()
        assert run.tokens(1) and run.scheduler.running == 1
        run.submit(later)  # joins while the first runs, and copies the first's prompt prefix (llama_memory_seq_cp)
        run.drain()
        assert run.tokens(1) == expected[0] and run.tokens(2) == expected[1]
        cached = [e.prompt_tokens_cached for e in run.events if isinstance(e, PromptEvaluated) and e.request_id == 2]
        assert cached and cached[0] > 0
        assert run.finished(2).stats.prompt_tokens_cached == cached[0]


def test_idle_caches_leave_the_kv_cache_and_come_back_from_host_memory(tiny_models: dict[str, Path]) -> None:
    first, second = greedy(1, "word1 word2 word3 word4 word5", 12), greedy(2, "a b c d e f", 12)
    again, later = greedy(3, "a b c d e f", 8), greedy(4, "word1 word2 word3 word4 go", 8)
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, r) for r in (first, second, again, later)]
    with open_session(tiny_models["llama"], n_seq=2) as session:
        run = Run(session)
        run.submit(first)
        run.submit(second)
        run.drain()
        run.submit(again)  # takes the sequence holding its prompt; the other, idle, goes to host memory
        run.scheduler.step()
        idle = next(s for s in run.scheduler.slots if s.job is None)
        assert not idle.tokens and C.llama_memory_seq_pos_max(session.ctx.memory, idle.seq) == -1
        assert run.scheduler.idle is not None and len(run.scheduler.idle) == 1
        run.drain()
        run.submit(later)  # its prompt's prefix comes back from host memory, not read again
        run.drain()
        for r, want in zip((first, second, again, later), expected, strict=True):
            assert run.tokens(r.request_id) == want
        assert run.finished(3).stats.prompt_tokens_cached > 0
        assert run.finished(4).stats.prompt_tokens_cached > 0


def test_cancel_stops_one_request_at_the_next_step(tiny_models: dict[str, Path]) -> None:
    with open_session(tiny_models["llama"], n_seq=2) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 200))
        run.submit(greedy(2, "the end", 20))
        for _ in range(4):
            run.scheduler.step()
        job = next(s.job for s in run.scheduler.slots if s.job is not None and s.job.request_id == 1)
        n_before = job.n_generated
        assert n_before > 0
        assert run.scheduler.cancel(1)
        run.scheduler.step()
        done = run.finished(1)
        assert done.stop_reason == "cancelled" and done.stats.generated_tokens == n_before == len(run.tokens(1))
        run.drain()
        assert run.finished(2).stop_reason == "max_tokens" and len(run.tokens(2)) == 20
        assert not run.scheduler.cancel(1)  # ended: nothing to cancel


def test_the_queue_is_bounded_and_a_waiting_request_can_be_cancelled(tiny_models: dict[str, Path]) -> None:
    with open_session(tiny_models["llama"], n_seq=1) as session:
        run = Run(session)
        run.scheduler.max_waiting = 2
        for i in range(4):
            run.submit(greedy(i + 1, "go", 4))
        busy = [e for e in run.events if isinstance(e, Busy)]
        assert [b.request_id for b in busy] == [4] and busy[0].waiting == 2 and busy[0].slots == 1
        assert run.scheduler.cancel(2)
        assert run.finished(2).stop_reason == "cancelled" and run.finished(2).stats.generated_tokens == 0
        run.drain()
        assert run.finished(1).stop_reason == "max_tokens"


def test_a_bad_request_fails_alone(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with open_session(tiny_models["llama"], n_seq=2) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 6), steering=(SteeringEntry(str(tmp_path / "missing.gguf")),))
        missing = SpeculativeParams(types=("draft-simple",), draft_model=str(tmp_path / "missing-draft.gguf"))
        run.submit(greedy(2, "go", 6), speculative=missing)
        run.submit(greedy(3, "go", 6))
        run.submit(Generate(4, prompt="go", sampling=GREEDY, max_tokens=6, tools='[{"type": "function"}]'))
        run.drain()
        failed = {e.request_id: e for e in run.events if isinstance(e, Failed)}
        assert set(failed) == {1, 2, 4} and "not found" in failed[2].message and "\n" not in failed[4].message
        assert run.finished(3).stop_reason == "max_tokens"


def random_vector(model: Model, seed: int) -> ControlVector:
    rng = np.random.default_rng(seed)
    return ControlVector({il: rng.normal(size=model.n_embd).astype(np.float32) for il in range(1, model.n_layer)})


def test_no_request_sees_another_requests_steering(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with open_session(tiny_models["llama"]) as single:
        happy = str(write_control_vector(random_vector(single.model, 1), tmp_path / "a.gguf"))
        sad = str(write_control_vector(random_vector(single.model, 2), tmp_path / "b.gguf"))
        mixes: list[tuple[SteeringEntry, ...]] = [(), (SteeringEntry(happy, 4.0),), (SteeringEntry(sad, -4.0),), ()]
        requests = [greedy(i + 1, p, 24) for i, p in enumerate(PROMPTS)]
        expected = [alone(single, r, m) for r, m in zip(requests, mixes, strict=True)]
        plain = [alone(single, r) for r in requests]
    assert expected[1] != plain[1] and expected[2] != plain[2]  # the vectors change these replies
    with open_session(tiny_models["llama"], n_seq=4) as session:
        run = Run(session)
        for r, m in zip(requests, mixes, strict=True):
            run.submit(r, steering=m)
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        assert run.scheduler.applied_mix in mixes


def logits_after(ctx: Context, prompt: list[int], other: list[int] | None, n: int = 16) -> list[np.ndarray]:
    """Sequence 0's logits over n greedy steps after `prompt`; with `other`, sequence 1 held `other` first (its cells
    before sequence 0's in a shared buffer) and is dropped once sequence 0's prompt is in."""
    batch = SeqBatch(ctx, 256)
    try:
        if other is not None:
            batch.add(1, other, 0, outputs=False)
            batch.decode()
        batch.add(0, prompt, 0, outputs=True)
        batch.decode()
        if other is not None:
            seq_remove(ctx, 1, -1)
        rows, row = [], len(prompt) - 1
        for pos in range(len(prompt), len(prompt) + n):
            logits = np.ctypeslib.as_array(ctx.logits_row(row), shape=(ctx.model.n_vocab,)).copy()
            rows.append(logits)
            batch.add(0, [int(np.argmax(logits))], pos, outputs=True)
            batch.decode()
            row = 0
        return rows
    finally:
        batch.close()


@pytest.mark.parametrize("unified", [True, False])
def test_where_a_sequences_cells_lie_changes_its_sums_only_in_a_shared_buffer(
    tiny_models: dict[str, Path], unified: bool
) -> None:
    """Why a request's cache is placed with care: in one KV buffer shared by the sequences, a sequence whose cells lie
    after another's (and whose next cells fill the holes that one left) gets other logits than alone; with a stream
    per sequence (kv_unified off: what `serve --parallel N` uses) they are bitwise the same."""
    with open_session(tiny_models["llama"], n_seq=2, unified=unified) as session:
        prompt = session.model.tokenize("word1 word2 the end go " * 3, add_special=False, parse_special=False)
        other = session.model.tokenize("a b c d e f " * 16, add_special=False, parse_special=False)
        alone_rows = logits_after(session.ctx, prompt, None)
        session.ctx.clear()
        after_other = logits_after(session.ctx, prompt, other)
    same = all(np.array_equal(a, b) for a, b in zip(alone_rows, after_other, strict=True))
    assert same is not unified


def test_a_prompt_cached_under_one_steering_mix_is_read_again_under_another(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A sequence's cache was computed under its request's steering: a request with the same prompt and another mix
    does not reuse it (its reply equals the request alone under its own mix), while one with the same mix does,
    alone or beside a request under another mix; sequence 0 goes back to the single path without another mix's
    cells."""
    prompt = "word1 word2 word3 word4 word5"
    with open_session(tiny_models["llama"]) as single:
        happy = (SteeringEntry(str(write_control_vector(random_vector(single.model, 1), tmp_path / "a.gguf")), 4.0),)
        requests = [greedy(i, prompt, 16) for i in range(1, 6)]
        mixes = [happy, (), happy, (), happy]
        expected = [alone(single, r, m) for r, m in zip(requests, mixes, strict=True)]
    assert expected[0] != expected[1]  # the vector changes the reply
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        for request, mix in zip(requests[:3], mixes[:3], strict=True):
            run.submit(request, steering=mix)
            run.drain()
        run.submit(requests[3], steering=mixes[3])  # together: each with its own mix's cache
        run.submit(requests[4], steering=mixes[4])
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        assert run.finished(2).stats.prompt_tokens_cached == 0  # the same prompt, no steering: read again
        assert run.finished(3).stats.prompt_tokens_cached > 0  # the first one's cache, same mix
        run.scheduler.release()
        first = run.scheduler.slots[0]
        assert first.mix == run.scheduler.base_mix and session.cached == first.tokens


def test_ngram_drafting_per_sequence_keeps_greedy_output(tiny_models: dict[str, Path]) -> None:
    repeated = " ".join(["word1 word2 word3 word4"] * 6)
    requests = [greedy(1, repeated, 96), greedy(2, "go", 20), greedy(3, repeated + " word1", 80)]
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(tiny_models["llama"], n_seq=4) as session:
        run = Run(session)  # each request with its own drafter type, one without
        run.submit(requests[0], speculative=SpeculativeParams(types=("ngram-mod",)))
        run.submit(requests[1])
        run.submit(requests[2], speculative=SpeculativeParams(types=("ngram-map-k",), fixed_length=True))
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        for request_id in (1, 3):  # a greedy tiny model falls into a loop: its own text is drafted and accepted
            stats = run.finished(request_id).speculative
            assert stats is not None and stats.drafted > 0 and stats.accepted > 0
            assert stats.acceptance_per_position and stats.acceptance_per_position[0] > 0
        assert run.finished(2).speculative is None


def test_sampled_requests_follow_their_own_seed(tiny_models: dict[str, Path]) -> None:
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    request = Generate(1, prompt="go", sampling=sampling, max_tokens=20, ignore_eos=True)
    with open_session(tiny_models["llama"]) as single:
        expected = alone(single, request)
    with open_session(tiny_models["llama"], n_seq=3) as session:
        run = Run(session)
        run.submit(request)
        run.submit(greedy(2, "the end", 20))
        run.submit(Generate(3, prompt="go", sampling=sampling, max_tokens=20, ignore_eos=True))
        run.drain()
        assert run.tokens(1) == expected == run.tokens(3)


def test_worker_and_router_route_parallel_requests(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], context=ContextParams(n_ctx=1024, n_threads=2, n_seq_max=2))
        router = RequestRouter(client)
        try:
            client.set_queue_limit(1)
            ids = [router.submit(greedy(0, p, 12)) for p in PROMPTS]  # 2 run, 1 waits, 1 is refused
            outcomes: dict[int, list[Event]] = {i: list(router.events(i, timeout=120)) for i in ids}
            last = {i: events[-1] for i, events in outcomes.items()}
            assert [type(e).__name__ for e in last.values()].count("Busy") == 1
            finished = [i for i, e in last.items() if isinstance(e, Finished)]
            assert len(finished) == 3
            for i in finished:
                chunks = [e for e in outcomes[i] if isinstance(e, TokenChunk)]
                assert sum(len(c.token_ids) for c in chunks) == 12
                assert all(e.request_id == i for e in outcomes[i] if hasattr(e, "request_id"))
        finally:
            router.close()
        events = list(client.generate(greedy(0, "go", 4)))  # the single-sequence path after parallel requests
        assert isinstance(events[-1], Finished) and events[-1].stats.generated_tokens == 4
