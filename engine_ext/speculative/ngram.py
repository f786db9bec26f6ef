"""Model-free n-gram drafters, ported from llama.cpp's common/ (the wheel exports none of it).

Each class mirrors one upstream speculative type; `name` is upstream's type name:

- `NgramSimple`  "ngram-simple":  common/ngram-map.cpp `common_ngram_simple_draft`
- `NgramMapK`    "ngram-map-k":   common/ngram-map.cpp `common_ngram_map_*` with key_only = true
- `NgramMapK4V`  "ngram-map-k4v": the same map with up to 4 value m-grams per key and their statistics
- `NgramMod`     "ngram-mod":     common/ngram-mod.cpp + speculative.cpp `common_speculative_impl_ngram_mod`
- `NgramCache`   "ngram-cache":   common/ngram-cache.cpp + speculative.cpp `common_speculative_impl_ngram_cache`

Drafts are the ones upstream computes from the same history; only the search structures differ. Upstream
rescans the history (ngram-simple, the map's statistics) where a C++ loop is cheap; here an incremental
index of n-gram start positions answers the same questions (the most recent occurrence in a range, every
occurrence in a range), kept in step with the history and rebuilt past the first changed token.

`draft(tokens, id_last, n_max)` runs the upstream algorithm unchanged, then truncates the result to `n_max`
as `common_speculative_draft` does (speculative.cpp:2832-2837). Statistics are recorded in `self.stats` as
`common_speculative_{begin,draft,accept}` record them for the implementation that drafted.
"""

from __future__ import annotations

import struct
import time
from abc import abstractmethod
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import repeat
from os import PathLike
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine_ext.private_files import write_private_bytes
from engine_ext.speculative.base import Drafter, common_prefix_length

__all__ = [
    "NGRAM_DRAFTERS",
    "NgramCache",
    "NgramCacheTable",
    "NgramMapK",
    "NgramMapK4V",
    "NgramMod",
    "NgramSimple",
    "load_ngram_cache",
    "make_ngram_drafter",
    "prompt_lookup_drafter",
    "ngram_cache_update",
    "save_ngram_cache",
]

LLAMA_TOKEN_NULL = -1

# common/ngram-map.h / ngram-map.cpp
COMMON_NGRAM_MAX_VALUES = 4  # ngram-map.h:39
COMMON_NGRAM_HASH_MAP_SIZE = 262144  # ngram-map.h:42 (2^18)
COMMON_NGRAM_MAX_VALUE_COUNT = 16380  # ngram-map.cpp:119
LCG_FACTOR = 2654435761  # ngram-map.cpp:11

# common/ngram-mod.cpp / speculative.cpp
NGRAM_MOD_FACTOR = 6364136223846793005  # ngram-mod.cpp:19
NGRAM_MOD_SIZE = 4 * 1024 * 1024  # speculative.cpp:1876
NGRAM_MOD_EMPTY = -1  # ngram-mod.h:16
NGRAM_MOD_OCCUPANCY_MAX = 0.25  # speculative.cpp:1914 (f_thold)
NGRAM_MOD_LOW_ACCEPT = 0.25  # speculative.cpp:2006
NGRAM_MOD_LOW_STREAK = 5  # speculative.cpp:2008
NGRAM_MOD_ADD_CHUNK = 32  # speculative.cpp:1940 (`i_last + 32 < cur_len`)

# common/ngram-cache.h / ngram-cache.cpp
LLAMA_NGRAM_MIN = 1  # ngram-cache.h:9
LLAMA_NGRAM_MAX = 4  # ngram-cache.h:10
LLAMA_NGRAM_STATIC = 2  # ngram-cache.h:11
DRAFT_MIN_SAMPLE_SIZE_LAX = (2, 2, 1, 1)  # ngram-cache.cpp:60
DRAFT_MIN_PERCENT_LAX = (66, 50, 50, 50)  # ngram-cache.cpp:61
DRAFT_MIN_SAMPLE_SIZE_STRICT = (4, 3, 2, 2)  # ngram-cache.cpp:62
DRAFT_MIN_PERCENT_STRICT = (75, 66, 66, 66)  # ngram-cache.cpp:63
NGRAM_CACHE_N_DRAFT = 8  # speculative.cpp:2191 (`uint16_t n_draft = 8; // TODO get from config?`)

