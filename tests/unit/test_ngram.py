"""The model-free n-gram drafters (engine_ext/speculative/ngram/) against upstream llama.cpp's logic.

Hand-computed cases for each drafter, plus a randomized comparison with literal line-by-line ports of the
upstream C++ (common/ngram-map.cpp, ngram-mod.cpp, ngram-cache.cpp, speculative.cpp), which rescan the history
the way upstream does, over multi-turn generations with edited histories.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine_ext.params import SPEC_TYPES
from engine_ext.speculative.base import Drafter, DrafterStats, common_prefix_length
from engine_ext.speculative.ngram import (
    NGRAM_DRAFTERS,
    NgramCache,
    NgramCacheTable,
    NgramMapK,
    NgramMapK4V,
    NgramMod,
    NgramSimple,
    load_ngram_cache,
    make_ngram_drafter,
    ngram_cache_update,
    save_ngram_cache,
)
from engine_ext.speculative.ngram import _map as ngram_map  # its hash-map size, shrunk by one test

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1

# ----- literal ports of upstream (the oracles) ----------------------------------------------------------------


def ref_simple_draft(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common_ngram_simple_draft, ngram-map.cpp:49-112."""
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = [tokens[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
    match_pos = 0
    j = cur_len - n - 1
    while j > 0:
        if tokens[j : j + len(pattern)] == pattern:  # all(tokens[j + k] == pattern[k] for k)
            match_pos = j
            break
        j -= 1
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [tokens[match_pos + n + j] for j in range(copy_max)]


class RefMap:
    """common_ngram_map + begin/draft/accept, ngram-map.cpp:121-536 (aborts become AssertionError)."""

    def __init__(self, n: int, m: int, key_only: bool, min_hits: int, hash_size: int = 262144) -> None:
        self.n, self.m, self.key_only, self.min_hits = n, m, key_only, min_hits
        self.keys: list[dict[str, Any]] = []
        self.key_map = [0] * hash_size
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0

    @staticmethod
    def hash(tokens: list[int], start: int, length: int) -> int:
        h = 0
        for i in range(length):
            h = (h * 2654435761 + tokens[start + i]) & M32
        return h

    def begin(self, tokens: list[int]) -> None:
        n, m = self.n, self.m
        size_begin = len(tokens)
        idx_begin_cleanup = self.size_last_begin
        if idx_begin_cleanup > size_begin:
            idx_begin_cleanup = size_begin - n - m if size_begin > n + m else 0
        if self.key_map and size_begin < self.idx_last_check:
            for i in range(len(self.key_map)):
                if self.key_map[i] != 0 and self.key_map[i] >= idx_begin_cleanup:
                    self.key_map[i] = 0
            self.key_map_last_idx = idx_begin_cleanup - 1 if idx_begin_cleanup > 0 else 0
        if size_begin < self.idx_last_check and self.keys:
            for i in range(len(self.keys) - 1, -1, -1):
                key = self.keys[i]
                if key["key_idx"] >= idx_begin_cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                values = key["values"]
                for j in range(3, -1, -1):
                    if values[j][0] != 0 and values[j][0] >= idx_begin_cleanup:
                        for k in range(j, 3):
                            values[k] = list(values[k + 1])
                        values[3][0] = 0
                        values[3][1] = 0
                if values[0][0] == 0:
                    del self.keys[i]
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def draft(self, inp: list[int], sampled: int) -> list[int]:
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0
        cur_len = len(inp)
        n, m = self.n, self.m
        if cur_len < 2 * n + m:
            return []
        assert self.idx_last_check <= cur_len
        self.idx_last_check = cur_len
        key_tokens = [inp[j] for j in range(cur_len - n + 1, cur_len)] + [sampled]
        match_pos = 0
        assert self.size_last_begin <= cur_len
        km = self.key_map
        idx_hash = self.hash(key_tokens, 0, n) % len(km)
        idx_key = km[idx_hash]
        if idx_key != 0 and idx_key < cur_len - n - m - 1:
            if inp[idx_key : idx_key + n] == key_tokens:
                match_pos = idx_key
        if match_pos == 0 and self.size_last_begin > n + m + 1:
            j = self.size_last_begin - n - m - 1
            while j > self.key_map_last_idx:
                if inp[j : j + n] == key_tokens:
                    match_pos = j
                    break
                j -= 1
        if match_pos == 0:
            j = cur_len - n - m - 1
            while j > self.size_last_begin and j > self.key_map_last_idx:
                if inp[j : j + n] == key_tokens:
                    match_pos = j
                    break
                j -= 1
        if self.size_last_begin > n + m + 1:
            j = self.size_last_begin - n - m - 1
            while j > self.key_map_last_idx:
                h = self.hash(inp, j, n) % len(km)
                if km[h] == 0:
                    km[h] = j
                j -= 1
        j = cur_len - n - m - 1
        while j > self.size_last_begin and j > self.key_map_last_idx:
            h = self.hash(inp, j, n) % len(km)
            if km[h] == 0:
                km[h] = j
            j -= 1
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)
        if match_pos == 0:
            return []

        key_offset = len(self.keys)
        for i, key in enumerate(self.keys):
            if inp[key["key_idx"] : key["key_idx"] + n] == key_tokens:
                key_offset = i
                break
        if key_offset == len(self.keys):
            self.keys.append(
                {"key_idx": match_pos, "stat_idx": 0, "key_num": 0, "values": [[0, 0, m] for _ in range(4)]}
            )
        curr = self.keys[key_offset]
        curr["key_num"] = min(curr["key_num"] + 1, 16380)
        values = curr["values"]
        if self.key_only:
            n_draft = min(m, values[0][2])
            self.last_draft_created = True
            self.last_draft_key_idx = key_offset
            self.last_draft_value_idx = 0
            return [inp[match_pos + n + i] for i in range(n_draft)]
        if curr["key_num"] < self.min_hits:
            return []
        for i in range(curr["stat_idx"], match_pos + 1):
            if inp[i : i + n] != key_tokens:
                continue
            begin_value_key = i + n
            idx_value = -1
            for v in range(4):
                begin_v = values[v][0]
                if begin_v == 0:
                    values[v][0] = begin_value_key
                    values[v][1] = 0
                    values[v][2] = m
                    idx_value = v
                    break
                if inp[begin_value_key : begin_value_key + m] == inp[begin_v : begin_v + m]:
                    idx_value = v
                    break
            if idx_value >= 0:
                values[idx_value][1] = min(values[idx_value][1] + 1, 16380)
        curr["stat_idx"] = match_pos
        max_occur, slot_max = 0, 0
        for v in range(4):
            if values[v][1] > max_occur:
                max_occur, slot_max = values[v][1], v
        sum_occur = sum(values[v][1] for v in range(4) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []
        n_draft = min(m, values[slot_max][2])
        self.last_draft_created = True
        self.last_draft_key_idx = key_offset
        self.last_draft_value_idx = slot_max
        return [inp[match_pos + n + i] for i in range(n_draft)]

    def accept(self, n_accepted: int) -> None:
        if not self.last_draft_created:
            return
        self.keys[self.last_draft_key_idx]["values"][self.last_draft_value_idx][2] = n_accepted


class RefMod:
    """common_ngram_mod (ngram-mod.cpp) + common_speculative_impl_ngram_mod (speculative.cpp:1849-2022)."""

    def __init__(self, n: int, size: int, n_max: int, n_min: int) -> None:
        self.n, self.size, self.n_max, self.n_min = n, size, n_max, n_min
        self.entries: dict[int, int] = {}
        self.used = 0
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def idx(self, tokens: list[int]) -> int:
        res = 0
        for i in range(self.n):
            res = (res * 6364136223846793005 + tokens[i]) & M64
        return res % self.size

    def add(self, tokens: list[int]) -> None:
        i = self.idx(tokens)
        if self.entries.get(i, -1) == -1:
            self.used += 1
        self.entries[i] = tokens[self.n]

    def get(self, tokens: list[int]) -> int:
        return self.entries.get(self.idx(tokens), -1)

    def reset(self) -> None:
        self.entries.clear()
        self.used = 0

    def begin(self, prompt: list[int]) -> None:
        self.i_last = 0
        self.n_draft_last = 0
        n = self.n
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self.add(prompt[i:])
        self.i_last = len(prompt) - n
        if self.used / self.size > 0.25:
            self.reset()

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        self.n_draft_last = 0
        cur_len = len(prompt)
        n = self.n
        if cur_len < n:
            return []
        if self.i_last + 32 < cur_len:
            for i in range(self.i_last, cur_len - n):
                self.add(prompt[i:])
            self.i_last = cur_len - n
        result = [0] * (n + self.n_max)
        for i in range(n - 1):
            result[i] = prompt[cur_len - n + 1 + i]
        result[n - 1] = id_last
        for i in range(self.n_max):
            token = self.get(result[i:])
            if token == -1:
                if i < self.n_min:
                    return []
                result = result[: n + i]
                break
            result[n + i] = token
        result = result[n:]
        self.n_draft_last = len(result)
        return result

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


def ref_cache_update(cache: NgramCacheTable, ngram_min: int, ngram_max: int, inp: list[int], nnew: int) -> None:
    """common_ngram_cache_update, ngram-cache.cpp:12-52."""
    for size in range(ngram_min, ngram_max + 1):
        for i in range(max(len(inp) - nnew, size), len(inp)):
            g = [inp[k] for k in range(i - size, i)] + [-1] * (4 - size)
            gram = (g[0], g[1], g[2], g[3])
            part = cache.get(gram)
            if part is None:
                cache[gram] = {inp[i]: 1}
            else:
                part[inp[i]] = part.get(inp[i], 0) + 1


LAX = ((2, 2, 1, 1), (66, 50, 50, 50))
STRICT = ((4, 3, 2, 2), (75, 66, 66, 66))


def ref_cache_draft(
    inp: list[int], draft: list[int], n_draft: int, ctx: NgramCacheTable, dyn: NgramCacheTable, static: NgramCacheTable
) -> None:
    """common_ngram_cache_draft, ngram-cache.cpp:146-198 (n-grams reaching before the history: skipped)."""

    def get_token(i: int) -> int:
        return inp[i] if i < len(inp) else draft[1 + i - len(inp)]

    def try_static(gram: tuple[int, int, int, int]) -> int:
        part = static.get(gram)
        if part is None:
            return -1
        max_count, sum_count, max_token = 0, 0, -1
        for token, count in part.items():
            if count > max_count:
                max_token, max_count = token, count
            sum_count += count
        if sum_count < LAX[0][1] or 100 * max_count < LAX[1][1] * sum_count:
            return -1
        return max_token

    def try_primary(nc: NgramCacheTable, grams: list[Any], part_static: dict[int, int], th: Any) -> int:
        drafted = -1
        i = len(grams) - 1
        while i >= 0 and drafted == -1:
            gram = grams[i]
            i -= 1
            if gram is None or gram not in nc:
                continue
            max_p, max_s, sum_p, max_token = 0, 0, 0, -1
            for token, count_p in nc[gram].items():
                count_s = 100 * part_static[token] if token in part_static else 1
                if count_p * count_s > max_p * max_s:
                    max_token, max_p, max_s = token, count_p, count_s
                sum_p += count_p
            if sum_p < th[0][i + 1] or 100 * max_p < th[1][i + 1] * sum_p:
                continue
            drafted = max_token
        return drafted

    inp_size = len(inp)
    if inp_size < 2:
        return
    while len(draft) - 1 < n_draft:
        start_static = inp_size - 2 + len(draft) - 1
        gram_static = (get_token(start_static), get_token(start_static + 1), -1, -1)
        part_static = static.get(gram_static, {})
        grams: list[Any] = []
        for size in range(1, 5):
            start = inp_size - size + len(draft) - 1
            if start < 0:
                grams.append(None)
                continue
            g = [get_token(j) for j in range(start, start + size)] + [-1] * (4 - size)
            grams.append(tuple(g))
        drafted = try_primary(ctx, grams, part_static, LAX)
        if drafted == -1:
            drafted = try_primary(dyn, grams, part_static, STRICT)
        if drafted == -1:
            drafted = try_static(gram_static)
        if drafted == -1:
            break
        draft.append(drafted)


class RefCache:
    """common_speculative_impl_ngram_cache::draft_one, speculative.cpp:2097-2140."""

    def __init__(self, n_draft: int = 8, dyn: NgramCacheTable | None = None, static: NgramCacheTable | None = None):
        self.n_draft = n_draft
        self.cache_size = 0
        self.ctx: NgramCacheTable = {}
        self.dyn = dyn or {}
        self.static = static or {}

    def begin(self, prompt: list[int]) -> None:
        pass

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        if self.cache_size < len(prompt) + 1:
            tokens_new = [prompt[j] for j in range(self.cache_size, len(prompt))] + [id_last]
            ref_cache_update(self.ctx, 1, 4, tokens_new, len(tokens_new))
            self.cache_size = len(prompt) + 1
        inp = list(prompt) + [id_last]
        result = [id_last]
        ref_cache_draft(inp, result, self.n_draft, self.ctx, self.dyn, self.static)
        return result[1:]

    def accept(self, n_accepted: int) -> None:
        pass


class RefSimple:
    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m

    def begin(self, prompt: list[int]) -> None:
        pass

    def draft(self, tokens: list[int], id_last: int) -> list[int]:
        return ref_simple_draft(tokens, id_last, self.n, self.m)

    def accept(self, n_accepted: int) -> None:
        pass


# ----- helpers -------------------------------------------------------------------------------------------------


def repetitive(rng: random.Random, length: int, vocab: int, p_copy: float = 0.5) -> list[int]:
    """Random tokens with copied stretches of earlier text (what n-gram drafters feed on)."""
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < p_copy:
            a = rng.randrange(len(out))
            out.extend(out[a : a + rng.randint(5, 80)])
        else:
            out.extend(rng.randrange(vocab) for _ in range(rng.randint(3, 40)))
    return out[:length]


def generate(
    drafter: Drafter, ref: Any, prompt: list[int], cont: list[int], n_max: int, as_array: bool = False
) -> tuple[list[int], int]:
    """Run one turn: the 'target' emits `cont`; both drafters see the same calls. Returns (history, #drafts)."""
    cached = list(prompt)
    start: Any = np.asarray(cached) if as_array else cached
    drafter.begin(start)
    ref.begin(list(cached))
    k = 0
    n_drafts = 0
    while k < len(cont) - 1:
        id_last = cont[k]
        view: Any = np.asarray(cached, dtype=np.int32) if as_array else cached
        got = drafter.draft(view, id_last, n_max)
        want = ref.draft(list(cached), id_last)[: max(n_max, 0)]
        if isinstance(ref, RefMod):
            ref.n_draft_last = len(want)  # NgramMod's one deliberate difference: the fraction of the capped draft
        assert got == want, f"step at history length {len(cached)}"
        n_acc = 0
        for i, t in enumerate(got):
            if k + 1 + i < len(cont) and cont[k + 1 + i] == t:
                n_acc += 1
            else:
                break
        if got:
            n_drafts += 1
            drafter.accept(n_acc)
            ref.accept(n_acc)
        cached.append(id_last)
        cached.extend(cont[k + 1 : k + 1 + n_acc])
        k += 1 + n_acc
    return cached, n_drafts


def check_stats(s: DrafterStats) -> None:
    assert s.n_acc_tokens <= s.n_gen_tokens
    assert s.n_acc_drafts <= s.n_gen_drafts <= s.n_call_draft
    assert s.n_call_accept <= s.n_call_draft
    assert sum(s.n_gen_per_pos) == s.n_gen_tokens
    assert sum(s.n_acc_per_pos) == s.n_acc_tokens
    assert all(a >= b for a, b in zip(s.n_acc_per_pos, s.n_acc_per_pos[1:], strict=False))
    assert all(a >= b for a, b in zip(s.n_gen_per_pos, s.n_gen_per_pos[1:], strict=False))
    assert all(a <= g for a, g in zip(s.n_acc_per_pos, s.n_gen_per_pos, strict=False))
    assert all(0.0 <= r <= 1.0 for r in s.acceptance_per_position())
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert s.t_draft_ms >= 0.0 and s.t_begin_ms >= 0.0 and s.t_accept_ms >= 0.0


# ----- registry ------------------------------------------------------------------------------------------------


def test_common_prefix_length_matches_a_token_by_token_scan() -> None:
    """The slice-halving search agrees with a plain scan: equal lists, prefixes, early and late mismatches,
    mismatches on both sides of its halving threshold, and a tuple against a list."""

    def scan(a: list[int], b: list[int]) -> int:
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(5)
    cases = [([], []), ([1], []), ([1, 2], [1, 3]), (list(range(100)), list(range(100)))]
    for _ in range(2000):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 400))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 60))]
        cases.append((a, b))
    for a, b in cases:
        assert common_prefix_length(a, b) == common_prefix_length(b, a) == scan(a, b)
        assert common_prefix_length(tuple(a), b) == scan(a, b)


