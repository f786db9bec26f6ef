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

This module is the package's public surface (the factory and tests import from it); the code lives in private
modules by job: ``_base`` (token lists, parameter checks, the n-gram index, the drafter frame), ``_map``
(ngram-simple, ngram-map-k, ngram-map-k4v), ``_mod`` (ngram-mod) and ``_cache`` (ngram-cache and its file format).
"""

from __future__ import annotations

from engine_ext.speculative.base import Drafter
from engine_ext.speculative.ngram._cache import (
    NgramCache,
    NgramCacheTable,
    load_ngram_cache,
    ngram_cache_update,
    save_ngram_cache,
)
from engine_ext.speculative.ngram._map import NgramMapK, NgramMapK4V, NgramSimple
from engine_ext.speculative.ngram._mod import NgramMod

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

# The drafters by upstream type name, and auto mode's prompt lookup

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
