"""draft-simple: a separate small model drafts greedily (common/speculative.cpp's draft-simple)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine_ext.bindings import logits_address
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams, ModelParams, SpeculativeConfigError
from engine_ext.sampling import FloatRows
from engine_ext.speculative.base import Drafter, common_prefix_length

# common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE and SPEC_VOCAB_CHECK_START_TOKEN_ID.
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
DRAFT_TOP_K = 10  # drafters pick the argmax of the top 10; p_min compares its softmax probability


def check_vocab_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokens mean something else than the target's (upstream's compatibility rules)."""
    from engine_ext.bindings import C

    name = draft.path.name
    if C.llama_vocab_type(target.vocab) != C.llama_vocab_type(draft.vocab):
        raise SpeculativeConfigError(f"draft model {name} uses another tokenizer type than the target")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_token != draft.bos_token):
        raise SpeculativeConfigError(f"draft model {name} has a different BOS token setting than the target")
    if target.eos_token != draft.eos_token:
        raise SpeculativeConfigError(f"draft model {name} has a different end-of-sequence token than the target")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpeculativeConfigError(
            f"draft model {name} has {draft.n_vocab} tokens, the target {target.n_vocab}: "
            f"they differ by more than {VOCAB_MAX_SIZE_DIFFERENCE}"
        )
    for token in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(token) != draft.token_text(token):
            raise SpeculativeConfigError(
                f"draft model {name} and the target disagree on token {token} "
                f"({draft.token_text(token)!r} vs {target.token_text(token)!r}): not the same vocabulary"
            )


def top_token(logits: np.ndarray, with_probability: bool) -> tuple[int, float]:
    """The argmax token and, when asked, its softmax probability among the top DRAFT_TOP_K logits."""
    best = int(logits.argmax())
    if not with_probability:
        return best, 1.0
    top = logits[np.argpartition(logits, -DRAFT_TOP_K)[-DRAFT_TOP_K:]].astype(np.float64)
    return best, float(1.0 / np.exp(top - top.max()).sum())


class DraftSimple(Drafter):
    """Drafts with its own model and context, keeping its memory in step with the target's tokens."""

    name = "draft-simple"

    def __init__(
        self,
        path: Path,
        target: Model,
        target_ctx: Context,
        *,
        p_min: float = 0.0,
        model_params: ModelParams = ModelParams(),
    ) -> None:
        super().__init__()
        self.model = Model(path, model_params)
        try:
            check_vocab_compatible(target, self.model)
            tp = target_ctx.params
            self.ctx = Context(
                self.model,
                ContextParams(
                    n_ctx=target_ctx.n_ctx,
                    n_batch=tp.n_batch,
                    n_ubatch=tp.n_ubatch,
                    n_threads=tp.n_threads,
                    n_threads_batch=tp.n_threads_batch,
                    flash_attn=tp.flash_attn,
                ),
            )
        except Exception:
            self.model.close()
            raise
        self.p_min = p_min
        self.cached: list[int] = []
        self._logits = FloatRows(self.model.n_vocab)

    def _sync(self, tokens: Sequence[int]) -> None:
        """Make the draft's memory hold exactly `tokens` (reusing the common prefix)."""
        cached = self.cached
        i = common_prefix_length(cached, tokens)  # every step: a slice comparison, not a loop over the history
        if i < len(cached):
            if not self.ctx.truncate(i):
                self.ctx.clear()
                i = 0
            del cached[i:]
        n_batch = self.ctx.n_batch
        for start in range(i, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            self.ctx.decode(chunk, len(cached), logits_last=False)
            cached.extend(chunk)

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        self._sync(tokens)
        ctx, cached = self.ctx, self.cached
        rows = self._logits
        want_p = self.p_min > 0.0
        result: list[int] = []
        token = id_last
        handle = ctx.handle
        while len(result) < n_max and len(cached) + 1 < ctx.n_ctx:
            ctx.decode_one(token, len(cached))
            cached.append(token)
            # One token decoded with logits: its row is the buffer's first. The address is read as an int (a
            # pointer object and its cast cost tens of µs right after a decode has cooled the caches).
            token, p = top_token(rows(logits_address(handle) or ctx.logits_row(-1))[0], want_p)
            if p < self.p_min:
                break
            result.append(token)
        return result

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
