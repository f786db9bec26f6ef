"""What every n-gram drafter shares: token lists, parameter checks, the incremental n-gram index, the drafter frame."""

from __future__ import annotations

import time
from abc import abstractmethod
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from engine_ext.speculative.base import Drafter, common_prefix_length

LLAMA_TOKEN_NULL = -1
LCG_FACTOR = 2654435761  # ngram-map.cpp:11, the n-gram hash of the index and of ngram-map

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
NUMPY_BULK = 256  # ranges at least this long are hashed with numpy, shorter ones by rolling in Python
_SYNC_TAIL = 64  # draft() checks that the indexed history still ends like this many tokens of `tokens`


def as_token_list(tokens: Sequence[int]) -> list[int]:
    """The tokens as a list of Python ints (a list is used as is, without copying)."""
    if type(tokens) is list:
        return tokens
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        listed = tolist()
        return listed if type(listed) is list else [int(t) for t in listed]
    return [int(t) for t in tokens]


def check_range(name: str, value: int, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer between {lo} and {hi}, not {value!r}")
    return value


class NgramIndex:
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
        if cnt >= NUMPY_BULK:
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
            h32 = (h32 * LCG_FACTOR + t) & MASK32
        out.append(h32)
        fpow = self._fpow
        for j in range(j0, j0 + cnt - 1):
            h32 = ((h32 - hist[j] * fpow) * LCG_FACTOR + hist[j + n]) & MASK32
            out.append(h32)
        return out


class NgramDrafter(Drafter):
    """Shared frame: list conversion, truncation to n_max, statistics and timings."""

    follows_draft_n_max = False  # upstream's --spec-draft-n-max is for model drafters

    def __init__(self, *, record_stats: bool = True) -> None:
        super().__init__()
        self.record_stats = record_stats
        self._n_last_draft = 0

    def begin(self, prompt: Sequence[int]) -> None:
        t0 = time.perf_counter()
        self._begin(as_token_list(prompt))
        if self.record_stats:
            self.stats.n_call_begin += 1
            self.stats.t_begin_ms += (time.perf_counter() - t0) * 1000.0

    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        t0 = time.perf_counter()
        n_max = max(int(n_max), 0)
        result = self._draft(as_token_list(tokens), int(id_last), n_max)
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
