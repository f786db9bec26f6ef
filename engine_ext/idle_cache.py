"""Idle sequences' caches kept in host memory, out of a unified KV cache (llama-server's --cache-idle-slots).

With one KV buffer shared by the parallel sequences (kv_unified), every decode step attends over the cells up to the
highest one in use (llama_kv_cache::get_n_kv), the idle sequences' cells included: masked out, but read, so a lone
request on a server that served four decoded at 0.83x of the single-sequence path's speed (starter model, 2
threads; scripts/bench_parallel.py's "1 after N, kept" column). llama-server saves idle slots to its host prompt
cache and clears them from the KV cache when a task starts; so does the scheduler here, and a request whose prompt
starts with a saved one gets that state back (llama_state_seq_set_data: the same K/V values, nothing recomputed).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from engine_ext.bindings import C
from engine_ext.model import Context

IDLE_CACHE_MAX_BYTES = 2 << 30  # host memory the saved states may take (llama-server's --cache-ram: 8 GiB)


Key = tuple[Hashable, tuple[int, ...]]  # (what the state was computed under: the steering mix, the tokens it holds)


class IdleCache:
    """Saved sequence states by the steering they were computed under and the tokens they hold, least recently used
    first; bounded by `max_bytes`."""

    def __init__(self, max_bytes: int = IDLE_CACHE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.n_bytes = 0
        # The ctypes buffers llama.cpp wrote, kept as they are: no copy on the way in or out.
        self._states: OrderedDict[Key, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def clear(self) -> None:
        self._states.clear()
        self.n_bytes = 0

    def save(self, ctx: Context, seq: int, tokens: Sequence[int], mix: Hashable = ()) -> bool:
        """Keep sequence `seq`'s state (holding `tokens`, computed under the steering `mix`); False when it is larger
        than the whole budget."""
        size = int(C.llama_state_seq_get_size_ext(ctx.handle, seq, 0))
        if size <= 0 or size > self.max_bytes:
            return False
        buf = (ctypes.c_uint8 * size)()
        if int(C.llama_state_seq_get_data_ext(ctx.handle, buf, size, seq, 0)) != size:
            return False
        key: Key = (mix, tuple(tokens))
        self._drop(key)
        while self._states and self.n_bytes + size > self.max_bytes:
            self._drop(next(iter(self._states)))
        self._states[key] = buf
        self.n_bytes += size
        return True

    def keys(self, mix: Hashable = ()) -> list[tuple[int, ...]]:
        """The token sequences of the states saved under `mix` (a state from another mix is not this one's cache)."""
        return [tokens for saved_mix, tokens in self._states if saved_mix == mix]

    def restore(self, ctx: Context, tokens: tuple[int, ...], seq: int, mix: Hashable = ()) -> bool:
        """Put the state saved for `tokens` under `mix` into sequence `seq` (empty before) and forget it here; False:
        refused."""
        key: Key = (mix, tokens)
        buf = self._states[key]
        self._drop(key)
        size = len(buf)
        return int(C.llama_state_seq_set_data_ext(ctx.handle, buf, size, seq, 0)) == size

    def _drop(self, key: Key) -> None:
        data = self._states.pop(key, None)
        if data is not None:
            self.n_bytes -= len(data)
