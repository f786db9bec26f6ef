"""The drafter chain: which drafter proposes each step, and the statistics of a generation."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from engine_ext.params import SpeculativeParams
from engine_ext.protocol import DrafterReport, SpeculativeStats
from engine_ext.spec_catalog import NGRAM_TYPES
from engine_ext.speculative.base import Drafter, DrafterStats, common_prefix_length, count_positions

RECENT_STEPS = 64
AUTO_WINDOW = 12  # verify steps compared against plain decoding before deciding
AUTO_SLOWER = 0.95  # speculation slower than this fraction of plain speed is switched off…
AUTO_PAUSE_TOKENS = 96  # …for this many tokens, then tried again
AUTO_POSITION_FLOOR = 0.2  # auto n_max stops at the first draft position accepted less often than this
# The longest draft verified in one batch. ggml's CPU flash attention switches to a tiled kernel at 64 query rows
# (ggml-cpu/ops.cpp `use_tiled ... neq1 >= Q_TILE_SZ`, GGML_FA_TILE_Q 64 in ggml-cpu/common.h), whose sums round
# differently from the per-row kernel that decodes one token: logits moved by up to 1.5 on the starter model, and
# a near-tie flipped, so a 64-token ngram-mod draft gave text different from plain greedy decoding. Under 64 rows
# (the last token and 62 drafted) the starter model's rows (Q4_1, and Q4_0/Q8_0) are bit for bit those of plain
# decoding; some other kernels (F32, Q4_K on a tiny model) depend on the batch size at any size.
MAX_VERIFY_DRAFT = 62
# llama.cpp's server notes that drafts after multimodal input are poor; a model drafter also never saw the image.
MEDIA_PAUSE_STATUS = "model drafters paused for this reply: they cannot see its image (n-gram drafters go on)"
AUTO_NGRAM_MAX = MAX_VERIFY_DRAFT  # the longest draft auto mode grows an n-gram drafter to


class SpeculativeDriver:
    """Drafters in upstream's priority order; the first non-empty draft of a step wins.

    Statistics are recorded here, around every drafter call, so each drafter counts the same way.
    """

    def __init__(self, params: SpeculativeParams, drafters: Sequence[Drafter], *, auto: bool = False) -> None:
        self.params = params
        self.drafters = list(drafters)
        # Only drafters that read the target's batches get them (the n-gram types do not): right after llama_decode
        # even a call to a no-op costs microseconds, as Python's code and data have been pushed out of the caches.
        self._processors = [d for d in self.drafters if type(d).process is not Drafter.process]
        self.auto = auto  # pause when slower than plain decoding
        # Draft lengths start short and follow the measured acceptance (per drafter, per conversation); fixed: as
        # upstream (n_max for model drafters, each n-gram type's own length).
        self.adaptive = auto or not params.fixed_length
        self._conversation: tuple[int, ...] = ()  # the last prompt: a prompt that does not go on from it is new
        # The prompt holds an image (engine_ext.vision): model drafters neither read batches nor draft this reply.
        self.media = False
        self._model_drafters = any(d.name not in NGRAM_TYPES for d in self.drafters)
        self._reset_lengths()
        self.reset_stats()

    def _reset_lengths(self) -> None:
        self.caps = {id(d): min(d.start_length or self._ceiling(d), self._ceiling(d)) for d in self.drafters}

    def reset_stats(self) -> None:
        for d in self.drafters:
            d.stats = DrafterStats()
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.acc_per_pos: list[int] = []
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self.draft_ms = 0.0
        self.verify_ms = 0.0
        self.n_max_now = self.params.n_max
        # Adaptive lengths (self.caps) are kept across generations of one conversation; see begin().
        if self.adaptive and self.drafters:
            self.n_max_now = self.caps[id(self.drafters[0])]
        self.window: deque[tuple[int, float]] = deque(maxlen=AUTO_WINDOW)  # (tokens produced, ms) per step
        self.paused_until = 0  # generated-token count at which a paused auto mode drafts again
        self.status = "drafting" if self.drafters else "off"
        if self.media and self._model_drafters:
            self.status = MEDIA_PAUSE_STATUS

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.drafters)

    def begin(self, prompt: Sequence[int]) -> None:
        # A prompt that does not go on from the last one (most of it) starts a new conversation: lengths start over.
        last = self._conversation
        if not last or common_prefix_length(prompt, last) < len(last) // 2:
            self._reset_lengths()
        self._conversation = tuple(prompt)
        for d in self.drafters:
            t0 = time.perf_counter()
            d.begin(prompt)
            d.stats.n_call_begin += 1
            d.stats.t_begin_ms += (time.perf_counter() - t0) * 1000.0

    def set_media(self, present: bool) -> bool:
        """The next prompt holds an image (or not); True when model drafters that read batches missed turns with
        images and must see the whole prompt again (the caller then evaluates it from the start)."""
        lost = self.media and not present and bool(self._processors)
        self.media = present
        return lost

    @property
    def reads_batches(self) -> bool:
        """Whether any drafter reads the target's batches (`process` does nothing otherwise)."""
        return bool(self._processors)

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        if self.media:  # positions after an image are not consecutive in a drafter's own memory
            return
        for d in self._processors:
            d.process(tokens, pos0)

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> tuple[list[int], Drafter | None]:
        """The step's draft (at least n_min tokens or none) and the drafter that made it.

        `n_max` is the step's budget (context room, tokens still wanted). Model drafters are also held to
        --spec-draft-n-max, n-gram drafters to their own lengths, as upstream; auto mode holds each drafter to
        its own adapted length (see `_adapt`).
        """
        t_start = time.perf_counter()
        try:
            capped = min(n_max, self.params.n_max)
            for d in self.drafters:
                if self.media and d.name not in NGRAM_TYPES:
                    continue
                if self.adaptive:
                    limit = min(n_max, self.caps[id(d)])
                else:
                    limit = capped if d.follows_draft_n_max else n_max
                t0 = time.perf_counter()
                proposal = d.draft(tokens, id_last, limit)[:limit]
                if self.media and proposal and min(proposal) < 0:  # an n-gram ran into an image's positions
                    proposal = proposal[: next(i for i, t in enumerate(proposal) if t < 0)]
                d.stats.n_call_draft += 1
                d.stats.t_draft_ms += (time.perf_counter() - t0) * 1000.0
                if proposal:
                    if len(proposal) < self.params.n_min:
                        return [], None
                    d.stats.record_draft(len(proposal))
                    return proposal, d
            return [], None
        finally:
            self.draft_ms += (time.perf_counter() - t_start) * 1000.0

    def accept(self, drafter: Drafter, n_drafted: int, n_accepted: int, verify_ms: float) -> None:
        t0 = time.perf_counter()
        drafter.accept(n_accepted)
        drafter.stats.n_call_accept += 1
        drafter.stats.record_accept(n_accepted)
        drafter.stats.t_accept_ms += (time.perf_counter() - t0) * 1000.0
        if self.adaptive:
            self._adapt(drafter, n_drafted, n_accepted)
        self.steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        count_positions(self.acc_per_pos, n_accepted)
        self.recent.append(n_accepted / n_drafted if n_drafted else 0.0)
        self.verify_ms += verify_ms

    # ----- auto mode ----------------------------------------------------------------------------------

    def drafting_allowed(self, n_generated: int) -> bool:
        if self.paused_until and n_generated >= self.paused_until:
            self.paused_until = 0
            self.window.clear()
            self.status = "drafting (trying again)"
        return self.paused_until == 0

    def _adapt(self, drafter: Drafter, n_drafted: int, n_accepted: int) -> None:
        """Adaptive lengths: a drafter's length stops at the first position that its drafts reaching it get accepted at
        less often than AUTO_POSITION_FLOOR; once a draft fills the length and is accepted whole, it doubles again
        (up to n_max for a model drafter, AUTO_NGRAM_MAX for an n-gram one)."""
        key = id(drafter)
        cap = self.caps[key]
        if n_accepted == n_drafted >= cap:
            cap = min(self._ceiling(drafter), cap * 2)
        else:
            rates = drafter.stats.acceptance_where_drafted()
            useful = next((i for i, r in enumerate(rates) if r < AUTO_POSITION_FLOOR), len(rates))
            cap = max(1, min(cap, useful + 1))
        self.caps[key] = self.n_max_now = cap

    def _ceiling(self, drafter: Drafter) -> int:
        return self.params.n_max if drafter.follows_draft_n_max else max(self.params.n_max, AUTO_NGRAM_MAX)

    def observe(self, n_produced: int, step_ms: float, plain_step_ms: float, n_generated: int) -> None:
        """Auto mode: after a verify step, pause when speculation is measured slower than plain decoding."""
        if not self.auto:
            return
        self.window.append((n_produced, step_ms))
        if plain_step_ms <= 0 or len(self.window) < AUTO_WINDOW:
            return
        tokens = sum(n for n, _ in self.window)
        ms = sum(t for _, t in self.window)
        ratio = (tokens / ms) * plain_step_ms if ms > 0 else 0.0
        if ratio < AUTO_SLOWER:
            self.paused_until = n_generated + AUTO_PAUSE_TOKENS
            rate = self.accepted / self.drafted if self.drafted else 0.0
            self.status = (
                f"paused: measured {ratio:.2f}× plain speed with {rate:.0%} of drafted tokens accepted; "
                f"plain decoding for {AUTO_PAUSE_TOKENS} tokens, then trying again"
            )
            self.window.clear()
        else:
            self.status = f"drafting: {ratio:.2f}× plain speed, n_max {self.n_max_now}"

    def snapshot(self, request_id: int, effective_tps: float, plain_tps: float) -> SpeculativeStats:
        reports = tuple(
            DrafterReport(
                name=d.name,
                drafts=d.stats.n_gen_drafts,
                proposed=d.stats.n_gen_tokens,
                accepted=d.stats.n_acc_tokens,
                acceptance_per_position=tuple(d.stats.acceptance_per_position()),
                draft_ms=d.stats.t_draft_ms,
            )
            for d in self.drafters
        )
        return SpeculativeStats(
            request_id=request_id,
            steps=self.steps,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_length=1.0 + self.accepted / self.steps if self.steps else 1.0,
            acceptance_per_position=tuple(a / self.steps for a in self.acc_per_pos) if self.steps else (),
            recent_acceptance=tuple(self.recent),
            draft_ms=self.draft_ms,
            verify_ms=self.verify_ms,
            effective_tps=effective_tps,
            plain_tps=plain_tps,
            drafters=reports,
            n_max=self.n_max_now,
            status=self.status,
        )

    def close(self) -> None:
        for d in self.drafters:
            d.close()