_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
_NUMPY_BULK = 256  # ranges at least this long are hashed with numpy, shorter ones by rolling in Python
_SYNC_TAIL = 64  # draft() checks that the indexed history still ends like this many tokens of `tokens`


def _as_list(tokens: Sequence[int]) -> list[int]:
    """The tokens as a list of Python ints (a list is used as is, without copying)."""
    if type(tokens) is list:
        return tokens
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        listed = tolist()
        return listed if type(listed) is list else [int(t) for t in listed]
    return [int(t) for t in tokens]


def _check_range(name: str, value: int, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer between {lo} and {hi}, not {value!r}")
    return value


class _NgramIndex:
    """Start positions of every n-gram of a token history, kept in step with it.

    `pos[key]` lists, ascending, every j with `tuple(hist[j:j+n]) == key`. With `with_hash`, `hashes[j]` is
    the 32-bit LCG hash of that n-gram as common_ngram_map_hash computes it (ngram-map.cpp:14-20).
    """

    __slots__ = ("n", "hist", "pos", "with_hash", "hashes", "_fpow")

    def __init__(self, n: int, *, with_hash: bool = False) -> None:
        self.n = n
        self.hist: list[int] = []
        self.pos: dict[tuple[int, ...], list[int]] = {}
        self.with_hash = with_hash
        self.hashes: list[int] = []
        self._fpow = pow(LCG_FACTOR, n - 1, 1 << 32)

    def sync(self, tokens: list[int], *, full: bool = True) -> int | None:
        """Make the index describe `tokens`; returns the first changed position if the history was rewritten.

        With full=False only the last _SYNC_TAIL indexed tokens are compared: within a generation the driver's
        history only grows, and begin() (full=True) checks it all. That keeps draft() O(new tokens).
        """
        hist = self.hist
        h = len(hist)
        if len(tokens) >= h and (
            tokens[:h] == hist if full else tokens[max(h - _SYNC_TAIL, 0) : h] == hist[-_SYNC_TAIL:]
        ):
            if len(tokens) > h:
                self._extend(tokens, h)
            return None
        p = common_prefix_length(hist, tokens)
        self._truncate(p)
        self._extend(tokens, p)
        return p

    def last_in(self, key: tuple[int, ...], lo: int, hi: int) -> int:
        """The largest start j with lo < j <= hi (0: none), as upstream's descending searches find it."""
        lst = self.pos.get(key)
        if not lst:
            return 0
        k = bisect_right(lst, hi) - 1
        if k >= 0 and lst[k] > lo:
            return lst[k]
        return 0

    def _truncate(self, p: int) -> None:
        hist, n, pos = self.hist, self.n, self.pos
        for j in range(len(hist) - n, max(p - n + 1, 0) - 1, -1):
            key = tuple(hist[j : j + n])
            lst = pos[key]
            lst.pop()
            if not lst:
                del pos[key]
        del hist[p:]
        del self.hashes[max(p - n + 1, 0) :]

    def _extend(self, tokens: list[int], start: int) -> None:
        hist, n, pos = self.hist, self.n, self.pos
        hist.extend(tokens[start:])
        j0 = max(start - n + 1, 0)
        end = len(hist) - n + 1  # starts j0..end-1 are new
        if end <= j0:
            return
        cnt = end - j0
        keys = zip(*(hist[j0 + k : j0 + k + cnt] for k in range(n)), strict=True)
        get = pos.get
        for j, key in enumerate(keys, j0):
            lst = get(key)
            if lst is None:
                pos[key] = [j]
            else:
                lst.append(j)
        if self.with_hash:
            self.hashes.extend(self._lcg_hashes(j0, cnt))

    def _lcg_hashes(self, j0: int, cnt: int) -> list[int]:
        hist, n = self.hist, self.n
        if cnt >= _NUMPY_BULK:
            arr = np.asarray(hist[j0 : j0 + cnt + n - 1], dtype=np.int64).astype(np.uint32)
            h = np.zeros(cnt, dtype=np.uint32)
            f = np.uint32(LCG_FACTOR)
            for k in range(n):
                h *= f
                h += arr[k : k + cnt]
            hashes: list[int] = h.tolist()
            return hashes
        out: list[int] = []
        h32 = 0
        for t in hist[j0 : j0 + n]:
            h32 = (h32 * LCG_FACTOR + t) & _MASK32
        out.append(h32)
        fpow = self._fpow
        for j in range(j0, j0 + cnt - 1):
            h32 = ((h32 - hist[j] * fpow) * LCG_FACTOR + hist[j + n]) & _MASK32
            out.append(h32)
        return out


class _NgramDrafter(Drafter):
    """Shared frame: list conversion, truncation to n_max, statistics and timings."""

    follows_draft_n_max = False  # upstream's --spec-draft-n-max is for model drafters

    def __init__(self, *, record_stats: bool = True) -> None:
        super().__init__()
        self.record_stats = record_stats
        self._n_last_draft = 0

    def begin(self, prompt: Sequence[int]) -> None:
        t0 = time.perf_counter()
        self._begin(_as_list(prompt))
        if self.record_stats:
            self.stats.n_call_begin += 1
            self.stats.t_begin_ms += (time.perf_counter() - t0) * 1000.0

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        t0 = time.perf_counter()
        n_max = max(int(n_max), 0)
        result = self._draft(_as_list(tokens), int(id_last), n_max)
        if len(result) > n_max:
            del result[n_max:]
        self._n_last_draft = len(result)
        if self.record_stats:
            self.stats.n_call_draft += 1
            self.stats.record_draft(len(result))
            self.stats.t_draft_ms += (time.perf_counter() - t0) * 1000.0
        return result

    def accept(self, n_accepted: int) -> None:
        if not 0 <= n_accepted <= self._n_last_draft:
            raise ValueError(
                f"{self.name}: {n_accepted} tokens accepted of a draft of {self._n_last_draft} (the last draft())"
            )
        if not self.record_stats:  # the driver records them (and times the call)
            self._accept(n_accepted)
            return
        t0 = time.perf_counter()
        self._accept(n_accepted)
        if self.record_stats:
            self.stats.n_call_accept += 1
            self.stats.record_accept(n_accepted)
            self.stats.t_accept_ms += (time.perf_counter() - t0) * 1000.0

    def _begin(self, prompt: list[int]) -> None:  # noqa: B027 - optional hook, like upstream's noop begin()
        """Upstream's impl begin(); a no-op unless overridden."""

    @abstractmethod
    def _draft(self, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        """Upstream's impl draft() for one sequence: `tokens` in the target's memory, then id_last."""

    def _accept(self, n_accepted: int) -> None:  # noqa: B027 - optional hook, like upstream's noop accept()
        """Upstream's impl accept(); a no-op unless overridden."""


# --------------------------------------------------------------------------------------------------------------
# ngram-simple


class NgramSimple(_NgramDrafter):
    """common_ngram_simple_draft (ngram-map.cpp:49-112): the last size_n tokens (the last size_n-1 of the history
    and id_last) are searched backwards in the history; the up to size_m tokens that followed the most recent
    earlier occurrence are the draft. No draft while len(tokens) <= size_n + size_m + 1, for a match at position 0,
    or when fewer than size_n tokens follow the match. `min_hits` is accepted, as upstream's parameters carry it,
    but common_ngram_simple_draft does not use it.
    """

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, record_stats: bool = True) -> None:
        super().__init__(record_stats=record_stats)
        self.size_n = _check_range("size_n", size_n, 1, 1024)
        self.size_m = _check_range("size_m", size_m, 1, 1024)
        self.min_hits = _check_range("min_hits", min_hits, 1, 0xFFFF)
        self._index = _NgramIndex(size_n)

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


class _NgramMap(_NgramDrafter):
    """common_ngram_map (ngram-map.h:61-95, ngram-map.cpp:121-536)."""

    key_only = True

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, *, record_stats: bool = True) -> None:
        super().__init__(record_stats=record_stats)
        self.size_n = _check_range("size_n", size_n, 1, 1024)
        self.size_m = _check_range("size_m", size_m, 1, 1024)
        self.min_hits = _check_range("min_hits", min_hits, 1, 0xFFFF)
        self.keys: list[_MapKey] = []  # key n-grams that occurred several times, in creation order
        self.size_last_begin = 0  # tokens at the previous begin()
        self.idx_last_check = 0  # history length at the last begin()/draft()
        self.last_draft_created = False
        self.last_draft_key: _MapKey | None = None
        self.last_draft_value_idx = 0
        # key_map[hash % 2^18] = start of an n-gram with that hash (0 / absent: empty), first writer wins
        self.key_map: dict[int, int] = {}
        self.key_map_last_idx = 0  # the last start added to key_map
        self._index = _NgramIndex(size_n, with_hash=True)
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
            h = (h * LCG_FACTOR + t) & _MASK32
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


