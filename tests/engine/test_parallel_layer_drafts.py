"""draft-eagle3, draft-dflash and draft-dspark per parallel sequence (engine_ext.speculative.layer_seqs): one draft
context with a draft sequence per target sequence, each reading its own rows of the target's hidden states in the
shared batch; greedy replies equal plain decoding alone, each request with its own acceptance figures, and every
draft equals that of a fresh single-path drafter fed the same history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from engine_ext.bindings import C
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams, SpeculativeParams
from engine_ext.protocol import Failed
from engine_ext.speculative.base import UNREAD
from engine_ext.speculative.dflash import DraftDFlash
from engine_ext.speculative.eagle3 import DraftEagle3
from engine_ext.speculative.factory import build_driver
from engine_ext.speculative.layer_seqs import SequenceLayerDrafter
from tests.engine.test_parallel import Run, alone, greedy, open_session

REPEATED = " ".join(["word1 word2 word3 word4"] * 4)


def eagle3(path: Path, n_max: int = 4, spec_type: str = "draft-eagle3") -> SpeculativeParams:
    return SpeculativeParams(types=(spec_type,), draft_model=str(path), n_max=n_max)


KINDS = [("draft-eagle3", "eagle3", 8), ("draft-dflash", "dflash", 2), ("draft-dspark", "dspark", 2)]


Call = tuple[int, int, list[int], int, int, list[int]]  # (seq, pool's id, tokens, id_last, n_max, draft)


def record_drafts(calls: list[Call], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SequenceLayerDrafter draft made from now on is appended to `calls`."""
    original = SequenceLayerDrafter.draft

    def recording(self: SequenceLayerDrafter, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        result = original(self, tokens, id_last, n_max)
        calls.append((self.seq, id(self.pool), list(tokens), id_last, n_max, result))
        return result

    monkeypatch.setattr(SequenceLayerDrafter, "draft", recording)


@pytest.mark.parametrize("spec_type, kind, n_max", KINDS)
def test_each_sequence_drafts_from_its_own_rows_alone_and_together(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, spec_type: str, kind: str, n_max: int
) -> None:
    target, draft = tiny_models["llama"], tiny_models[kind]
    requests = [greedy(1, "go", 40), greedy(2, "word1 word2 word3", 32), greedy(3, REPEATED, 36), greedy(4, "a b", 24)]
    with open_session(target) as single:
        expected = [alone(single, r) for r in requests]
    calls: list[Call] = []
    record_drafts(calls, monkeypatch)
    with open_session(target, n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(requests[0], speculative=eagle3(draft, 3, spec_type))  # alone on the scheduler
        run.drain()
        assert run.tokens(1) == expected[0]
        # Together: two EAGLE3 requests (another length each), then a plain one joining the sequence the first
        # left while the second drafts, its rows between theirs in the batch.
        run.submit(requests[1], speculative=eagle3(draft, n_max, spec_type))
        run.submit(requests[2], speculative=eagle3(draft, 3, spec_type))
        run.submit(requests[3])
        run.drain()
        assert [run.tokens(r.request_id) for r in requests[1:]] == expected[1:]
        for request_id in (1, 2, 3):
            stats = run.finished(request_id).speculative
            assert stats is not None and [d.name for d in stats.drafters] == [spec_type]
            assert stats.drafted > 0 and 0 <= stats.accepted <= stats.drafted  # its own figures
        assert run.finished(4).speculative is None
        pools = run.scheduler.drafts.layer_pools
        assert len(pools) == (1 if spec_type == "draft-eagle3" else 2)  # DFlash: a context per draft block length
        block_of = {id(pool): key[2] or n_max for key, pool in pools.items()}
        assert {int(C.llama_n_ctx_seq(p.ctx)) for p in pools.values()} == {session.ctx.n_ctx_seq}  # a KV stream each
        assert {seq for seq, *_ in calls} == {0, 1}
        run.scheduler.close()
    assert len(calls) > 20 and all(result for *_, n_max, result in calls if n_max > 0)
    # Each draft is the one a fresh single-path drafter makes from the same history read at once: each sequence read
    # its own rows of the shared batches, and its draft state was its own.
    model = Model(target)
    try:
        for _, pool_id, tokens, id_last, call_n_max, result in calls[::3]:
            ctx = Context(model, ContextParams(n_ctx=512, n_batch=256, n_threads=2))
            driver = build_driver(eagle3(draft, block_of[pool_id], spec_type), model, ctx)
            try:
                ctx.decode(tokens, 0, logits_last=False)
                driver.process(tokens, 0)
                assert driver.drafters[0].draft(tokens, id_last, call_n_max) == result, f"at position {len(tokens)}"
            finally:
                driver.close()
                ctx.close()
    finally:
        model.close()


def read_history(pool: DraftEagle3 | DraftDFlash, seq: int) -> tuple[list[int], int]:
    """What draft sequence `seq` read (tokens by position, UNREAD where it did not) and the first position whose rows
    it holds (EAGLE3: encoder rows; DFlash: injected rows, from the first position read)."""
    if isinstance(pool, DraftEagle3):
        return pool.states[seq].seen, min(pool.states[seq].g_by_pos, default=-1)
    seen = pool.seen[seq]
    return seen, next((i for i, t in enumerate(seen) if t != UNREAD), -1)


@pytest.mark.parametrize("spec_type, kind", [("draft-eagle3", "eagle3"), ("draft-dflash", "dflash")])
def test_a_request_on_a_sequence_copied_from_another_forgets_the_old_draft_history(
    tiny_models: dict[str, Path], spec_type: str, kind: str
) -> None:
    """A request placed on a sequence whose cells were copied from another sequence (its prompt's prefix is there):
    its draft sequence forgets what it read of the conversation the sequence held before, keeping only what the two
    share, and the reply is still plain decoding's."""
    target, spec = tiny_models["llama"], eagle3(tiny_models[kind], 3, spec_type)
    shared = "word1 word2 other words here and more of them"
    plain, first = greedy(1, shared, 8), greedy(2, shared, 10)
    old, again, drafted = greedy(3, REPEATED, 12), greedy(4, shared, 16), greedy(5, shared + " and then", 24)
    with open_session(target) as single:
        expected = [alone(single, r) for r in (again, drafted)]
    with open_session(target, n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(plain)  # sequence 0
        run.drain()
        run.submit(first)  # back on sequence 0, which holds its prompt
        run.submit(old, speculative=spec)  # sequence 1: its draft sequence reads this conversation
        run.drain()
        (pool,) = run.scheduler.drafts.layer_pools.values()
        seen, rows_from = read_history(pool, 1)
        assert len(seen) > 12 and 0 <= rows_from <= 12
        run.submit(again)  # sequence 0 again
        run.submit(drafted, speculative=spec)  # sequence 1, its prefix copied from sequence 0
        run.scheduler.step()
        slot = next(s for s in run.scheduler.slots if s.job is not None and s.job.request_id == 5)
        assert slot.seq == 1 and slot.job is not None and slot.job.plan is not None
        (seen, rows_from), prompt = read_history(pool, 1), slot.job.plan.tokens
        assert slot.job.n_cached > 12 and len(seen) > slot.job.n_cached  # part of its prompt read since
        assert all(t in (UNREAD, p) for t, p in zip(seen, prompt, strict=False))
        assert rows_from >= slot.job.n_cached  # nothing kept from the conversation the sequence held
        run.drain()
        assert [run.tokens(4), run.tokens(5)] == expected
        stats = run.finished(5).speculative
        assert stats is not None and stats.drafted > 0
        run.scheduler.close()


def test_an_eagle3_draft_not_made_for_the_target_fails_only_its_request(tiny_models: dict[str, Path]) -> None:
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 6), speculative=eagle3(tiny_models["dflash"]))
        run.submit(greedy(2, "go", 6), speculative=eagle3(tiny_models["llama"].parent / "missing.gguf"))
        run.submit(greedy(3, "go", 6))
        run.drain()
        failed = {e.request_id: e.message for e in run.events if isinstance(e, Failed)}
        assert set(failed) == {1, 2}
        assert "draft-eagle3" in failed[1] and "not found" in failed[2]
        assert len(run.tokens(3)) == 6 and not run.scheduler.drafts.layer_pools
        run.scheduler.close()


def test_on_a_gpu_a_layer_input_drafter_starts_only_before_the_first_reply(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turning the target's layer inputs on in a context that has decoded on a device crashed the engine (issue 24):
    with the target on one (as the factory sees it), the first such drafter is refused once the target has decoded,
    saying what to do; before, or once one is on, it drafts."""
    from engine_ext.speculative import factory

    monkeypatch.setattr(factory, "target_backends", lambda model: ("Vulkan",))
    target, draft = tiny_models["llama"], tiny_models["eagle3"]
    with open_session(target, n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 6), speculative=eagle3(draft))  # nothing decoded yet: its layer inputs go on
        run.drain()
        run.submit(greedy(2, "go", 6), speculative=eagle3(tiny_models["dflash"], 3, "draft-dflash"))  # on already
        run.drain()
        assert not [e for e in run.events if isinstance(e, Failed)]
        run.scheduler.close()
    with open_session(target, n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 6))
        run.drain()
        run.submit(greedy(2, "go", 6), speculative=eagle3(draft))
        run.drain()
        [failed] = [e for e in run.events if isinstance(e, Failed)]
        assert failed.request_id == 2 and "on a GPU" in failed.message and "--parallel 1" in failed.message
        assert not run.scheduler.drafts.layer_pools
        run.scheduler.close()
