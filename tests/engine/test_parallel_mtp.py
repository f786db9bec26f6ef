"""draft-mtp per parallel sequence (engine_ext.speculative.mtp_seqs): one MTP head context with an MTP sequence per
target sequence, fed the target's hidden states from the shared batch; on the hybrid qwen35 target each sequence's
rejected draft is dropped by llama.cpp's per-sequence recurrent rollback (n_rs_seq). Greedy replies equal plain
decoding alone at one sequence without drafting, each request with its own acceptance figures."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams, ModelParams, SpeculativeParams
from engine_ext.protocol import Failed
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.factory import build_driver
from engine_ext.speculative.mtp import DraftMTP
from engine_ext.speculative.mtp_seqs import MTPSequences, SequenceMTP
from tests.engine.test_parallel import Run, alone, greedy, open_session

REPEATED = " ".join(["word1 word2 word3 word4"] * 4)
N_RS_SEQ = 4


@contextmanager
def mtp_parallel(path: Path, *, n_seq: int = 2, n_rs_seq: int = N_RS_SEQ, load_mtp: bool = True) -> Iterator[Session]:
    """The target as `serve --parallel N --spec-type draft-mtp` loads it: its heads, a KV stream per sequence, and
    n_rs_seq recurrent states per sequence for rolling a draft back."""
    model = Model(path, ModelParams(load_mtp=load_mtp))
    params = ContextParams(n_ctx=1024, n_batch=256, n_threads=2, n_seq_max=n_seq, kv_unified=False, n_rs_seq=n_rs_seq)
    ctx = Context(model, params)
    try:
        yield Session(model, ctx)
    finally:
        ctx.close()
        model.close()


def mtp(n_max: int = N_RS_SEQ, draft_model: Path | None = None) -> SpeculativeParams:
    return SpeculativeParams(types=("draft-mtp",), n_max=n_max, draft_model=str(draft_model) if draft_model else None)


@pytest.mark.parametrize("kind", ["qwen35", "nemotron_h_moe"])  # GDN and Mamba-2 hybrids, their heads in the model
def test_mtp_per_sequence_keeps_greedy_output_alone_and_together(tiny_models: dict[str, Path], kind: str) -> None:
    requests = [greedy(1, "go", 40), greedy(2, "word1 word2 word3", 32), greedy(3, REPEATED, 36), greedy(4, "hi", 24)]
    with open_session(tiny_models[kind]) as single:  # the same trunk: plain decoding, one sequence, no drafting
        expected = [alone(single, r) for r in requests]
    with mtp_parallel(tiny_models[f"{kind}_mtp"]) as session:
        run = Run(session)
        run.submit(requests[0], speculative=mtp())  # alone on the scheduler
        run.drain()
        assert run.tokens(1) == expected[0]
        # Together: two drafting requests, then a plain one joining the sequence the first leaves.
        run.submit(requests[1], speculative=mtp())
        run.submit(requests[2], speculative=mtp())
        run.submit(requests[3])
        run.scheduler.step()
        drafters = {s.seq: s.job.driver.drafters for s in run.scheduler.slots if s.job and s.job.driver}
        assert {seq: [(type(d), d.seq) for d in ds] for seq, ds in drafters.items()} == {  # type: ignore[attr-defined]
            0: [(SequenceMTP, 0)],
            1: [(SequenceMTP, 1)],
        }
        run.drain()
        assert [run.tokens(r.request_id) for r in requests[1:]] == expected[1:]
        for r in requests[:3]:
            stats = run.finished(r.request_id).speculative
            assert stats is not None and stats.drafters[0].name == "draft-mtp" and stats.status == "drafting"
            assert stats.drafted > 0 and stats.steps > 0 and stats.accepted <= stats.drafted  # its own figures
        assert run.finished(4).speculative is None
        (heads,) = run.scheduler.drafts.heads.values()
        assert heads.decodes > 0 and len(heads.cached) == 2
        assert heads.shared_decodes > 0  # the rows of both sequences read by the head in one decode
        run.scheduler.close()


def test_each_sequence_drafts_what_the_single_path_drafts(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's drafts (position, last token, draft) for a request are the single path's DraftMTP's, alone on the
    scheduler and beside another drafting request: each MTP sequence reads its own rows of the shared batch."""
    requests = [greedy(1, " ".join([REPEATED] * 4), 30), greedy(2, "a b c d e f", 30)]  # read in two chunks
    single_drafts: list[tuple[int, int, list[int]]] = []
    seq_drafts: dict[int, list[tuple[int, int, list[int]]]] = {0: [], 1: []}
    draft_one, draft_seq = DraftMTP.draft, MTPSequences.draft

    def record_one(self: DraftMTP, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        made = draft_one(self, tokens, id_last, n_max)
        single_drafts.append((len(tokens), id_last, made))
        return made

    def record_seq(self: MTPSequences, seq: int, tokens: list[int], id_last: int, n_max: int, p: float) -> list[int]:
        made = draft_seq(self, seq, tokens, id_last, n_max, p)
        seq_drafts[seq].append((len(tokens), id_last, made))
        return made

    monkeypatch.setattr(DraftMTP, "draft", record_one)
    monkeypatch.setattr(MTPSequences, "draft", record_seq)
    with mtp_parallel(tiny_models["qwen35_mtp"], n_seq=1) as single:
        single.spec = build_driver(mtp(), single.model, single.ctx)
        try:
            single.generate(requests[0], lambda e: None, lambda: False)
        finally:
            single.spec.close()
    with mtp_parallel(tiny_models["qwen35_mtp"]) as session:
        run = Run(session)
        run.submit(requests[0], speculative=mtp())
        run.drain()
        alone_drafts = seq_drafts[0][:]
        seq_drafts[0].clear()
        # On the empty sequence 1; then the same prompt again on sequence 0 (its recurrent state cannot be cut back
        # to the prompt: read afresh), beside it.
        run.submit(requests[1], speculative=mtp())
        run.submit(greedy(3, " ".join([REPEATED] * 4), 30), speculative=mtp())
        run.drain()
        run.scheduler.close()
    assert run.tokens(3) == run.tokens(1)
    # The single path also drafts before the first reply token (the prompt's last token verified with the draft);
    # a parallel sequence samples that one from its prompt's last row, then drafts as the single path does.
    # Its adaptive draft length starts over with that first step: a draft is the other's first tokens.
    assert single_drafts[0][0] > 256  # the prompt: more than a batch (n_batch 256)
    assert len(single_drafts) > 5 and max(len(d) for _, _, d in alone_drafts) == N_RS_SEQ
    assert same_drafts(alone_drafts, single_drafts[1:])
    assert same_drafts(seq_drafts[0], single_drafts[1:]) and seq_drafts[1]


def same_drafts(a: list[tuple[int, int, list[int]]], b: list[tuple[int, int, list[int]]]) -> bool:
    """The same steps (position, last token), each draft the start of the other."""
    return [s[:2] for s in a] == [s[:2] for s in b] and all(
        x[: len(y)] == y[: len(x)] and (x or y) for (_, _, x), (_, _, y) in zip(a, b, strict=True)
    )


def test_a_sidecar_head_drafts_per_sequence(tiny_models: dict[str, Path]) -> None:
    """The `mtp-*.gguf` sidecar holds qwen35_mtp's head: it drafts for the plain qwen35 trunk, per sequence."""
    requests = [greedy(1, "a b c d e f", 30), greedy(2, REPEATED, 30)]
    with open_session(tiny_models["qwen35"]) as single:
        expected = [alone(single, r) for r in requests]
    with mtp_parallel(tiny_models["qwen35"], load_mtp=False) as session:
        run = Run(session)
        for r in requests:
            run.submit(r, speculative=mtp(draft_model=tiny_models["qwen35_mtp_sidecar"]))
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        assert all((s := run.finished(r.request_id).speculative) and s.drafted > 0 for r in requests)
        assert list(run.scheduler.drafts.heads) == [tiny_models["qwen35_mtp_sidecar"].resolve()]
        run.scheduler.close()


def test_without_rollback_states_a_hybrid_target_answers_plainly(tiny_models: dict[str, Path]) -> None:
    """n_rs_seq 0: one sequence's rejected draft cannot be dropped from the recurrent state; no drafting, same reply."""
    request = greedy(1, "word1 word2 word3", 20)
    with open_session(tiny_models["qwen35"]) as single:
        expected = alone(single, request)
    with mtp_parallel(tiny_models["qwen35_mtp"], n_rs_seq=0) as session:
        run = Run(session)
        run.submit(request, speculative=mtp())
        run.submit(greedy(2, "go", 4), speculative=mtp(draft_model=tiny_models["qwen35"].parent / "mtp-missing.gguf"))
        run.drain()
        assert run.tokens(1) == expected
        stats = run.finished(1).speculative
        assert stats is not None and stats.drafted == 0 and stats.status.startswith("off: this model's recurrent")
        (failed,) = [e for e in run.events if isinstance(e, Failed)]
        assert failed.request_id == 2 and "not found" in failed.message
        run.scheduler.close()


def test_a_target_without_heads_fails_only_the_request_that_asks_for_them(tiny_models: dict[str, Path]) -> None:
    with open_session(tiny_models["llama"], n_seq=2, unified=False) as session:
        run = Run(session)
        run.submit(greedy(1, "go", 6), speculative=mtp())
        run.submit(greedy(2, "go", 6))
        run.drain()
        (failed,) = [e for e in run.events if isinstance(e, Failed)]
        assert failed.request_id == 1 and "has no MTP head" in failed.message and "sidecar" in failed.message
        assert run.finished(2).stop_reason == "max_tokens" and not run.scheduler.drafts.heads
        run.scheduler.close()


class Oracle(Drafter):
    """Drafts the known reply's next `n_right(step)` tokens, then wrong ones up to n_max: each draft is accepted in
    part, the rest rolled back."""

    name = "ngram-simple"

    def __init__(self, prompt: list[int], reply: list[int], n_right: Callable[[int], int]) -> None:
        super().__init__()
        self.prompt, self.reply, self.n_right = prompt, reply, n_right

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        m = len(tokens) - len(self.prompt) + 1  # the reply tokens up to id_last
        right = self.reply[m : m + min(n_max, self.n_right(m))]
        return right + [(t + 1) % 200 for t in self.reply[m + len(right) : m + n_max]]


@pytest.mark.parametrize("kind", ["qwen35", "nemotron_h_moe"])
def test_partly_accepted_drafts_roll_one_sequence_of_a_hybrid_target_back(
    tiny_models: dict[str, Path], kind: str
) -> None:
    """Drafts accepted in part on the hybrid target: each sequence's recurrent state is cut back to what it kept
    (llama.cpp's rollback per sequence) while the other sequence goes on; the replies those of plain decoding."""
    requests = [greedy(1, "go", 40), greedy(2, "word1 word2 word3", 40)]
    with open_session(tiny_models[kind]) as single:
        expected = [alone(single, r) for r in requests]
    with mtp_parallel(tiny_models[kind], load_mtp=False) as session:
        run = Run(session)
        for r in requests:
            run.submit(r, speculative=SpeculativeParams(types=("ngram-simple",), n_max=N_RS_SEQ, fixed_length=True))
        run.scheduler.step()
        for slot, n_right in zip(run.scheduler.slots, (lambda m: m % 3, lambda m: (m + 1) % 4), strict=True):
            job = slot.job
            assert job is not None and job.driver is not None and job.plan is not None
            job.driver.drafters[0] = Oracle(job.plan.tokens, expected[slot.seq], n_right)
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        for r in requests:
            stats = run.finished(r.request_id).speculative
            assert stats is not None and 0 < stats.accepted < stats.drafted, stats  # kept in part, rolled back
            assert max(len(stats.acceptance_per_position), 1) <= N_RS_SEQ
        run.scheduler.close()


@pytest.mark.parametrize("draft", ["qwen35", "qwen3"])  # itself (a hybrid draft, accepted), another model (rejected)
def test_draft_simple_on_a_hybrid_target_with_rollback_states(tiny_models: dict[str, Path], draft: str) -> None:
    requests = [greedy(1, "go", 30), greedy(2, REPEATED, 30)]
    with open_session(tiny_models["qwen35"]) as single:
        expected = [alone(single, r) for r in requests]
    with mtp_parallel(tiny_models["qwen35"], load_mtp=False) as session:
        run = Run(session)
        spec = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models[draft]), n_max=N_RS_SEQ)
        for r in requests:
            run.submit(r, speculative=spec)
        run.drain()
        assert [run.tokens(r.request_id) for r in requests] == expected
        for r in requests:
            stats = run.finished(r.request_id).speculative
            assert stats is not None and stats.drafted > 0 and stats.status == "drafting", stats
            assert (stats.accepted == stats.drafted) == (draft == "qwen35")
        run.scheduler.close()
