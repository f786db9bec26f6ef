"""draft-dflash / DFlash2 / draft-dspark: block-diffusion drafts conditioned on the target's layer inputs.

Upstream: common/speculative.cpp common_speculative_impl_draft_dflash (notes §3.6, §3.7). Every target row's
inputs to the draft's `target_layers` are injected into the draft's KV cache (an embedding-only batch at the
target positions); a draft is one decode of a noise block [id_last, mask, …] read back at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_ext import bindings
from engine_ext.archs import LAST_LAYER_INPUT_ARCHS, LAYER_INPUT_ARCHS
from engine_ext.bindings import C, ext
from engine_ext.model import Context, Model, free_context, new_draft_context
from engine_ext.params import SpeculativeConfigError
from engine_ext.spec_catalog import DRAFT_P_MIN
from engine_ext.speculative import target_outputs
from engine_ext.speculative.base import UNREAD, Drafter, common_prefix_length
from engine_ext.speculative.draft_model import top_token


def walk_dflash2_lattice(rows: np.ndarray, top_k: int, p_min: float) -> list[int]:
    """DFlash2's candidate lattice walk (common/speculative.cpp:1236-1264).

    Row i (i ≥ 1) is `[top_k candidate ids, top_k × top_k scores]`, scores[pred][cand]. Starting from
    predecessor 0, each step takes the best-scoring successor of the previous choice; with p_min, it stops
    at the first choice whose softmax probability among the successors is below p_min.
    """
    result: list[int] = []
    predecessor = 0
    for i in range(1, rows.shape[0]):
        row = rows[i]
        scores = row[top_k + predecessor * top_k : top_k + (predecessor + 1) * top_k]
        predecessor = int(np.argmax(scores))
        if p_min > 0.0:
            total = float(np.exp(scores.astype(np.float64) - float(scores[predecessor])).sum())
            if 1.0 / total < p_min:
                break
        result.append(int(row[predecessor]))
    return result


def truncate_by_confidence(tokens: Sequence[int], confidence: Sequence[float], p_min: float) -> list[int]:
    """DSpark: keep the draft up to the first position whose confidence head is below p_min."""
    kept: list[int] = []
    for token, conf in zip(tokens, confidence, strict=True):
        if p_min > 0.0 and conf < p_min:
            break
        kept.append(token)
    return kept


def _meta_bool(model: Model, key: str, default: bool) -> bool:
    value = model.meta(key)
    return default if value is None else value == "true"


class DraftDFlash(Drafter):
    """DFlash, DFlash2 (selector lattice) and DSpark (anchor-first blocks, confidence head) drafts.

    `n_seq` > 1: a draft sequence per target sequence of the parallel loop (engine_ext.speculative.layer_seqs),
    each with its own KV stream and injected rows; the Drafter interface drafts on sequence 0 (the single path)."""

    def __init__(
        self,
        draft: Model,
        target: Model,
        target_ctx: Context,
        *,
        dspark: bool,
        n_max: int,
        p_min: float,
        n_seq: int = 1,
    ) -> None:
        super().__init__()
        self.draft_model = draft
        self.target = target
        self.target_ctx = target_ctx
        self.is_dspark = dspark
        self.name = "draft-dspark" if dspark else "draft-dflash"
        self.p_min = p_min
        self.layer_ids = bindings.target_layer_ids(draft.handle)
        self._check(draft, target)
        self.n_embd_tgt = target.n_embd
        self.n_embd_dec = draft.n_embd
        self.n_embd_enc = len(self.layer_ids) * self.n_embd_tgt
        self.block_size = int(draft.meta("dflash.block_size") or 16)
        self.sample_from_anchor = _meta_bool(draft, "dflash.sample_from_anchor", True)
        self.causal = _meta_bool(draft, "dflash.attention.causal", False)
        self.selector_top_k = int(bindings.model_dflash_selector_top_k(draft.handle))
        self.is_dflash2 = self.selector_top_k > 0
        if dspark and p_min > 0.0 and not _meta_bool(draft, "dflash.has_confidence_head", True):
            raise SpeculativeConfigError(f"this DSpark draft has no confidence head: use {DRAFT_P_MIN.flag} 0")
        anchored = dspark and self.sample_from_anchor
        self.n_max = min(n_max, self.block_size if anchored else self.block_size - 1)
        self.n_block = self.n_max + (0 if anchored else 1)
        self.mask_token = int(C.llama_vocab_mask(draft.vocab))
        if self.mask_token < 0:
            raise SpeculativeConfigError(
                f"draft {draft.path.name} defines no mask token (tokenizer.ggml.mask_token_id)"
            )
        handle = new_draft_context(draft, target_ctx, n_outputs_max=self.n_block, n_seq_max=n_seq)
        if not handle:
            raise SpeculativeConfigError(f"llama.cpp could not create a draft context on {draft.path.name}")
        self.ctx: Any = handle
        self.memory: Any = C.llama_get_memory(handle)
        self.n_ubatch = int(C.llama_n_ubatch(handle))
        for lid in self.layer_ids:
            target_outputs.acquire(target_ctx, lid)
        ext.llama_set_embeddings_nextn(handle, True, not self.is_dflash2)
        C.llama_set_causal_attn(handle, self.causal)
        # Per draft sequence: rows of target features in its memory (positions 0..injected-1), and their tokens.
        self.injected = [0] * n_seq
        self.seen: list[list[int]] = [[] for _ in range(n_seq)]

    def _check(self, draft: Model, target: Model) -> None:
        """Refuse what would abort inside llama.cpp (GGML_ASSERT on a missing layer input, bad widths)."""
        name = draft.path.name
        if not self.layer_ids:
            raise SpeculativeConfigError(f"{name} is not a DFlash/DSpark draft (no target_layers)")
        arch = target.architecture
        if arch not in LAYER_INPUT_ARCHS:
            raise SpeculativeConfigError(
                f"the target's architecture {arch} does not expose the layer inputs a DFlash draft reads"
            )
        limit = target.n_layer + (1 if arch in LAST_LAYER_INPUT_ARCHS else 0)
        bad = [lid for lid in self.layer_ids if lid >= limit]
        if bad:
            raise SpeculativeConfigError(
                f"{name} reads target layers {bad}, but the target has {target.n_layer} layers"
            )
        if draft.n_embd != target.n_embd:
            raise SpeculativeConfigError(
                f"{name} has hidden size {draft.n_embd}, the target {target.n_embd}: not a draft for this model"
            )
        if draft.n_vocab != target.n_vocab:
            raise SpeculativeConfigError(
                f"{name} has {draft.n_vocab} tokens, the target {target.n_vocab}: not a draft for this model"
            )

    # ----- drafter interface ---------------------------------------------------------------------------

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        self.process_seq(0, tokens, pos0, 0)

    def process_seq(self, seq: int, tokens: Sequence[int], pos0: int, row0: int, *, restart: bool = False) -> None:
        """Inject the target's layer inputs for the rows it just decoded (rows row0.. of its batch) at their
        positions, into draft sequence `seq`. After a gap (rows it never saw): it starts over, from the next batch
        at position 0, or (`restart`) from this one: an empty sequence may start anywhere."""
        n = len(tokens)
        if pos0 > self.injected[seq]:
            C.llama_memory_seq_rm(self.memory, seq, -1, -1)  # rows we never saw: start over
            self.injected[seq] = 0
            self.seen[seq] = []
            if not restart:
                return
        elif pos0 < self.injected[seq]:
            C.llama_memory_seq_rm(self.memory, seq, pos0, -1)
        layers = []
        for lid in self.layer_ids:
            ptr = bindings.get_embeddings_layer_inp(self.target_ctx.handle, lid)
            if not ptr:
                return
            layers.append(np.ctypeslib.as_array(ptr, shape=(row0 + n, self.n_embd_tgt))[row0:])
        features = np.ascontiguousarray(np.concatenate(layers, axis=1), dtype=np.float32)
        for start in range(0, n, self.n_ubatch):
            batch = C.llama_batch_ext_init(self.ctx)
            try:
                for i in range(start, min(n, start + self.n_ubatch)):
                    row = features[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                    idx = C.llama_batch_ext_add_embd(batch, seq, C.llama_embd(row, 1, self.n_embd_enc))
                    p = pos0 + i
                    C.llama_batch_ext_set_pos(batch, idx, (C.llama_pos * 4)(p, p, p, 0))
                rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_DECODE, batch)
            finally:
                C.llama_batch_ext_free(batch)
            if rc != 0:
                raise SpeculativeConfigError(f"injecting target features into the draft failed ({rc})")
        seen = self.seen[seq]
        del seen[pos0:]
        seen.extend([UNREAD] * (pos0 - len(seen)))
        seen.extend(tokens)
        self.injected[seq] = pos0 + n

    def keep(self, seq: int, tokens: Sequence[int]) -> None:
        """Target sequence `seq` now holds `tokens` (a new request placed on it): the injected rows of another
        history go, what the two share stays (up to the first position not read: its cells may have been copied
        from another sequence since)."""
        n = common_prefix_length(self.seen[seq], tokens)
        if n < self.injected[seq]:
            C.llama_memory_seq_rm(self.memory, seq, n, -1)
            self.injected[seq] = n
        del self.seen[seq][n:]

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        return self.draft_seq(0, tokens, id_last, n_max)

    def draft_seq(
        self, seq: int, tokens: Sequence[int], id_last: int, n_max: int, p_min: float | None = None
    ) -> list[int]:
        """Up to n_max tokens after tokens + [id_last], drafted on draft sequence `seq` (p_min: the request's, else
        the drafter's)."""
        pos0 = len(tokens)
        if self.injected[seq] < pos0:
            return []
        if self.injected[seq] > pos0:
            C.llama_memory_seq_rm(self.memory, seq, pos0, -1)
            self.injected[seq] = pos0
            del self.seen[seq][pos0:]
        batch = C.llama_batch_ext_init(self.ctx)
        try:
            for i in range(self.n_block):
                idx = C.llama_batch_ext_add_token(batch, seq, id_last if i == 0 else self.mask_token)
                C.llama_batch_ext_set_pos(batch, idx, ctypes.byref(C.llama_pos(pos0 + i)))
                C.llama_batch_ext_set_output_logits(batch, idx, not self.is_dflash2)
            rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_DECODE, batch)
        finally:
            C.llama_batch_ext_free(batch)
        try:
            if rc != 0:
                return []
            return self._read_block(self.p_min if p_min is None else p_min)[:n_max]
        finally:
            C.llama_memory_seq_rm(self.memory, seq, pos0, -1)  # drop the noise block

    def _read_block(self, p_min: float) -> list[int]:
        n_vocab = self.draft_model.n_vocab
        if self.is_dflash2:
            ptr = ext.llama_get_embeddings_nextn(self.ctx)
            rows = np.ctypeslib.as_array(ptr, shape=(self.n_block, self.n_embd_dec))
            return walk_dflash2_lattice(rows, self.selector_top_k, p_min)
        first = 0 if self.is_dspark and self.sample_from_anchor else 1
        result: list[int] = []
        confidence: list[float] = []
        conf_rows = None
        if self.is_dspark and p_min > 0.0:
            ptr = ext.llama_get_embeddings_nextn(self.ctx)
            conf_rows = np.ctypeslib.as_array(ptr, shape=(self.n_block, self.n_embd_dec))
        for i in range(first, self.n_block):
            logits = np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, i), shape=(n_vocab,))
            token, p = top_token(logits, not self.is_dspark and p_min > 0.0)
            if not self.is_dspark and p < p_min:
                break
            result.append(token)
            if conf_rows is not None:
                confidence.append(float(conf_rows[i, 0]))
        if conf_rows is not None:
            return truncate_by_confidence(result, confidence, p_min)
        return result

    def close(self) -> None:
        if self.ctx is not None:
            for lid in self.layer_ids:
                target_outputs.release(self.target_ctx, lid)
            free_context(self.ctx)
            self.ctx = None
            self.draft_model.close()
