"""draft-eagle3: lossless on the tiny targets, drafts that do not depend on how the history arrived, refusals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from engine_ext.client import EngineClient, EngineFailure
from engine_ext.gguf import inspect_gguf
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeConfigError, SpeculativeParams
from engine_ext.protocol import Finished, Generate, TokenChunk
from engine_ext.speculative.eagle3 import DraftEagle3, check_eagle3_compatible
from engine_ext.speculative.factory import build_driver
from tests.engine.test_speculative import PROMPTS, check_lossless, generate, session_for
from tests.tiny_models import EAGLE3_TARGET_LAYERS, N_EMBD, write_eagle3_draft


def eagle3(path: Path, *, n_max: int = 4, p_min: float = 0.0) -> SpeculativeParams:
    return SpeculativeParams(types=("draft-eagle3",), draft_model=str(path), n_max=n_max, p_min=p_min)


def test_tiny_eagle3_file(tiny_models: dict[str, Path]) -> None:
    info = inspect_gguf(tiny_models["eagle3"])
    assert info.architecture == "eagle3" and info.draft_type == "eagle3"
    assert info.draft.target_layers == tuple(EAGLE3_TARGET_LAYERS)
    assert info.draft.target_hidden_size == N_EMBD
    assert info.block_count == 1
    assert info.vocab_size == inspect_gguf(tiny_models["llama"]).vocab_size


@pytest.mark.parametrize("p_min", [0.0, 0.5])
def test_eagle3_on_tiny_llama_is_lossless_and_drafts(tiny_models: dict[str, Path], p_min: float) -> None:
    results = check_lossless(tiny_models["llama"], eagle3(tiny_models["eagle3"], p_min=p_min))
    drafted = sum(r.speculative.drafted for r in results if r.speculative)
    for r in results:
        assert r.speculative is not None
        assert {d.name for d in r.speculative.drafters} == {"draft-eagle3"}
        assert len(r.speculative.acceptance_per_position) <= 4
    if p_min == 0.0:
        assert drafted > 0


@pytest.mark.parametrize("chain", [(), ("ngram-mod",)])
def test_eagle3_drafts_do_not_depend_on_how_the_history_arrived(
    tiny_models: dict[str, Path], chain: tuple[str, ...]
) -> None:
    """Every draft made during generation (history fed as prompt chunks, verify batches, single tokens, with
    the deferred last row bridged across calls; with ngram-mod in front, steps eagle3 never saw drafted or
    accepted) equals the draft of a fresh drafter fed the history at once."""
    spec = eagle3(tiny_models["eagle3"])
    calls: list[tuple[list[int], int, int, list[int]]] = []
    with session_for(tiny_models["llama"], spec=replace(spec, types=(*chain, "draft-eagle3"))) as session:
        assert session.spec is not None
        drafter = session.spec.drafters[-1]
        assert isinstance(drafter, DraftEagle3)
        original = drafter.draft

        def recording(tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
            result = original(tokens, id_last, n_max)
            calls.append((list(tokens), id_last, n_max, result))
            return result

        drafter.draft = recording  # type: ignore[method-assign]
        for prompt in PROMPTS[:3]:
            generate(session, prompt, 32)
    assert len(calls) > 20
    assert all(result for _, _, n_max, result in calls if n_max > 0), "every step should draft (p_min = 0)"
    model = Model(tiny_models["llama"])
    try:
        for tokens, id_last, n_max, result in calls[::5]:
            ctx = Context(model, ContextParams(n_ctx=1024, n_batch=256, n_threads=2))
            driver = build_driver(spec, model, ctx)
            try:
                ctx.decode(tokens, 0, logits_last=False)
                driver.process(tokens, 0)
                assert driver.drafters[0].draft(tokens, id_last, n_max) == result, f"at position {len(tokens)}"
            finally:
                driver.close()
                ctx.close()
    finally:
        model.close()


@pytest.mark.parametrize("kind, n_rs_seq", [("qwen35", 4), ("qwen35", 0), ("qwen3next", 0), ("nemotron_h_moe", 4)])
def test_eagle3_on_hybrid_targets(tiny_models: dict[str, Path], kind: str, n_rs_seq: int) -> None:
    # Rejected drafts roll the recurrent state back (n_rs_seq > 0) or restore a checkpoint and replay; the
    # drafter re-anchors on the encoder rows it keeps by position.
    results = check_lossless(tiny_models[kind], eagle3(tiny_models["eagle3"]), n_rs_seq=n_rs_seq, prompts=PROMPTS[:3])
    assert sum(r.speculative.drafted for r in results if r.speculative) > 0


def test_eagle3_reading_the_final_hidden_state_of_qwen35(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    # Target layer id == n_layer reads the target's final hidden state (qwen35 emits it; llama does not).
    draft = write_eagle3_draft(tmp_path / "eagle3-last.gguf", target_layers=[0, 2, 4])
    results = check_lossless(tiny_models["qwen35"], eagle3(draft), n_rs_seq=4, prompts=PROMPTS[:3])
    assert sum(r.speculative.drafted for r in results if r.speculative) > 0
    with pytest.raises(SpeculativeConfigError, match=r"reads target layers \[2\]"):
        check_lossless(tiny_models["llama"], eagle3(write_eagle3_draft(tmp_path / "e.gguf", target_layers=[0, 1, 2])))


def _check(**overrides: object) -> None:
    values: dict[str, object] = dict(
        name="d.gguf",
        target_layers=[0, 1, 1],
        target_hidden_size=64,
        draft_n_embd=64,
        draft_n_vocab=272,
        own_token_embd_rows=None,
        own_output=False,
        target_arch="llama",
        target_n_layer=2,
        target_n_embd=64,
        target_n_vocab=272,
    )
    values.update(overrides)
    check_eagle3_compatible(**values)  # type: ignore[arg-type]


def test_eagle3_compatibility_rules_by_hand() -> None:
    _check()
    _check(target_arch="qwen35", target_n_layer=4, target_layers=[0, 2, 4])  # final hidden state
    _check(draft_n_embd=128, own_token_embd_rows=272, own_output=True)  # its own embeddings and head
    cases: list[tuple[dict[str, object], str]] = [
        ({"target_layers": None}, "not an EAGLE3 draft"),
        ({"target_layers": [0, 1]}, "exactly 3"),
        ({"target_layers": [0, 1, 1, 1]}, "exactly 3"),
        ({"target_hidden_size": None}, "target_hidden_size"),
        ({"target_hidden_size": 32}, "hidden size 32"),
        ({"target_layers": [0, -1, 1]}, "negative"),
        ({"target_layers": [0, 1, 2]}, r"reads target layers \[2\]"),
        ({"target_layers": [0, 1, 5], "target_arch": "qwen35", "target_n_layer": 4}, r"\[5\]"),
        ({"target_arch": "qwen2"}, "does not expose the layer inputs"),
        ({"draft_n_embd": 128}, "borrows the target's"),
        ({"draft_n_embd": 128, "own_token_embd_rows": 272}, "borrows the target's"),
        ({"draft_n_vocab": 300}, "300 tokens"),
        ({"own_token_embd_rows": 100, "own_output": True}, "embeds only 100 tokens"),
    ]
    for overrides, message in cases:
        with pytest.raises(SpeculativeConfigError, match=message):
            _check(**overrides)


def test_eagle3_refusals_keep_the_worker_alive(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    two = write_eagle3_draft(tmp_path / "eagle3-two.gguf", target_layers=[0, 1])
    wide = write_eagle3_draft(tmp_path / "eagle3-wide.gguf", target_hidden_size=2 * N_EMBD)
    deep = write_eagle3_draft(tmp_path / "eagle3-deep.gguf", target_layers=[0, 1, 2])
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=512, n_threads=2))
        refusals: list[tuple[SpeculativeParams, str]] = [
            (SpeculativeParams(types=("draft-eagle3",)), "needs its draft GGUF"),
            (eagle3(tmp_path / "missing.gguf"), "not found"),
            (eagle3(tiny_models["dflash"]), "it is a dflash draft"),
            (eagle3(tiny_models["qwen3"]), "not an EAGLE3 draft"),
            (eagle3(two), "exactly 3"),
            (eagle3(wide), "hidden size 128"),
            (eagle3(deep), r"reads target layers \[2\]"),
        ]
        for params, message in refusals:
            with pytest.raises(EngineFailure, match=message):
                client.set_speculative(params)
        configured = client.set_speculative(eagle3(tiny_models["eagle3"]))
        assert configured.drafters == ("draft-eagle3",)
        request = Generate(
            request_id=client.new_request_id(), prompt="ok", sampling=GREEDY, max_tokens=16, ignore_eos=True
        )
        events = list(client.generate(request))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.speculative is not None
        assert finished.speculative.drafted > 0
        sources = {s for e in events if isinstance(e, TokenChunk) for s in e.provenance}
        assert sources <= {"draft-eagle3", "target", "target/draft-eagle3"}
        assert client.set_speculative(SpeculativeParams()).drafters == ()


def test_eagle3_behind_an_ngram_drafter(tiny_models: dict[str, Path]) -> None:
    # Steps won by ngram-mod never call eagle3's draft() or accept(); eagle3 still sees every target batch
    # through process() and must re-anchor on the right row when it drafts next.
    spec = SpeculativeParams(types=("ngram-mod", "draft-eagle3"), draft_model=str(tiny_models["eagle3"]), n_max=4)
    results = check_lossless(tiny_models["llama"], spec)
    by_name: dict[str, int] = {}
    for r in results:
        assert r.speculative is not None
        for d in r.speculative.drafters:
            by_name[d.name] = by_name.get(d.name, 0) + d.proposed
    assert by_name.get("ngram-mod", 0) > 0 and by_name.get("draft-eagle3", 0) > 0


def test_closing_one_drafter_keeps_the_target_outputs_another_uses(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    # draft-mtp and an EAGLE3 draft reading layer n_layer both need the target's final hidden state; closing
    # either one must leave it on for the other (the outputs are counted per target context).
    from engine_ext.bindings import ext
    from engine_ext.speculative import target_outputs
    from engine_ext.speculative.mtp import DraftMTP

    model = Model(tiny_models["qwen35_mtp"], ModelParams(load_mtp=True))
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2, n_rs_seq=4))
    draft_path = write_eagle3_draft(tmp_path / "eagle3-last.gguf", target_layers=[0, 2, model.n_layer])
    try:
        for first_closed in ("mtp", "eagle3"):
            mtp = DraftMTP(model, model, ctx)
            eagle = DraftEagle3(Model(draft_path), model, ctx)  # closes its draft model with itself
            assert target_outputs.holders(ctx, target_outputs.NEXTN) == 2
            (mtp if first_closed == "mtp" else eagle).close()
            assert target_outputs.holders(ctx, target_outputs.NEXTN) == 1
            ctx.clear()
            ctx.decode([1, 2, 3], 0, logits_last=True)
            assert ext.llama_get_embeddings_nextn(ctx.handle), f"closing {first_closed} turned the hidden state off"
            (eagle if first_closed == "mtp" else mtp).close()
            assert target_outputs.holders(ctx, target_outputs.NEXTN) == 0
    finally:
        ctx.close()
        model.close()
