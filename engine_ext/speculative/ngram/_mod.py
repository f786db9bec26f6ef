"""ngram-mod: common/ngram-mod.cpp and speculative.cpp's common_speculative_impl_ngram_mod."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from engine_ext.speculative.ngram._base import MASK64, NUMPY_BULK, NgramDrafter, check_range

# common/ngram-mod.cpp / speculative.cpp
NGRAM_MOD_FACTOR = 6364136223846793005  # ngram-mod.cpp:19
NGRAM_MOD_SIZE = 4 * 1024 * 1024  # speculative.cpp:1876
NGRAM_MOD_EMPTY = -1  # ngram-mod.h:16
NGRAM_MOD_OCCUPANCY_MAX = 0.25  # speculative.cpp:1914 (f_thold)
NGRAM_MOD_LOW_ACCEPT = 0.25  # speculative.cpp:2006
NGRAM_MOD_LOW_STREAK = 5  # speculative.cpp:2008
NGRAM_MOD_ADD_CHUNK = 32  # speculative.cpp:1940 (`i_last + 32 < cur_len`)

# --------------------------------------------------------------------------------------------------------------
# ngram-mod


class NgramMod(NgramDrafter):
    """common_ngram_mod (ngram-mod.cpp) + common_speculative_impl_ngram_mod (speculative.cpp:1849-2022).

    A table of `size` int32 entries maps hash(n_match tokens) % size to the token that followed them last.
    Drafting looks the next token up repeatedly, up to n_max times; a miss before n_min tokens drops the draft.
    The table is cleared when begin() leaves it more than 25 % occupied, and after 5 accepts in a row with an
    acceptance fraction below 0.25.

    One deliberate difference: the fraction is taken of the draft as returned (after draft()'s n_max cap), not
    of the uncapped one. Upstream divides by the uncapped length, but its cap is the step's budget (context,
    tokens still wanted), so the two agree but for the last steps; under auto mode's smaller adaptive cap (at most
    --spec-draft-n-max, vs. drafts of 48-64) upstream's division would count almost every round as low and keep
    clearing the table.
    """

    name = "ngram-mod"
    start_length = None  # it drafts only where it can copy 48 tokens or more after a 24-token match: at full length

    def __init__(
        self,
        n_match: int = 24,
        n_max: int = 64,
        n_min: int = 48,
        size: int = NGRAM_MOD_SIZE,
        *,
        record_stats: bool = True,
    ) -> None:
        super().__init__(record_stats=record_stats)
        self.n_match = check_range("n_match", n_match, 1, 1024)
        self.n_max = check_range("n_max", n_max, 0, 1024)
        self.n_min = check_range("n_min", n_min, 0, 1024)
        check_range("size", size, 1, 1 << 40)
        self.table: npt.NDArray[np.int32] = np.full(size, NGRAM_MOD_EMPTY, dtype=np.int32)
        self.used = 0
        self.i_last = 0  # the last history position added to the table
        self.n_draft_last = 0  # length of the last draft (after draft()'s n_max cap, see above)
        self.n_low = 0  # consecutive accepts with a low acceptance fraction
        self._mpow = pow(NGRAM_MOD_FACTOR, n_match - 1, 1 << 64)

    @property
    def size(self) -> int:
        return int(self.table.shape[0])

    @property
    def occupancy(self) -> float:
        return self.used / self.size

    def reset(self) -> None:
        self.table.fill(NGRAM_MOD_EMPTY)
        self.used = 0

    def idx(self, tokens: Sequence[int]) -> int:
        """common_ngram_mod::idx over the first n_match tokens."""
        h = 0
        for t in tokens[: self.n_match]:
            h = (h * NGRAM_MOD_FACTOR + t) & MASK64
        return h % self.size

    def get(self, tokens: Sequence[int]) -> int:
        """common_ngram_mod::get: the token stored for the first n_match tokens (-1: none)."""
        return int(self.table.item(self.idx(tokens)))

    def _add_range(self, tokens: list[int], a: int, b: int) -> None:
        """common_ngram_mod::add(tokens + i) for i in [a, b), in order."""
        cnt = b - a
        if cnt <= 0:
            return
        n, size, table = self.n_match, self.size, self.table
        if cnt < NUMPY_BULK:
            h = 0
            for t in tokens[a : a + n]:
                h = (h * NGRAM_MOD_FACTOR + t) & MASK64
            mpow, item, used = self._mpow, table.item, 0
            for i in range(a, b):
                k = h % size
                nxt = tokens[i + n]
                if item(k) == NGRAM_MOD_EMPTY:
                    used += 1
                table[k] = nxt
                h = ((h - tokens[i] * mpow) * NGRAM_MOD_FACTOR + nxt) & MASK64
            self.used += used
            return
        arr = np.asarray(tokens[a : b + n], dtype=np.int64)
        u = arr.astype(np.uint64)
        hv = np.zeros(cnt, dtype=np.uint64)
        f = np.uint64(NGRAM_MOD_FACTOR)
        for k in range(n):
            hv *= f
            hv += u[k : k + cnt]
        idx = (hv % np.uint64(size)).astype(np.int64)
        nxt_arr = arr[n : n + cnt]
        # sequential semantics: the last write to a slot wins; a slot counts as used once
        uniq, first_rev = np.unique(idx[::-1], return_index=True)
        last = cnt - 1 - first_rev
        self.used += int(np.count_nonzero(table[uniq] == NGRAM_MOD_EMPTY))
        table[uniq] = nxt_arr[last].astype(np.int32)

    def _begin(self, prompt: list[int]) -> None:
        self.i_last = 0
        self.n_draft_last = 0
        n = self.n_match
        if len(prompt) < n:
            return
        self._add_range(prompt, 0, len(prompt) - n)
        self.i_last = len(prompt) - n
        if self.occupancy > NGRAM_MOD_OCCUPANCY_MAX:
            self.reset()

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        result = super().draft(tokens, id_last, n_max)
        self.n_draft_last = len(result)  # the capped length (upstream: uncapped, see the class docstring)
        return result

    def _draft(self, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        self.n_draft_last = 0
        cur_len = len(tokens)
        n = self.n_match
        if cur_len < n:
            return []
        if self.i_last + NGRAM_MOD_ADD_CHUNK < cur_len:
            self._add_range(tokens, self.i_last, cur_len - n)
            self.i_last = cur_len - n

        seq = tokens[cur_len - n + 1 :]
        seq.append(id_last)
        h = 0
        for t in seq:
            h = (h * NGRAM_MOD_FACTOR + t) & MASK64
        size, item, mpow = self.size, self.table.item, self._mpow
        for i in range(self.n_max):
            tok = item(h % size)
            if tok == NGRAM_MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            seq.append(tok)
            h = ((h - seq[i] * mpow) * NGRAM_MOD_FACTOR + tok) & MASK64
        result = seq[n:]
        self.n_draft_last = len(result)
        return result

    def _accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            f_acc = n_accepted / self.n_draft_last
            if f_acc < NGRAM_MOD_LOW_ACCEPT:
                self.n_low += 1
                if self.n_low >= NGRAM_MOD_LOW_STREAK:
                    self.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0
