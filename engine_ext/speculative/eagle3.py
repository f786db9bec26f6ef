"""draft-eagle3: a one-layer EAGLE3 head drafting from three of the target's hidden states.

Upstream: common/speculative.cpp common_speculative_impl_draft_eagle3 (notes §3.5) and src/models/eagle3.cpp.
For every row the target decodes, the inputs of the draft's three `target_layers` (the target's final hidden
state for an id equal to the target's layer count) are concatenated and run through the draft's encoder
(`fc`, one ENCODE) into g, one row of the draft's hidden size per target position. The decoder then keeps a
KV cache in which memory position P holds the pair (token[P+1], g[P]); the last target row of every batch is
deferred, because the token that follows it is not known yet. Drafting seeds that last row with the target's
freshest sample and continues from the decoder's own pre-norm hidden state, one row per drafted token.

Unlike upstream, g is kept by target position (a bounded history), so the drafter does not depend on
`accept()` being called (another drafter of the chain may have won the step), and a prompt that reuses a
prefix of the cache, or a restored checkpoint, re-anchors from the stored row instead of a stashed state.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine_ext import bindings
from engine_ext.archs import LAYER_INPUT_ARCHS
from engine_ext.bindings import C, ext
from engine_ext.model import Context, Model, free_context, init_context
from engine_ext.params import SpeculativeConfigError, SpeculativeParams
from engine_ext.spec_catalog import DRAFT_MODEL
from engine_ext.speculative import target_outputs
from engine_ext.speculative.base import UNREAD, Drafter, common_prefix_length
from engine_ext.speculative.draft_model import top_token

EAGLE3_N_TARGET_LAYERS = 3  # src/models/eagle3.cpp: "EAGLE3 requires exactly 3 entries in 'extract_layers'"
G_HISTORY = 512  # encoder rows kept by target position, to re-anchor after a rollback or a reused prefix

# Targets whose graphs emit their final hidden state (t_h_nextn, width n_embd) for every row when asked: a
# target layer id equal to the target's layer count reads it (upstream enables llama_set_embeddings_nextn).
# deepseek4 is left out: its unmasked h_nextn is the multi-stream residual, not n_embd wide.
NEXTN_OUTPUT_ARCHS = (
    frozenset(
        {
            "qwen35",
            "qwen35moe",
            "qwen3next",
            "nemotron_h",
            "nemotron_h_moe",
            "mimo2",
            "gemma4",
            "gpt-oss",
            "bailingmoe3",
        }
    )
    & LAYER_INPUT_ARCHS
)


def check_eagle3_compatible(
    *,
    name: str,
    target_layers: Sequence[int] | None,
    target_hidden_size: int | None,
    draft_n_embd: int | None,
    draft_n_vocab: int | None,
    own_token_embd_rows: int | None,
    own_output: bool,
    target_arch: str,
    target_n_layer: int,
    target_n_embd: int,
    target_n_vocab: int,
) -> None:
    """Refuse an EAGLE3 draft that llama.cpp would reject, or abort on, next to this target.

    `own_token_embd_rows` is the row count of the draft's own `token_embd` (None: it borrows the target's);
    `own_output` says whether it has its own `output` head.
    """
    if target_layers is None:
        raise SpeculativeConfigError(f"{name} is not an EAGLE3 draft: it has no eagle3.target_layers")
    layers = list(target_layers)
    if len(layers) != EAGLE3_N_TARGET_LAYERS:
        raise SpeculativeConfigError(
            f"{name} lists {len(layers)} target layers {layers}; an EAGLE3 draft reads exactly {EAGLE3_N_TARGET_LAYERS}"
        )
    if target_hidden_size is None:
        raise SpeculativeConfigError(f"{name} does not say its target's hidden size (eagle3.target_hidden_size)")
    if target_hidden_size != target_n_embd:
        raise SpeculativeConfigError(
            f"{name} was made for a target with hidden size {target_hidden_size}, this target has "
            f"{target_n_embd}: not a draft for this model"
        )
    negative = [lid for lid in layers if lid < 0]
    if negative:
        raise SpeculativeConfigError(f"{name} lists negative target layers {negative}")
    if any(lid < target_n_layer for lid in layers) and target_arch not in LAYER_INPUT_ARCHS:
        raise SpeculativeConfigError(
            f"the target's architecture {target_arch} does not expose the layer inputs an EAGLE3 draft reads"
        )
    last_ok = target_arch in NEXTN_OUTPUT_ARCHS
    bad = [lid for lid in layers if lid > target_n_layer or (lid == target_n_layer and not last_ok)]
    if bad:
        allowed = f"0..{target_n_layer}" if last_ok else f"0..{target_n_layer - 1}"
        raise SpeculativeConfigError(
            f"{name} reads target layers {bad}, but this {target_arch} target has {target_n_layer} layers "
            f"(usable ids: {allowed})"
        )
    borrows = own_token_embd_rows is None or not own_output
    if draft_n_embd is not None and borrows and draft_n_embd != target_n_embd:
        raise SpeculativeConfigError(
            f"{name} has hidden size {draft_n_embd} and borrows the target's token embeddings or output head, "
            f"whose hidden size is {target_n_embd}: not a draft for this model"
        )
    if draft_n_vocab is not None and draft_n_vocab != target_n_vocab:
        raise SpeculativeConfigError(
            f"{name} has {draft_n_vocab} tokens, the target {target_n_vocab}: not a draft for this model"
        )
    if own_token_embd_rows is not None and own_token_embd_rows < target_n_vocab:
        raise SpeculativeConfigError(
            f"{name} embeds only {own_token_embd_rows} tokens, the target has {target_n_vocab}"
        )


def _own_tensors(path: Path) -> tuple[int | None, bool]:
    """(rows of the draft's own token_embd or None, whether it has its own output head), from the header."""
    from engine_ext.gguf import read_header

    shapes = {t.name: t.shape for t in read_header(path).tensors}
    embd = shapes.get("token_embd.weight")
    return (int(embd[1]) if embd is not None and len(embd) > 1 else None), "output.weight" in shapes


def check_eagle3_file(path: Path, target: Model) -> None:
    """The header-level checks, before llama.cpp loads the file (its loader rejects some of these itself)."""
    from engine_ext.gguf import inspect_gguf

    info = inspect_gguf(path)
    if info.draft.draft_type != "eagle3":
        raise SpeculativeConfigError(f"{path.name} is not an EAGLE3 draft")
    embd_rows, own_output = _own_tensors(path)
    check_eagle3_compatible(
        name=path.name,
        target_layers=info.draft.target_layers,
        target_hidden_size=info.draft.target_hidden_size,
        draft_n_embd=info.embedding_length,
        draft_n_vocab=info.vocab_size,
        own_token_embd_rows=embd_rows,
        own_output=own_output,
        target_arch=target.architecture,
        target_n_layer=target.n_layer,
        target_n_embd=target.n_embd,
        target_n_vocab=target.n_vocab,
    )


@dataclass
class _SeqState:
    """What one draft sequence knows: the encoder output by target position, the boundary row its last draft
    wrote, and the target's tokens by position (UNREAD where it did not read them), to keep only what the history of
    a new request on the sequence shares."""

    g_by_pos: dict[int, np.ndarray] = field(default_factory=dict)
    seed: tuple[int, int] | None = None  # (pos, token) of the boundary row the last draft() wrote
    seen: list[int] = field(default_factory=list)


class DraftEagle3(Drafter):
    """An EAGLE3 draft model (arch `eagle3`) for the loaded target; owns the draft Model once built.

    `n_seq` > 1: a draft sequence per target sequence of the parallel loop (engine_ext.speculative.layer_seqs), each
    with its own state and its own KV stream; the Drafter interface drafts on sequence 0 (the single path)."""

    name = "draft-eagle3"

    def __init__(self, draft: Model, target: Model, target_ctx: Context, *, p_min: float = 0.0, n_seq: int = 1) -> None:
        super().__init__()
        self.ctx: Any = None
        self.draft_model = draft
        self.target = target
        self.target_ctx = target_ctx
        self.p_min = p_min
        if draft.architecture != "eagle3":
            raise SpeculativeConfigError(f"{draft.path.name} is not an EAGLE3 draft ({draft.architecture})")
        self.layer_ids = bindings.target_layer_ids(draft.handle)
        header = draft.meta("eagle3.target_hidden_size")
        embd_rows, own_output = _own_tensors(draft.path)
        check_eagle3_compatible(
            name=draft.path.name,
            target_layers=self.layer_ids,
            target_hidden_size=int(header) if header is not None else None,
            draft_n_embd=draft.n_embd,
            draft_n_vocab=draft.n_vocab,
            own_token_embd_rows=embd_rows,
            own_output=own_output,
            target_arch=target.architecture,
            target_n_layer=target.n_layer,
            target_n_embd=target.n_embd,
            target_n_vocab=target.n_vocab,
        )
        self.n_layer_tgt = target.n_layer
        self.n_embd_tgt = target.n_embd
        self.n_embd_dec = draft.n_embd
        self.n_embd_enc = len(self.layer_ids) * self.n_embd_tgt
        self.n_vocab = draft.n_vocab
        cparams = C.llama_context_default_params()
        cparams.n_ctx = target_ctx.n_ctx
        cparams.n_batch = target_ctx.n_batch
        cparams.n_ubatch = min(target_ctx.params.n_ubatch, target_ctx.n_batch)
        cparams.n_seq_max = n_seq
        if n_seq > 1:
            cparams.kv_unified = False  # a KV stream per sequence, laid out as the target's
        cparams.n_rs_seq = 0
        cparams.ctx_other = target_ctx.handle  # the draft borrows the target's token_embd / output if it lacks them
        threads = target_ctx.params.n_threads or int(C.llama_n_threads(target_ctx.handle))
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        handle = init_context(draft.handle, cparams)
        if not handle:
            raise SpeculativeConfigError(f"llama.cpp could not create a draft context on {draft.path.name}")
        self.ctx = handle
        self.memory: Any = C.llama_get_memory(handle)
        self.n_ctx = int(C.llama_n_ctx_seq(handle))  # what one sequence may hold
        self.n_batch = int(C.llama_n_batch(handle))
        self.n_ubatch = int(C.llama_n_ubatch(handle))
        self.uses_nextn = any(lid == self.n_layer_tgt for lid in self.layer_ids)
        for lid in sorted(set(self.layer_ids)):
            if lid < self.n_layer_tgt:
                target_outputs.acquire(target_ctx, lid)
        if self.uses_nextn:
            target_outputs.acquire(target_ctx, target_outputs.NEXTN)
        # The draft emits its encoder output (g) and its decoder's pre-norm hidden state as "nextn" embeddings.
        ext.llama_set_embeddings_nextn(handle, True, True)
        self.states = [_SeqState() for _ in range(n_seq)]

    # ----- helpers -----------------------------------------------------------------------------------

    def _pos_max(self, seq: int) -> int:
        return int(C.llama_memory_seq_pos_max(self.memory, seq))

    def _features(self, n: int, row0: int) -> np.ndarray | None:
        """[n, 3 * n_embd_tgt]: the target's inputs to the three layers for rows row0.. of the batch it just decoded
        (row0 > 0: this sequence's rows of a batch shared with other sequences)."""
        handle = self.target_ctx.handle
        layers = []
        for lid in self.layer_ids:
            if lid < self.n_layer_tgt:
                ptr = bindings.get_embeddings_layer_inp(handle, lid)
            else:
                ptr = ext.llama_get_embeddings_nextn(handle)
            if not ptr:
                return None
            layers.append(np.ctypeslib.as_array(ptr, shape=(row0 + n, self.n_embd_tgt))[row0:])
        return np.ascontiguousarray(np.concatenate(layers, axis=1), dtype=np.float32)

    def _encode(self, seq: int, features: np.ndarray) -> np.ndarray | None:
        """g = fc(features), one ENCODE per n_ubatch rows (the encoder cannot split a batch itself)."""
        n = features.shape[0]
        g = np.empty((n, self.n_embd_dec), dtype=np.float32)
        for start in range(0, n, self.n_ubatch):
            end = min(n, start + self.n_ubatch)
            # The per-token encoder ignores positions, but the batch check wants them to follow the memory.
            pos = self._pos_max(seq) + 1
            batch = C.llama_batch_ext_init(self.ctx)
            try:
                for i in range(start, end):
                    row = features[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                    idx = C.llama_batch_ext_add_embd(batch, seq, C.llama_embd(row, 1, self.n_embd_enc))
                    if idx < 0:
                        return None
                    p = pos + i - start
                    C.llama_batch_ext_set_pos(batch, idx, (C.llama_pos * 4)(p, p, p, 0))
                    C.llama_batch_ext_set_output_embd(batch, idx, True)
                rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_ENCODE, batch)
            finally:
                C.llama_batch_ext_free(batch)
            if rc != 0:
                return None
            ptr = ext.llama_get_embeddings_nextn(self.ctx)
            if not ptr:
                return None
            g[start:end] = np.ctypeslib.as_array(ptr, shape=(end - start, self.n_embd_dec))
        return g

    def _decode(self, seq: int, rows: Sequence[tuple[int, int, np.ndarray]], *, output_last: bool) -> bool:
        """Decode (pos, token, g) rows into the draft's memory; True on success."""
        for start in range(0, len(rows), self.n_batch):
            chunk = rows[start : start + self.n_batch]
            batch = C.llama_batch_ext_init(self.ctx)
            try:
                for i, (pos, token, g) in enumerate(chunk):
                    idx = C.llama_batch_ext_add_token(batch, seq, token)
                    if idx < 0:
                        return False
                    C.llama_batch_ext_set_embd_token(
                        batch, idx, C.llama_embd(g.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd_dec)
                    )
                    C.llama_batch_ext_set_pos(batch, idx, ctypes.byref(C.llama_pos(pos)))
                    last = start + i == len(rows) - 1
                    C.llama_batch_ext_set_output_logits(batch, idx, output_last and last)
                rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_DECODE, batch)
            finally:
                C.llama_batch_ext_free(batch)
            if rc != 0:
                return False
        return True

    def _cut(self, seq: int, start: int) -> None:
        """Keep the sequence's draft memory below `start`; drop it all when what stays does not end at start - 1."""
        C.llama_memory_seq_rm(self.memory, seq, max(start, 0), -1)
        pos_max = self._pos_max(seq)
        if pos_max >= 0 and pos_max != start - 1:
            C.llama_memory_seq_rm(self.memory, seq, -1, -1)  # a hole: decoding after it would be refused

    def _forget_from(self, seq: int, pos: int) -> None:
        state = self.states[seq]
        for stale in [p for p in state.g_by_pos if p >= pos]:
            del state.g_by_pos[stale]
        del state.seen[pos:]

    def _reset(self, seq: int) -> None:
        C.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.states[seq] = _SeqState()

    def keep(self, seq: int, tokens: Sequence[int]) -> None:
        """Target sequence `seq` now holds `tokens` (a new request placed on it): what this draft sequence read of
        another history is forgotten, what the two share is kept (up to the first position it did not read: its
        cells may have been copied from another sequence since)."""
        state = self.states[seq]
        n = common_prefix_length(state.seen, tokens)
        if n < len(state.seen):
            self._forget_from(seq, n)
            state.seed = None

    # ----- drafter interface ---------------------------------------------------------------------------

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        self.process_seq(0, tokens, pos0, 0)

    def process_seq(self, seq: int, tokens: Sequence[int], pos0: int, row0: int) -> None:
        """Encode the target rows at pos0.. (rows row0.. of its batch) and write the decoder pairs (token[P+1], g[P])
        they complete on draft sequence `seq`."""
        n = len(tokens)
        if n == 0 or self.ctx is None:
            return
        features = self._features(n, row0)
        g = self._encode(seq, features) if features is not None else None
        if g is None:
            self._reset(seq)  # nothing to anchor on; the next batch starts over
            return
        state = self.states[seq]
        g_prev = state.g_by_pos.get(pos0 - 1)
        seeded = state.seed == (pos0 - 1, tokens[0]) and self._pos_max(seq) >= pos0 - 1
        state.seed = None
        rows: list[tuple[int, int, np.ndarray]] = []
        if seeded:
            start = pos0  # draft() already wrote the boundary row with this very token
        elif g_prev is not None:
            start = pos0 - 1  # the cross-batch bridge: the deferred row meets its token
            rows.append((pos0 - 1, tokens[0], g_prev))
        else:
            start = pos0  # nothing known before pos0 (a fresh prompt, or the history was lost)
        self._cut(seq, start)  # an empty sequence may start anywhere, so pos0 > 0 with no history is fine
        rows.extend((pos0 + k, tokens[k + 1], g[k]) for k in range(n - 1))
        self._forget_from(seq, pos0)
        if rows and not self._decode(seq, rows, output_last=False):
            self._reset(seq)
            return
        by_pos = state.g_by_pos
        for k in range(max(0, n - G_HISTORY), n):
            by_pos[pos0 + k] = g[k].copy()
        for old in [p for p in by_pos if p < pos0 + n - G_HISTORY]:
            del by_pos[old]
        seen = state.seen  # (_forget_from cut it to pos0 at most)
        seen.extend([UNREAD] * (pos0 - len(seen)))
        seen.extend(tokens)

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        return self.draft_seq(0, tokens, id_last, n_max)

    def draft_seq(
        self, seq: int, tokens: Sequence[int], id_last: int, n_max: int, p_min: float | None = None
    ) -> list[int]:
        """Up to n_max tokens after tokens + [id_last], drafted on draft sequence `seq` (p_min: the request's, else
        the drafter's)."""
        p_min = self.p_min if p_min is None else p_min
        if self.ctx is None:
            return []
        pos = len(tokens)
        g = self.states[seq].g_by_pos.get(pos - 1)
        n_max = min(n_max, self.n_ctx - pos + 1)  # drafting rows sit at pos - 1 .. pos + n_max - 2
        if g is None or n_max <= 0:
            return []
        self._forget_from(seq, pos)  # rows of tokens the target rejected
        self._cut(seq, pos - 1)
        result: list[int] = []
        token, p = id_last, pos - 1
        want_p = p_min > 0.0
        try:
            for _ in range(n_max):
                if not self._decode(seq, ((p, token, g),), output_last=True):
                    break
                ptr = C.llama_get_logits_ith(self.ctx, -1)
                if not ptr:
                    break
                logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                token, prob = top_token(logits, want_p)
                if prob < p_min:
                    break
                result.append(token)
                h = ext.llama_get_embeddings_nextn_ith(self.ctx, -1)
                if not h:
                    break
                g = np.ctypeslib.as_array(h, shape=(self.n_embd_dec,)).copy()
                p += 1
        finally:
            # Keep the boundary row (id_last at pos - 1); drop the drafting rows: process() writes the real ones.
            C.llama_memory_seq_rm(self.memory, seq, pos, -1)
            self.states[seq].seed = (pos - 1, id_last) if self._pos_max(seq) == pos - 1 else None
        return result

    def accept(self, n_accepted: int) -> None:
        # Rows past the accepted prefix are dropped by the next draft()/process() (they look g up by
        # position), so nothing depends on this being called.
        return None

    def close(self) -> None:
        if self.ctx is not None:
            for lid in sorted(set(self.layer_ids)):
                if lid < self.n_layer_tgt:
                    target_outputs.release(self.target_ctx, lid)
            if self.uses_nextn:
                target_outputs.release(self.target_ctx, target_outputs.NEXTN)
            free_context(self.ctx)
            self.ctx = None
            self.draft_model.close()


def build_eagle3(params: SpeculativeParams, model: Model, ctx: Context, *, n_seq: int = 1) -> DraftEagle3:
    """The factory's entry: `--spec-draft-model` must be an EAGLE3 GGUF made for this target (n_seq: draft sequences,
    one per target sequence of the parallel loop)."""
    from engine_ext.gguf import inspect_gguf
    from engine_ext.params import ModelParams

    if not params.draft_model:
        raise SpeculativeConfigError(f"draft-eagle3 needs its draft GGUF ({DRAFT_MODEL.flag} PATH)")
    path = Path(params.draft_model)
    if not path.is_file():
        raise SpeculativeConfigError(f"draft model not found: {path}")
    kind = inspect_gguf(path).draft.draft_type
    if kind != "eagle3":
        hint = f"it is a {kind} draft" if kind else "it is not an EAGLE3 draft"
        raise SpeculativeConfigError(f"{path.name} cannot be used with draft-eagle3: {hint}")
    check_eagle3_file(path, model)
    draft = Model(path, ModelParams(n_gpu_layers=model.params.n_gpu_layers))
    try:
        return DraftEagle3(draft, model, ctx, p_min=params.p_min, n_seq=n_seq)
    except Exception:
        draft.close()
        raise
