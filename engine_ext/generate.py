"""The generation loop: prompt rendering, the multi-turn prompt cache with state checkpoints, token streaming."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine_ext.archs import RS_ROLLBACK_ARCHS
from engine_ext.chat_prompt import (
    ChatTemplateCancelled,
    render_reply_prompt,
    truncate_messages_to_fit,
)
from engine_ext.grammar import reply_grammar
from engine_ext.model import Checkpoint, Context, Model
from engine_ext.params import EngineError, PromptTooLong
from engine_ext.protocol import (
    Event,
    Finished,
    Generate,
    GenerationStats,
    PromptEvaluated,
    PromptProgress,
    SpeculativeStats,
    SpeculativeUpdate,
    StopReason,
    rejected_by,
)
from engine_ext.reasoning import ReasoningBudget, thinking_end_text
from engine_ext.reply_stream import prompt_opens_reasoning
from engine_ext.sampling import Sampler
from engine_ext.session_state import MAX_CHECKPOINTS, SessionState
from engine_ext.speculative.base import common_prefix_length
from engine_ext.speculative.driver import MAX_VERIFY_DRAFT, SpeculativeDriver
from engine_ext.threads import PlainBaseline, ThreadGovernor
from engine_ext.token_stream import PromptPlan, ReplyStream, TokenInfo
from engine_ext.tool_turn import ToolTurn, template_inputs
from engine_ext.vision import (
    EncodedImage,
    NoProjector,
    Vision,
    evaluate_with_media,
    image_token_count,
    message_dicts,
    request_images,
    tokenize_with_media,
)

# Live speculative statistics (the TUI's meter) twice a second: each costs ~40 us of the verify step it falls in
# (built with Python's caches cold after a decode) and a message the UI draws.
SPEC_UPDATE_INTERVAL_S = 0.5
MIN_REPLY_ROOM = 256  # tokens kept free for the reply when the conversation is trimmed to fit
_COUNT_ALL = 1 << 40  # a "context" no prompt fills: count_prompt drops no turn
PLAIN_PROBE_STEPS = 4  # plain steps a speculative reply takes under conditions plain decoding was not measured in


class PromptCancelled(Exception):
    """The request was cancelled while its prompt was being read (between two batches)."""

    n_cached = 0  # prompt tokens reused from the cache (evaluate_prompt sets it)


class Session(SessionState):
    """A loaded model and context plus what its memory holds, reused across turns."""

    def __init__(self, model: Model, ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self.cached: list[int] = []  # tokens whose state is in sequence 0, in order
        # Texts recently evaluated (rendered prompts, prompts plus replies) with their exact tokens. A
        # new prompt that extends one keeps those tokens: re-tokenizing a reply rarely gives back the ids
        # the model generated, and a mismatch would cost a re-evaluation of the whole reply.
        self.anchors: list[tuple[str, tuple[int, ...]]] = []
        self.checkpoints: list[Checkpoint] = []
        # Recurrent/hybrid (and SWA) memories cannot be truncated at any position: keep checkpoints.
        self.uses_checkpoints = model.is_recurrent or model.is_hybrid
        self.spec: SpeculativeDriver | None = None
        self.token_info = TokenInfo(model)
        # Plain decoding's step time per (threads, others' load): speculation's speedup is measured against plain
        # decoding under the same conditions. `governor` (the worker's) sets the threads and says the conditions.
        self.baseline = PlainBaseline()
        self.governor: ThreadGovernor | None = None
        self._plain_steps: dict[tuple[int, int], int] = {}
        # Let llama_decode take each verify row's argmax itself for greedy speculative requests (backend sampling):
        # Python then reads token ids instead of scanning n_vocab logits per row. Off by default: on the CPU
        # backend ggml's scalar argmax made each verify decode ~0.5 ms per row slower than numpy's argmax here
        # (scripts/bench_spec_step_overhead.py --backend-sampling), a net loss in tokens/s.
        self.backend_greedy = False
        self.template = model.chat_template
        self.bos_text = model.token_text(model.bos_token) if model.bos_token >= 0 else ""
        self.eos_text = model.token_text(model.eos_token) if model.eos_token >= 0 else ""
        self.reasoning: ReasoningBudget | None = None  # the reply being generated's, while it may think
        self._end_thinking_early = False  # EndThinking came while the prompt was read: forced from the first token
        self._thinking_end: str | None = None  # what the template writes at the end of thinking (found once)
        self.vision: Vision | None = None  # the projector, when the model was loaded with one (engine_ext.vision)
        self.media: dict[str, EncodedImage] = {}  # the images of the request in hand, by content hash
        self._encodes_before = (0, 0.0)  # the projector's encode count and time when the request began
        self._decodes_before = 0  # the context's llama_decode calls when the request began

    # ----- prompt -----------------------------------------------------------------------------------

    def _tokenize_text(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=True)

    def _tokenize_prompt(self, text: str) -> list[int]:
        tokens = tokenize_with_media(text, self.media, self._tokenize_text)
        bos = self.model.bos_token
        if self.model.add_bos and bos >= 0 and (not tokens or tokens[0] != bos):
            tokens.insert(0, bos)
        return tokens

    def _tokens_for(self, text: str) -> list[int]:
        """Tokens for a prompt, reusing the tokens of the longest recent text it extends."""
        best: tuple[str, tuple[int, ...]] | None = None
        for anchor in self.anchors:
            if text.startswith(anchor[0]) and (best is None or len(anchor[0]) > len(best[0])):
                best = anchor
        if best is None:
            return self._tokenize_prompt(text)
        rest = text[len(best[0]) :]
        return list(best[1]) + tokenize_with_media(rest, self.media, self._tokenize_text)

    def add_anchor(self, text: str, tokens: Sequence[int]) -> None:
        if text:
            self.anchors = [a for a in self.anchors if a[0] != text]
            self.anchors.append((text, tuple(tokens)))
            del self.anchors[:-MAX_CHECKPOINTS]

    def _render(
        self,
        request: Generate,
        messages: Sequence[Mapping[str, Any]],
        cancelled: Callable[[], bool] | None = None,
        started_at: float | None = None,
    ) -> tuple[str, bool]:
        """The prompt's text, and whether it ends inside the answer of the reply being continued."""
        messages, tools = template_inputs(self.template, messages, request.tools, request.tool_choice)
        return render_reply_prompt(
            self.template,
            messages,
            continue_reply=request.continue_reply,
            # A budget of 0 is no thinking at all: templates that understand enable_thinking are told so.
            enable_thinking=False
            if request.enable_thinking is None and request.reasoning_budget == 0
            else request.enable_thinking,
            reasoning_effort=request.reasoning_effort,
            tools=tools,
            bos_token=self.bos_text,
            eos_token=self.eos_text,
            cancelled=cancelled,
            started_at=started_at,
        )

    def plan(
        self, request: Generate, cancelled: Callable[[], bool] | None = None, n_ctx: int | None = None
    ) -> PromptPlan:
        """Tokens to evaluate for a request, trimming the oldest turns when the context (`n_ctx`: the context's, or
        what one parallel sequence may hold) is too small; `cancelled` can stop the chat template's rendering
        (ChatTemplateCancelled)."""
        n_ctx = self.ctx.n_ctx if n_ctx is None else n_ctx
        self.media = {}
        room = request.max_tokens if request.max_tokens > 0 else MIN_REPLY_ROOM
        budget = max(1, n_ctx - min(room, n_ctx // 2))
        if request.prompt_tokens is not None:
            tokens = list(request.prompt_tokens)
            plan = PromptPlan(tokens, None, 0, False, chat=False, split_last=False)
        elif request.prompt is not None and request.suffix is not None:
            plan = PromptPlan(self.model.infill_tokens(request.prompt, request.suffix), None, 0, False, chat=False)
        elif request.prompt is not None:
            plan = PromptPlan(self._tokens_for(request.prompt), request.prompt, 0, False, chat=False)
        else:
            messages = message_dicts(request.messages)
            images = request_images(request.messages)
            if images and self.vision is None:
                raise NoProjector("this model was loaded without a projector (mmproj), so it cannot see images")
            self.media = self.vision.prepare(images) if images and self.vision is not None else {}
            if not messages:
                raise EngineError("nothing to generate from: no messages and no prompt")

            # One time limit for all the renders of this prompt (trimming a long conversation renders it
            # O(log turns) times): a template just under the limit must not multiply it.
            render_started = time.monotonic()

            def count(msgs: Sequence[Mapping[str, Any]]) -> int:
                return len(self._tokens_for(self._render(request, msgs, cancelled, render_started)[0]))

            kept, dropped = truncate_messages_to_fit(messages, count, budget)
            text, continues = self._render(request, kept, cancelled, render_started)
            plan = PromptPlan(
                self._tokens_for(text),
                text,
                dropped,
                prompt_opens_reasoning(text),
                chat=True,
                continues_answer=continues,
            )
        if len(plan.tokens) >= n_ctx:
            raise PromptTooLong(len(plan.tokens), n_ctx)
        if not plan.tokens:
            raise EngineError("the prompt is empty")
        return plan

    def _reuse_cache(self, tokens: Sequence[int]) -> int:
        """Make sequence 0 hold a prefix of `tokens`; return its length (< len(tokens))."""
        n_common = min(common_prefix_length(self.cached, tokens), len(tokens) - 1)
        self.restored_tokens = 0
        if self.disk is not None:
            restored = self._restore_from_disk(tokens, n_common)
            if restored is not None:
                return restored
            n_common = min(common_prefix_length(self.cached, tokens), len(tokens) - 1)  # a refusal may have cleared it
        if n_common == len(self.cached):
            return n_common
        if not self.uses_checkpoints and self.ctx.truncate(n_common):
            del self.cached[n_common:]
            return n_common
        best: Checkpoint | None = None
        for cp in self.checkpoints:
            n = len(cp.tokens)
            if n <= n_common and tuple(tokens[:n]) == cp.tokens and (best is None or n > len(best.tokens)):
                best = cp
        if best is not None:
            self.ctx.restore_checkpoint(best)
            self.checkpoints.remove(best)
            self.checkpoints.append(best)  # most recently used last
            self.cached = list(best.tokens)
            return len(best.tokens)
        self.ctx.clear()
        self.cached = []
        return 0

    def _evaluate(
        self,
        tokens: Sequence[int],
        *,
        logits_last: bool,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Decode `tokens` into the context, a micro-batch (n_ubatch) at a time: llama_decode splits a larger batch
        into micro-batches anyway, and between two of them `cancelled` is asked (a long prompt takes seconds, and
        Esc must not wait for all of it). What was decoded stays in the cache. `progress` is told how many of
        `tokens` are in before each micro-batch but the first."""
        if self.media and self.vision is not None and tokens and min(tokens) < 0:
            evaluate_with_media(
                self.cached,
                self.ctx,
                self.vision,
                tokens,
                lambda run, last: self._evaluate(run, logits_last=last, cancelled=cancelled),
                logits_last,
            )
            return
        n_batch = min(self.ctx.n_batch, self.ctx.params.n_ubatch)
        for start in range(0, len(tokens), n_batch):
            if start:
                if cancelled is not None and cancelled():
                    raise PromptCancelled
                if progress is not None:
                    progress(start)
            chunk = tokens[start : start + n_batch]
            last = start + n_batch >= len(tokens)
            pos0 = len(self.cached)
            self.ctx.decode(chunk, pos0, logits_last=logits_last and last)
            self.cached.extend(chunk)
            if self.spec is not None:
                self.spec.process(chunk, pos0)  # model drafters (MTP) read the target's hidden states

    def evaluate_prompt(
        self,
        tokens: Sequence[int],
        *,
        split_last: bool = True,
        hold_last: bool = False,
        cancelled: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Evaluate what the cache lacks, leaving logits for the last token; returns tokens reused.

        With `hold_last` the last token is left out: speculative decoding verifies it in its first batch, with
        the first draft (as upstream's speculative-simple starts, so a copy can start with the reply).
        Raises PromptCancelled when `cancelled` says so between batches. `progress(done, total)` hears how many
        of the prompt's tokens are in the context, between batches of a prompt longer than one.
        """
        if self.spec is not None and self.spec.set_media(bool(self.media) and min(tokens) < 0):
            self.reset_cache()  # model drafters missed the turns with images: they start over with the target
        n_cached = self._reuse_cache(tokens)
        rest = tokens[n_cached:]
        told = None if progress is None else (lambda done: progress(n_cached + done, len(tokens)))
        try:
            if hold_last:
                self._evaluate(rest[:-1], logits_last=False, cancelled=cancelled, progress=told)
                if split_last and len(rest) > 1:
                    self._checkpoint()
                return n_cached
            if split_last and len(rest) > 1:
                # Checkpoint just before the last prompt token so a regenerate re-evaluates one token.
                self._evaluate(rest[:-1], logits_last=False, cancelled=cancelled, progress=told)
                self._checkpoint()
                rest = rest[-1:]
            self._evaluate(rest, logits_last=True, cancelled=cancelled)
        except PromptCancelled as stop:
            stop.n_cached = n_cached
            raise
        return n_cached

    def count_prompt(self, request: Generate) -> Finished:
        """The tokens of `request`'s prompt as rendered (its template, tools and images), nothing evaluated and no
        turn dropped to fit the context: what an API's count_tokens answers (Generate.count_only)."""
        plan = self.plan(request, n_ctx=_COUNT_ALL)
        images = image_token_count(plan.tokens, self.vision) if self.media else 0
        self.media = {}
        n_ctx = self.ctx.n_ctx
        stats = GenerationStats(len(plan.tokens), 0, 0, 0.0, 0, 0.0, 0.0, n_ctx, len(self.cached), image_tokens=images)
        return Finished(request.request_id, "max_tokens", stats)

    def reasoning_budget(self, request: Generate, plan: PromptPlan) -> ReasoningBudget | None:
        """The reasoning budget of a chat reply (None for a raw prompt or a reply continued in its answer): it counts
        the thinking tokens and forces the request's budget message plus the template's end of thinking."""
        if not plan.chat or plan.continues_answer:
            return None
        if self._thinking_end is None:
            self._thinking_end = thinking_end_text(self.template, bos_token=self.bos_text, eos_token=self.eos_text)
        forced = self.model.tokenize(
            request.reasoning_budget_message + self._thinking_end, add_special=False, parse_special=True
        )
        return ReasoningBudget(
            self.token_info.piece, forced, request.reasoning_budget, starts_in_reasoning=plan.opens_reasoning
        )

    def end_thinking(self) -> bool:
        """Stop the reply's thinking now (EndThinking, asked only while a generation runs): its end is forced at the
        next token boundary, or from the first token when the prompt is still being read."""
        if self.reasoning is None:
            self._end_thinking_early = True
            return True
        return self.reasoning.force()

    # ----- generation -------------------------------------------------------------------------------

    def generate(
        self,
        request: Generate,
        emit: Callable[[Event], None],
        cancelled: Callable[[], bool],
    ) -> Finished:
        """Run one request to completion, streaming TokenChunks (and speculative updates) through `emit`."""
        t_request = time.perf_counter()
        self._decodes_before = self.ctx.decodes
        self._end_thinking_early = False
        tools = ToolTurn.of(request, self.template, self.model.path.name)
        if tools is not None:
            emit = tools.watch(emit)
        if self.vision is not None:
            self._encodes_before = (self.vision.encodes, self.vision.encode_ms)
        try:
            plan = self.plan(request, cancelled)
        except ChatTemplateCancelled:  # Esc while a slow template rendered: no reply, nothing read
            now = time.perf_counter()
            return self._finish(
                request,
                PromptPlan([], None, 0, False, chat=True),
                0,
                0.0,
                _LoopResult("cancelled", 0, now, now, 0.0, None),
            )
        if tools is not None:
            shape = tools.grammar(plan.opens_reasoning)
        else:
            shape = reply_grammar(request.grammar, request.json_schema, opens_reasoning=plan.opens_reasoning)
        sampler = Sampler(self.model, request.sampling, shape.gbnf, shape.triggers, shape.root)
        spec = self.spec if request.speculative and self.spec is not None else None
        self._choose_backend_sampling(sampler, spec)
        try:
            t_prompt = time.perf_counter()
            try:
                n_cached = self.evaluate_prompt(
                    plan.tokens,
                    split_last=plan.split_last,
                    hold_last=spec is not None,
                    cancelled=cancelled,
                    progress=lambda done, total: emit(PromptProgress(request.request_id, done, total)),
                )
            except PromptCancelled as stop:  # Esc while a long prompt was read: no reply, what was read is kept
                now = time.perf_counter()
                stopped = _LoopResult("cancelled", 0, now, now, 0.0, None)
                return self._finish(request, plan, stop.n_cached, (now - t_prompt) * 1000.0, stopped)
            prompt_ms = (time.perf_counter() - t_prompt) * 1000.0
            emit(PromptEvaluated(request.request_id, len(plan.tokens), n_cached, self.ctx.n_ctx))
            if plan.text is not None:
                self.add_anchor(plan.text, plan.tokens)
            sampler.feed_prompt_history(plan.tokens)
            stream = ReplyStream(self.model, request, plan, emit, self.token_info)
            self.reasoning = self.reasoning_budget(request, plan)
            if self.reasoning is not None and self._end_thinking_early:
                self.reasoning.force()
            if spec is None:
                loop = self._decode_plain(request, sampler, stream, cancelled, t_request)
            else:
                loop = self._decode_speculative(request, sampler, stream, cancelled, t_request, spec, plan.tokens[-1])
            stream.finish()
            thought = self.reasoning
        finally:
            self.reasoning = None
            sampler.close()
        try:
            finished = self._finish(request, plan, n_cached, prompt_ms, loop)
        finally:
            self.media = {}
        if thought is not None and thought.started_at:
            stats = replace(finished.stats, reasoning_tokens=thought.thinking_tokens, reasoning_ms=thought.thinking_ms)
            finished = replace(finished, stats=stats)
        if tools is None:
            return finished
        return tools.finish(finished, lambda t: self.model.token_piece(t, special=True), plan.opens_reasoning)

    def _choose_backend_sampling(self, sampler: Sampler, spec: SpeculativeDriver | None) -> None:
        """With `backend_greedy`, attach the context's backend greedy sampler for a pure greedy speculative request;
        detach it for any request that needs logits (another sampler). A plain greedy request keeps it as it is:
        each change costs llama.cpp a graph re-reserve (a few ms). Both give the argmax, but on an exact tie of the
        top logits ggml's CPU argmax picks the last index and numpy (like llama.cpp's CPU greedy sampler) the first.
        """
        ctx = self.ctx
        if not sampler.pure_greedy:
            ctx.set_backend_greedy(False)
        elif spec is not None:
            ctx.set_backend_greedy(self.backend_greedy)

    @property
    def conditions(self) -> tuple[int, int]:
        return self.governor.conditions if self.governor is not None else (0, 0)

    @property
    def plain_step_ms(self) -> float:
        """Plain decoding's step time under the current conditions (0: not measured under them)."""
        return self.baseline.get(self.conditions)

    def _decode_plain(
        self,
        request: Generate,
        sampler: Sampler,
        stream: ReplyStream,
        cancelled: Callable[[], bool],
        t_request: float,
    ) -> _LoopResult:
        """One token per step: the hot path, kept free of anything but sampling and decoding."""
        ctx, cached = self.ctx, self.cached
        n_ctx, max_tokens = ctx.n_ctx, request.max_tokens
        decode_one, push, sample, reasoning = ctx.decode_one, stream.push, sampler.sample, self.reasoning
        n_generated = 0
        source = "target"
        stop_reason: StopReason = "max_tokens"
        t_first = t_last = time.perf_counter()
        ttft_ms = 0.0
        governor = self.governor
        # The step time is measured per segment of constant conditions (the governor counts its changes), and the
        # governor measures the step rate per thread count while this loop runs.
        changes = governor.changes if governor is not None else 0
        if governor is not None:
            governor.decoding = True
        segment = (self.conditions, t_first, 1)  # conditions, start time, tokens generated at the start
        while True:
            if reasoning is None:
                token = sample(ctx)
            else:  # the reply may think: the budget counts its tokens and may force the end of thinking
                token, source = reasoning.next_token(sampler, ctx)
            t_last = time.perf_counter()
            if n_generated == 0:
                t_first = t_last
                ttft_ms = (t_last - t_request) * 1000.0
                segment = (segment[0], t_first, 1)
            n_generated += 1
            if governor is not None and governor.changes != changes:
                changes = governor.changes
                self._observe_plain_segment(segment, t_last, n_generated)
                segment = (self.conditions, t_last, n_generated)
            reason = push(token, source, t_last)
            if reason is not None:
                stop_reason = reason
                break
            if max_tokens > 0 and n_generated >= max_tokens:
                break
            if len(cached) >= n_ctx:
                stop_reason = "context_full"
                break
            if cancelled():
                stop_reason = "cancelled"
                break
            decode_one(token, len(cached))
            cached.append(token)
        if governor is not None:
            governor.decoding = False
        self._observe_plain_segment(segment, t_last, n_generated)
        return _LoopResult(stop_reason, n_generated, t_first, t_last, ttft_ms, None)

    def _observe_plain_segment(self, segment: tuple[tuple[int, int], float, int], t_end: float, n_end: int) -> None:
        conditions, t_start, n_start = segment
        if n_end > n_start:
            self.baseline.observe(conditions, (t_end - t_start) * 1000.0 / (n_end - n_start))

    def _observe_plain_step(self, step_ms: float) -> None:
        conditions = self.conditions
        self.baseline.observe(conditions, step_ms)
        self._plain_steps[conditions] = self._plain_steps.get(conditions, 0) + 1

    def _plain_probe(self) -> bool:
        """Whether this speculative step decodes plainly instead: the thread count follows the load and plain
        decoding was measured fewer than PLAIN_PROBE_STEPS times under the current conditions (a busy machine's, a
        new thread count's), so the speedup shown and auto's pause rule compare with plain decoding as fast as it is
        now. (A fixed count keeps today's rule: the speedup is known once a plain reply was measured.)"""
        return self.governor is not None and self._plain_steps.get(self.conditions, 0) < PLAIN_PROBE_STEPS

    def _decode_speculative(
        self,
        request: Generate,
        sampler: Sampler,
        stream: ReplyStream,
        cancelled: Callable[[], bool],
        t_request: float,
        spec: SpeculativeDriver,
        id_last: int,
    ) -> _LoopResult:
        """Draft, verify on the target in one batch, keep the matching prefix plus one target token.

        The memory holds the prompt but its last token, `id_last`: the first step drafts after it and verifies
        it with the draft, as upstream's speculative-simple does (the first tokens of a copy come out at once).

        Every emitted token is sampled by the target's own sampler conditioned on the true prefix, so greedy
        output is identical to plain decoding (common/sampling.cpp's verification, notes §3.9).
        """
        ctx, cached, model = self.ctx, self.cached, self.model
        n_ctx, max_tokens = ctx.n_ctx, request.max_tokens
        first_eog = self.token_info.first_eog
        rollback = model.architecture in RS_ROLLBACK_ARCHS and ctx.params.n_rs_seq > 0
        needs_checkpoint = self.uses_checkpoints
        reads_batches = spec.reads_batches
        reasoning = self.reasoning
        spec.reset_stats()
        spec.begin(cached)
        n_generated = 0
        stop_reason: StopReason = "max_tokens"
        last_update = 0.0

        t_first = t_last = time.perf_counter()
        ttft_ms = 0.0
        ids: list[int] = []
        sources: list[str] = []
        while True:
            if ids:
                if n_generated == 0:
                    t_first = t_last
                    ttft_ms = (t_first - t_request) * 1000.0
                if max_tokens > 0:
                    ids = ids[: max_tokens - n_generated]
                n_taken, reason = stream.push_many(ids, sources, t_last)
                n_generated += n_taken
                if reason is None and max_tokens > 0 and n_generated >= max_tokens:
                    reason = "max_tokens"
                if reason is not None:
                    stop_reason = reason
                    break
            if t_last - last_update >= SPEC_UPDATE_INTERVAL_S and n_generated:
                last_update = t_last
                stream.emit(SpeculativeUpdate(self._spec_snapshot(spec, request, n_generated, t_first, t_last)))
            if ids:
                id_last = ids[-1]
            n_past = len(cached)
            room = n_ctx - n_past - 1
            if room < 0:
                stop_reason = "context_full"
                break
            if cancelled():
                stop_reason = "cancelled"
                break
            budget = self._draft_budget(room, max_tokens - n_generated if max_tokens > 0 else None, rollback)
            if budget > 0 and spec.drafting_allowed(n_generated) and not self._plain_probe():
                draft, drafter = spec.draft(cached, id_last, budget)
            else:
                draft, drafter = [], None
            if drafter is None:
                t_plain = time.perf_counter()
                ctx.decode_one(id_last, n_past)
                cached.append(id_last)
                if reasoning is None:
                    ids, sources = [sampler.sample(ctx)], ["target"]
                else:
                    token, source = reasoning.next_token(sampler, ctx)
                    ids, sources = [token], [source]
                t_last = time.perf_counter()
                self._observe_plain_step((t_last - t_plain) * 1000.0)
                if reads_batches:
                    spec.process((id_last,), n_past)
                continue
            t_verify = time.perf_counter()
            checkpoint = ctx.save_checkpoint(cached) if needs_checkpoint and not rollback else None
            eog_at = first_eog(draft, 0, len(draft) - 1)  # before decoding: Python's data is still in the caches
            if eog_at < len(draft) - 1 and not request.ignore_eos:
                # Nothing after an end-of-generation token is ever used: accepted, it ends the reply; rejected,
                # so is what follows. Don't verify it (an n-gram draft often runs on past the end of a reply it
                # has seen, into the next turn: tens of tokens decoded for nothing).
                draft = draft[: eog_at + 1]
            batch = [id_last, *draft]
            ctx.decode(batch, n_past, logits_last=False, logits_all=True)
            if reads_batches:
                spec.process(batch, n_past)
            ids = sampler.sample_and_accept_n(ctx, draft, eog_at)
            if reasoning is not None:
                reasoning.observe_all(ids)
            n_accepted = len(ids) - 1
            kept = batch[: 1 + n_accepted]
            cached.extend(kept)
            if n_accepted < len(draft):
                if checkpoint is not None:
                    # Recurrent state cannot be cut back: restore the state before the batch, replay what stays.
                    ctx.restore_checkpoint(checkpoint)
                    ctx.decode(kept, n_past, logits_last=False)
                elif not ctx.truncate(len(cached)):
                    raise EngineError("the model's memory could not be rolled back after a rejected draft")
            step_start, t_last = t_last, time.perf_counter()
            spec.accept(drafter, len(draft), n_accepted, (t_last - t_verify) * 1000.0)
            spec.observe(len(ids), (t_last - step_start) * 1000.0, self.plain_step_ms, n_generated)
            # The last token is the target's: past a draft accepted whole, or where the draft was rejected (not where
            # an accepted end-of-generation draft token ended verification early).
            rejected = n_accepted < len(draft) and ids[-1] != draft[n_accepted]
            sources = [drafter.name] * n_accepted + [rejected_by(drafter.name) if rejected else "target"]
        snapshot = self._spec_snapshot(spec, request, n_generated, t_first, t_last)
        return _LoopResult(stop_reason, n_generated, t_first, t_last, ttft_ms, snapshot)

    def _draft_budget(self, room: int, tokens_left: int | None, rollback: bool) -> int:
        """A step's draft: what fits the context and one batch with the last token, no token past max_tokens (a step
        yields the drafts accepted plus one), what recurrent state can roll back, none across the reasoning budget."""
        budget = min(room, MAX_VERIFY_DRAFT, self.ctx.n_batch - 1, self.ctx.params.n_rs_seq if rollback else room)
        budget = budget if tokens_left is None else min(budget, tokens_left - 1)
        thinking_room = self.reasoning.draft_room() if self.reasoning is not None else None
        return budget if thinking_room is None else min(budget, thinking_room)

    def _spec_snapshot(
        self, spec: SpeculativeDriver, request: Generate, n_generated: int, t_first: float, t_last: float
    ) -> SpeculativeStats:
        elapsed = t_last - t_first
        effective = (n_generated - 1) / elapsed if n_generated > 1 and elapsed > 0 else 0.0
        plain = 1000.0 / self.plain_step_ms if self.plain_step_ms > 0 else 0.0
        return spec.snapshot(request.request_id, effective, plain)

    def _finish(
        self,
        request: Generate,
        plan: PromptPlan,
        n_cached: int,
        prompt_ms: float,
        loop: _LoopResult,
    ) -> Finished:
        n_prompt = len(plan.tokens)
        if plan.text is not None and len(self.cached) > n_prompt:
            reply = b"".join(map(self.token_info.piece, self.cached[n_prompt:]))
            self.add_anchor(plan.text + reply.decode("utf-8", errors="replace"), self.cached)
        self._checkpoint()
        n_ctx = self.ctx.n_ctx
        notices: tuple[str, ...] = ()
        if plan.dropped_messages:
            notices = (
                f"dropped the {plan.dropped_messages} oldest message(s) so the conversation fits the "
                f"{n_ctx}-token context",
            )
        if loop.stop_reason == "context_full":
            notices += (f"stopped: the {n_ctx}-token context is full",)
        if self.disk is not None:
            notices += self._disk_notices + self.disk.take_notices()
        self._disk_notices = ()
        stats = GenerationStats(
            prompt_tokens=n_prompt,
            prompt_tokens_cached=n_cached,
            prompt_tokens_evaluated=n_prompt - n_cached,
            prompt_ms=prompt_ms,
            generated_tokens=loop.n_generated,
            decode_ms=(loop.t_last - loop.t_first) * 1000.0,
            ttft_ms=loop.ttft_ms,
            n_ctx=n_ctx,
            n_ctx_used=len(self.cached),
            dropped_messages=plan.dropped_messages,
            n_threads=self.ctx.n_threads,
            image_tokens=image_token_count(plan.tokens, self.vision) if self.media else 0,
            images_encoded=self.vision.encodes - self._encodes_before[0] if self.vision is not None else 0,
            image_encode_ms=self.vision.encode_ms - self._encodes_before[1] if self.vision is not None else 0.0,
            n_decode=self.ctx.decodes - self._decodes_before,
            n_decode_total=self.ctx.decodes,
        )
        return Finished(request.request_id, loop.stop_reason, stats, notices, loop.speculative)


@dataclass
class _LoopResult:
    stop_reason: StopReason
    n_generated: int
    t_first: float
    t_last: float
    ttft_ms: float
    speculative: SpeculativeStats | None