def test_registry_names_match_upstream_types() -> None:
    assert list(NGRAM_DRAFTERS) == ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    assert [t for t in SPEC_TYPES if t.startswith("ngram-")] == list(NGRAM_DRAFTERS)
    for name, cls in NGRAM_DRAFTERS.items():
        assert cls.name == name
        d = make_ngram_drafter(name)
        assert isinstance(d, cls) and isinstance(d, Drafter) and d.name == name


def test_make_ngram_drafter_rejects_unknown_names_and_bad_params() -> None:
    with pytest.raises(ValueError, match=r"unknown n-gram drafter 'ngram-foo'.*ngram-simple"):
        make_ngram_drafter("ngram-foo")
    with pytest.raises(ValueError, match="size_n"):
        make_ngram_drafter("ngram-simple", size_n=0)
    with pytest.raises(ValueError, match="n_match"):
        make_ngram_drafter("ngram-mod", n_match=0, size=64)
    with pytest.raises(TypeError):
        make_ngram_drafter("ngram-simple", n_match=3)
    d = make_ngram_drafter("ngram-map-k4v", size_n=8, size_m=24, min_hits=2)
    assert isinstance(d, NgramMapK4V) and (d.size_n, d.size_m, d.min_hits) == (8, 24, 2)


def test_upstream_defaults() -> None:
    # common/common.h:354-365 and speculative.cpp:1876,2191
    for cls in (NgramSimple, NgramMapK, NgramMapK4V):
        d = cls()
        assert (d.size_n, d.size_m, d.min_hits) == (12, 48, 1)
    mod = NgramMod()
    assert (mod.n_match, mod.n_max, mod.n_min, mod.size) == (24, 64, 48, 4 * 1024 * 1024)
    assert mod.table.dtype == np.int32 and (mod.table == -1).all()
    assert NgramCache().n_draft == 8
    assert NgramMapK.key_only and not NgramMapK4V.key_only


