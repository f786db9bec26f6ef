"""ngram-cache: common/ngram-cache.cpp (the cache, its file format) and speculative.cpp's impl."""

from __future__ import annotations

import struct
from itertools import repeat
from os import PathLike
from pathlib import Path

from engine_ext.private_files import write_private_bytes
from engine_ext.speculative.ngram._base import LLAMA_TOKEN_NULL, NgramDrafter, check_range

# common/ngram-cache.h / ngram-cache.cpp
LLAMA_NGRAM_MIN = 1  # ngram-cache.h:9
LLAMA_NGRAM_MAX = 4  # ngram-cache.h:10
LLAMA_NGRAM_STATIC = 2  # ngram-cache.h:11
DRAFT_MIN_SAMPLE_SIZE_LAX = (2, 2, 1, 1)  # ngram-cache.cpp:60
DRAFT_MIN_PERCENT_LAX = (66, 50, 50, 50)  # ngram-cache.cpp:61
DRAFT_MIN_SAMPLE_SIZE_STRICT = (4, 3, 2, 2)  # ngram-cache.cpp:62
DRAFT_MIN_PERCENT_STRICT = (75, 66, 66, 66)  # ngram-cache.cpp:63
NGRAM_CACHE_N_DRAFT = 8  # speculative.cpp:2191 (`uint16_t n_draft = 8; // TODO get from config?`)

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


class NgramCache(NgramDrafter):
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
        self.n_draft = check_range("n_draft", n_draft, 0, 0xFFFF)
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
