"""The generation loop: prompt rendering, the multi-turn prompt cache with state checkpoints, token streaming."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine_ext.chat import (
    ReasoningSplitter,
    StopStringMatcher,
    Utf8StreamDecoder,
    prompt_opens_reasoning,
    render_chat,
    truncate_messages_to_fit,
)
from engine_ext.model import Checkpoint, Context, Model
from engine_ext.params import EngineError
from engine_ext.protocol import Finished, Generate, GenerationStats, StopReason, TokenChunk
from engine_ext.sampling import Sampler

MAX_CHECKPOINTS = 8
CHUNK_INTERVAL_S = 0.03  # coalesce streamed text so the pipe and the UI see ~30 messages/s at most
MIN_REPLY_ROOM = 256  # tokens kept free for the reply when the conversation is trimmed to fit


class PromptTooLong(EngineError):
    """The prompt does not fit the context even after dropping old turns."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class PromptPlan:
    tokens: list[int]
    text: str | None  # the prompt's text when it has one (not for pre-tokenized prompts)
    dropped_messages: int
    opens_reasoning: bool
    chat: bool
    # Evaluate the last prompt token on its own, as a regenerate of this prompt will (so greedy replies
    # repeat exactly); off for pre-tokenized benchmark prompts, measured as one batch like llama-bench.
    split_last: bool = True