# ----- ngram-simple --------------------------------------------------------------------------------------------


def test_simple_hand_computed() -> None:
    d = NgramSimple(size_n=2, size_m=3)
    # pattern = last size_n-1 tokens + id_last = [1, 2]; found at 1; the 3 tokens after it are drafted
    assert d.draft([7, 1, 2, 3, 4, 5, 8, 8, 1], 2, 16) == [3, 4, 5]
    # the most recent earlier occurrence wins (6, not 1); copy stops at the end of the history
    assert d.draft([7, 1, 2, 3, 4, 5, 1, 2, 6, 6, 1], 2, 16) == [6, 6, 1]
    # n_max caps the draft
    assert d.draft([7, 1, 2, 3, 4, 5, 8, 8, 1], 2, 2) == [3, 4]
    # a match at position 0 does not count
    assert d.draft([1, 2, 3, 4, 5, 6, 7, 1], 2, 16) == []
    # fewer than size_n tokens after the match: no draft
    assert d.draft([9, 9, 9, 9, 9, 9, 1, 2, 1], 2, 16) == []
    assert d.draft([9, 9, 9, 9, 9, 1, 2, 5, 1], 2, 16) == [5, 1]
    # length threshold: len(tokens) must exceed size_n + size_m + 1
    assert d.draft([1, 2, 3, 1, 2, 1], 2, 16) == []
    assert d.draft([0, 1, 2, 3, 4, 5, 1], 2, 16) == [3, 4, 5]
    # no occurrence
    assert d.draft([7, 1, 2, 3, 4, 5, 8, 8, 1], 3, 16) == []