# --------------------------------------------------------------------------------------------------------------
# ngram-mod


class NgramMod(_NgramDrafter):
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
        self.n_match = _check_range("n_match", n_match, 1, 1024)
        self.n_max = _check_range("n_max", n_max, 0, 1024)
        self.n_min = _check_range("n_min", n_min, 0, 1024)
        _check_range("size", size, 1, 1 << 40)
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
            h = (h * NGRAM_MOD_FACTOR + t) & _MASK64
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
        if cnt < _NUMPY_BULK:
            h = 0
            for t in tokens[a : a + n]:
                h = (h * NGRAM_MOD_FACTOR + t) & _MASK64
            mpow, item, used = self._mpow, table.item, 0
            for i in range(a, b):
                k = h % size
                nxt = tokens[i + n]
                if item(k) == NGRAM_MOD_EMPTY:
                    used += 1
                table[k] = nxt
                h = ((h - tokens[i] * mpow) * NGRAM_MOD_FACTOR + nxt) & _MASK64
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
            h = (h * NGRAM_MOD_FACTOR + t) & _MASK64
        size, item, mpow = self.size, self.table.item, self._mpow
        for i in range(self.n_max):
            tok = item(h % size)
            if tok == NGRAM_MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            seq.append(tok)
            h = ((h - seq[i] * mpow) * NGRAM_MOD_FACTOR + tok) & _MASK64
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