class Session:
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
        self.template = model.chat_template
        self.bos_text = model.token_text(model.bos_token) if model.bos_token >= 0 else ""
        self.eos_text = model.token_text(model.eos_token) if model.eos_token >= 0 else ""

    # ----- prompt -----------------------------------------------------------------------------------

    def _tokenize_prompt(self, text: str) -> list[int]:
        tokens = self.model.tokenize(text, add_special=False, parse_special=True)
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
        return list(best[1]) + self.model.tokenize(rest, add_special=False, parse_special=True)

    def _add_anchor(self, text: str, tokens: Sequence[int]) -> None:
        if text:
            self.anchors = [a for a in self.anchors if a[0] != text]
            self.anchors.append((text, tuple(tokens)))
            del self.anchors[:-MAX_CHECKPOINTS]

    def _render(self, request: Generate, messages: Sequence[Mapping[str, str]]) -> str:
        text = render_chat(
            self.template,
            messages,
            bos_token=self.bos_text,
            eos_token=self.eos_text,
            add_generation_prompt=not request.continue_reply,
            enable_thinking=request.enable_thinking,
        )
        if request.continue_reply and messages and messages[-1]["role"] == "assistant":
            # Continue a stopped reply: cut the rendered prompt right after the partial reply text.
            partial = messages[-1]["content"]
            cut = text.rfind(partial) if partial else -1
            if cut >= 0:
                text = text[: cut + len(partial)]
        return text

    def plan(self, request: Generate) -> PromptPlan:
        """Tokens to evaluate for a request, trimming the oldest turns when the context is too small."""
        n_ctx = self.ctx.n_ctx
        room = request.max_tokens if request.max_tokens > 0 else MIN_REPLY_ROOM
        budget = max(1, n_ctx - min(room, n_ctx // 2))
        if request.prompt_tokens is not None:
            tokens = list(request.prompt_tokens)
            plan = PromptPlan(tokens, None, 0, False, chat=False, split_last=False)
        elif request.prompt is not None:
            plan = PromptPlan(self._tokens_for(request.prompt), request.prompt, 0, False, chat=False)
        else:
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            if not messages:
                raise EngineError("nothing to generate from: no messages and no prompt")

            def count(msgs: Sequence[Mapping[str, str]]) -> int:
                return len(self._tokenize_prompt(self._render(request, msgs)))

            kept, dropped = truncate_messages_to_fit(messages, count, budget)
            text = self._render(request, kept)
            plan = PromptPlan(self._tokens_for(text), text, dropped, prompt_opens_reasoning(text), chat=True)
        if len(plan.tokens) >= n_ctx:
            raise PromptTooLong(
                f"the prompt is {len(plan.tokens)} tokens but the context holds {n_ctx}; "
                "start a new conversation or raise the context size (-c)"
            )
        if not plan.tokens:
            raise EngineError("the prompt is empty")
        return plan

    def _reuse_cache(self, tokens: Sequence[int]) -> int:
        """Make sequence 0 hold a prefix of `tokens`; return its length (< len(tokens))."""
        n_common = min(common_prefix_length(self.cached, tokens), len(tokens) - 1)
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

    def _checkpoint(self) -> None:
        if not self.uses_checkpoints or not self.cached:
            return
        key = tuple(self.cached)
        self.checkpoints = [cp for cp in self.checkpoints if cp.tokens != key]
        self.checkpoints.append(self.ctx.save_checkpoint(key))
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def _evaluate(self, tokens: Sequence[int], *, logits_last: bool) -> None:
        n_batch = self.ctx.n_batch
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            last = start + n_batch >= len(tokens)
            self.ctx.decode(chunk, len(self.cached), logits_last=logits_last and last)
            self.cached.extend(chunk)

    def evaluate_prompt(self, tokens: Sequence[int], *, split_last: bool = True) -> int:
        """Evaluate what the cache lacks, leaving logits for the last token; returns tokens reused."""
        n_cached = self._reuse_cache(tokens)
        rest = tokens[n_cached:]
        if split_last and len(rest) > 1:
            # Checkpoint just before the last prompt token so a regenerate re-evaluates one token.
            self._evaluate(rest[:-1], logits_last=False)
            self._checkpoint()
            rest = rest[-1:]
        self._evaluate(rest, logits_last=True)
        return n_cached

    # ----- generation -------------------------------------------------------------------------------

    def generate(
        self,
        request: Generate,
        emit: Callable[[TokenChunk], None],
        cancelled: Callable[[], bool],
    ) -> Finished:
        """Run one request to completion, streaming TokenChunks through `emit`."""
        t_request = time.perf_counter()
        plan = self.plan(request)
        sampler = Sampler(self.model, request.sampling)
        try:
            return self._generate(request, plan, sampler, emit, cancelled, t_request)
        finally:
            sampler.close()

    def _generate(
        self,
        request: Generate,
        plan: PromptPlan,
        sampler: Sampler,
        emit: Callable[[TokenChunk], None],
        cancelled: Callable[[], bool],
        t_request: float,
    ) -> Finished:
        model, ctx = self.model, self.ctx
        tokens = plan.tokens
        t_prompt = time.perf_counter()
        n_cached = self.evaluate_prompt(tokens, split_last=plan.split_last)
        if plan.text is not None:
            self._add_anchor(plan.text, tokens)
        reply_bytes: list[bytes] = []  # pieces of the generated tokens that enter the cache
        prompt_ms = (time.perf_counter() - t_prompt) * 1000.0
        params = request.sampling
        if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            window = params.repeat_last_n if params.repeat_last_n > 0 else len(tokens)
            for t in tokens[-window:]:
                sampler.accept(t)

        utf8 = Utf8StreamDecoder()
        stopper = StopStringMatcher(list(request.stop))
        splitter = ReasoningSplitter(starts_in_reasoning=plan.opens_reasoning) if plan.chat else None
        pending_text: list[str] = []
        pending_reasoning: list[str] = []
        pending_ids: list[int] = []
        last_flush = 0.0

        def route(text: str) -> None:
            if not text:
                return
            if splitter is None:
                pending_text.append(text)
                return
            for kind, part in splitter.feed(text):
                (pending_reasoning if kind == "reasoning" else pending_text).append(part)

        def flush() -> None:
            nonlocal last_flush
            if pending_ids or pending_text or pending_reasoning:
                emit(
                    TokenChunk(
                        request.request_id,
                        "".join(pending_text),
                        "".join(pending_reasoning),
                        tuple(pending_ids),
                        ("target",) * len(pending_ids),
                    )
                )
                pending_text.clear()
                pending_reasoning.clear()
                pending_ids.clear()
            last_flush = time.perf_counter()

        n_ctx = ctx.n_ctx
        max_tokens = request.max_tokens
        n_generated = 0
        stop_reason: StopReason = "max_tokens"
        t_first = t_last = time.perf_counter()
        ttft_ms = 0.0
        is_eog, piece, decode_one, cached = model.is_eog, model.token_piece, ctx.decode_one, self.cached
        while True:
            token = sampler.sample(ctx)
            t_last = time.perf_counter()
            if n_generated == 0:
                t_first = t_last
                ttft_ms = (t_last - t_request) * 1000.0
            n_generated += 1
            if not request.ignore_eos and is_eog(token):
                stop_reason = "eos"
                break
            pending_ids.append(token)
            token_bytes = piece(token)
            text, stopped = stopper.feed(utf8.feed(token_bytes))
            route(text)
            if stopped:
                stop_reason = "stop_string"
                break
            if n_generated == 1 or t_last - last_flush >= CHUNK_INTERVAL_S:
                flush()
            if max_tokens > 0 and n_generated >= max_tokens:
                stop_reason = "max_tokens"
                break
            if len(cached) >= n_ctx:
                stop_reason = "context_full"
                break
            if cancelled():
                stop_reason = "cancelled"
                break
            decode_one(token, len(cached))
            cached.append(token)
            reply_bytes.append(token_bytes)

        if stop_reason != "stop_string":
            route(stopper.feed(utf8.flush())[0] + stopper.flush())
        if splitter is not None:
            for kind, part in splitter.flush():
                (pending_reasoning if kind == "reasoning" else pending_text).append(part)
        flush()
        if plan.text is not None and reply_bytes:
            self._add_anchor(plan.text + b"".join(reply_bytes).decode("utf-8", errors="replace"), self.cached)
        self._checkpoint()
        notices: tuple[str, ...] = ()
        if plan.dropped_messages:
            notices = (
                f"dropped the {plan.dropped_messages} oldest message(s) so the conversation fits the "
                f"{n_ctx}-token context",
            )
        if stop_reason == "context_full":
            notices += (f"stopped: the {n_ctx}-token context is full",)
        stats = GenerationStats(
            prompt_tokens=len(tokens),
            prompt_tokens_cached=n_cached,
            prompt_tokens_evaluated=len(tokens) - n_cached,
            prompt_ms=prompt_ms,
            generated_tokens=n_generated,
            decode_ms=(t_last - t_first) * 1000.0,
            ttft_ms=ttft_ms,
            n_ctx=n_ctx,
            n_ctx_used=len(self.cached),
            dropped_messages=plan.dropped_messages,
        )
        return Finished(request.request_id, stop_reason, stats, notices)