def test_simple_reproduces_repeated_text() -> None:
    rng = random.Random(1)
    text = [rng.randrange(1000) for _ in range(300)]
    history = text + text[:100]
    d = NgramSimple()
    assert d.draft(history, text[100], 64) == text[101:149]  # size_m = 48
    assert d.draft(history, text[100], 16) == text[101:117]
    assert d.draft(history, 1000, 64) == []  # an unseen token


def test_simple_follows_rewritten_history() -> None:
    d = NgramSimple(size_n=2, size_m=2)
    h = [5, 1, 2, 3, 4, 9, 9, 1]
    assert d.draft(h, 2, 8) == [3, 4]
    h2 = [5, 1, 7, 3, 4, 9, 9, 1, 2, 8, 8, 6, 1]  # token 2 changed: the old occurrence is gone
    assert d.draft(h2, 2, 8) == [8, 8]
    assert d.draft(h2[:7] + [1], 2, 8) == []


def test_begin_rechecks_the_whole_history() -> None:
    # draft() only checks the recent end of the history (it grows within a generation); begin() checks it all
    rng = random.Random(6)
    text = [rng.randrange(1000) for _ in range(300)]
    history = text + text[:100]
    for d in (NgramSimple(), NgramMapK4V()):
        d.begin(history)
        assert d.draft(history, text[100], 64) == text[101:149]
        edited = list(history)
        edited[110] = 99999  # far from the end
        d.begin(edited)
        assert d.draft(edited, text[100], 64) == ref_simple_draft(edited, text[100], 12, 48)
        assert d.draft(edited, text[100], 64) == [*text[101:110], 99999, *text[111:149]]


# ----- ngram-map-k / k4v ---------------------------------------------------------------------------------------


