"""ngram-simple, ngram-map-k and ngram-map-k4v: common/ngram-map.cpp."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from engine_ext.speculative.ngram._base import LCG_FACTOR, MASK32, NgramDrafter, NgramIndex, check_range

# common/ngram-map.h / ngram-map.cpp
COMMON_NGRAM_MAX_VALUES = 4  # ngram-map.h:39
COMMON_NGRAM_HASH_MAP_SIZE = 262144  # ngram-map.h:42 (2^18)
COMMON_NGRAM_MAX_VALUE_COUNT = 16380  # ngram-map.cpp:119

# --------------------------------------------------------------------------------------------------------------
# ngram-simple


class NgramSimple(NgramDrafter):
    """common_ngram_simple_draft (ngram-map.cpp:49-112): the last size_n tokens (the last size_n-1 of the history
    and id_last) are searched backwards in the history; the up to size_m tokens that followed the most recent
    earlier occurrence are the draft. No draft while len(tokens) <= size_n + size_m + 1, for a match at position 0,
    or when fewer than size_n tokens follow the match. `min_hits` is accepted, as upstream's parameters carry it,
    but common_ngram_simple_draft does not use it.
    """

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, record_stats: bool = True) -> None:
        super().__init__(record_stats=record_stats)
        self.size_n = check_range("size_n", size_n, 1, 1024)
        self.size_m = check_range("size_m", size_m, 1, 1024)
        self.min_hits = check_range("min_hits", min_hits, 1, 0xFFFF)
        self._index = NgramIndex(size_n)

    def _begin(self, prompt: list[int]) -> None:
        # upstream's begin() is a no-op; indexing the prompt here keeps the first draft() as fast as the rest
        self._index.sync(prompt)

    def _draft(self, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        n, m = self.size_n, self.size_m
        cur_len = len(tokens)
        if cur_len <= n + m + 1:
            return []
        self._index.sync(tokens, full=False)
        pattern = tuple(tokens[cur_len - n + 1 :]) + (id_last,)
        # search backwards from cur_len - n - 1 down to 1 (position 0 means "no match" upstream)
        match_pos = self._index.last_in(pattern, 0, cur_len - n - 1)
        if match_pos == 0:
            return []
        copy_max = min(m, cur_len - (match_pos + n))
        if copy_max < n:
            return []
        return tokens[match_pos + n : match_pos + n + copy_max]


# --------------------------------------------------------------------------------------------------------------
# ngram-map-k / ngram-map-k4v


class _MapKey:
    """common_ngram_map_key (ngram-map.h:52-58); the 4 values are kept as parallel lists."""

    __slots__ = ("key_idx", "stat_idx", "key_num", "value_idx", "value_num", "n_accepted")

    def __init__(self, key_idx: int, m: int) -> None:
        self.key_idx = key_idx  # index of the key n-gram in the history
        self.stat_idx = 0  # index up to which the value statistics were computed
        self.key_num = 0  # occurrences of the key (hits)
        self.value_idx = [0] * COMMON_NGRAM_MAX_VALUES  # index of each value m-gram (0: unused slot)
        self.value_num = [0] * COMMON_NGRAM_MAX_VALUES  # occurrences of each value after the key
        self.n_accepted = [m] * COMMON_NGRAM_MAX_VALUES  # tokens accepted at the value's last draft


class _NgramMap(NgramDrafter):
    """common_ngram_map (ngram-map.h:61-95, ngram-map.cpp:121-536)."""

    key_only = True

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, record_stats: bool = True) -> None:
        super().__init__(record_stats=record_stats)
        self.size_n = check_range("size_n", size_n, 1, 1024)
        self.size_m = check_range("size_m", size_m, 1, 1024)
        self.min_hits = check_range("min_hits", min_hits, 1, 0xFFFF)
        self.keys: list[_MapKey] = []  # key n-grams that occurred several times, in creation order
        self.size_last_begin = 0  # tokens at the previous begin()
        self.idx_last_check = 0  # history length at the last begin()/draft()
        self.last_draft_created = False
        self.last_draft_key: _MapKey | None = None
        self.last_draft_value_idx = 0
        # key_map[hash % 2^18] = start of an n-gram with that hash (0 / absent: empty), first writer wins
        self.key_map: dict[int, int] = {}
        self.key_map_last_idx = 0  # the last start added to key_map
        self._index = NgramIndex(size_n, with_hash=True)
        self._key_lookup: dict[tuple[int, ...], _MapKey] = {}
        self._key_lookup_stale = False

    # common_ngram_map_begin (ngram-map.cpp:121-219)
    def _begin(self, prompt: list[int]) -> None:
        n, m = self.size_n, self.size_m
        size_begin = len(prompt)
        idx_begin_cleanup = self.size_last_begin
        if idx_begin_cleanup > size_begin:
            idx_begin_cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            # clear hash entries of n-grams at or after the cleanup index
            self.key_map = {h: j for h, j in self.key_map.items() if j < idx_begin_cleanup}
            self.key_map_last_idx = idx_begin_cleanup - 1 if idx_begin_cleanup > 0 else 0
            if self.keys:
                kept: list[_MapKey] = []
                for key in self.keys:
                    if key.key_idx >= idx_begin_cleanup:
                        continue
                    if not self.key_only:
                        for j in range(COMMON_NGRAM_MAX_VALUES - 1, -1, -1):
                            if key.value_idx[j] != 0 and key.value_idx[j] >= idx_begin_cleanup:
                                # delete the value: shift the later ones left, clear the last slot's idx/num
                                for arr in (key.value_idx, key.value_num, key.n_accepted):
                                    arr[j : COMMON_NGRAM_MAX_VALUES - 1] = arr[j + 1 : COMMON_NGRAM_MAX_VALUES]
                                key.value_idx[-1] = 0
                                key.value_num[-1] = 0
                        if key.value_idx[0] == 0:
                            continue  # no values left
                    kept.append(key)
                self.keys = kept
                self._key_lookup_stale = True
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin
        if self._index.sync(prompt) is not None:  # not upstream: prepares the first draft()'s searches
            self._key_lookup_stale = True

    def _find_key(self, key_tokens: tuple[int, ...], tokens: list[int]) -> _MapKey | None:
        """The first key (in creation order) whose n-gram in the current history equals key_tokens."""
        if self._key_lookup_stale:
            n = self.size_n
            lookup: dict[tuple[int, ...], _MapKey] = {}
            for key in self.keys:
                lookup.setdefault(tuple(tokens[key.key_idx : key.key_idx + n]), key)
            self._key_lookup = lookup
            self._key_lookup_stale = False
        return self._key_lookup.get(key_tokens)

    # common_ngram_map_draft (ngram-map.cpp:221-516)
    def _draft(self, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        self.last_draft_created = False
        self.last_draft_key = None
        self.last_draft_value_idx = 0

        inp = tokens
        cur_len = len(inp)
        n, m = self.size_n, self.size_m
        if cur_len < 2 * n + m:
            return []
        if self.idx_last_check > cur_len or self.size_last_begin > cur_len:
            # upstream aborts here (the history shrank without begin()); start over from this history instead
            self._begin(inp)
        self.idx_last_check = cur_len

        index = self._index
        if index.sync(inp, full=False) is not None:
            self._key_lookup_stale = True
        key_tokens = tuple(inp[cur_len - n + 1 :]) + (id_last,)
        size_last_begin = self.size_last_begin
        key_map_last_idx = self.key_map_last_idx
        key_map = self.key_map
        last_start = cur_len - n - m - 1

        # 1. the hash map (one probe; a collision is a miss)
        match_pos = 0
        h = 0
        for t in key_tokens:
            h = (h * LCG_FACTOR + t) & MASK32
        idx_key = key_map.get(h % COMMON_NGRAM_HASH_MAP_SIZE, 0)
        if idx_key != 0 and idx_key < last_start and tuple(inp[idx_key : idx_key + n]) == key_tokens:
            match_pos = idx_key
        # 2. descending in (key_map_last_idx, size_last_begin - n - m - 1]
        if match_pos == 0 and size_last_begin > n + m + 1:
            match_pos = index.last_in(key_tokens, key_map_last_idx, size_last_begin - n - m - 1)
        # 3. descending in (max(size_last_begin, key_map_last_idx), cur_len - n - m - 1]
        if match_pos == 0:
            match_pos = index.last_in(key_tokens, max(size_last_begin, key_map_last_idx), last_start)

        # add the hashes of the new n-grams, in the same (descending) order
        hashes = index.hashes
        if size_last_begin > n + m + 1:
            for j in range(size_last_begin - n - m - 1, key_map_last_idx, -1):
                hk = hashes[j] % COMMON_NGRAM_HASH_MAP_SIZE
                if not key_map.get(hk, 0):
                    key_map[hk] = j
        for j in range(last_start, max(size_last_begin, key_map_last_idx), -1):
            hk = hashes[j] % COMMON_NGRAM_HASH_MAP_SIZE
            if not key_map.get(hk, 0):
                key_map[hk] = j
        self.key_map_last_idx = max(last_start, key_map_last_idx)

        if match_pos == 0:
            return []

        # the key's statistics
        curr_key = self._find_key(key_tokens, inp)
        if curr_key is None:
            curr_key = _MapKey(match_pos, m)
            self.keys.append(curr_key)
            self._key_lookup[key_tokens] = curr_key
        curr_key.key_num = min(curr_key.key_num + 1, COMMON_NGRAM_MAX_VALUE_COUNT)

        if self.key_only:
            # simple mode: the m tokens following the match, limited by the last acceptance (values[0])
            n_draft_tokens = min(m, curr_key.n_accepted[0])
            self.last_draft_created = True
            self.last_draft_key = curr_key
            self.last_draft_value_idx = 0
            return inp[match_pos + n : match_pos + n + max(n_draft_tokens, 0)]

        if curr_key.key_num < self.min_hits:
            return []

        # complex mode: count the (up to 4) distinct m-grams after each occurrence in [stat_idx, match_pos]
        value_idx, value_num, n_accepted = curr_key.value_idx, curr_key.value_num, curr_key.n_accepted
        occurrences = index.pos[key_tokens]
        lo = bisect_left(occurrences, curr_key.stat_idx)
        hi = bisect_right(occurrences, match_pos)
        for i in occurrences[lo:hi]:
            begin_value = i + n
            value = None
            idx_value = -1
            for v in range(COMMON_NGRAM_MAX_VALUES):
                begin_v = value_idx[v]
                if begin_v == 0:
                    # an empty slot: a new value m-gram
                    value_idx[v] = begin_value
                    value_num[v] = 0
                    n_accepted[v] = m
                    idx_value = v
                    break
                if value is None:
                    value = inp[begin_value : begin_value + m]
                if value == inp[begin_v : begin_v + m]:
                    idx_value = v
                    break
            if idx_value >= 0:
                value_num[idx_value] = min(value_num[idx_value] + 1, COMMON_NGRAM_MAX_VALUE_COUNT)
        curr_key.stat_idx = match_pos

        max_occur = 0
        slot_max = 0
        for v in range(COMMON_NGRAM_MAX_VALUES):
            if value_num[v] > max_occur:
                max_occur = value_num[v]
                slot_max = v
        sum_occur = sum(value_num) - value_num[slot_max]
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []  # the most frequent value is not clearly more frequent than the others

        # as upstream (ngram-map.cpp:503-507): the tokens following match_pos, limited by the slot's acceptance
        n_draft_tokens = min(m, n_accepted[slot_max])
        self.last_draft_created = True
        self.last_draft_key = curr_key
        self.last_draft_value_idx = slot_max
        return inp[match_pos + n : match_pos + n + max(n_draft_tokens, 0)]

    # common_ngram_map_accept (ngram-map.cpp:518-536)
    def _accept(self, n_accepted: int) -> None:
        if not self.last_draft_created or self.last_draft_key is None:
            return
        self.last_draft_key.n_accepted[self.last_draft_value_idx] = n_accepted


class NgramMapK(_NgramMap):
    """ngram-map-k: key n-grams only. The m tokens after the key's match are drafted, cut to the number accepted
    at the key's previous draft. `min_hits` is accepted but, as upstream, unused in key-only mode.
    """

    name = "ngram-map-k"
    key_only = True


class NgramMapK4V(_NgramMap):
    """ngram-map-k4v: keys with up to 4 value m-grams and their counts; drafts once the key has `min_hits` hits
    and its most frequent value occurs at least twice as often as all the others together.
    """

    name = "ngram-map-k4v"
    key_only = False
