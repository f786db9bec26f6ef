"""Sampling parameters and llama.cpp's native sampler chain built from them."""

from __future__ import annotations

from typing import Any

from engine_ext.bindings import C
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, SamplingParams

__all__ = ["GREEDY", "Sampler", "SamplingParams"]

class Sampler:
    """A native llama_sampler chain; `sample()` reads one logits row, samples and accepts the token."""

    def __init__(self, model: Model, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        chain: Any = C.llama_sampler_chain_init(chain_params)
        self._chain: Any = chain
        add = C.llama_sampler_chain_add
        penalized = (
            params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        )
        if penalized and params.repeat_last_n != 0:
            add(
                chain,
                C.llama_sampler_init_penalties(
                    params.repeat_last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                ),
            )
        if params.greedy:
            add(chain, C.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(chain, C.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(chain, C.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(chain, C.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, C.llama_sampler_init_temp(params.temperature))
        add(chain, C.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """Sample from the logits of output row `idx` (-1: the last one) and accept the token."""
        return int(C.llama_sampler_sample(self._chain, ctx.handle, idx))

    def accept(self, token: int) -> None:
        """Feed a token the sampler did not pick (prompt history for the penalties)."""
        C.llama_sampler_accept(self._chain, token)

    def reset(self) -> None:
        C.llama_sampler_reset(self._chain)

    def close(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
