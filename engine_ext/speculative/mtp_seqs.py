"""draft-mtp for the parallel sequences (engine_ext.parallel): an MTP draft sequence per target sequence.

One MTP context (engine_ext.speculative.mtp's, on the head inside the target or an `mtp-*.gguf` sidecar) serves every
sequence of a scheduler: it has the target's n_seq_max and a KV stream per sequence, so MTP sequence i holds the head's
rows (token_k at pos_k, h_{k-1}) for what target sequence i holds. The target emits its final hidden state for every row
of the step's shared batch, in batch order (llama_get_embeddings_nextn, unmasked); after each decode the scheduler hands
every sequence's run of rows (`feed`) to its MTP sequence, and before the next step a sequence drafts on its own MTP
sequence from its own last hidden state (`draft`). The rows read are decoded at the first draft after them, every
sequence's in one llama_decode (`flush`): one head decode per step for them, not one per sequence. Per sequence it keeps
what the single path's DraftMTP keeps: the tokens its MTP sequence holds and the recent target hidden states by
position.

A hybrid target (qwen35: GDN recurrent layers) drops a rejected draft with llama.cpp's per-sequence recurrent
rollback (n_rs_seq, `rs_idx` per sequence): the scheduler limits a sequence's draft to n_rs_seq tokens.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_ext.bindings import C, ext, logits_address
from engine_ext.engine_status import entered, left
from engine_ext.model import Context, Model, free_context, new_draft_context
from engine_ext.params import SpeculativeConfigError
from engine_ext.sampling import FloatRows
from engine_ext.speculative import target_outputs
from engine_ext.speculative.base import Drafter, common_prefix_length
from engine_ext.speculative.draft_model import top_token
from engine_ext.speculative.mtp import H_HISTORY, check_head


class MTPSequences:
    """An MTP head and one context over it with a sequence per target sequence; `cached[i]`: what MTP sequence i
    holds, in order; `h_by_pos[i]`: target sequence i's recent final hidden states, by position."""

    def __init__(self, head_model: Model, target: Model, target_ctx: Context, *, owns_head: bool = False) -> None:
        check_head(head_model, target)
        self.head_model = head_model
        self.owns_head = owns_head
        self.target_ctx = target_ctx
        self.n_embd = target.n_embd
        n_seq = max(1, target_ctx.params.n_seq_max)
        handle = new_draft_context(head_model, target_ctx, n_outputs_max=n_seq, mtp=True, n_seq_max=n_seq)
        if not handle:
            raise SpeculativeConfigError(f"llama.cpp could not create an MTP context on {head_model.path.name}")
        self.ctx: Any = handle
        self.memory: Any = C.llama_get_memory(handle)
        self.n_ctx_seq = int(C.llama_n_ctx_seq(handle))
        target_outputs.acquire(target_ctx, target_outputs.NEXTN)
        ext.llama_set_embeddings_nextn(handle, True, True)
        n_batch = self.n_batch = target_ctx.n_batch
        self.batch = C.llama_batch_init(n_batch, self.n_embd, 1)  # tokens and embeddings; the token array is ours
        self._tokens = (C.llama_token * n_batch)()
        self.batch.token = self._tokens
        self._embd = np.ctypeslib.as_array(self.batch.embd, shape=(n_batch, self.n_embd))
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]
        self.h_by_pos: list[dict[int, np.ndarray]] = [{} for _ in range(n_seq)]
        self._logits = FloatRows(target.n_vocab)
        self._hidden = FloatRows(self.n_embd)
        self.decodes = 0
        self.shared_decodes = 0  # decodes holding the rows of more than one sequence
        # Rows read and not decoded yet, (seq, tokens, pos0, embeddings) each: decoded together at the next flush.
        self.queued: list[tuple[int, list[int], int, np.ndarray]] = []

    def _decode(
        self, seqs: Sequence[int], tokens: Sequence[int], pos: Sequence[int], embd: np.ndarray, *, output_last: bool
    ) -> None:
        batch, n = self.batch, len(tokens)
        for i in range(n):
            self._tokens[i] = tokens[i]
            batch.pos[i] = pos[i]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seqs[i]
            batch.logits[i] = 1 if output_last and i == n - 1 else 0
        self._embd[:n] = embd
        batch.n_tokens = n
        previous = entered("decode")  # the phase the client sees (engine_ext.engine_status)
        self.decodes += 1
        rc = C.llama_decode(self.ctx, batch)
        left(previous)
        if rc != 0:
            raise SpeculativeConfigError(f"the MTP head failed to decode (llama_decode returned {rc})")

    def flush(self) -> None:
        """Decode the rows the sequences read since the last flush, every sequence's together (a batch at a time)."""
        if not self.queued:
            return
        queued, self.queued = self.queued, []
        seqs = [seq for seq, tokens, _, _ in queued for _ in tokens]
        tokens = [t for _, run, _, _ in queued for t in run]
        pos = [pos0 + i for _, run, pos0, _ in queued for i in range(len(run))]
        embd = np.concatenate([rows for _, _, _, rows in queued])
        try:
            for start in range(0, len(tokens), self.n_batch):
                end = start + self.n_batch
                self._decode(seqs[start:end], tokens[start:end], pos[start:end], embd[start:end], output_last=False)
                self.shared_decodes += len(set(seqs[start:end])) > 1
        except SpeculativeConfigError:
            for seq in set(seqs):
                self._drop(seq)

    def _drop(self, seq: int) -> None:
        self.queued = [q for q in self.queued if q[0] != seq]
        C.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.cached[seq] = []
        self.h_by_pos[seq].clear()

    def feed(self, seq: int, held: Sequence[int], tokens: Sequence[int], row0: int) -> None:
        """Target sequence `seq`, holding `held`, just decoded `tokens` at rows row0.. of the target's batch: pair
        each (token_k at pos_k) with the target's hidden state at pos_k - 1 on MTP sequence `seq`. An MTP sequence
        that does not hold `held` (its target sequence's cells were copied from another, or read before drafting
        began) is emptied and drafts nothing until its target sequence starts over. Decoded at the next flush."""
        ptr = ext.llama_get_embeddings_nextn(self.target_ctx.handle)
        n, pos0, cached = len(tokens), len(held), self.cached[seq]
        if not ptr or not n:
            return
        if len(cached) < pos0 or common_prefix_length(cached[:pos0], held) < pos0:
            self._drop(seq)
            if pos0 > 0:
                return
        if len(self.cached[seq]) > pos0:
            self.flush()  # its rows in the memory before they are cut
            if len(self.cached[seq]) < pos0:  # the flush failed
                return
            C.llama_memory_seq_rm(self.memory, seq, pos0, -1)
            del self.cached[seq][pos0:]
        h = np.ctypeslib.as_array(ptr, shape=(row0 + n, self.n_embd))[row0:].copy()
        by_pos = self.h_by_pos[seq]
        prev = by_pos.get(pos0 - 1)
        rows = np.empty((n, self.n_embd), dtype=np.float32)
        rows[0] = prev if prev is not None else 0.0
        rows[1:] = h[:-1]
        self.queued.append((seq, list(tokens), pos0, rows))
        self.cached[seq].extend(tokens)
        for i in range(n):
            by_pos[pos0 + i] = h[i]
        for stale in [p for p in by_pos if p < pos0 + n - H_HISTORY or p >= pos0 + n]:
            del by_pos[stale]
        if sum(len(q[1]) for q in self.queued) >= self.n_batch:  # a prompt read in chunks: a batch's worth at a time
            self.flush()

    def draft(self, seq: int, tokens: Sequence[int], id_last: int, n_max: int, p_min: float) -> list[int]:
        """Up to n_max tokens the head predicts after tokens + [id_last] on MTP sequence `seq` (none when it does
        not hold `tokens`' rows, or its context fails: the sequence is then dropped)."""
        self.flush()
        pos0, cached = len(tokens), self.cached[seq]
        if len(cached) < pos0:
            return []
        if len(cached) > pos0:
            C.llama_memory_seq_rm(self.memory, seq, pos0, -1)
            del cached[pos0:]
        h_prev = self.h_by_pos[seq].get(pos0 - 1)
        if h_prev is None:
            return []
        result: list[int] = []
        token, h, want_p = id_last, h_prev, p_min > 0.0
        try:
            for i in range(n_max):
                if pos0 + i + 1 >= self.n_ctx_seq:
                    break
                self._decode((seq,), (token,), (pos0 + i,), h[np.newaxis, :], output_last=True)
                logits = self._logits(logits_address(self.ctx) or C.llama_get_logits_ith(self.ctx, -1))
                token, p = top_token(logits[0], want_p)
                if p < p_min:
                    break
                result.append(token)
                h = self._hidden(ext.llama_get_embeddings_nextn_ith(self.ctx, -1))[0].copy()
        except SpeculativeConfigError:
            self._drop(seq)
            return []
        # Drop the drafting rows: the verify batch's real rows come through feed().
        C.llama_memory_seq_rm(self.memory, seq, pos0, -1)
        return result

    def close(self) -> None:
        if self.ctx is None:
            return
        target_outputs.release(self.target_ctx, target_outputs.NEXTN)
        self.batch.token = ctypes.POINTER(C.llama_token)()  # ours, not llama's to free
        C.llama_batch_free(self.batch)
        free_context(self.ctx)
        self.ctx = None
        if self.owns_head:
            self.head_model.close()


class SequenceMTP(Drafter):
    """draft-mtp for one request of the parallel sequences: drafts on the MTP sequence of the target sequence the
    request holds (`seq`, set once the request has one); its rows come from the scheduler (MTPSequences.feed)."""

    name = "draft-mtp"

    def __init__(self, heads: MTPSequences, p_min: float) -> None:
        super().__init__()
        self.heads = heads
        self.p_min = p_min
        self.seq = -1

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        if self.seq < 0:
            return []
        return self.heads.draft(self.seq, tokens, id_last, n_max, self.p_min)
