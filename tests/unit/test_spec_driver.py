"""The drafter chain and auto mode, with scripted drafters (no model)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine_ext.params import SpeculativeParams
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.driver import AUTO_NGRAM_MAX, AUTO_PAUSE_TOKENS, AUTO_WINDOW, SpeculativeDriver


class Scripted(Drafter):
    def __init__(self, name: str, proposal: list[int]) -> None:
        super().__init__()
        self.name = name
        self.proposal = proposal
        self.accepted: list[int] = []

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        return self.proposal[:n_max]

    def accept(self, n_accepted: int) -> None:
        self.accepted.append(n_accepted)


def test_first_non_empty_draft_wins_and_n_min_applies() -> None:
    empty, full = Scripted("a", []), Scripted("b", [1, 2, 3])
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=2), [empty, full])
    draft, drafter = driver.draft([9], 9, 2)
    assert draft == [1, 2] and drafter is full
    strict = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=8, n_min=4), [full])
    assert strict.draft([9], 9, 8) == ([], None)


def test_statistics_follow_upstream_definitions() -> None:
    d = Scripted("d", [1, 2, 3, 4])
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=4), [d])
    for n_acc in (4, 2, 0, 3):
        driver.draft([0], 0, 4)
        driver.accept(d, 4, n_acc, 1.0)
    s = driver.snapshot(1, 10.0, 5.0)
    assert (s.steps, s.drafted, s.accepted) == (4, 16, 9)
    assert s.acceptance_rate == 9 / 16
    assert s.mean_accepted_length == 1 + 9 / 4
    assert s.acceptance_per_position == (0.75, 0.75, 0.5, 0.25)  # non-increasing by construction
    assert s.speedup == 2.0
    assert d.accepted == [4, 2, 0, 3]
    assert s.drafters[0].accepted == 9 and s.drafters[0].proposed == 16


def test_auto_mode_pauses_when_slower_then_tries_again() -> None:
    d = Scripted("d", [1, 2, 3, 4])
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=4), [d], auto=True)
    plain_step_ms = 10.0
    for _ in range(AUTO_WINDOW):
        driver.draft([0], 0, 4)
        driver.accept(d, 4, 0, 15.0)
        driver.observe(1, 16.0, plain_step_ms, n_generated=50)  # one token per 16 ms: slower than 10 ms
    assert not driver.drafting_allowed(51)
    assert "paused" in driver.status and "0.62×" in driver.status
    assert driver.drafting_allowed(50 + AUTO_PAUSE_TOKENS)


def test_auto_mode_shortens_drafts_to_the_positions_that_pay() -> None:
    d = Scripted("d", list(range(8)))
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=8), [d], auto=True)
    for n_acc in (2, 1, 2, 0, 2):
        driver.draft([0], 0, driver.n_max_now)
        driver.accept(d, 8, n_acc, 1.0)
        driver.observe(1 + n_acc, 5.0, 10.0, n_generated=10)
    # Positions 0 and 1 are accepted in 80% and 60% of steps, position 2 never: draft 3 tokens.
    assert driver.n_max_now == 3
    assert "drafting" in driver.status


def test_draft_n_max_caps_model_drafters_only() -> None:
    # Upstream's --spec-draft-n-max is a model-drafter setting: n-gram drafters keep their own lengths and are only
    # held to the step's budget (context room, tokens still wanted). Auto mode starts from the same lengths.
    ngram, model = Scripted("ngram", list(range(80))), Scripted("model", list(range(80)))
    ngram.follows_draft_n_max = False
    fixed = SpeculativeParams(types=("ngram-simple",), n_max=4, fixed_length=True)
    assert SpeculativeDriver(fixed, [ngram]).draft([0], 0, 8) == (list(range(8)), ngram)
    assert SpeculativeDriver(fixed, [model]).draft([0], 0, 8) == (list(range(4)), model)
    # Drafters without a start length (ngram-mod) start auto mode at those lengths too.
    ngram.start_length = model.start_length = None
    params = SpeculativeParams(types=("ngram-simple",), n_max=4)
    auto = SpeculativeDriver(params, [ngram, model], auto=True)
    auto.reset_stats()  # as each generation does: auto mode sets its lengths there
    assert auto.draft([0], 0, 100) == (list(range(AUTO_NGRAM_MAX)), ngram)
    ngram.proposal = []
    assert auto.draft([0], 0, 100) == (list(range(4)), model)


def test_auto_mode_lengths_shrink_to_what_pays_and_double_back() -> None:
    ngram = Scripted("ngram", list(range(80)))
    ngram.follows_draft_n_max = False
    ngram.start_length = None  # as ngram-mod: its full length first
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-mod",), n_max=16), [ngram], auto=True)
    driver.reset_stats()
    lengths = []
    for n_accepted in (0, 1, 2, 4, 8, 16, 32, 64, 64):  # rejected at once, then every draft accepted whole
        draft, _ = driver.draft([0], 0, 100)
        lengths.append(len(draft))
        driver.accept(ngram, len(draft), min(n_accepted, len(draft)), 1.0)
    assert lengths == [AUTO_NGRAM_MAX, 1, 2, 4, 8, 16, 32, AUTO_NGRAM_MAX, AUTO_NGRAM_MAX]  # back, never past it
    assert driver.n_max_now == AUTO_NGRAM_MAX == 62
    # A model drafter doubles back only up to n_max (the rollback depth of hybrid models is sized to it).
    model = Scripted("model", list(range(80)))
    model.start_length = None
    driver = SpeculativeDriver(SpeculativeParams(types=("draft-simple",), n_max=16), [model], auto=True)
    driver.reset_stats()
    lengths = []
    for n_accepted in (3, 3, 4, 4, 8, 16):
        draft, _ = driver.draft([0], 0, 100)
        lengths.append(len(draft))
        driver.accept(model, len(draft), min(n_accepted, len(draft)), 1.0)
    # 3 of 16 accepted: no draft reaching position 3 was accepted there, so 4 tokens (twice); 4 of 4 doubles to 8;
    # 4 of 8: position 4 never accepted, so 5; 5 of 5 doubles to 10.
    assert lengths == [16, 4, 4, 8, 5, 10]
    for _ in range(3):
        draft, _ = driver.draft([0], 0, 100)
        driver.accept(model, len(draft), len(draft), 1.0)
    assert driver.n_max_now == 16 and len(driver.draft([0], 0, 100)[0]) == 16  # never past n_max


def test_a_drafter_with_a_start_length_starts_short_in_auto_mode_and_grows() -> None:
    copier = Scripted("ngram-prompt", list(range(40)))
    copier.follows_draft_n_max = False
    copier.start_length = 4
    driver = SpeculativeDriver(SpeculativeParams(types=("auto",), n_max=16), [copier], auto=True)
    lengths = []
    for _ in range(4):
        draft, _ = driver.draft([0], 0, 100)
        lengths.append(len(draft))
        driver.accept(copier, len(draft), len(draft), 1.0)
    assert lengths == [4, 8, 16, 32]
    fixed = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=16, fixed_length=True), [copier])
    assert len(fixed.draft([0], 0, 100)[0]) == 40  # --spec-draft-fixed keeps upstream's lengths


def test_fixed_types_start_short_too_and_keep_their_lengths_through_a_conversation() -> None:
    """A 62-token wrong draft of ngram-simple cost 907 ms in a user's run: every drafter starts at 4 tokens, grows
    with acceptance, and keeps its length for the next reply of the same conversation; a new conversation (a prompt
    that does not go on from the last) starts over."""
    ngram = Scripted("ngram-simple", list(range(80)))
    ngram.follows_draft_n_max = False
    driver = SpeculativeDriver(SpeculativeParams(types=("ngram-simple",), n_max=16), [ngram])
    conversation = list(range(100, 140))
    driver.begin(conversation)
    lengths = []
    for _ in range(3):
        draft, _ = driver.draft([0], 0, 100)
        lengths.append(len(draft))
        driver.accept(ngram, len(draft), len(draft), 1.0)
    assert lengths == [4, 8, 16]
    driver.reset_stats()
    driver.begin(conversation + [1, 2, 3])  # the next reply: the same conversation, longer
    assert len(driver.draft([0], 0, 100)[0]) == 32
    driver.reset_stats()
    driver.begin(list(range(500, 540)))  # another conversation
    assert len(driver.draft([0], 0, 100)[0]) == 4
    assert not driver.auto  # a fixed type adapts its lengths but never pauses


def test_auto_without_a_model_drafter_adds_the_prompt_copier(tiny_models: dict[str, Path]) -> None:
    from engine_ext.model import Context, Model
    from engine_ext.params import ContextParams
    from engine_ext.speculative.factory import build_driver

    model = Model(tiny_models["llama"])
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=256, n_threads=1))
    try:
        plain = build_driver(SpeculativeParams(types=("auto",), n_max=8), model, ctx)
        assert plain.names == ("ngram-mod", "ngram-prompt") and plain.auto
        with_draft = build_driver(
            SpeculativeParams(types=("auto",), n_max=8, draft_model=str(tiny_models["qwen3"])), model, ctx
        )
        assert with_draft.names == ("ngram-mod", "draft-simple")  # a model drafter drafts where the copier would
        with_draft.close()
    finally:
        ctx.close()
        model.close()