def test_map_k_begin_draft_accept() -> None:
    d = NgramMapK(size_n=2, size_m=2)
    t = [9, 1, 2, 3, 4, 5, 6, 1]
    d.begin(t)
    assert (d.size_last_begin, d.idx_last_check) == (8, 8)
    assert d.draft(t, 2, 16) == [3, 4]  # key [1, 2] found at 1 by the descending search of the prompt
    assert len(d.keys) == 1 and d.keys[0].key_idx == 1 and d.keys[0].key_num == 1
    assert d.key_map_last_idx == 3
    d.accept(1)
    assert d.keys[0].n_accepted[0] == 1
    # the hash map finds the key again (at its first stored position); the draft is cut to the 1 accepted
    t2 = [9, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1]
    assert d.draft(t2, 2, 16) == [3]
    assert d.keys[0].key_num == 2
    d.accept(1)
    assert d.stats.n_call_begin == 1 and d.stats.n_call_draft == 2 and d.stats.n_call_accept == 2
    assert d.stats.n_gen_tokens == 3 and d.stats.n_acc_tokens == 2 and d.stats.n_acc_per_pos == [2]
    # accepting 0 silences the key (as upstream: min(size_m, n_accepted) tokens)
    assert d.draft(t2, 2, 16) == [3]
    d.accept(0)
    assert d.draft(t2, 2, 16) == []
    assert d.last_draft_created  # an empty draft from a known key still counts as the last draft upstream


def test_map_k_threshold_and_unsearched_gap() -> None:
    d = NgramMapK(size_n=2, size_m=2)
    assert d.draft([1, 2, 3, 1, 2], 2, 16) == []  # len < 2*size_n + size_m
    # found: key (6, 7) at 1, within the prompt search range (0, size_last_begin - n - m - 1]
    p = [9, 6, 7, 5, 5, 0, 0, 0, 0, 0]
    d.begin(p)
    assert d.draft(p + [1, 1, 1, 6], 7, 16) == [5, 5]
    # not found: upstream searches (key_map_last_idx, size_last_begin - n - m - 1], then
    # (size_last_begin, cur_len - n - m - 1]; a start in between (6 here) is skipped, and stays skipped
    p = [9, 0, 0, 0, 0, 0, 6, 7, 5, 5]
    t = p + [1, 1, 1, 6]
    d, ref = NgramMapK(size_n=2, size_m=2), RefMap(2, 2, True, 1)
    for x in (d, ref):
        x.begin(p)
    assert d.draft(t, 7, 16) == ref.draft(t, 7) == []
    for x in (d, ref):
        x.begin(t)
    assert d.draft(t, 7, 16) == ref.draft(t, 7) == []
    assert NgramSimple(size_n=2, size_m=2).draft(t, 7, 16) == [5, 5]


def test_map_k4v_value_statistics() -> None:
    t = [0, 1, 5, 1, 5, 1, 6, 1, 5, 9, 9]
    d = NgramMapK4V(size_n=1, size_m=1)
    d.begin(t)
    assert d.draft(t, 1, 16) == [5]  # after key 1: value 5 three times, 6 once -> 3 >= 2*1
    key = d.keys[0]
    assert key.key_idx == 7 and key.stat_idx == 7
    assert key.value_idx == [2, 6, 0, 0] and key.value_num == [3, 1, 0, 0]
    d.accept(0)
    assert key.n_accepted == [0, 1, 1, 1]

    # no clear winner: 5 twice, 6 twice -> no draft
    t2 = [0, 1, 5, 1, 6, 1, 6, 1, 5, 9, 9]
    d2 = NgramMapK4V(size_n=1, size_m=1)
    d2.begin(t2)
    assert d2.draft(t2, 1, 16) == []
    assert d2.keys[0].value_num == [2, 2, 0, 0]
    assert not d2.last_draft_created


def test_map_k4v_min_hits() -> None:
    t = [0, 1, 5, 1, 5, 1, 6, 1, 5, 9, 9]
    d = NgramMapK4V(size_n=1, size_m=1, min_hits=2)
    d.begin(t)
    assert d.draft(t, 1, 16) == []  # first hit of the key
    assert d.keys[0].key_num == 1 and d.keys[0].value_num == [0, 0, 0, 0]
    assert d.draft(t + [1], 1, 16) == [5]  # second hit (found through the hash map)
    assert d.keys[0].key_num == 2 and d.keys[0].value_num == [3, 1, 0, 0]
    # a third hit recounts the occurrence at the old match position, as upstream (stat_idx is inclusive)
    assert d.draft(t + [1, 1, 5, 1, 5, 2, 2, 2], 1, 16) == [5]
    assert d.keys[0].value_num == [4, 1, 0, 0]


@pytest.mark.parametrize("seed", range(5))
def test_map_begin_cleanup_after_shorter_history(seed: int) -> None:
    rng = random.Random(seed)
    base = repetitive(rng, 600, 12)
    for cls, key_only in ((NgramMapK, True), (NgramMapK4V, False)):
        d = cls(size_n=2, size_m=3)
        ref = RefMap(2, 3, key_only, 1)
        hist, _ = generate(d, ref, base[:200], base[200:400], 8)
        assert d.keys
        shorter = hist[:150] + [999, 998] + hist[300:330]  # e.g. a removed reasoning block
        d.begin(shorter)
        ref.begin(shorter)
        assert [k.key_idx for k in d.keys] == [k["key_idx"] for k in ref.keys]
        if not key_only:
            assert [k.value_idx for k in d.keys] == [[v[0] for v in k["values"]] for k in ref.keys]
            assert [k.value_num for k in d.keys] == [[v[1] for v in k["values"]] for k in ref.keys]
        assert d.key_map_last_idx == ref.key_map_last_idx
        assert d.key_map == {h: j for h, j in enumerate(ref.key_map) if j}
        generate(d, ref, shorter, base[400:600], 8)  # begins again with the same prompt: no further cleanup


