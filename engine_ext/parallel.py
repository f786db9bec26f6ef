"""Parallel sequences with continuous batching (llama-server's -np N): up to n_seq_max requests decode together.

Each step decodes one llama_batch holding the next token of every running sequence (with its n-gram draft, verified
in the same batch) and the last prompt token of each sequence that is joining; each sequence samples its own rows
with its own sampler chain. Requests join and leave between steps; a Cancel stops one at the next step.

Exactness: a sequence's greedy reply equals the same request run alone on the single-sequence path. Its cells lie
as there: with a KV stream per sequence (kv_unified off, as `serve --parallel N` loads), in position order from the
stream's start; in one buffer shared by the sequences, where they lie (after another's, in the holes another left)
changes the attention's sums. A request reuses a cache only under the steering mix it was computed with. A joining
prompt's other tokens are decoded in chunks of their own (as Session.evaluate_prompt reads them), not mixed with
other sequences' rows, and a step decodes fewer than 64 rows: ggml's CPU flash attention switches to a tiled
kernel at 64 query rows, whose sums round differently (see MAX_VERIFY_DRAFT).

Steering: a control vector is context-wide in llama.cpp, so a step decodes the sequences of one steering mix only.
Mixes take turns, STEERING_QUANTUM_STEPS steps each while another mix has sequences waiting: each change costs
llama.cpp a compute-graph re-reserve (llama_set_adapter_cvec), so changing at every step would slow every sequence,
while draining a group first would let one long reply hold the others' first token back without bound.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine_ext.generate import Session
from engine_ext.grammar import reply_grammar
from engine_ext.idle_cache import IdleCache
from engine_ext.params import EngineError, SteeringEntry
from engine_ext.protocol import (
    Busy,
    Event,
    Failed,
    Finished,
    GenerationStats,
    PromptEvaluated,
    PromptProgress,
    SpeculativeStats,
    StopReason,
    Submit,
    ThreadsChanged,
    rejected_by,
)
from engine_ext.reasoning import ReasoningBudget, next_reply_token
from engine_ext.sampling import Sampler
from engine_ext.seq_batch import SeqBatch, seq_copy, seq_remove, verify_rows
from engine_ext.seq_disk import seq_disk_of
from engine_ext.speculative.base import Drafter, common_prefix_length
from engine_ext.speculative.draft_seqs import SequenceDrafts
from engine_ext.speculative.driver import MAX_VERIFY_DRAFT, SpeculativeDriver
from engine_ext.token_stream import PromptPlan, ReplyStream
from engine_ext.tool_turn import ToolTurn
from engine_ext.vision import EncodedImage, image_token_count

MAX_STEP_ROWS = MAX_VERIFY_DRAFT + 1  # rows of one step's batch (drafts are shortened to fit)
STEERING_QUANTUM_STEPS = 8  # steps a steering mix keeps the batch while another mix waits
WAITING_PER_SLOT = 4  # default bound of the queue: this many waiting requests per sequence
Mix = tuple[SteeringEntry, ...]


@dataclass
class _Job:
    """One request from submission to its Finished event."""

    submit: Submit
    order: int
    t_request: float
    cancelled: bool = False
    plan: PromptPlan | None = None
    sampler: Sampler | None = None
    stream: ReplyStream | None = None
    driver: SpeculativeDriver | None = None
    drafting: bool = False  # the driver drafts (not on a recurrent memory)
    pending: list[int] = field(default_factory=list)  # prompt tokens not in the memory yet
    n_cached: int = 0
    id_last: int = -1  # the last sampled token, not decoded yet
    n_generated: int = 0
    t_prompt: float = 0.0
    prompt_ms: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    ttft_ms: float = 0.0
    decodes_at_start: int = -1  # the context's llama_decode calls when it got a sequence (-1: not yet)
    reasoning: ReasoningBudget | None = None  # a chat reply's thinking budget (engine_ext.reasoning)
    end_thinking: bool = False  # "stop thinking now" came before its reply began
    tools: ToolTurn | None = None
    media: dict[str, EncodedImage] = field(default_factory=dict)  # its images, by content hash (the cache is shared)
    encoded: tuple[int, float] = (0, 0.0)  # images the projector encoded for it, and the time it took

    @property
    def request_id(self) -> int:
        return self.submit.request.request_id

    @property
    def mix(self) -> Mix:
        return self.submit.steering


@dataclass
class _Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # what this sequence's memory holds, in order
    job: _Job | None = None
    mix: Mix = ()  # the steering mix `tokens` were computed under: another mix's requests do not reuse them


@dataclass
class _Row:
    """A sequence's part of the step's batch."""

    slot: _Slot
    row: int
    draft: list[int]
    drafter: Drafter | None
    first: bool  # the prompt's last token: the first reply token is sampled from it
    eog_at: int = 0


class ParallelScheduler:
    """The sequences of one context (n_seq_max of them) and the queue of requests waiting for one."""

    def __init__(self, session: Session, emit: Callable[[Event], None], *, fixed_steering: bool = False) -> None:
        self.session = session
        self.model = session.model
        self.ctx = ctx = session.ctx
        self.emit = emit
        n_seq = max(1, ctx.params.n_seq_max)
        self.slots = [_Slot(i) for i in range(n_seq)]
        # Each sequence holds at most its share of the cells, so the sequences together never overflow the cache.
        self.n_ctx_seq = ctx.n_ctx // n_seq if ctx.params.kv_unified else ctx.n_ctx_seq
        self.whole_state = self.model.is_recurrent or self.model.is_hybrid  # cut or copied only whole
        # A prefix is copied from another sequence: its cells shared in one KV buffer (kv_unified), else its whole
        # stream copied and the tail cut (llama.cpp copies across streams only whole; cell order is kept).
        self.copies_prefix = not self.whole_state
        self.split_streams = not ctx.params.kv_unified and n_seq > 1
        # Idle sequences' caches go to host memory when a request starts, so it does not attend over their cells.
        self.idle = IdleCache() if self.copies_prefix and n_seq > 1 and not self.split_streams else None
        self.batch = SeqBatch(ctx, max(ctx.n_batch, n_seq, MAX_STEP_ROWS))
        self.disk = seq_disk_of(session.disk, ctx, self.whole_state, session.vision)  # states on disk (seq_disk)
        self.waiting: deque[_Job] = deque()
        self.drafts = SequenceDrafts(self.model, ctx)  # the requests' drafters (draft-simple's context shared)
        self.max_waiting = WAITING_PER_SLOT * n_seq
        self.admitting = True  # False while a request for the single-sequence path waits: the sequences drain
        self.fixed_steering = fixed_steering  # a steering change replaces the context here (lavapipe): one mix only
        self.active = False
        self.base_mix: Mix = ()  # the mix SetSteering applied (the single-sequence path's)
        self.applied_mix: Mix = ()
        self._mixer: object | None = None
        self._orders = 0
        self._steps = 0
        self._quantum = 0
        self._last_ran: dict[Mix, int] = {}
        self._clears = ctx.clears
        self._slot0_before: list[int] = []

    # ----- queue ---------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether there is work for step(): running sequences, or waiting requests it may admit."""
        return any(s.job is not None for s in self.slots) or (self.admitting and bool(self.waiting))

    @property
    def running(self) -> int:
        return sum(s.job is not None for s in self.slots)

    def submit(self, submit: Submit) -> None:
        """Queue a request; refused (Busy) when `max_waiting` requests already wait that no free sequence takes."""
        queued = len(self.waiting) - sum(s.job is None for s in self.slots)
        if queued >= self.max_waiting:
            self.emit(Busy(submit.request.request_id, queued, len(self.slots)))
            return
        self._orders += 1
        self.waiting.append(_Job(submit, self._orders, time.perf_counter()))

    def cancel(self, request_id: int) -> bool:
        """Stop a request: a waiting one at once, a running one at the next step. False: not one of these."""
        for job in self.waiting:
            if job.request_id == request_id:
                self.waiting.remove(job)
                self._finished(job, "cancelled", [])
                return True
        for slot in self.slots:
            if slot.job is not None and slot.job.request_id == request_id:
                slot.job.cancelled = True
                return True
        return False

    def end_thinking(self, request_id: int) -> bool:
        """Stop a request's thinking now (EndThinking): forced at its next token, or from its first when it has not
        started. False: not one of these, or its answer already began."""
        for job in [s.job for s in self.slots if s.job is not None] + list(self.waiting):
            if job.request_id == request_id:
                job.end_thinking = True
                return job.reasoning.force() if job.reasoning is not None else True
        return False

    def take_waiting(self, other: ParallelScheduler) -> None:
        """Requests waiting in `other` (replaced with its context) wait here, in their order."""
        self.waiting.extend(other.waiting)
        other.waiting.clear()
        self._orders = other._orders

    def fail_all(self, exc: BaseException) -> None:
        """Every request ends with Failed (the model goes away, or a step failed unexpectedly)."""
        for slot in self.slots:
            if slot.job is not None:
                self._fail(slot, exc)
        while self.waiting:
            self._fail_job(self.waiting.popleft(), exc)

    # ----- sharing the context with the single-sequence path --------------------------------------------

    def activate(self, base_mix: Mix) -> None:
        """Take the context's sequences over from the single-sequence path (sequence 0 is its cache)."""
        ctx, session = self.ctx, self.session
        ctx.set_backend_greedy(False)  # a backend sampler on sequence 0 would leave its rows without logits
        if ctx.clears != self._clears:
            for slot in self.slots:
                slot.tokens = []
            if self.idle is not None:
                self.idle.clear()
        self.slots[0].tokens = list(session.cached)
        self.slots[0].mix = base_mix
        self._slot0_before = list(session.cached)
        self.base_mix = self.applied_mix = base_mix
        self.active = True

    def release(self) -> None:
        """Give the context back to the single-sequence path: its steering again, sequence 0 as the cache."""
        if not self.active:
            return
        if self.disk is not None:  # the sequences go idle: each state that changed since its last save is saved
            self.disk.save_all(self.slots)
        if self.applied_mix != self.base_mix:
            self._apply_mix(self.base_mix)
        session = self.session
        first = self.slots[0]
        if first.mix != self.base_mix:  # computed under a request's steering: not the single path's cache
            seq_remove(self.ctx, first.seq, -1)
            first.tokens, first.mix = [], self.base_mix
        session.cached = list(first.tokens)
        spec = session.spec
        if spec is not None and spec.reads_batches and session.cached != self._slot0_before:
            session.reset_cache()  # its model drafters did not see what sequence 0 decoded here
        self._clears = self.ctx.clears
        self.active = False
        if session.governor is not None:
            session.governor.decoding = False

    def close(self) -> None:
        self.batch.close()
        self.drafts.close()

    # ----- steps ---------------------------------------------------------------------------------------

    def step(self) -> None:
        """Admit, then decode one batch for the running sequences of one steering mix."""
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled:
                self._finish(slot, "cancelled")
        admitted = False
        while self.admitting and self.waiting and any(s.job is None for s in self.slots):
            self._admit(self.waiting.popleft())
            admitted = True
        if admitted and self.idle is not None:
            self._save_idle(self.idle)
        self._follow_load()
        live = [s for s in self.slots if s.job is not None]
        if not live:
            return
        mix = self._choose_mix(live)
        if mix != self.applied_mix:
            try:
                self._apply_mix(mix)
            except EngineError as exc:
                for slot in live:
                    if slot.job is not None and slot.job.mix == mix:
                        self._fail(slot, exc)
                return
        self._steps += 1
        self._last_ran[mix] = self._steps
        group = [s for s in live if s.job is not None and s.job.mix == mix]
        reading = [s for s in group if s.job is not None and len(s.job.pending) > 1]
        if reading:
            self._read_prompt_chunk(min(reading, key=lambda s: s.job.order if s.job else 0))
        ready = [s for s in group if s.job is not None and len(s.job.pending) <= 1]
        if ready:
            self._decode_ready(ready)

    def _follow_load(self) -> None:
        """The thread count follows the machine's load between steps, as on the single-sequence path (the worker's
        governor, engine_ext.threads; it measures the step rate while every running sequence decodes)."""
        governor = self.session.governor
        if governor is None:
            return
        jobs = [s.job for s in self.slots if s.job is not None]
        governor.decoding = bool(jobs) and all(len(j.pending) <= 1 for j in jobs)
        if governor.tick() and governor.last_load is not None:
            load = governor.last_load
            for job in jobs:
                self.emit(ThreadsChanged(job.request_id, governor.current, load.others, load.cpus))

    def _choose_mix(self, live: list[_Slot]) -> Mix:
        mixes: dict[Mix, int] = {}
        for slot in live:
            if slot.job is not None:
                mixes.setdefault(slot.job.mix, slot.job.order)
        current = self.applied_mix
        if current in mixes and (len(mixes) == 1 or self._quantum < STEERING_QUANTUM_STEPS):
            self._quantum += 1
            return current
        others = [m for m in mixes if m != current] or list(mixes)
        self._quantum = 1
        return min(others, key=lambda m: (self._last_ran.get(m, 0), mixes[m]))  # the one that waited longest

    def _apply_mix(self, mix: Mix) -> None:
        from engine_ext.steering.mixer import SteeringMixer

        if self._mixer is None:
            self._mixer = SteeringMixer(self.model, self.ctx)
        assert isinstance(self._mixer, SteeringMixer)
        self.applied_mix = ()  # until applied: a refused vector leaves none
        self._mixer.apply(mix)
        self.applied_mix = mix

    def _check_mix(self, mix: Mix) -> None:
        """Refuse a mix that cannot be applied (a missing or wrong vector file) before the request starts."""
        from engine_ext.steering.mixer import SteeringMixer

        if mix == self.base_mix:
            return
        if self.fixed_steering:
            raise EngineError(
                "steering per request is off with the model on Mesa's lavapipe (a change there needs a fresh context); "
                "send the server's own steering, or load the model with -ngl 0"
            )
        if self._mixer is None:
            self._mixer = SteeringMixer(self.model, self.ctx)
        assert isinstance(self._mixer, SteeringMixer)
        self._mixer.compose(mix)

    # ----- joining -------------------------------------------------------------------------------------

    def _admit(self, job: _Job) -> None:
        request = job.submit.request
        try:
            self._check_mix(job.mix)
            job.tools = ToolTurn.of(request, self.session.template, self.model.path.name)
            plan = self._plan(job)
            job.driver = self._driver(job)
            if job.driver is not None:
                job.driver.set_media(bool(job.media))
            if job.tools is not None:
                shape = job.tools.grammar(plan.opens_reasoning)
            else:
                shape = reply_grammar(request.grammar, request.json_schema, opens_reasoning=plan.opens_reasoning)
            job.sampler = Sampler(self.model, request.sampling, shape.gbnf, shape.triggers, shape.root)
            job.reasoning = self.session.reasoning_budget(request, plan)
        except Exception as exc:
            self._fail_job(job, exc)
            return
        if job.reasoning is not None and job.end_thinking:
            job.reasoning.force()
        slot = self._place(plan.tokens, job.mix)
        if job.driver is not None:
            self.drafts.bind(job.driver, slot.seq, slot.tokens)
        job.plan = plan
        job.n_cached = len(slot.tokens)
        job.pending = list(plan.tokens[job.n_cached :])
        job.sampler.feed_prompt_history(plan.tokens)
        emit = self.emit if job.tools is None else job.tools.watch(self.emit)  # a reply with tools keeps its ids
        job.stream = ReplyStream(self.model, request, plan, emit, self.session.token_info)
        job.t_prompt = time.perf_counter()
        slot.job = job
        job.decodes_at_start = self.ctx.decodes

    def _plan(self, job: _Job) -> PromptPlan:
        """The request's prompt, its images encoded (or found in the projector's cache, where the images of the
        running sequences stay until they are decoded)."""
        session, vision = self.session, self.session.vision
        if vision is None:
            return session.plan(job.submit.request, None, n_ctx=self.n_ctx_seq)
        vision.pinned = {sha for s in self.slots if s.job is not None for sha in s.job.media}
        before = (vision.encodes, vision.encode_ms)
        try:
            plan = session.plan(job.submit.request, None, n_ctx=self.n_ctx_seq)
            job.media = session.media
        finally:
            session.media = {}  # the single-sequence path's, between its requests
            job.encoded = (vision.encodes - before[0], vision.encode_ms - before[1])
        return plan

    def _driver(self, job: _Job) -> SpeculativeDriver | None:
        params = job.submit.speculative
        if params is None or not params.enabled:
            return None
        driver = self.drafts.driver(params)
        job.drafting = not self.whole_state or self.drafts.rolls_back
        if not job.drafting:
            driver.status = "off: this model's recurrent memory cannot drop a rejected draft of one sequence"
        return driver

    def _place(self, tokens: Sequence[int], mix: Mix) -> _Slot:
        """A free sequence holding the longest usable prefix of `tokens` computed under the steering `mix`: its own
        cache, else a copy of another sequence's (llama_memory_seq_cp: cells shared, nothing recomputed) where the
        memory allows it. The sequence then holds what `mix` computes."""
        slot = self._find_prefix(tokens, mix)
        slot.mix = mix
        return slot

    def _find_prefix(self, tokens: Sequence[int], mix: Mix) -> _Slot:
        ctx = self.ctx

        def usable(slot: _Slot) -> int:
            return self._usable(slot.tokens, tokens) if slot.mix == mix else 0

        free = [s for s in self.slots if s.job is None]
        slot = max(free, key=lambda s: (usable(s), not s.tokens))  # with nothing to reuse, an empty one: others kept
        if self.disk is not None and usable(slot) < len(slot.tokens):  # its cells go (evicted): saved first
            self.disk.save(slot.seq, slot.tokens, slot.mix, final=True)
        if slot.tokens and slot.mix != mix and self.idle is not None:  # another mix's cache: kept, not overwritten
            self.idle.save(ctx, slot.seq, slot.tokens, slot.mix)
            seq_remove(ctx, slot.seq, -1)
            slot.tokens = []
        n_own = usable(slot)
        source, n_source = None, n_own
        if self.copies_prefix or self.whole_state:
            for other in self.slots:
                n = usable(other)
                if other is not slot and n > n_source and other.seq not in self.drafts.pending:
                    source, n_source = other, n
        if self.idle is not None and self._restore_idle(self.idle, slot, tokens, mix, max(n_own, n_source)):
            return slot
        if self.disk is not None and self.disk.restore_into(slot, tokens, mix, max(n_own, n_source)):
            return slot  # a state file's prefix
        if source is not None:
            seq_remove(ctx, slot.seq, -1)
            whole = self.whole_state or self.split_streams
            seq_copy(ctx, source.seq, slot.seq, -1 if whole else n_source)
            if self.split_streams:
                seq_remove(ctx, slot.seq, n_source)
            slot.tokens = source.tokens[:n_source]
            return slot
        if n_own < len(slot.tokens) and not seq_remove(ctx, slot.seq, n_own):
            seq_remove(ctx, slot.seq, -1)
            n_own = 0
        del slot.tokens[n_own:]
        return slot

    def _restore_idle(self, idle: IdleCache, slot: _Slot, tokens: Sequence[int], mix: Mix, n_better: int) -> bool:
        """Put into `slot` the state saved under `mix` sparing the most prompt tokens, if it spares more than
        `n_better`."""
        key, n = max(((k, self._usable(k, tokens)) for k in idle.keys(mix)), key=lambda kn: kn[1], default=((), 0))
        if n <= n_better:
            return False
        ctx = self.ctx
        seq_remove(ctx, slot.seq, -1)
        if not idle.restore(ctx, key, slot.seq, mix):
            seq_remove(ctx, slot.seq, -1)
            slot.tokens = []
            return True
        seq_remove(ctx, slot.seq, n)
        slot.tokens = list(key[:n])
        return True

    def _save_idle(self, idle: IdleCache) -> None:
        """Move every idle sequence's cache to host memory (llama-server's --cache-idle-slots): out of the KV
        cache, its cells no longer widen the attention of the sequences that decode."""
        for slot in self.slots:
            if slot.job is None and slot.tokens:
                idle.save(self.ctx, slot.seq, slot.tokens, slot.mix)
                seq_remove(self.ctx, slot.seq, -1)
                slot.tokens = []

    def _usable(self, cached: Sequence[int], tokens: Sequence[int]) -> int:
        """Prompt tokens a sequence holding `cached` spares re-reading (one is always left to sample from)."""
        n = min(common_prefix_length(cached, tokens), len(tokens) - 1)
        if self.whole_state and n < len(cached):
            return 0  # a recurrent state holds all of `cached` or nothing
        return n

    def _read_prompt_chunk(self, slot: _Slot) -> None:
        """Decode the next micro-batch of a joining prompt on its own (all but its last token)."""
        job = slot.job
        assert job is not None and job.plan is not None
        pending, vision = job.pending, self.session.vision
        try:
            if pending[0] < 0 and vision is not None:  # an image's span, at this sequence's positions
                n = vision.decode_span(self.ctx, len(slot.tokens), pending[0], slot.seq)
            else:  # text up to the next image, a micro-batch at most (as Session.evaluate_prompt reads it)
                limit, n = min(self.ctx.n_batch, self.ctx.params.n_ubatch, len(pending) - 1), 0
                while n < limit and pending[n] >= 0:
                    n += 1
                self.batch.add(slot.seq, pending[:n], len(slot.tokens), outputs=False)
                self.batch.decode()
                self.drafts.read_prompt(job, slot.seq, slot.tokens, pending[:n])  # MTP heads read its rows
            chunk = pending[:n]
            self.drafts.process(job.driver if job.drafting else None, chunk, len(slot.tokens), 0)
        except EngineError as exc:
            self._fail(slot, exc)
            return
        slot.tokens.extend(chunk)
        del job.pending[:n]
        if len(job.pending) > 1:
            self.emit(PromptProgress(job.request_id, len(slot.tokens), len(job.plan.tokens)))

    # ----- decoding ------------------------------------------------------------------------------------

    def _decode_ready(self, ready: list[_Slot]) -> None:
        rows: list[_Row] = []
        spare = max(0, MAX_STEP_ROWS - len(ready))
        batch = self.batch
        first_eog = self.session.token_info.first_eog
        # The sequences' draft-simple drafts made together (a draft llama_decode per position), read in the loop.
        self.drafts.draft_together(
            [
                (j.driver, s.seq, s.tokens, j.id_last, self._draft_budget(j, len(s.tokens), spare))
                for s in ready
                if (j := s.job) is not None and j.driver is not None and not j.pending
            ]
        )
        for slot in sorted(ready, key=lambda s: s.job.order if s.job else 0):
            job = slot.job
            assert job is not None
            pos = len(slot.tokens)
            if job.pending:
                rows.append(_Row(slot, batch.add(slot.seq, job.pending, pos, outputs=True), [], None, True))
                continue
            if pos >= self.n_ctx_seq:
                self._finish(slot, "context_full")
                continue
            draft: list[int] = []
            drafter, driver, budget = None, job.driver, self._draft_budget(job, pos, spare)
            if driver is not None and budget > 0 and driver.drafting_allowed(job.n_generated):
                draft, drafter = driver.draft(slot.tokens, job.id_last, budget)
            eog_at = first_eog(draft, 0, len(draft) - 1) if draft else 0
            if draft and eog_at < len(draft) - 1 and not job.submit.request.ignore_eos:
                draft = draft[: eog_at + 1]  # nothing after an end-of-generation token is used
            spare -= len(draft)
            row = batch.add(slot.seq, [job.id_last, *draft], pos, outputs=True)
            rows.append(_Row(slot, row, draft, drafter, False, eog_at))
        if not rows:
            return
        t_step = time.perf_counter()
        try:
            batch.decode()
        except EngineError as exc:
            for r in rows:
                self._fail(r.slot, exc)
            return
        for r in rows:  # model drafters read their sequence's rows of the target's outputs, before any is taken
            self.drafts.read_rows(r.slot.job, r.slot.seq, r.slot.tokens, r.draft, r.row)
        for r in rows:
            self._take(r, t_step)

    def _draft_budget(self, job: _Job, pos: int, spare: int) -> int:
        """The longest draft the job's sequence may verify this step (0: none): the step's spare rows, its context's
        room, the tokens still wanted, and its thinking budget (no accepted draft crosses it, as Session's)."""
        if not job.drafting or job.driver is None:
            return 0
        max_tokens = job.submit.request.max_tokens
        budget = min(spare, self.n_ctx_seq - pos - 1, self.drafts.max_draft)
        if max_tokens > 0:
            budget = min(budget, max_tokens - job.n_generated - 1)
        thinking_room = job.reasoning.draft_room() if job.reasoning is not None else None
        return budget if thinking_room is None else min(budget, thinking_room)

    def _take(self, r: _Row, t_step: float) -> None:
        """Sample a sequence's rows, keep what was accepted, stream it, and finish the request if it is done."""
        slot, job = r.slot, r.slot.job
        assert job is not None and job.sampler is not None and job.stream is not None and job.plan is not None
        ctx = self.ctx
        now = time.perf_counter()
        if r.first:
            slot.tokens.extend(job.pending)
            job.pending = []
            job.prompt_ms = (now - job.t_prompt) * 1000.0
            job.stream.emit(PromptEvaluated(job.request_id, len(job.plan.tokens), job.n_cached, self.n_ctx_seq))
            if job.plan.text is not None:
                self.session.add_anchor(job.plan.text, job.plan.tokens)
            if self.disk is not None:  # a recurrent memory's state after the prompt, saved with the reply's
                self.disk.checkpoint(slot.seq, slot.tokens, slot.mix)
            if job.driver is not None:
                job.driver.begin(slot.tokens)
            ids, sources = next_reply_token(job.sampler, job.reasoning, ctx, r.row)
            job.t_first, job.ttft_ms = now, (now - job.t_request) * 1000.0
        elif r.drafter is None or job.driver is None:
            slot.tokens.append(job.id_last)
            ids, sources = next_reply_token(job.sampler, job.reasoning, ctx, r.row)
        else:
            draft = r.draft
            ids = verify_rows(job.sampler, ctx, r.row, draft, r.eog_at)
            if job.reasoning is not None:
                job.reasoning.observe_all(ids)
            n_accepted = len(ids) - 1
            slot.tokens.append(job.id_last)
            slot.tokens.extend(draft[:n_accepted])
            if n_accepted < len(draft) and not self.drafts.roll_back(slot.seq, len(slot.tokens)):  # rejected: gone
                self._fail(slot, EngineError("the model's memory could not drop a rejected draft"))
                return
            job.driver.accept(r.drafter, len(draft), n_accepted, (now - t_step) * 1000.0)
            rejected = n_accepted < len(draft) and ids[-1] != draft[n_accepted]
            name = r.drafter.name
            sources = [name] * n_accepted + [rejected_by(name) if rejected else "target"]
        job.t_last = now
        max_tokens = job.submit.request.max_tokens
        if max_tokens > 0:
            ids, sources = ids[: max_tokens - job.n_generated], sources[: max_tokens - job.n_generated]
        n_taken, reason = job.stream.push_many(ids, sources, now)
        job.n_generated += n_taken
        job.id_last = ids[-1]
        if reason is None and max_tokens > 0 and job.n_generated >= max_tokens:
            reason = "max_tokens"
        if reason is not None:
            self._finish(slot, reason)

    # ----- leaving -------------------------------------------------------------------------------------

    def _finish(self, slot: _Slot, reason: StopReason) -> None:
        job = slot.job
        assert job is not None
        slot.job = None
        plan = job.plan
        if job.stream is not None:
            job.stream.finish()
        if plan is not None and plan.text is not None and len(slot.tokens) > len(plan.tokens):
            reply = b"".join(map(self.session.token_info.piece, slot.tokens[len(plan.tokens) :]))
            self.session.add_anchor(plan.text + reply.decode("utf-8", errors="replace"), slot.tokens)
        self._finished(job, reason, slot.tokens)
        if self.disk is not None:  # after its Finished: llama.cpp copies the state out, the writer's thread writes it
            self.disk.save(slot.seq, slot.tokens, slot.mix)

    def _finished(self, job: _Job, reason: StopReason, tokens: Sequence[int]) -> None:
        plan = job.plan
        n_prompt = len(plan.tokens) if plan is not None else 0
        notices: tuple[str, ...] = ()
        if plan is not None and plan.dropped_messages:
            notices = (
                f"dropped the {plan.dropped_messages} oldest message(s) so the conversation fits the "
                f"{self.n_ctx_seq}-token context of a sequence",
            )
        if reason == "context_full":
            notices += (f"stopped: the {self.n_ctx_seq}-token context of a sequence is full",)
        notices += self.disk.take_notices() if self.disk is not None else ()
        t_end = job.t_last if job.n_generated else time.perf_counter()
        stats = GenerationStats(
            prompt_tokens=n_prompt,
            prompt_tokens_cached=job.n_cached,
            prompt_tokens_evaluated=max(0, min(n_prompt, len(tokens)) - job.n_cached),
            prompt_ms=job.prompt_ms,
            generated_tokens=job.n_generated,
            decode_ms=(t_end - job.t_first) * 1000.0 if job.n_generated else 0.0,
            ttft_ms=job.ttft_ms,
            n_ctx=self.n_ctx_seq,
            n_ctx_used=len(tokens),
            dropped_messages=plan.dropped_messages if plan is not None else 0,
            n_threads=self.ctx.n_threads,
            n_decode=self.ctx.decodes - job.decodes_at_start if job.decodes_at_start >= 0 else 0,
            n_decode_total=self.ctx.decodes,
            image_tokens=image_token_count(plan.tokens, self.session.vision) if plan is not None and job.media else 0,
            images_encoded=job.encoded[0],
            image_encode_ms=job.encoded[1],
        )
        thought = job.reasoning
        if thought is not None and thought.started_at:
            stats = replace(stats, reasoning_tokens=thought.thinking_tokens, reasoning_ms=thought.thinking_ms)
        finished = Finished(job.request_id, reason, stats, notices, self._spec_stats(job))
        if job.tools is not None and plan is not None:
            piece = self.session.model.token_piece
            finished = job.tools.finish(finished, lambda t: piece(t, special=True), plan.opens_reasoning)
        self.emit(finished)
        if job.sampler is not None:
            job.sampler.close()

    def _spec_stats(self, job: _Job) -> SpeculativeStats | None:
        if job.driver is None:
            return None
        elapsed = job.t_last - job.t_first
        effective = (job.n_generated - 1) / elapsed if job.n_generated > 1 and elapsed > 0 else 0.0
        return job.driver.snapshot(job.request_id, effective, 0.0)

    def _fail(self, slot: _Slot, exc: BaseException) -> None:
        """End a running request with Failed; its sequence's memory is dropped (it may hold half a batch)."""
        job = slot.job
        assert job is not None
        slot.job = None
        seq_remove(self.ctx, slot.seq, -1)
        slot.tokens = []
        self._fail_job(job, exc)

    def _fail_job(self, job: _Job, exc: BaseException) -> None:
        if not isinstance(exc, EngineError):
            traceback.print_exception(exc)  # to the engine log: a bug, not a user's error
        self.emit(Failed.of(job.request_id, exc))
        if job.sampler is not None:
            job.sampler.close()