# --------------------------------------------------------------------------------------------------------------
# ngram-cache

# common_ngram_cache: n-gram (4 tokens, LLAMA_TOKEN_NULL-padded) -> {following token: count}, in insertion order
NgramCacheTable = dict[tuple[int, int, int, int], dict[int, int]]

_NGRAM_STRUCT = struct.Struct("<4i")
_I32 = struct.Struct("<i")


def ngram_cache_update(cache: NgramCacheTable, ngram_min: int, ngram_max: int, inp: list[int], nnew: int) -> None:
    """common_ngram_cache_update (ngram-cache.cpp:12-52): count the n-grams ending in the last nnew tokens."""
    inp_size = len(inp)
    null = repeat(LLAMA_TOKEN_NULL)
    for size in range(ngram_min, ngram_max + 1):
        i_start = max(inp_size - nnew, size)
        if i_start >= inp_size:
            continue
        cnt = inp_size - i_start
        cols = [inp[i_start - size + k : i_start - size + k + cnt] for k in range(size)]
        grams = zip(*cols, *([null] * (LLAMA_NGRAM_MAX - size)), strict=False)  # null: endless padding
        get = cache.get
        for gram, token in zip(grams, inp[i_start:inp_size], strict=True):
            part = get(gram)
            if part is None:
                cache[gram] = {token: 1}
            else:
                part[token] = part.get(token, 0) + 1


def _try_draft_static(nc_static: NgramCacheTable, ngram_static: tuple[int, int, int, int]) -> int:
    """try_draft from the static cache only (ngram-cache.cpp:66-95)."""
    part = nc_static.get(ngram_static)
    if part is None:
        return LLAMA_TOKEN_NULL
    max_count = 0
    sum_count = 0
    max_token = LLAMA_TOKEN_NULL
    for token, count in part.items():
        if count > max_count:
            max_token = token
            max_count = count
        sum_count += count
    if sum_count < DRAFT_MIN_SAMPLE_SIZE_LAX[LLAMA_NGRAM_STATIC - 1]:
        return LLAMA_TOKEN_NULL
    if 100 * max_count < DRAFT_MIN_PERCENT_LAX[LLAMA_NGRAM_STATIC - 1] * sum_count:
        return LLAMA_TOKEN_NULL
    return max_token


