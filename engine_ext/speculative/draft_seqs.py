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

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from engine_ext.archs import RS_ROLLBACK_ARCHS
from engine_ext.bindings import logits_address
from engine_ext.model import Context, Model
from engine_ext.params import ContextError, ContextParams, ModelParams, SpeculativeConfigError, SpeculativeParams
from engine_ext.sampling import FloatRows
from engine_ext.seq_batch import SeqBatch, seq_remove
from engine_ext.speculative.base import Drafter, common_prefix_length
from engine_ext.speculative.dflash import DraftDFlash
from engine_ext.speculative.draft_model import check_vocab_compatible, top_token
from engine_ext.speculative.driver import MAX_VERIFY_DRAFT, SpeculativeDriver
from engine_ext.speculative.eagle3 import DraftEagle3
from engine_ext.speculative.layer_seqs import SequenceLayerDrafter
from engine_ext.speculative.mtp_seqs import MTPSequences, SequenceMTP


class _Running(Protocol):
    """What read_rows reads of a running request (engine_ext.parallel's _Job)."""

    driver: SpeculativeDriver | None
    drafting: bool
    pending: list[int]
    id_last: int


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
        # This step's drafts made together (draft_together): seq -> (tokens' length, id_last, draft).
        self.ready: dict[int, tuple[int, int, list[int]]] = {}

    def _sync(self, wanted: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Make each draft sequence `seq` hold exactly its `tokens` (reusing the common prefix): what they lack
        decoded together, a batch at a time (a failed decode leaves `cached` ahead: the caller drops the sequences)."""
        batch = self.batch
        for seq, tokens in wanted:
            cached = self.cached[seq]
            i = common_prefix_length(cached, tokens)
            if i < len(cached):
                if not seq_remove(self.ctx, seq, i):  # a recurrent draft is cut only whole
                    seq_remove(self.ctx, seq, -1)
                    i = 0
                del cached[i:]
            while i < len(tokens):
                if not batch.room:
                    batch.decode()
                chunk = tokens[i : i + batch.room]
                batch.add(seq, chunk, i, outputs=False)
                cached.extend(chunk)
                i += len(chunk)
        if len(batch):
            batch.decode()

    def draft(self, seq: int, tokens: Sequence[int], id_last: int, n_max: int, p_min: float) -> list[int]:
        """Up to n_max tokens the draft model predicts after tokens + [id_last], greedily, on sequence `seq`; none
        when the draft context fails (its sequence is dropped and read again at the next draft)."""
        result: list[int] = []
        ctx, batch, rows = self.ctx, self.batch, self._logits
        want_p = p_min > 0.0
        try:
            self._sync(((seq, tokens),))
            cached, token = self.cached[seq], id_last
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

    def draft_together(self, asks: Sequence[tuple[int, Sequence[int], int, int, float]]) -> None:
        """The drafts of several sequences made at once: (seq, tokens, id_last, n_max, p_min) each, one llama_decode
        per draft position holding every sequence still drafting; kept in `ready` for their SequenceDrafter's next
        draft call (this step's)."""
        self.ready = {}
        ctx, batch, rows = self.ctx, self.batch, self._logits
        try:
            self._sync([(seq, tokens) for seq, tokens, _, _, _ in asks])
            cached = {seq: self.cached[seq] for seq, _, _, _, _ in asks}
            drafts: dict[int, list[int]] = {seq: [] for seq, _, _, _, _ in asks}
            going = {seq: (id_last, n_max, p_min) for seq, _, id_last, n_max, p_min in asks}
            while going:
                order = [seq for seq in going if len(cached[seq]) + 1 < ctx.n_ctx_seq]
                for seq in order:
                    batch.add(seq, (going[seq][0],), len(cached[seq]), outputs=True)
                if not order:
                    break
                batch.decode()
                logits = rows(logits_address(ctx.handle) or ctx.logits_row(0), len(order))
                for i, seq in enumerate(order):
                    token, n_max, p_min = going.pop(seq)
                    cached[seq].append(token)
                    token, p = top_token(logits[i], p_min > 0.0)
                    if p >= p_min:
                        drafts[seq].append(token)
                        if len(drafts[seq]) < n_max:
                            going[seq] = (token, n_max, p_min)
        except ContextError:
            batch.clear()
            for seq, _, _, _, _ in asks:
                seq_remove(ctx, seq, -1)
                self.cached[seq] = []
            return
        self.ready = {seq: (len(tokens), id_last, drafts[seq]) for seq, tokens, id_last, _, _ in asks}

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
        made = self.drafts.ready.pop(self.seq, None)
        if made is not None and made[:2] == (len(tokens), id_last):  # drafted with the other sequences this step
            return made[2][:n_max]
        return self.drafts.draft(self.seq, tokens, id_last, n_max, self.p_min)


class SequenceDrafts:
    """The drafters of a scheduler's requests: n-gram drafters each request's own, the model drafters' models and
    contexts shared: draft-simple's (DraftSequences), draft-mtp's head context (MTPSequences: the target's own head or
    a sidecar file), draft-eagle3's DraftEagle3 and draft-dflash/dspark's DraftDFlash (a sequence per target
    sequence, engine_ext.speculative.layer_seqs); one per draft model, made on first use, closed with the scheduler.

    A recurrent or hybrid target drafts only where llama.cpp rolls one sequence's state back by a few tokens
    (`rolls_back`: n_rs_seq > 0 on an architecture that has it), its drafts at most n_rs_seq long (`max_draft`)."""

    def __init__(self, model: Model, ctx: Context) -> None:
        self.model = model
        self.ctx = ctx
        self.pools: dict[Path, DraftSequences] = {}
        self.heads: dict[Path | None, MTPSequences] = {}
        whole_state = model.is_recurrent or model.is_hybrid
        n_rs_seq = ctx.params.n_rs_seq if model.architecture in RS_ROLLBACK_ARCHS else 0
        self.rolls_back = whole_state and n_rs_seq > 0
        self.max_draft = min(MAX_VERIFY_DRAFT, n_rs_seq) if whole_state else MAX_VERIFY_DRAFT
        # Sequences whose recurrent state was rolled back and has not decoded since (llama.cpp applies a rollback
        # at the sequence's next decode): not copied into another sequence before, which would copy it unrolled.
        self.pending: set[int] = set()
        # By (type, file, block length: DFlash's draft block is sized when its context is made).
        self.layer_pools: dict[tuple[str, Path, int], DraftEagle3 | DraftDFlash] = {}

    def driver(self, params: SpeculativeParams) -> SpeculativeDriver:
        """A request's drafter chain, its model drafters drafting in the shared draft contexts (auto too: its chain)."""
        from engine_ext.speculative.factory import build_driver

        params.validate()
        return build_driver(
            params,
            self.model,
            self.ctx,
            draft_simple=lambda: self._drafter(params),
            draft_mtp=lambda: SequenceMTP(self._heads(params), params.p_min),
            layer_input=lambda spec_type: self._layer_input(spec_type, params),
        )

    def _drafter(self, params: SpeculativeParams) -> Drafter:
        assert params.draft_model is not None  # validate() checked it
        path = Path(params.draft_model).resolve()  # one pool per file, however a request spells its path
        pool = self.pools.get(path)
        if pool is None:
            if not path.is_file():
                raise SpeculativeConfigError(f"draft model not found: {path}")
            pool = self.pools[path] = DraftSequences(path, self.model, self.ctx)
        return SequenceDrafter(pool, params.p_min)

    def _heads(self, params: SpeculativeParams) -> MTPSequences:
        """The MTP head context: on the target's own head (loaded with load_mtp), or an `mtp-*.gguf` sidecar's."""
        from engine_ext.params import ModelParams

        sidecar = params.draft_model and Path(params.draft_model).name.startswith("mtp-")
        path = Path(params.draft_model).resolve() if sidecar and params.draft_model else None
        heads = self.heads.get(path)
        if heads is not None:
            return heads
        if path is None:
            if self.model.n_layer_nextn < 1:
                raise SpeculativeConfigError(
                    f"{self.model.path.name} has no MTP head; give its mtp-*.gguf sidecar as the draft model"
                )
            heads = MTPSequences(self.model, self.model, self.ctx)
        elif not path.is_file():
            raise SpeculativeConfigError(f"MTP sidecar not found: {path}")
        else:
            head = Model(path, ModelParams(n_gpu_layers=self.model.params.n_gpu_layers, load_mtp=True))
            try:
                heads = MTPSequences(head, self.model, self.ctx, owns_head=True)
            except Exception:
                head.close()
                raise
        self.heads[path] = heads
        return heads

    def read_rows(self, job: _Running | None, seq: int, held: Sequence[int], draft: Sequence[int], row0: int) -> None:
        """After a step's decode: sequence `seq` held `held` and decoded, at rows row0.., its prompt's last token
        (`job.pending`) or `job.id_last` and its draft: its MTP head and its drafters that read the target's outputs
        read them (before the next decode overwrites them)."""
        if job is None:
            return
        tokens = job.pending or [job.id_last, *draft]
        self.read_prompt(job, seq, held, tokens, row0)
        if job.drafting:
            self.process(job.driver, tokens, len(held), row0)

    def read_prompt(self, job: _Running, seq: int, held: Sequence[int], tokens: Sequence[int], row0: int = 0) -> None:
        """After a target decode: sequence `seq`, holding `held`, decoded `tokens` at rows row0..; where its request
        drafts with an MTP head, the head's sequence reads them (the target's hidden states at those rows)."""
        self.pending.discard(seq)  # a rolled-back state is applied at the sequence's decode
        driver = job.driver
        if driver is None or not job.drafting or driver.media:  # after an image, positions are not consecutive
            return
        for d in driver.drafters:
            if isinstance(d, SequenceMTP) and d.seq == seq:
                d.heads.feed(seq, held, tokens, row0)

    def roll_back(self, seq: int, n_keep: int) -> bool:
        """Drop target sequence `seq`'s positions from n_keep (a rejected draft); False when its memory cannot."""
        if not seq_remove(self.ctx, seq, n_keep):
            return False
        if self.rolls_back:
            self.pending.add(seq)
        return True

    def _layer_input(self, spec_type: str, params: SpeculativeParams) -> Drafter:
        from engine_ext.speculative.eagle3 import build_eagle3
        from engine_ext.speculative.factory import build_dflash, target_backends

        assert params.draft_model is not None  # validate() checked it
        path = Path(params.draft_model).resolve()
        eagle3 = spec_type == "draft-eagle3"
        key = (spec_type, path, 0 if eagle3 else params.n_max)
        pool = self.layer_pools.get(key)
        if pool is None and not any(p.target_ctx is self.ctx for p in self.layer_pools.values()):
            # The target's layer inputs go on now. In a context that had decoded on a device that crashed the engine
            # (issue 24; the single path gets a fresh context, engine_ext.worker.set_speculative): refused there.
            if self.ctx.decodes and target_backends(self.model):
                raise SpeculativeConfigError(
                    f"with the model on a GPU, {spec_type} with parallel requests must start before the model's first "
                    "reply (turning on the model outputs it reads after the model has decoded there crashed the "
                    "engine): restart the server and send it first, or serve with --parallel 1 or -ngl 0"
                )
        if pool is None:  # the builders refuse a missing file or a draft not made for this target
            n_seq, resolved = max(1, self.ctx.params.n_seq_max), replace(params, draft_model=str(path))
            if eagle3:
                pool = build_eagle3(resolved, self.model, self.ctx, n_seq=n_seq)
            else:
                pool = build_dflash(spec_type, resolved, self.model, self.ctx, n_seq=n_seq)
            self.layer_pools[key] = pool
        return SequenceLayerDrafter(pool, params.p_min)

    @staticmethod
    def process(driver: SpeculativeDriver | None, tokens: Sequence[int], pos0: int, row0: int) -> None:
        """The target just decoded the request's `tokens` at positions pos0.., rows row0.. of its batch: its model
        drafters that read the target's outputs (draft-eagle3) read these rows (right after the decode: the next one
        overwrites them)."""
        if driver is None or not driver.reads_batches:
            return
        for d in driver.drafters:
            if isinstance(d, SequenceLayerDrafter):
                d.row0 = row0
        driver.process(tokens, pos0)

    def draft_together(self, asks: Sequence[tuple[SpeculativeDriver, int, Sequence[int], int, int]]) -> None:
        """Before a step: the draft-simple drafts of the sequences that draft with the same draft model, made
        together where two or more do ((driver, seq, tokens, id_last, budget) each: a sequence's budget as the step
        gives it before any draft is added, its driver's length for the drafter; only where draft-simple is the
        first drafter of the chain, so no draft is made that an earlier drafter would have replaced)."""
        by_pool: dict[DraftSequences, list[tuple[int, Sequence[int], int, int, float]]] = {}
        drafting: dict[DraftSequences, list[tuple[SpeculativeDriver, Drafter]]] = {}
        for pool in self.pools.values():
            pool.ready = {}
        for driver, seq, tokens, id_last, budget in asks:
            first = driver.drafters[0] if driver.drafters and not driver.media else None
            if not isinstance(first, SequenceDrafter) or first.seq != seq:
                continue
            n_max = min(budget, driver.caps[id(first)] if driver.adaptive else driver.params.n_max)
            if n_max > 0:
                by_pool.setdefault(first.drafts, []).append((seq, tokens, id_last, n_max, first.p_min))
                drafting.setdefault(first.drafts, []).append((driver, first))
        for pool, pool_asks in by_pool.items():
            if len(pool_asks) > 1:  # alone, a sequence drafts as on the single path
                t0 = time.perf_counter()
                pool.draft_together(pool_asks)
                share = (time.perf_counter() - t0) * 1000.0 / len(pool_asks)
                for driver, drafter in drafting[pool]:  # each request's draft time: its share of the decodes
                    driver.draft_ms += share
                    drafter.stats.t_draft_ms += share

    @staticmethod
    def bind(driver: SpeculativeDriver, seq: int, tokens: Sequence[int] = ()) -> None:
        """The request's model drafters draft on sequence `seq` (the one it was placed on, holding `tokens`)."""
        for d in driver.drafters:
            if isinstance(d, SequenceDrafter | SequenceMTP):
                d.seq = seq
            elif isinstance(d, SequenceLayerDrafter):
                d.bind(seq, tokens)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        for heads in self.heads.values():
            heads.close()
        self.heads.clear()
        for layer_pool in self.layer_pools.values():
            layer_pool.close()
        self.layer_pools.clear()
