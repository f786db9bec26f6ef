"""Model drafters for the parallel sequences (engine_ext.parallel): draft-simple with a draft sequence per target
sequence.

One draft context serves every sequence of a scheduler: it has the target's n_seq_max and a KV stream per sequence
(kv_unified off, as `serve --parallel N` loads the target), so draft sequence i holds the draft model's cells for what
target sequence i holds, n_ctx / n_seq_max of them. One context rather than one per sequence: the draft model's
weights and compute buffers are held once, and its memory is the single path's (one n_ctx KV cache) whatever N is.
Each sequence's draft memory follows its target sequence's tokens by their common prefix (a new request on a slot
reuses what its prompt shares with the last one), and its draft is decoded on its own sequence, one token per
llama_decode, as DraftSimple drafts; the target verifies it in the step's shared batch. A draft only proposes: what
a request outputs is what the target samples, so drafting never changes a greedy reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine_ext.bindings import logits_address
from engine_ext.model import Context, Model
from engine_ext.params import ContextError, ContextParams, ModelParams, SpeculativeConfigError, SpeculativeParams
from engine_ext.sampling import FloatRows
from engine_ext.seq_batch import SeqBatch, seq_remove
from engine_ext.spec_catalog import parallel_refusal
from engine_ext.speculative.base import Drafter, common_prefix_length
from engine_ext.speculative.draft_model import check_vocab_compatible, top_token
from engine_ext.speculative.driver import SpeculativeDriver


class DraftSequences:
    """A draft model and one context over it with a sequence per target sequence; `cached[i]`: what draft
    sequence i holds, in order."""

    def __init__(self, path: Path, target: Model, target_ctx: Context) -> None:
        self.path = path
        self.model = Model(path, ModelParams(n_gpu_layers=target.params.n_gpu_layers))
        try:
            check_vocab_compatible(target, self.model)
            tp = target_ctx.params
            n_seq = max(1, tp.n_seq_max)
            params = ContextParams(
                n_ctx=target_ctx.n_ctx,
                n_batch=tp.n_batch,
                n_ubatch=tp.n_ubatch,
                n_threads=tp.n_threads,
                n_threads_batch=tp.n_threads_batch,
                flash_attn=tp.flash_attn,
                n_seq_max=n_seq,
                kv_unified=False,
            )
            self.ctx = Context(self.model, params)
        except Exception:
            self.model.close()
            raise
        self.batch = SeqBatch(self.ctx, self.ctx.n_batch)
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]
        self._logits = FloatRows(self.model.n_vocab)

    def _sync(self, seq: int, tokens: Sequence[int]) -> list[int]:
        """Make draft sequence `seq` hold exactly `tokens` (reusing the common prefix); its cached list."""
        cached = self.cached[seq]
        i = common_prefix_length(cached, tokens)
        if i < len(cached):
            if not seq_remove(self.ctx, seq, i):  # a recurrent draft is cut only whole
                seq_remove(self.ctx, seq, -1)
                i = 0
            del cached[i:]
        batch, n_batch = self.batch, self.ctx.n_batch
        for start in range(i, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            batch.add(seq, chunk, len(cached), outputs=False)
            batch.decode()
            cached.extend(chunk)
        return cached

    def draft(self, seq: int, tokens: Sequence[int], id_last: int, n_max: int, p_min: float) -> list[int]:
        """Up to n_max tokens the draft model predicts after tokens + [id_last], greedily, on sequence `seq`; none
        when the draft context fails (its sequence is dropped and read again at the next draft)."""
        result: list[int] = []
        ctx, batch, rows = self.ctx, self.batch, self._logits
        want_p = p_min > 0.0
        try:
            cached = self._sync(seq, tokens)
            token = id_last
            handle = ctx.handle
            while len(result) < n_max and len(cached) + 1 < ctx.n_ctx_seq:
                batch.add(seq, (token,), len(cached), outputs=True)
                batch.decode()
                cached.append(token)
                # One row with logits: the buffer's first.
                token, p = top_token(rows(logits_address(handle) or ctx.logits_row(0))[0], want_p)
                if p < p_min:
                    break
                result.append(token)
        except ContextError:
            batch.clear()
            seq_remove(ctx, seq, -1)
            self.cached[seq] = []
            return []
        return result

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


class SequenceDrafter(Drafter):
    """draft-simple for one request of the parallel sequences: drafts on the draft sequence of the target sequence
    the request holds (`seq`, set once the request has one)."""

    name = "draft-simple"

    def __init__(self, drafts: DraftSequences, p_min: float) -> None:
        super().__init__()
        self.drafts = drafts
        self.p_min = p_min
        self.seq = -1

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        if self.seq < 0:
            return []
        return self.drafts.draft(self.seq, tokens, id_last, n_max, self.p_min)


class SequenceDrafts:
    """The drafters of a scheduler's requests: n-gram drafters each request's own, draft-simple's model and context
    shared (DraftSequences, one per draft model, made on first use, closed with the scheduler)."""

    def __init__(self, model: Model, ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self.pools: dict[Path, DraftSequences] = {}

    def driver(self, params: SpeculativeParams) -> SpeculativeDriver:
        """A request's drafter chain; refused (SpeculativeConfigError) for the drafters a sequence has none of."""
        from engine_ext.speculative.factory import build_driver

        params.validate()
        refusal = parallel_refusal(params.types)
        if refusal:
            raise SpeculativeConfigError(refusal)
        return build_driver(params, self.model, self.ctx, draft_simple=lambda: self._drafter(params))

    def _drafter(self, params: SpeculativeParams) -> Drafter:
        assert params.draft_model is not None  # validate() checked it
        path = Path(params.draft_model)
        pool = self.pools.get(path)
        if pool is None:
            if not path.is_file():
                raise SpeculativeConfigError(f"draft model not found: {path}")
            pool = self.pools[path] = DraftSequences(path, self.model, self.ctx)
        return SequenceDrafter(pool, params.p_min)

    @staticmethod
    def bind(driver: SpeculativeDriver, seq: int) -> None:
        """The request's model drafters draft on sequence `seq` (the one it was placed on)."""
        for d in driver.drafters:
            if isinstance(d, SequenceDrafter):
                d.seq = seq

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
