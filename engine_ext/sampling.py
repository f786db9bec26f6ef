"""Sampling parameters and llama.cpp's native sampler chain built from them."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_ext import settings_schema as s
from engine_ext.bindings import C, logits_address
from engine_ext.engine_status import entered, left, phase
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, EngineError, SamplingParams

__all__ = ["GREEDY", "BackendSamplingError", "FloatRows", "Sampler", "SamplingParams"]

BLOCK_ROWS = 4  # the most verify rows read per numpy call…
LONG_RUN_ROWS = 16  # …until this many rows in a row were accepted: then blocks double (a long draft is likely to hold)
VERIFY_RESERVE_ROWS = 128  # rows of the logits view kept for verification (a view of more is made when needed)


class FloatRows:
    """Zero-copy (n_rows, width) float32 views of native buffers (logits, hidden states), valid until the buffer
    changes (the next decode). One view per buffer address is kept, at least `reserve` rows tall, and the rows
    asked for are a slice of it (a plain step's one row and a verify step's n alternate on the same logits
    buffer): making a view costs tens of microseconds right after a decode has pushed Python's data out of the
    caches. The view may reach past the buffer's end, but only the rows asked for are ever read, so a slice is
    safe whatever the buffer's size is now.
    """

    __slots__ = ("width", "reserve", "_addr", "_rows", "_view")

    def __init__(self, width: int, reserve: int = 1) -> None:
        self.width = width
        self.reserve = reserve
        self._addr = 0
        self._rows = 0  # rows of the kept view
        self._view: np.ndarray = np.empty((0, width), dtype=np.float32)

    def __call__(self, ptr: Any, n_rows: int = 1) -> np.ndarray:
        """Rows 0..n_rows-1 of the buffer at `ptr` (a ctypes pointer or an int address)."""
        addr = ptr if type(ptr) is int else ctypes.cast(ptr, ctypes.c_void_p).value or 0
        if addr != self._addr or n_rows > self._rows:
            rows = max(n_rows, self.reserve)
            buf = (ctypes.c_float * (rows * self.width)).from_address(addr)
            self._view = np.frombuffer(memoryview(buf), dtype=np.float32).reshape(rows, self.width)
            self._addr, self._rows = addr, rows
        return self._view[:n_rows]


def _changes_anything(name: str, p: SamplingParams) -> bool:
    """Whether sampler `name` changes anything with these parameters (one that does not stays out of the chain)."""
    if name == "penalties":
        return (p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and bool(
            p.repeat_last_n
        )
    switched = {
        "dry": p.dry_multiplier > 0.0 and p.dry_penalty_last_n > 0,
        "top_n_sigma": p.top_n_sigma >= 0.0,
        "top_k": p.top_k > 0,
        "typ_p": p.typical_p < 1.0,
        "top_p": p.top_p < 1.0,
        "min_p": p.min_p > 0.0,
        "xtc": p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5,
        "temperature": True,
    }
    return switched.get(name, False)


class Sampler:
    """A native llama_sampler chain; `sample()` reads one logits row, samples and accepts the token.

    A pure greedy chain (temperature 0 and no penalties) is stateless and picks the first index of the largest
    logit (llama-sampler.cpp `llama_sampler_greedy_apply`), exactly as numpy's argmax does: then rows are read
    straight from the context's logits buffer, in growing blocks and only about as far as verification goes, without
    building the n_vocab-entry candidate array the native chain needs for every row. When the context samples
    greedily on the backend (`Context.backend_greedy`), the rows hold token ids already and only those are read.
    """

    def __init__(
        self,
        model: Model,
        params: SamplingParams,
        grammar: str | None = None,
        triggers: Sequence[str] = (),
        root: str = "root",
    ) -> None:
        """`grammar`: GBNF text (engine_ext.grammar) the output must follow; its sampler comes first in the chain,
        and only tokens the chain picks advance it (not the prompt history fed to `accept`). With `triggers` (regex
        patterns) the grammar is lazy: it applies from the first capture group of the first pattern the output
        matches on (llama_sampler_init_grammar_lazy_patterns; engine_ext.tool_grammar)."""
        params.validate()
        self.params = params
        self._logits = FloatRows(model.n_vocab, VERIFY_RESERVE_ROWS)
        self._grammar: _Grammar | None = None
        if grammar is not None:
            self._grammar = _Grammar(model, grammar, triggers, root)
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain: Any = C.llama_sampler_chain_init(chain_params)
        self._breakers: Any = None  # DRY's sequence breakers, kept alive with the chain
        # The samplers in the request's order that change anything (common/sampling.cpp's chain; mirostat takes the
        # place of all but the penalties and DRY, as upstream's does not run them at all: here they shape its logits).
        used = [name for name in params.samplers if _changes_anything(name, params)]
        shaping = [name for name in used if name in ("penalties", "dry")]
        # Only the greedy sampler in the chain (no penalties, no grammar): argmax of the raw logits is its choice.
        self.pure_greedy = params.greedy and not shaping and self._grammar is None
        self._greedy = params.greedy and not shaping  # argmax, grammar or not
        seed = params.seed & 0xFFFFFFFF
        if params.greedy:
            for name in shaping:
                self._add(model, name, params)
            self._append(C.llama_sampler_init_greedy())
        elif params.mirostat:
            for name in shaping:
                self._add(model, name, params)
            self._append(C.llama_sampler_init_temp(params.temperature))
            tau, eta = params.mirostat_tau, params.mirostat_eta
            if params.mirostat == 1:
                self._append(C.llama_sampler_init_mirostat(model.n_vocab, seed, tau, eta, 100))
            else:
                self._append(C.llama_sampler_init_mirostat_v2(seed, tau, eta))
        else:
            for name in used:
                self._add(model, name, params)
            self._append(C.llama_sampler_init_dist(seed))

    def _append(self, sampler: Any) -> None:
        C.llama_sampler_chain_add(self._chain, sampler)

    def _add(self, model: Model, name: str, p: SamplingParams) -> None:
        """Sampler `name` at the chain's end, as common/sampling.cpp makes it (min_keep 1 where it takes one)."""
        if name == "penalties":
            # llama.h 0.3.36: n_vocab comes first
            penalties = (p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
            self._append(C.llama_sampler_init_penalties(model.n_vocab, *penalties))
        elif name == "dry":
            breakers = [text.encode("utf-8") for text in p.dry_sequence_breakers]
            self._breakers = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
            base = p.dry_base if p.dry_base >= 1.0 else s.DRY_BASE.default  # llama-server's: below 1, the default
            dry = (p.dry_multiplier, base, p.dry_allowed_length, p.dry_penalty_last_n)
            self._append(C.llama_sampler_init_dry(model.vocab, *dry, self._breakers, len(breakers)))
        elif name == "top_n_sigma":
            self._append(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        elif name == "top_k":
            self._append(C.llama_sampler_init_top_k(p.top_k))
        elif name == "typ_p":
            self._append(C.llama_sampler_init_typical(p.typical_p, 1))
        elif name == "top_p":
            self._append(C.llama_sampler_init_top_p(p.top_p, 1))
        elif name == "min_p":
            self._append(C.llama_sampler_init_min_p(p.min_p, 1))
        elif name == "xtc":
            self._append(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, p.seed & 0xFFFFFFFF))
        elif name == "temperature":
            self._append(C.llama_sampler_init_temp(p.temperature))

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """Sample from the logits of output row `idx` (-1: the last one) and accept the token."""
        previous = entered("sample")  # the phase the client sees (engine_ext.engine_status)
        token = self._sample(ctx, idx)
        left(previous)
        return token

    def _sample(self, ctx: Context, idx: int) -> int:
        if self._grammar is not None:
            return self._sample_constrained(ctx, idx)
        if self.pure_greedy:
            if ctx.backend_greedy:
                return _backend_token(ctx, idx)
            # After a one-output decode the last row is the buffer's first: its address read as an int costs no
            # pointer object and cast (tens of µs right after a decode has cooled the caches).
            ptr = (
                logits_address(ctx.handle) if idx == -1 and ctx.one_output else C.llama_get_logits_ith(ctx.handle, idx)
            )
            if ptr:
                return int(self._logits(ptr, 1)[0].argmax())
        return int(C.llama_sampler_sample(self._chain, ctx.handle, idx))

    def sample_and_accept_n(self, ctx: Context, draft: Sequence[int], first_eog: int) -> list[int]:
        with phase("sample"):
            return self._sample_and_accept_n(ctx, draft, first_eog)

    def _sample_and_accept_n(self, ctx: Context, draft: Sequence[int], first_eog: int) -> list[int]:
        """Verify a draft whose batch gave output rows 0..len(draft) (common_sampler_sample_and_accept_n).

        Row i is sampled and accepted; verification stops at the first sample that differs from draft[i], or
        at an end-of-generation token before the last draft position; a fully matching draft also gets the
        sample of row len(draft). Returns the sampled tokens: the accepted draft prefix plus one target token.
        Rows are read only about as far as the first rejection (most of a long draft usually is rejected).
        `first_eog` is the index of the first end-of-generation token in draft[:-1] (len(draft) - 1 or more:
        none); the caller finds it before decoding the batch, while Python's data is still in the caches.
        """
        n = len(draft)
        # The last row to sample: an accepted end-of-generation draft token ends verification as a rejection does.
        last = first_eog if first_eog < n - 1 else n
        ids: list[int] = []
        if self.pure_greedy:
            if ctx.backend_greedy:
                for i in range(last + 1):
                    t = _backend_token(ctx, i)
                    ids.append(t)
                    if i == last or t != draft[i]:
                        break
                return ids
            addr = logits_address(ctx.handle)
            if addr:
                # Argmax of rows 0, 1-2, 3-6, 7-10, 11-14, 15-18, then 19-26, 27-42, ...: a block per numpy call,
                # doubling up to BLOCK_ROWS, so at most BLOCK_ROWS - 1 rows read past an early rejection are wasted
                # (a few us each). Past LONG_RUN_ROWS accepted rows blocks double on: a long accepted run (ngram-mod
                # copies 48-64 tokens at a time) costs few calls (each ~10 us right after a decode), and the rows
                # wasted past a late rejection are fewer than those accepted before it.
                kept = self._logits
                rows = kept._view if addr == kept._addr and n < kept._rows else kept(addr, n + 1)  # FloatRows inline
                start, size = 0, 1
                while True:
                    stop = min(last + 1, start + size)
                    best: list[int] = rows[start:stop].argmax(axis=1).tolist()
                    for i, t in enumerate(best, start):
                        if i == last or t != draft[i]:
                            ids += best[: i + 1 - start]
                            return ids
                    ids += best
                    start = stop
                    size = size * 2 if start >= LONG_RUN_ROWS else min(size * 2, BLOCK_ROWS)
        if self._grammar is not None:
            for i in range(last + 1):
                t = self._sample_constrained(ctx, i)
                ids.append(t)
                if i == last or t != draft[i]:
                    break
            return ids
        chain, handle, sample = self._chain, ctx.handle, C.llama_sampler_sample
        for i in range(last + 1):
            t = int(sample(chain, handle, i))
            ids.append(t)
            if i == last or t != draft[i]:
                break
        return ids

    def accept(self, token: int) -> None:
        """Feed a token the sampler did not pick (prompt history for the penalties); a grammar does not see it."""
        C.llama_sampler_accept(self._chain, token)

    def feed_prompt_history(self, prompt: Sequence[int]) -> None:
        """The prompt's last tokens (repeat_last_n of them) for a penalizing chain, as llama.cpp's samplers see them;
        an image's positions (negative ids, engine_ext.vision) are not tokens."""
        params = self.params
        if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            window = params.repeat_last_n if params.repeat_last_n > 0 else len(prompt)
            for t in prompt[-window:]:
                if t >= 0:
                    self.accept(t)

    def accept_forced(self, token: int) -> None:
        """Feed a token the engine forced (the end of thinking) as if the chain had picked it: the penalties count it,
        and a grammar advances over it where it allows it (a lazy grammar not yet triggered allows anything)."""
        with phase("sample"):
            grammar = self._grammar
            if grammar is not None and grammar.allows(token):
                grammar.accept(token)
            C.llama_sampler_accept(self._chain, token)

    def _sample_constrained(self, ctx: Context, idx: int) -> int:
        """Sample row `idx` under the grammar as upstream's common_sampler_sample does (grammar_first off): the
        chain picks from the raw logits; only when the grammar refuses that token are all candidates filtered by the
        grammar and the chain run again. Checking one token costs microseconds; filtering 50k costs milliseconds."""
        grammar = self._grammar
        assert grammar is not None
        ptr = C.llama_get_logits_ith(ctx.handle, idx)
        if not ptr:
            raise EngineError(f"no logits for output row {idx}")
        logits = self._logits(ptr, 1)[0]
        if self._greedy:
            token = int(logits.argmax())
            if not grammar.allows(token):
                token = grammar.best_allowed(logits)
        else:
            token = grammar.sample_with(self._chain, logits)
        grammar.accept(token)
        C.llama_sampler_accept(self._chain, token)
        return token

    def reset(self) -> None:
        C.llama_sampler_reset(self._chain)

    def close(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            self._grammar.close()
            self._grammar = None


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class _Grammar:
    """llama.cpp's grammar sampler beside the chain, with the candidate arrays it filters (llama_token_data_array
    over numpy memory: filled from a logits row without a Python loop)."""

    def __init__(self, model: Model, grammar: str, triggers: Sequence[str] = (), root: str = "root") -> None:
        from engine_ext.grammar import GrammarError, native_log_size, parse_error
        from engine_ext.grammar_bounds import check_bounds

        check_bounds(
            grammar, root
        )  # every grammar, given, converted or built for tool calls, before llama.cpp reads it
        log_size = native_log_size()
        previous = entered("grammar")  # llama.cpp parses the grammar here (engine_ext.engine_status)
        if triggers:
            # const char ** trigger_patterns, size_t n, const llama_token * trigger_tokens, size_t n
            patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
            handle = C.llama_sampler_init_grammar_lazy_patterns(
                model.vocab, grammar.encode(), root.encode(), patterns, len(triggers), None, 0
            )
        else:
            handle = C.llama_sampler_init_grammar(model.vocab, grammar.encode(), root.encode())
        left(previous)
        if not handle:
            raise GrammarError(f"the grammar does not parse: {parse_error(log_size)}")
        self.handle: Any = handle
        self._all = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
        self._all["id"] = np.arange(model.n_vocab, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._all_array = self._array(self._all)
        self._one_array = self._array(self._one)

    @staticmethod
    def _array(data: np.ndarray) -> Any:
        pointer = ctypes.cast(data.ctypes.data, C.llama_token_data_p)
        return C.llama_token_data_array(pointer, len(data), -1, False)

    def allows(self, token: int) -> bool:
        one, array = self._one, self._one_array
        one[0] = (token, 1.0, 0.0)
        array.size, array.selected, array.sorted = 1, -1, False
        C.llama_sampler_apply(self.handle, ctypes.byref(array))
        return bool(np.isfinite(one[0]["logit"]))

    def _filtered(self, logits: np.ndarray) -> Any:
        """Every candidate, with the grammar's refusals at -inf."""
        data, array = self._all, self._all_array
        data["id"] = np.arange(len(data), dtype=np.int32)  # a chain may have sorted the array last time
        data["logit"] = logits
        data["p"] = 0.0
        array.size, array.selected, array.sorted = len(data), -1, False
        C.llama_sampler_apply(self.handle, ctypes.byref(array))
        return array

    def best_allowed(self, logits: np.ndarray) -> int:
        self._filtered(logits)
        return int(self._all["id"][int(self._all["logit"].argmax())])

    def sample_with(self, chain: Any, logits: np.ndarray) -> int:
        """The chain's pick from the raw logits if the grammar allows it, else its pick among what the grammar
        allows (upstream's resampling)."""
        data, array = self._all, self._all_array
        data["id"] = np.arange(len(data), dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        array.size, array.selected, array.sorted = len(data), -1, False
        C.llama_sampler_apply(chain, ctypes.byref(array))
        token = int(data["id"][array.selected])
        if self.allows(token):
            return token
        array = self._filtered(logits)
        C.llama_sampler_apply(chain, ctypes.byref(array))
        return int(data["id"][array.selected])

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self.handle, token)

    def close(self) -> None:
        if self.handle is not None:
            C.llama_sampler_free(self.handle)
            self.handle = None


class BackendSamplingError(EngineError):
    """The backend sampler attached to the context gave no token (its device cannot run the argmax)."""


def _backend_token(ctx: Context, idx: int) -> int:
    token = ctx.sampled_token(idx)
    if token < 0:
        # The chain is attached but the device could not run it: llama.cpp copied neither tokens nor logits.
        ctx.set_backend_greedy(False)
        ctx.backend_greedy_broken = True  # never attached again on this context
        raise BackendSamplingError(
            "llama.cpp's backend sampler gave no token on this device; greedy sampling now runs in llmtui "
            "again: retry the request"
        )
    return token
