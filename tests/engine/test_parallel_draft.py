"""draft-simple per parallel sequence (engine_ext.speculative.draft_seqs): one draft context with a draft sequence
per target sequence, drafts verified in the shared batch; greedy replies equal plain decoding alone, each request
with its own acceptance figures; auto's chain drafts per sequence too."""

from __future__ import annotations

from pathlib import Path

from engine_ext.params import SpeculativeParams
from engine_ext.protocol import Failed
from engine_ext.speculative.draft_seqs import SequenceDrafter, SequenceDrafts
from tests.engine.test_parallel import Run, alone, greedy, open_session

REPEATED = " ".join(["word1 word2 word3 word4"] * 4)


def draft_simple(path: Path, n_max: int = 4) -> SpeculativeParams:
    return SpeculativeParams(types=("draft-simple",), draft_model=str(path), n_max=n_max)


def test_draft_simple_per_sequence_keeps_greedy_output_alone_and_together(tiny_models: dict[str, Path]) -> None:
    target, perfect, other = tiny_models["llama"], tiny_models["llama"], tiny_models["qwen3"]
    requests = [greedy(1, "go", 40), greedy(2, "word1 word2 word3", 32), greedy(3, REPEATED, 36)]
    with open_session(target) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(target, n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(requests[0], speculative=draft_simple(perfect))  # alone on the scheduler
        run.drain()
        assert run.tokens(1) == expected[0]
        # Together: a perfect draft and another model's draft, each on its own draft sequence, then a plain request
        # joining the sequence the first left while the second drafts.
        run.submit(requests[1], speculative=draft_simple(perfect, n_max=8))
        run.submit(requests[2], speculative=draft_simple(other))
        run.drain()
        assert [run.tokens(r.request_id) for r in requests[1:]] == expected[1:]
        for request_id in (1, 2):  # the target itself as its draft: drafts are accepted
            stats = run.finished(request_id).speculative
            assert stats is not None and stats.drafters[0].name == "draft-simple"
            assert stats.drafted > 0 and stats.accepted > stats.drafted * 0.8 and stats.mean_accepted_length > 2
            assert stats.acceptance_per_position and stats.acceptance_per_position[0] > 0.8
        stats = run.finished(3).speculative
        assert stats is not None and stats.drafted > 0 and stats.accepted <= stats.drafted  # its own figures
        pools = run.scheduler.drafts.pools
        assert list(pools) == [perfect, other] and all(p.ctx.params.n_seq_max == 2 for p in pools.values())
        run.scheduler.close()


def test_a_drafting_request_beside_a_plain_one_and_its_draft_on_its_own_sequence(tiny_models: dict[str, Path]) -> None:
    requests = [greedy(1, "a b c d e f", 30), greedy(2, "the end", 30)]
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(requests[0])
        run.submit(requests[1], speculative=draft_simple(tiny_models["llama"]))
        run.scheduler.step()
        slot = next(s for s in run.scheduler.slots if s.job is not None and s.job.request_id == 2)
        assert slot.job is not None and slot.job.driver is not None
        (drafter,) = slot.job.driver.drafters
        assert isinstance(drafter, SequenceDrafter) and drafter.seq == slot.seq
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        assert run.finished(1).speculative is None
        stats = run.finished(2).speculative
        assert stats is not None and stats.accepted > 0
        run.scheduler.close()


def test_sequences_drafting_with_one_draft_model_draft_together(tiny_models: dict[str, Path]) -> None:
    """Two sequences drafting with the same draft model: each draft position is one draft llama_decode for both
    (fewer draft decodes than drafted tokens), their replies those of plain decoding."""
    requests = [greedy(1, "go", 48), greedy(2, "word1 word2 word3", 48)]
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        for r in requests:
            run.submit(r, speculative=draft_simple(tiny_models["llama"], n_max=8))
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        stats = [run.finished(r.request_id).speculative for r in requests]
        assert all(s is not None and s.accepted > 0.8 * s.drafted for s in stats)
        (pool,) = run.scheduler.drafts.pools.values()
        # One at a time, each drafted token is a decode of its own; together, a decode serves both sequences.
        assert 0 < pool.ctx.decodes < sum(s.drafted for s in stats if s is not None)
        run.scheduler.close()


def test_draft_together_drafts_each_sequence_on_its_own_positions(tiny_models: dict[str, Path]) -> None:
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        drafts = SequenceDrafts(session.model, session.ctx)
        try:
            params = draft_simple(tiny_models["llama"])
            one, two = (drafts.driver(params) for _ in range(2))
            drafts.bind(one, 0)
            drafts.bind(two, 1)
            (pool,) = drafts.pools.values()
            prompts = [session.model.tokenize(p, add_special=True, parse_special=False) for p in ("go", "a b c d")]
            drafts.draft_together([(one, 0, prompts[0], 7, 8), (two, 1, prompts[1], 9, 3)])
            assert pool.ctx.decodes == 1 + 4  # both prompts in one batch, then four positions (three for the second)
            assert [len(pool.ready[s][2]) for s in (0, 1)] == [4, 3]  # the driver's first length (4), the budget (3)
            assert pool.cached[0] == [*prompts[0], 7, *pool.ready[0][2][:3]]
            assert pool.cached[1] == [*prompts[1], 9, *pool.ready[1][2][:2]]
            made = pool.ready[0][2]
            assert one.draft(prompts[0], 7, 8) == (made, one.drafters[0])  # this step's draft, not made again
            assert pool.ctx.decodes == 5 and 0 not in pool.ready
        finally:
            drafts.close()


def test_auto_drafts_per_sequence_with_its_chain_and_a_missing_draft_fails_alone(tiny_models: dict[str, Path]) -> None:
    """auto under parallel sequences: ngram-mod, then the draft model on the sequence's own draft sequence (the
    chain auto builds on the single path), lossless beside a plain request; a missing draft fails its request only."""
    requests = [greedy(1, REPEATED, 36), greedy(2, "go", 30), greedy(3, "the end", 20)]
    with open_session(tiny_models["llama"]) as single:
        expected = [alone(single, r) for r in requests]
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        auto = SpeculativeParams(types=("auto",), draft_model=str(tiny_models["llama"]))
        run.submit(requests[0], speculative=auto)
        run.submit(requests[1])
        run.submit(requests[2], speculative=draft_simple(tiny_models["llama"].parent / "missing.gguf"))
        run.drain()
        failed = {e.request_id: e.message for e in run.events if isinstance(e, Failed)}
        assert set(failed) == {3} and "not found" in failed[3]
        assert [run.tokens(r.request_id) for r in requests[:2]] == expected[:2]
        stats = run.finished(1).speculative
        assert stats is not None and [d.name for d in stats.drafters] == ["ngram-mod", "draft-simple"]
        assert stats.drafted > 0 and stats.accepted > 0
        assert list(run.scheduler.drafts.pools) == [tiny_models["llama"]]  # the shared draft context
        run.scheduler.close()


def test_a_hybrid_target_answers_plainly_saying_drafting_is_off(tiny_models: dict[str, Path]) -> None:
    """A recurrent memory cannot drop one sequence's rejected draft: the request decodes without drafting."""
    request = greedy(1, "word1 word2 word3", 20)
    with open_session(tiny_models["qwen35"]) as single:
        expected = alone(single, request)
    with open_session(tiny_models["qwen35"], n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(request, speculative=draft_simple(tiny_models["llama"]))
        run.drain()
        assert run.tokens(1) == expected
        stats = run.finished(1).speculative
        assert stats is not None and stats.drafted == 0 and stats.status.startswith("off: this model's recurrent")
        run.scheduler.close()
