"""Sampling parameters and llama.cpp's native sampler chain built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_ext.bindings import C
from engine_ext.model import Context, EngineError, Model

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed per generation


@dataclass(frozen=True)
class SamplingParams:
    """A sampling preset (llama.cpp names); temperature 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be ≥ 0, not {self.temperature}")
        if self.top_k < 0:
            raise EngineError(f"top-k must be ≥ 0 (0 disables it), not {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise EngineError(f"top-p must be between 0 and 1, not {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise EngineError(f"min-p must be between 0 and 1, not {self.min_p}")
        if self.repeat_penalty <= 0:
            raise EngineError(f"repeat penalty must be > 0 (1 disables it), not {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise EngineError("repeat-last-n must be -1 (whole context), 0 (off) or positive")


GREEDY = SamplingParams(temperature=0.0)


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
