"""The reasoning budget: a reply's thinking tokens counted as they come, and the end of thinking forced when the
budget is spent or the user says "stop thinking now" (llama.cpp's common/reasoning-budget.cpp, a state machine over
the reply's tokens: idle, counting, waiting for a complete UTF-8 character, forcing, done).

Upstream forces its tokens from inside the sampler chain (every other logit set to -inf); here the decode loop asks
`next_forced()` before it samples, feeds the forced token to the sampler as if it had picked it, and marks it FORCED.
Tags are found in the reply's text, not its token ids, so a tokenizer that spells `</think>` in several tokens is
counted the same; like engine_ext.reply_stream's ReasoningSplitter, a reply has at most one thinking block, at its
start.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from engine_ext.chat_prompt import ChatTemplateError, render_chat
from engine_ext.protocol import FORCED

if TYPE_CHECKING:
    from engine_ext.model import Context
    from engine_ext.sampling import Sampler

__all__ = [
    "DEFAULT_THINKING_END",
    "ReasoningBudget",
    "thinking_end_text",
]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
# What Qwen3-style templates put between a reply's thinking and its answer; used when the template does not show it.
DEFAULT_THINKING_END: Final = "\n</think>\n\n"
_THOUGHT_MARK = "\u2063thought\u2063"  # invisible separators: text no template writes itself
_ANSWER_MARK = "\u2063answer\u2063"

BudgetState = Literal["idle", "counting", "waiting_utf8", "forcing", "done"]


def thinking_end_text(template: str | None, *, bos_token: str = "", eos_token: str = "") -> str:
    """The text a chat template writes between an assistant turn's thinking and its answer (Qwen3's
    "\\n</think>\\n\\n"), found by rendering one turn with marked reasoning and answer; DEFAULT_THINKING_END when
    the template does not render `reasoning_content` or fails."""
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": _ANSWER_MARK, "reasoning_content": _THOUGHT_MARK},
    ]
    try:
        text = render_chat(
            template,
            messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=False,
            enable_thinking=True,
        )
    except ChatTemplateError:
        return DEFAULT_THINKING_END
    start = text.find(_THOUGHT_MARK)
    end = text.find(_ANSWER_MARK, start + 1) if start >= 0 else -1
    between = text[start + len(_THOUGHT_MARK) : end] if end >= 0 else ""
    return between if THINK_CLOSE in between else DEFAULT_THINKING_END


class ReasoningBudget:
    """Counts a reply's thinking tokens and forces the end of thinking after `budget` of them (-1: never by itself;
    `force()` still ends it), once the text is at a complete UTF-8 character.

    `observe()` is told every token of the reply in order (forced ones included); `next_forced()` says which token
    the next one must be while forcing. `draft_room()` bounds a speculative step so that no accepted draft crosses the
    budget: the step's tokens then all fall in the state the plain loop would sample them in (greedy output with and
    without speculation stays identical).
    """

    def __init__(
        self,
        piece: Callable[[int], bytes],
        forced_tokens: Sequence[int],
        budget: int,
        *,
        starts_in_reasoning: bool,
    ) -> None:
        self._piece = piece
        self.forced_tokens = tuple(forced_tokens)
        self.budget = budget
        self.remaining = budget
        self.thinking_tokens = 0  # tokens counted inside the thinking block (forced ones not included)
        self.forced = False  # whether the end of thinking was forced (budget or force())
        self._end_requested = False
        self._utf8: Any = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = ""  # text not yet known not to be part of a tag
        self._force_pos = 0
        self.started_at = 0.0  # perf_counter() when thinking began (0: it did not)
        self.ended_at = 0.0  # … and when it ended (0: not yet)
        self.state: BudgetState = "idle"
        if starts_in_reasoning:
            self._start_counting()

    def _start_counting(self) -> None:
        self.state = "counting"
        self.started_at = time.perf_counter()
        self._tail = ""
        if self.budget == 0 or self._end_requested:
            self._begin_forcing()

    def _begin_forcing(self) -> None:
        self.forced = True
        self._tail = ""
        if self._utf8.getstate()[0]:  # bytes of an unfinished character: finish it first
            self.state = "waiting_utf8"
        else:
            self._force_pos = 0
            if self.forced_tokens:
                self.state = "forcing"
            else:
                self._done()

    def force(self) -> bool:
        """Stop thinking now: force the end at the next token boundary (or as soon as thinking starts). Returns
        whether the reply is thinking or may still start to (not once its answer began)."""
        if self.state == "idle":
            self._end_requested = True
            return True
        if self.state == "counting":
            self._begin_forcing()
            return True
        return self.state in ("waiting_utf8", "forcing")

    def next_forced(self) -> int | None:
        """The token the reply's next token must be (None: the model's own)."""
        return self.forced_tokens[self._force_pos] if self.state == "forcing" else None

    def draft_room(self) -> int | None:
        """The most draft tokens a speculative step may verify (None: no bound). A step yields its accepted drafts
        plus one target token, so while counting, at most `remaining - 1` drafts; before thinking starts the step's
        first token may open it, leaving room for `budget` more; none while waiting or forcing."""
        state = self.state
        if state == "done":
            return None
        if state in ("waiting_utf8", "forcing"):
            return 0
        budget = 0 if self._end_requested else self.budget
        if budget < 0:
            return None
        return max(0, self.remaining - 1) if state == "counting" else budget

    def observe(self, token: int) -> None:
        """One token of the reply, in order."""
        state = self.state
        if state == "done":
            return
        text = self._utf8.decode(self._piece(token), final=False)
        if state == "forcing":
            self._force_pos += 1
            if self._force_pos >= len(self.forced_tokens):
                self._done()
            return
        if state == "idle":
            head = (self._tail + text).lstrip()
            if head.startswith(THINK_OPEN):
                self._start_counting()
                self._tail = head[len(THINK_OPEN) :]
            elif THINK_OPEN.startswith(head):
                self._tail = head  # whitespace or the start of the tag so far
            else:
                self.state = "done"  # an answer without thinking
            return
        seen = self._tail + text
        if THINK_CLOSE in seen:
            self._done()  # the model ended its thinking itself
            return
        self._tail = seen[-(len(THINK_CLOSE) - 1) :]
        if state == "waiting_utf8":
            if not self._utf8.getstate()[0]:
                self._begin_forcing()
            return
        self.thinking_tokens += 1
        if self.budget >= 0:
            self.remaining -= 1
            if self.remaining <= 0:
                self._begin_forcing()

    def next_token(self, sampler: Sampler, ctx: Context, row: int = -1) -> tuple[int, str]:
        """The reply's next token and its provenance: the forced one (fed to the sampler as if it had picked it) or
        the sampler's pick from output row `row` (-1: the context's last logits); observed either way."""
        token = self.next_forced()
        if token is None:
            token, source = sampler.sample(ctx, row), "target"
        else:
            sampler.accept_forced(token)
            source = FORCED
        self.observe(token)
        return token, source

    def _done(self) -> None:
        self.state = "done"
        self.ended_at = time.perf_counter()

    @property
    def thinking_ms(self) -> float:
        """How long the reply thought (so far, while it still thinks)."""
        if not self.started_at:
            return 0.0
        return ((self.ended_at or time.perf_counter()) - self.started_at) * 1000.0

    def observe_all(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.observe(token)


def next_reply_token(
    sampler: Sampler, reasoning: ReasoningBudget | None, ctx: Context, row: int
) -> tuple[list[int], list[str]]:
    """A parallel sequence's next token from its row and its provenance: sampled, or forced by its reasoning budget
    (the end of thinking)."""
    if reasoning is None:
        return [sampler.sample(ctx, row)], ["target"]
    token, source = reasoning.next_token(sampler, ctx, row)
    return [token], [source]