def test_map_draft_without_begin_after_shrink_restarts() -> None:
    # upstream aborts when the history is shorter than at the last call without a begin(); here it restarts
    d = NgramMapK(size_n=2, size_m=2)
    t = [9, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1]
    ref = RefMap(2, 2, True, 1)
    for x in (d, ref):
        x.begin(t)
    assert d.draft(t, 2, 16) == ref.draft(t, 2) == [3, 4]
    ref.begin(t[:8])  # what the driver should have done
    assert d.draft(t[:8], 2, 16) == ref.draft(t[:8], 2)
    assert d.idx_last_check == 8 and d.size_last_begin == 8 and not d.keys  # the key at 7 was cleaned up


# ----- ngram-mod -----------------------------------------------------------------------------------------------


def test_mod_hash_matches_upstream() -> None:
    d = NgramMod(n_match=3, size=1000)
    toks = [5, 70000, 3, 9]
    want = (((5 * 6364136223846793005 + 70000) * 6364136223846793005 + 3) & M64) % 1000
    assert d.idx(toks) == want
    d._add_range(toks, 0, 1)
    assert d.get(toks) == 9 and d.used == 1


def test_mod_hand_computed() -> None:
    d = NgramMod(n_match=2, n_max=3, n_min=1, size=1 << 16)
    d.begin([1, 2, 3, 4, 1, 2])  # (1,2)->3 (2,3)->4 (3,4)->1 (4,1)->2
    assert d.used == 4 and d.i_last == 4
    assert d.draft([1, 2, 3, 4, 1, 2], 3, 16) == [4, 1, 2]  # from (2,3), up to n_max
    assert d.n_draft_last == 3
    assert d.draft([1, 2, 3, 4, 1, 2], 3, 2) == [4, 1]  # truncated by draft()'s n_max
    assert d.n_draft_last == 2  # the acceptance fraction is of the capped draft (upstream: of the uncapped one)
    d.accept(1)  # 1 of the 2 verified: not low
    assert d.n_low == 0
    assert d.draft([1, 2, 3, 4, 1, 2], 7, 16) == []  # (2,7) unknown

    d2 = NgramMod(n_match=2, n_max=4, n_min=3, size=1 << 16)
    d2.begin([5, 6, 7, 8])  # (5,6)->7 (6,7)->8
    assert d2.draft([5, 6, 7, 8, 0, 5], 6, 16) == []  # 2 tokens < n_min 3
    d3 = NgramMod(n_match=2, n_max=4, n_min=2, size=1 << 16)
    d3.begin([5, 6, 7, 8])
    assert d3.draft([5, 6, 7, 8, 0, 5], 6, 16) == [7, 8]
    assert d3.draft([5], 6, 16) == []  # len(tokens) < n_match
    assert NgramMod(n_match=3, size=64).draft([1], 2, 8) == []  # len(tokens) < n_match


def test_mod_adds_new_ngrams_in_chunks() -> None:
    d = NgramMod(n_match=2, n_max=2, n_min=1, size=1 << 16)
    hist = [1, 2, 3]
    d.begin(hist)
    assert d.i_last == 1
    hist += list(range(10, 42))  # 35 tokens: i_last + 32 < 35
    assert d.draft(hist, 11, 8) == []  # (41, 11) is not known
    assert d.i_last == 33 and d.used == 33
    assert d.draft(hist, 10, 8) == []  # (41, 10) unknown
    assert d.draft([*hist[:-1], 10], 11, 8) == [12, 13]


def test_mod_resets_on_occupancy() -> None:
    d = NgramMod(n_match=1, n_max=4, n_min=1, size=8)
    d.begin([1, 2])  # one entry: 1/8 <= 0.25
    assert d.used == 1
    d.begin([1, 2, 3])  # (2)->3: 2/8 = 0.25, not above
    assert d.used == 2
    d.begin([1, 2, 3, 4])  # 3/8 > 0.25: cleared after adding
    assert d.used == 0 and (d.table == -1).all() and d.i_last == 3


def test_mod_resets_after_five_low_acceptance_rounds() -> None:
    d = NgramMod(n_match=2, n_max=4, n_min=1, size=1 << 16)
    hist = [1, 2, 3, 4, 5, 6, 1, 2]
    d.begin(hist)
    used = d.used
    for i in range(4):
        assert d.draft(hist, 3, 16) == [4, 5, 6, 1]
        d.accept(0)
        assert d.n_low == i + 1
    assert d.draft(hist, 3, 16) == [4, 5, 6, 1]
    d.accept(1)  # 1/4 = 0.25 is not low: the streak ends
    assert d.n_low == 0 and d.used == used
    for _ in range(4):
        d.draft(hist, 3, 16)
        d.accept(0)
    assert d.used == used and d.n_low == 4
    d.draft(hist, 3, 16)
    d.accept(0)
    assert d.used == 0 and d.n_low == 0 and d.i_last == 0 and (d.table == -1).all()
    assert d.draft(hist, 3, 16) == []
    # an empty draft leaves the streak alone
    d.accept(0)
    assert d.n_low == 0


def test_mod_low_acceptance_is_measured_on_the_capped_draft() -> None:
    text = list(range(100, 200))
    d = NgramMod(n_match=4, n_max=64, n_min=48, size=1 << 16)
    history = text * 2
    d.begin(history)
    for _ in range(6):
        draft = d.draft(history, text[0], 8)
        assert len(draft) == 8  # 64 proposed, 8 kept
        d.accept(2)  # 2/8 = 0.25 is not low (2/64 would be)
    assert d.n_low == 0 and d.used > 0
    for _ in range(5):
        d.draft(history, text[0], 8)
        d.accept(1)
    assert d.used == 0  # 1/8 five times in a row: cleared


