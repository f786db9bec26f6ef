"""draft-mtp: NextN (MTP) heads draft from the target's own hidden states (common/speculative.cpp draft-mtp).

The target emits its final hidden state h for every row it decodes (`llama_set_embeddings_nextn`). The MTP
context, made on the model that holds the head (the target loaded with `load_mtp`, or an `mtp-*.gguf`
sidecar) with `ctx_other` = the target context, keeps its own KV cache of rows (token_k at pos_k, h_{k-1}).
Drafting continues from the head's own hidden state row by row.
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
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.draft_model import top_token

H_HISTORY = 512  # recent target hidden states kept by position, to re-anchor after a rollback


def check_head(head_model: Model, target: Model) -> None:
    """Refuse (SpeculativeConfigError) a head llama.cpp could not draft with for `target`."""
    if head_model.n_layer_nextn < 1:
        raise SpeculativeConfigError(f"{head_model.path.name} has no MTP (NextN) head")
    if not head_model.params.load_mtp:
        # Creating an MTP context on weights loaded without load_mtp aborts inside llama.cpp.
        raise SpeculativeConfigError(
            f"{head_model.path.name} was loaded without its MTP weights; reload it with MTP enabled"
        )
    if head_model.n_embd != target.n_embd or head_model.n_vocab != target.n_vocab:
        raise SpeculativeConfigError(
            f"MTP head {head_model.path.name} does not match the target (n_embd {head_model.n_embd} vs "
            f"{target.n_embd}, vocabulary {head_model.n_vocab} vs {target.n_vocab})"
        )


class DraftMTP(Drafter):
    name = "draft-mtp"

    def __init__(
        self, head_model: Model, target: Model, target_ctx: Context, *, p_min: float = 0.0, owns_head: bool = False
    ) -> None:
        super().__init__()
        self.owns_head = owns_head
        check_head(head_model, target)
        self.head_model = head_model
        self.target = target
        self.target_ctx = target_ctx
        self.p_min = p_min
        self.n_embd = target.n_embd
        self.n_vocab = target.n_vocab
        n_batch = target_ctx.n_batch
        handle = new_draft_context(head_model, target_ctx, n_outputs_max=1, mtp=True)
        if not handle:
            raise SpeculativeConfigError(f"llama.cpp could not create an MTP context on {head_model.path.name}")
        self.ctx: Any = handle
        self.memory: Any = C.llama_get_memory(handle)
        target_outputs.acquire(target_ctx, target_outputs.NEXTN)
        ext.llama_set_embeddings_nextn(handle, True, True)
        # A batch carrying both tokens and embeddings (llama_batch_compat accepts it); the token array is ours.
        self.batch = C.llama_batch_init(n_batch, self.n_embd, 1)
        self._tokens = (C.llama_token * n_batch)()
        self.batch.token = self._tokens
        self._embd = np.ctypeslib.as_array(self.batch.embd, shape=(n_batch, self.n_embd))
        self.n_batch = n_batch
        self.cached: list[int] = []  # tokens in the MTP context, by position
        self.h_by_pos: dict[int, np.ndarray] = {}  # target hidden state after the token at each position
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        self._logits = FloatRows(self.n_vocab)
        self._hidden = FloatRows(self.n_embd)

    # ----- memory ------------------------------------------------------------------------------------

    def _truncate(self, n_keep: int) -> None:
        if n_keep < len(self.cached):
            C.llama_memory_seq_rm(self.memory, 0, n_keep, -1)
            del self.cached[n_keep:]

    def _decode_rows(self, tokens: Sequence[int], pos0: int, embd: np.ndarray, *, output_last: bool) -> None:
        batch = self.batch
        n = len(tokens)
        for i, t in enumerate(tokens):
            self._tokens[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if output_last and i == n - 1 else 0
        self._embd[:n] = embd
        batch.n_tokens = n
        previous = entered("decode")  # the phase the client sees (engine_ext.engine_status)
        rc = C.llama_decode(self.ctx, batch)
        left(previous)
        if rc != 0:
            raise SpeculativeConfigError(f"the MTP head failed to decode (llama_decode returned {rc})")

    # ----- drafter interface ---------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> None:
        # The prompt's rows reached the head through process(); nothing else to do.
        return None

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        """Pair each new target row (token_k at pos_k) with the target's hidden state at pos_k - 1."""
        n = len(tokens)
        ptr = ext.llama_get_embeddings_nextn(self.target_ctx.handle)
        if not ptr:
            return
        h = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()
        self._truncate(pos0)
        if pos0 > len(self.cached):
            # Rows the head never saw (the prompt cache predates speculation): start its memory afresh here.
            C.llama_memory_clear(self.memory, True)
            self.cached = []
            return
        prev = self.h_by_pos.get(pos0 - 1)
        rows = np.empty((n, self.n_embd), dtype=np.float32)
        rows[0] = prev if prev is not None else 0.0
        rows[1:] = h[:-1]
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            self._decode_rows(chunk, pos0 + start, rows[start : start + len(chunk)], output_last=False)
            self.cached.extend(chunk)
        for i in range(n):
            self.h_by_pos[pos0 + i] = h[i]
        for stale in [p for p in self.h_by_pos if p < pos0 + n - H_HISTORY or p >= pos0 + n]:
            del self.h_by_pos[stale]

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        pos0 = len(tokens)
        if len(self.cached) != pos0:
            if len(self.cached) < pos0:
                return []  # the head's memory lags behind the target's (see process)
            self._truncate(pos0)
        h_prev = self.h_by_pos.get(pos0 - 1)
        if h_prev is None:
            return []
        result: list[int] = []
        token, h = id_last, h_prev
        want_p = self.p_min > 0.0
        for i in range(n_max):
            if pos0 + i + 1 >= self.target_ctx.n_ctx:
                break
            self._decode_rows((token,), pos0 + i, h[np.newaxis, :], output_last=True)
            # One row decoded with logits: the buffer's first (its address read as an int, see DraftSimple.draft).
            logits = self._logits(logits_address(self.ctx) or C.llama_get_logits_ith(self.ctx, -1))
            token, p = top_token(logits[0], want_p)
            if p < self.p_min:
                break
            result.append(token)
            h_ptr = ext.llama_get_embeddings_nextn_ith(self.ctx, -1)
            h = self._hidden(h_ptr)[0].copy()
        # Drop the drafting rows: the verify batch writes the real rows through process().
        C.llama_memory_seq_rm(self.memory, 0, pos0, -1)
        return result

    def close(self) -> None:
        if self.ctx is not None:
            target_outputs.release(self.target_ctx, target_outputs.NEXTN)
            self.batch.token = ctypes.POINTER(C.llama_token)()  # ours, not llama's to free
            C.llama_batch_free(self.batch)
            free_context(self.ctx)
            self.ctx = None
            if self.owns_head:
                self.head_model.close()
