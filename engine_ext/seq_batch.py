"""A llama_batch whose rows belong to different sequences (parallel requests), and the per-sequence memory calls."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

from engine_ext.bindings import C
from engine_ext.engine_status import entered, left
from engine_ext.model import Context, array_at
from engine_ext.params import ContextError
from engine_ext.sampling import Sampler


class SeqBatch:
    """Rows (token, position, sequence, output flag) appended one sequence's run at a time, then decoded at once.

    `add` returns the row index of the run's first token: llama_get_logits_ith takes a row of the batch, so each
    sequence samples at its own rows. `close()` frees the native batch (idempotent)."""

    def __init__(self, ctx: Context, capacity: int) -> None:
        self.ctx = ctx
        self.capacity = capacity
        self._stack = ExitStack()
        self._batch = C.llama_batch_init(capacity, 0, 1)
        self._stack.callback(C.llama_batch_free, self._batch)
        batch = self._batch
        self._tokens = array_at(batch.token, capacity)
        self._pos = array_at(batch.pos, capacity)
        self._logits = array_at(batch.logits, capacity)
        self._n_seq = array_at(batch.n_seq_id, capacity)
        self._n_seq[:capacity] = [1] * capacity
        self.n = 0

    def __len__(self) -> int:
        return self.n

    @property
    def room(self) -> int:
        return self.capacity - self.n

    def clear(self) -> None:
        self.n = 0

    def add(self, seq: int, tokens: Sequence[int], pos0: int, *, outputs: bool) -> int:
        """Append `tokens` of sequence `seq` at positions pos0..; `outputs`: logits for every one of them (verifying
        a draft, or one token to sample), else none. Returns the row of the first."""
        n, k = self.n, len(tokens)
        if n + k > self.capacity:
            raise ContextError(f"a batch holds {self.capacity} tokens; {n + k} were added")
        self._tokens[n : n + k] = tokens
        self._pos[n : n + k] = range(pos0, pos0 + k)
        self._logits[n : n + k] = (b"\x01" if outputs else b"\x00") * k
        seq_id = self._batch.seq_id
        for i in range(n, n + k):
            seq_id[i][0] = seq
        self.n = n + k
        return n

    def decode(self) -> None:
        """Decode the rows added since the last clear() in one llama_decode, then clear."""
        ctx = self.ctx
        handle = ctx.handle
        batch = self._batch
        batch.n_tokens = self.n
        ctx.one_output = False  # rows are read by index (Sampler.sample(ctx, row))
        previous = entered("decode")  # the phase the client sees (engine_ext.engine_status)
        ctx.decodes += 1
        rc = C.llama_decode(handle, batch)
        left(previous)
        self.n = 0
        if rc != 0:
            if rc == 1:
                raise ContextError("the context is full: no room in the KV cache for this batch")
            raise ContextError(f"llama_decode failed with code {rc} (the engine log has the reason)")

    def close(self) -> None:
        self._stack.close()


def seq_remove(ctx: Context, seq: int, p0: int, p1: int = -1) -> bool:
    """Drop positions p0..p1 (-1: to the end; p0 -1: all) of sequence `seq`; False when the memory cannot (a
    recurrent state is cut only whole)."""
    return bool(C.llama_memory_seq_rm(ctx.memory, seq, p0, p1))


def seq_copy(ctx: Context, src: int, dst: int, p1: int) -> None:
    """Make sequence `dst` share the cells of `src` at positions < p1 (-1: all of it, the only copy a recurrent
    state or a KV cache split by sequence allows: llama-kv-cache.cpp asserts on a partial cross-stream copy)."""
    C.llama_memory_seq_cp(ctx.memory, src, dst, -1 if p1 < 0 else 0, p1)


def verify_rows(sampler: Sampler, ctx: Context, row0: int, draft: Sequence[int], first_eog: int) -> list[int]:
    """Sample rows row0.. of a sequence's verify run (common_sampler_sample_and_accept_n, as Sampler's, but at the
    sequence's rows of a shared batch): the accepted draft prefix plus one target token."""
    n = len(draft)
    last = first_eog if first_eog < n - 1 else n
    ids: list[int] = []
    for i in range(last + 1):
        token = sampler.sample(ctx, row0 + i)
        ids.append(token)
        if i == last or token != draft[i]:
            break
    return ids