def test_mod_bulk_add_matches_sequential() -> None:
    rng = random.Random(3)
    toks = repetitive(rng, 3000, 40)
    for size in (97, 4096, 1 << 20):
        a = NgramMod(n_match=4, size=size)
        b = NgramMod(n_match=4, size=size)
        a._add_range(toks, 0, len(toks) - 4)  # numpy path
        for i in range(0, len(toks) - 4, 100):  # rolling path, in pieces
            b._add_range(toks, i, min(i + 100, len(toks) - 4))
        ref = RefMod(4, size, 64, 48)
        for i in range(len(toks) - 4):
            ref.add(toks[i:])
        assert a.used == b.used == ref.used
        assert (a.table == b.table).all()
        assert {int(i): int(a.table[i]) for i in np.flatnonzero(a.table != -1)} == ref.entries


def test_mod_reproduces_repeated_text() -> None:
    rng = random.Random(2)
    text = [rng.randrange(5000) for _ in range(300)]
    d = NgramMod()
    history = text + text[:100]
    d.begin(history)
    assert d.draft(history, text[100], 100) == text[101:165]  # n_max 64
    assert d.draft(history, text[100], 16) == text[101:117]


# ----- ngram-cache ---------------------------------------------------------------------------------------------


def test_cache_hand_computed() -> None:
    d = NgramCache()
    assert d.draft([1, 2, 3, 1, 2, 3, 1, 2], 3, 16) == [1, 2, 3, 1, 2, 3, 1, 2]  # n_draft 8
    assert d.cache_size == 9
    assert d.nc_context[(3, 1, 2, 3)] == {1: 1}
    assert d.nc_context[(1, 2, 3, 1)] == {2: 2}
    assert d.nc_context[(3, -1, -1, -1)] == {1: 2}
    d2 = NgramCache()
    assert d2.draft([1, 2, 3, 1, 2, 3, 1, 2], 3, 5) == [1, 2, 3, 1, 2]
    # a 1-gram needs 2 samples (lax thresholds): (5)->{6: 1} is not enough
    assert NgramCache().draft([5, 6], 5, 16) == []
    # 3- and 4-grams need only 1 sample: the alternation goes on up to n_draft
    assert NgramCache().draft([5, 6, 5, 6], 5, 16) == [6, 5, 6, 5, 6, 5, 6, 5]
    assert NgramCache().draft([], 5, 16) == []


def test_cache_update_counts_within_the_new_tokens_only() -> None:
    d = NgramCache()
    d.draft([1, 2, 3], 4, 8)
    assert d.cache_size == 4
    d.draft([1, 2, 3, 4, 5], 6, 8)  # new tokens [5, 6]: (4)->5 spans the boundary and is not counted
    assert (4, -1, -1, -1) not in d.nc_context
    assert d.nc_context[(5, -1, -1, -1)] == {6: 1}
    assert d.cache_size == 6
    d.draft([1, 2, 3], 4, 8)  # shorter history: no update (as upstream, begin() does not reset)
    assert d.cache_size == 6


def test_cache_update_matches_reference() -> None:
    rng = random.Random(7)
    toks = repetitive(rng, 2000, 30)
    a: NgramCacheTable = {}
    b: NgramCacheTable = {}
    ngram_cache_update(a, 1, 4, toks, len(toks))
    ref_cache_update(b, 1, 4, toks, len(toks))
    assert a == b
    assert all(list(a[g]) == list(b[g]) for g in a)  # same insertion order (tie-breaks)
    ngram_cache_update(a, 1, 4, toks + [1, 2, 3], 3)
    ref_cache_update(b, 1, 4, toks + [1, 2, 3], 3)
    assert a == b


def test_cache_file_format(tmp_path: Path) -> None:
    # two records as llama-lookup-create writes them: int32 ngram[4], int32 n, n x (int32 token, int32 count)
    raw = struct.pack("<4ii", 7, 8, -1, -1, 2) + struct.pack("<4i", 9, 3, 10, 1)
    raw += struct.pack("<4ii", 8, 9, -1, -1, 1) + struct.pack("<2i", 11, 2)
    path = tmp_path / "static.bin"
    path.write_bytes(raw)
    cache = load_ngram_cache(path)
    assert cache == {(7, 8, -1, -1): {9: 3, 10: 1}, (8, 9, -1, -1): {11: 2}}
    out = tmp_path / "out.bin"
    save_ngram_cache(cache, out)
    assert out.read_bytes() == raw
    (tmp_path / "bad.bin").write_bytes(raw[:-4])
    with pytest.raises(ValueError):
        load_ngram_cache(tmp_path / "bad.bin")

    # the static cache drafts on its own: (7, 8) -> 9 (3 of 4), then (8, 9) -> 11
    d = NgramCache(lookup_cache_static=path)
    assert d.draft([1, 7], 8, 16) == [9, 11]
    # the dynamic cache uses the strict thresholds: (7, 8) -> {9: 3, 10: 1} is 75 % of 4 samples (>= 66 %, >= 3),
    # but (8, 9) -> {11: 2} has fewer than 3 samples
    d2 = NgramCache(lookup_cache_dynamic=path)
    assert d2.draft([1, 7], 8, 16) == [9]


def test_cache_reproduces_repeated_text() -> None:
    rng = random.Random(4)
    text = [rng.randrange(5000) for _ in range(300)]
    history = text + text[:100]
    assert NgramCache().draft(history, text[100], 16) == text[101:109]


# ----- all drafters against the literal upstream ports -----------------------------------------------------