def _try_draft_primary(
    nc_primary: NgramCacheTable,
    ngrams: list[tuple[int, int, int, int] | None],
    part_static: dict[int, int],
    min_sample_size: tuple[int, ...],
    min_percent: tuple[int, ...],
) -> int:
    """try_draft from the context/dynamic cache, weighted by the static cache (ngram-cache.cpp:98-144)."""
    for i in range(len(ngrams) - 1, -1, -1):
        gram = ngrams[i]
        if gram is None:
            continue
        part = nc_primary.get(gram)
        if part is None:
            continue
        max_count_primary = 0
        max_count_static = 0
        sum_count_primary = 0
        max_token = LLAMA_TOKEN_NULL
        for token, count_primary in part.items():
            static = part_static.get(token)
            count_static = 100 * static if static is not None else 1
            if count_primary * count_static > max_count_primary * max_count_static:
                max_token = token
                max_count_primary = count_primary
                max_count_static = count_static
            sum_count_primary += count_primary
        if sum_count_primary < min_sample_size[i]:
            continue
        if 100 * max_count_primary < min_percent[i] * sum_count_primary:
            continue
        return max_token
    return LLAMA_TOKEN_NULL


def load_ngram_cache(path: str | PathLike[str]) -> NgramCacheTable:
    """common_ngram_cache_load (ngram-cache.cpp:222-258): upstream's binary lookup-cache file.

    Records of `int32 ngram[4]` (LLAMA_TOKEN_NULL-padded), `int32 ntokens`, then ntokens pairs of
    `int32 token, int32 count`, little-endian, back to back (as llama-lookup-create writes them).
    """
    with open(path, "rb") as f:
        data = f.read()
    cache: NgramCacheTable = {}
    off, end = 0, len(data)
    while off + _NGRAM_STRUCT.size <= end:  # a trailing partial n-gram ends the read, as upstream
        gram: tuple[int, int, int, int] = _NGRAM_STRUCT.unpack_from(data, off)
        off += _NGRAM_STRUCT.size
        if off + 4 > end:
            raise ValueError(f"{path}: truncated n-gram cache record at byte {off}")
        (ntokens,) = _I32.unpack_from(data, off)
        off += 4
        if ntokens <= 0 or off + 8 * ntokens > end:
            raise ValueError(f"{path}: bad n-gram cache record at byte {off - 4} ({ntokens} tokens)")
        values = struct.unpack_from(f"<{2 * ntokens}i", data, off)
        off += 8 * ntokens
        part: dict[int, int] = {}
        for token, count in zip(values[0::2], values[1::2], strict=True):
            if count <= 0:
                raise ValueError(f"{path}: non-positive count {count} in the n-gram cache")
            part.setdefault(token, count)  # emplace: the first occurrence wins
        cache.setdefault(gram, part)
    return cache


def save_ngram_cache(cache: NgramCacheTable, path: str | PathLike[str]) -> None:
    """common_ngram_cache_save (ngram-cache.cpp:200-220)."""
    chunks: list[bytes] = []
    for gram, part in cache.items():
        if not part:
            raise ValueError(f"n-gram {gram} has no token counts")
        chunks.append(_NGRAM_STRUCT.pack(*gram))
        chunks.append(_I32.pack(len(part)))
        flat: list[int] = []
        for token, count in part.items():
            if count <= 0:
                raise ValueError(f"n-gram {gram}: non-positive count {count}")
            flat += (token, count)
        chunks.append(struct.pack(f"<{len(flat)}i", *flat))
    write_private_bytes(Path(path), b"".join(chunks))


