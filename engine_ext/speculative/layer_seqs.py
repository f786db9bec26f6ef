"""draft-eagle3, draft-dflash and draft-dspark for the parallel sequences (engine_ext.parallel): a draft sequence per
target sequence.

These drafters read the target's hidden states (the inputs of some of its layers, engine_ext.speculative
.target_outputs) for every row the target decodes. One draft context (DraftEagle3 or DraftDFlash built with the
target's n_seq_max, a KV stream per sequence) serves every sequence of a scheduler, as draft-simple's does
(engine_ext.speculative.draft_seqs). In the parallel loop a batch holds the rows of several sequences, so each
request's drafter is told where its own rows lie in the batch (`row0`) and reads only those, into its own draft
sequence with its own state (EAGLE3: encoder rows by position and the boundary row of its last draft; DFlash: the
injected rows). The target verifies the drafts in the step's shared batch: a draft only proposes, so drafting never
changes a greedy reply.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_ext.params import SpeculativeConfigError
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.dflash import DraftDFlash
from engine_ext.speculative.eagle3 import DraftEagle3


class SequenceLayerDrafter(Drafter):
    """draft-eagle3, draft-dflash or draft-dspark for one request of the parallel sequences: reads and drafts on the
    draft sequence of the target sequence the request holds (`seq`, set once the request has one); the shared
    context (`pool`) is the scheduler's."""

    def __init__(self, pool: DraftEagle3 | DraftDFlash, p_min: float) -> None:
        super().__init__()
        self.pool = pool
        self.name = pool.name
        self.p_min = p_min
        self.seq = -1
        self.row0 = 0  # where this sequence's rows begin in the batch the target just decoded

    def bind(self, seq: int, tokens: Sequence[int]) -> None:
        """The request was placed on sequence `seq`, whose memory holds `tokens`: what the draft sequence read of
        another history is forgotten."""
        self.seq = seq
        self.pool.keep(seq, tokens)

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        if self.seq < 0:
            return
        if not isinstance(self.pool, DraftDFlash):
            self.pool.process_seq(self.seq, tokens, pos0, self.row0)  # a failure drops the sequence's rows itself
            return
        try:  # a prefix found cached: it reads on from there
            self.pool.process_seq(self.seq, tokens, pos0, self.row0, restart=True)
        except SpeculativeConfigError:  # the draft context refused the rows: this sequence starts over, none fails
            self.pool.keep(self.seq, ())

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        if self.seq < 0:
            return []
        return self.pool.draft_seq(self.seq, tokens, id_last, n_max, self.p_min)