def _cases() -> list[tuple[str, Callable[[], tuple[Drafter, Any]]]]:
    return [
        ("simple-2-3", lambda: (NgramSimple(2, 3), RefSimple(2, 3))),
        ("simple-default", lambda: (NgramSimple(), RefSimple(12, 48))),
        ("simple-1-1", lambda: (NgramSimple(1, 1), RefSimple(1, 1))),
        ("map-k-2-3", lambda: (NgramMapK(2, 3), RefMap(2, 3, True, 1))),
        ("map-k-default", lambda: (NgramMapK(), RefMap(12, 48, True, 1))),
        ("map-k4v-2-3", lambda: (NgramMapK4V(2, 3), RefMap(2, 3, False, 1))),
        ("map-k4v-1-2-hits2", lambda: (NgramMapK4V(1, 2, 2), RefMap(1, 2, False, 2))),
        ("map-k4v-default", lambda: (NgramMapK4V(), RefMap(12, 48, False, 1))),
        ("mod-3", lambda: (NgramMod(3, 8, 2, size=509), RefMod(3, 509, 8, 2))),
        ("mod-2-small", lambda: (NgramMod(2, 6, 0, size=64), RefMod(2, 64, 6, 0))),
        ("mod-default", lambda: (NgramMod(24, 64, 48, size=1 << 20), RefMod(24, 1 << 20, 64, 48))),
        ("cache", lambda: (NgramCache(), RefCache())),
    ]


@pytest.mark.parametrize("case", _cases(), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_upstream_over_multi_turn_chats(case: tuple[str, Callable[[], tuple[Drafter, Any]]], seed: int) -> None:
    label, factory = case
    drafter, ref = factory()
    rng = random.Random(seed)
    vocab = 8 if "1-" in label or "2-" in label else 60
    story = repetitive(rng, 2600, vocab)
    total = 0
    # turn 1
    hist, n = generate(drafter, ref, story[:300], story[300:700], 16)
    total += n
    # turn 2: the history plus a new user message
    hist, n = generate(drafter, ref, hist + story[700:760], story[760:1200], 10, as_array=True)
    total += n
    # turn 3: a middle block removed (shorter than the last check), then a long generation
    edited = hist[:200] + hist[400:500] + story[1200:1250]
    hist, n = generate(drafter, ref, edited, story[1250:2000], 64)
    total += n
    # turn 4: a much shorter, unrelated prompt
    hist, n = generate(drafter, ref, story[2000:2060], story[2060:2600], 3)
    total += n
    assert total > 0 or label.startswith("mod-default") or label == "simple-default"
    check_stats(drafter.stats)
    assert drafter.stats.n_call_begin == 4
    assert drafter.stats.n_gen_drafts == total


@pytest.mark.parametrize("key_only", [True, False])
def test_map_matches_upstream_with_hash_collisions(monkeypatch: pytest.MonkeyPatch, key_only: bool) -> None:
    monkeypatch.setattr(ngram_map, "COMMON_NGRAM_HASH_MAP_SIZE", 16)
    rng = random.Random(11)
    story = repetitive(rng, 2000, 10)
    d: Drafter = NgramMapK(2, 2) if key_only else NgramMapK4V(2, 2)
    ref = RefMap(2, 2, key_only, 1, hash_size=16)
    hist, n1 = generate(d, ref, story[:400], story[400:900], 8)
    hist, n2 = generate(d, ref, hist[:250] + story[900:950], story[950:1500], 8)
    assert n1 + n2 > 0
    check_stats(d.stats)


# ----- the shared frame ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NGRAM_DRAFTERS))
def test_stats_and_accept_bookkeeping(name: str) -> None:
    params: dict[str, Any] = {"size": 1 << 16} if name == "ngram-mod" else {}
    d = make_ngram_drafter(name, **params)
    rng = random.Random(9)
    text = [rng.randrange(3000) for _ in range(200)]
    history = text * 3
    d.begin(history)
    draft = d.draft(history, text[0], 8)
    assert 0 < len(draft) <= 8
    assert d.stats.n_call_begin == 1 and d.stats.n_call_draft == 1
    assert d.stats.n_gen_drafts == 1 and d.stats.n_gen_tokens == len(draft)
    assert d.stats.n_gen_per_pos == [1] * len(draft)
    with pytest.raises(ValueError, match="accepted"):
        d.accept(len(draft) + 1)
    with pytest.raises(ValueError):
        d.accept(-1)
    d.accept(3)
    assert d.stats.n_call_accept == 1 and d.stats.n_acc_tokens == 3 and d.stats.n_acc_per_pos == [1, 1, 1]
    assert d.stats.mean_accepted_length == 4.0
    assert d.draft(history, text[0], 0) == []
    d.accept(0)  # after an empty draft only 0 can be accepted
    with pytest.raises(ValueError):
        d.accept(1)
    check_stats(d.stats)
    quiet = make_ngram_drafter(name, record_stats=False, **params)
    quiet.begin(history)
    quiet.draft(history, text[0], 8)
    quiet.accept(1)
    assert quiet.stats == DrafterStats()


@pytest.mark.parametrize("name", list(NGRAM_DRAFTERS))
def test_does_not_modify_or_keep_the_callers_list(name: str) -> None:
    params: dict[str, Any] = {"size": 1 << 16} if name == "ngram-mod" else {}
    d = make_ngram_drafter(name, **params)
    rng = random.Random(10)
    text = [rng.randrange(3000) for _ in range(100)]
    history = text * 3
    snapshot = list(history)
    d.begin(history)
    first = d.draft(history, text[0], 8)
    assert history == snapshot
    first.append(-5)  # the returned draft is the caller's own list
    assert d.draft(history, text[0], 8) == first[:-1]