class NgramCache(_NgramDrafter):
    """Lookup decoding (ngram-cache.cpp, speculative.cpp:2024-2161).

    A context cache counts, for each 1..4-gram, the tokens that followed it; drafting appends, up to n_draft
    times, the best-supported next token of the longest suffix n-gram that passes the sample-size/percentage
    thresholds (context cache: lax; dynamic cache: strict; static cache (2-grams): lax), weighting by the
    static cache. The dynamic and static caches are loaded from upstream's files (`lookup_cache_dynamic`,
    `lookup_cache_static`, as --lookup-cache-dynamic/-static) and, as upstream, not updated.
    """

    name = "ngram-cache"

    def __init__(
        self,
        n_draft: int = NGRAM_CACHE_N_DRAFT,
        lookup_cache_static: str | PathLike[str] | None = None,
        lookup_cache_dynamic: str | PathLike[str] | None = None,
        *,
        record_stats: bool = True,
    ) -> None:
        super().__init__(record_stats=record_stats)
        self.n_draft = _check_range("n_draft", n_draft, 0, 0xFFFF)
        self.cache_size = 0  # tokens counted into the context cache
        self.nc_context: NgramCacheTable = {}
        self.nc_dynamic: NgramCacheTable = load_ngram_cache(lookup_cache_dynamic) if lookup_cache_dynamic else {}
        self.nc_static: NgramCacheTable = load_ngram_cache(lookup_cache_static) if lookup_cache_static else {}

    def _draft(self, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        prompt = tokens
        if self.cache_size < len(prompt) + 1:
            tokens_new = prompt[self.cache_size :]
            tokens_new.append(id_last)
            # as upstream: only n-grams within the new tokens are counted
            ngram_cache_update(self.nc_context, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, tokens_new, len(tokens_new))
            self.cache_size = len(prompt) + 1

        inp_size = len(prompt) + 1
        if inp_size < LLAMA_NGRAM_STATIC:
            return []
        # the speculative sequence inp + draft; only its last LLAMA_NGRAM_MAX tokens are ever read
        seq = prompt[-(LLAMA_NGRAM_MAX - 1) :] if LLAMA_NGRAM_MAX > 1 else []
        seq.append(id_last)
        n_seq0 = len(seq)
        nc_context, nc_dynamic, nc_static = self.nc_context, self.nc_dynamic, self.nc_static
        n_total = inp_size
        limit = min(self.n_draft, n_max)  # each token depends only on earlier ones: truncating early is exact
        empty: dict[int, int] = {}
        while len(seq) - n_seq0 < limit:
            ngram_static = (seq[-2], seq[-1], LLAMA_TOKEN_NULL, LLAMA_TOKEN_NULL)
            part_static = nc_static.get(ngram_static, empty) if nc_static else empty
            ngrams_cd: list[tuple[int, int, int, int] | None] = []
            for size in range(LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX + 1):
                if size > n_total:
                    ngrams_cd.append(None)  # would read before the history (undefined upstream)
                    continue
                gram = seq[-size:] + [LLAMA_TOKEN_NULL] * (LLAMA_NGRAM_MAX - size)
                ngrams_cd.append((gram[0], gram[1], gram[2], gram[3]))
            drafted = _try_draft_primary(
                nc_context, ngrams_cd, part_static, DRAFT_MIN_SAMPLE_SIZE_LAX, DRAFT_MIN_PERCENT_LAX
            )
            if drafted == LLAMA_TOKEN_NULL and nc_dynamic:
                drafted = _try_draft_primary(
                    nc_dynamic, ngrams_cd, part_static, DRAFT_MIN_SAMPLE_SIZE_STRICT, DRAFT_MIN_PERCENT_STRICT
                )
            if drafted == LLAMA_TOKEN_NULL and nc_static:
                drafted = _try_draft_static(nc_static, ngram_static)
            if drafted == LLAMA_TOKEN_NULL:
                break
            seq.append(drafted)
            n_total += 1
        return seq[n_seq0:]


# --------------------------------------------------------------------------------------------------------------

NGRAM_DRAFTERS: dict[str, type[Drafter]] = {
    cls.name: cls for cls in (NgramSimple, NgramMapK, NgramMapK4V, NgramMod, NgramCache)
}


def make_ngram_drafter(name: str, **params: object) -> Drafter:
    """A new n-gram drafter of upstream type `name`, with its upstream-named parameters."""
    cls = NGRAM_DRAFTERS.get(name)
    if cls is None:
        raise ValueError(f"unknown n-gram drafter {name!r}; use one of {', '.join(NGRAM_DRAFTERS)}")
    return cls(**params)


PROMPT_LOOKUP_KEY = 3  # tokens matched: the last two and the one just sampled
PROMPT_LOOKUP_COPY = 16  # the most tokens copied from where they matched


def prompt_lookup_drafter(*, record_stats: bool = False) -> NgramSimple:
    """Auto mode's short-key copier for a model without a model drafter ("ngram-prompt"): ngram-simple matching 3
    tokens instead of 12 and copying up to 16, so text repeated from the prompt is drafted in the first reply
    already (upstream's n-gram types need 12-24 matching tokens and copies of 12-48: a sentence repeated once is
    too short for them). Its drafts start short and grow with acceptance, as every drafter's (SpeculativeDriver)."""
    drafter = NgramSimple(size_n=PROMPT_LOOKUP_KEY, size_m=PROMPT_LOOKUP_COPY, record_stats=record_stats)
    drafter.name = "ngram-prompt"
    return drafter
