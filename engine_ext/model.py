"""Owners of llama.cpp's model and context handles, with their load parameters."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_ext.bindings import C
from engine_ext.cpu import capped_threads, default_threads
from engine_ext.engine_status import entered, left, phase
from engine_ext.gguf import validate_loadable
from engine_ext.params import (
    GPU_LAYERS_AUTO,
    KV_CACHE_TYPES,
    SPLIT_MODES,
    ContextError,
    ContextParams,
    EngineError,
    ModelLoadError,
    ModelParams,
)

# ggml type ids of the KV cache types (ggml/include/ggml.h, enum ggml_type).
_GGML_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
assert set(_GGML_TYPES) == set(KV_CACHE_TYPES)

_FLASH_ATTN: dict[str, int] = {
    "auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# Expert tensors of one layer (common/common.h LLM_FFN_EXPS_REGEX), for --n-cpu-moe.
FFN_EXPS_REGEX = "blk\\.{il}\\.ffn_(up|down|gate|gate_up)_(ch|)exps"
_keep_alive: list[Any] = []  # override patterns llama.cpp holds pointers to while a model loads


def model_params_struct(params: ModelParams) -> Any:
    """llama_model_params for `params` (the mapping of every llmtui/llama.cpp model flag)."""
    if params.n_gpu_layers == GPU_LAYERS_AUTO:
        raise EngineError("-ngl auto must be planned before loading (engine_ext.placement.resolve_gpu_layers)")
    mparams = C.llama_model_default_params()
    mparams.n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else 999
    mparams.use_mmap = params.use_mmap
    mparams.use_mlock = params.use_mlock
    mparams.use_extra_bufts = params.use_extra_bufts
    mparams.load_mtp = params.load_mtp
    mparams.main_gpu = params.main_gpu
    mparams.split_mode = SPLIT_MODES.index(params.split_mode)
    if params.tensor_split:
        n = int(C.llama_max_devices())
        shares = (ctypes.c_float * n)(*params.tensor_split[:n])
        _keep_alive.append(shares)
        mparams.tensor_split = shares
    if params.n_cpu_moe:
        from engine_ext.bindings import TensorBuftOverride, ggml_cpu_buffer_type

        cpu = ggml_cpu_buffer_type()
        overrides = (TensorBuftOverride * (params.n_cpu_moe + 1))()  # NULL-terminated
        for il in range(params.n_cpu_moe):
            pattern = ctypes.create_string_buffer(FFN_EXPS_REGEX.format(il=il).encode())
            _keep_alive.append(pattern)
            overrides[il].pattern = ctypes.cast(pattern, ctypes.c_char_p)
            overrides[il].buft = cpu
        _keep_alive.append(overrides)
        mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    return mparams


# llama.cpp's BPE pre-tokenizers match some of their patterns with std::regex, which recurses once per character
# of a match: a run of about 30,000 punctuation characters or digits ('<' × 100,000 from a prompt file or a chat
# template) overflowed the worker's 8 MiB stack (SIGSEGV in unicode_regex_split, src/unicode.cpp). No pattern's
# match crosses a change between whitespace and other characters, so pieces whose runs stay below this many
# characters match at most this long: 2,048 keeps the recursion under 1 MiB of stack.
MAX_TOKENIZED_RUN = 2048


def split_long_runs(text: str, max_run: int, specials: Sequence[str] = ()) -> list[str]:
    """``text`` cut into pieces (joined, they are ``text``) in which no run of whitespace or of other characters is
    longer than ``max_run``. Cuts are made only inside longer runs, and never inside one of ``specials`` (the special
    tokens' texts, which llama.cpp matches before the pre-tokenizer); text without such a run is one piece, so it
    tokenises exactly as before. A piece's tokens at a cut may differ from the uncut text's (BPE merges stop there)."""
    longest = max((len(s) for s in specials), default=1)
    # each run is scanned once: the lookbehinds let a match start only where a run starts
    long_runs = re.compile(rf"(?<!\S)\S{{{max_run + 1},}}|(?<!\s)\s{{{max_run + 1},}}")
    cuts: list[int] = []
    for run in long_runs.finditer(text):
        last, end = run.span()
        while end - last > max_run:
            cut = last + max_run
            for _ in range(8):  # moved to the start of a special token's text that spans it (overlaps: again)
                moved = _spanning_special(text, cut, last, specials, longest)
                if moved is None:
                    break
                cut = moved
            cuts.append(cut)
            last = cut
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _spanning_special(text: str, cut: int, floor: int, specials: Sequence[str], longest: int) -> int | None:
    """Where a special token's text that spans ``cut`` starts, when that is above ``floor``; else None."""
    lo = max(floor + 1, cut - longest + 1)
    window = text[lo : cut + longest - 1]
    for special in specials:
        i = window.find(special)
        while i != -1 and lo + i < cut:
            if lo + i + len(special) > cut:
                return lo + i
            i = window.find(special, i + 1)
    return None


class Model:
    """A loaded llama_model plus its vocabulary; `close()` frees it (idempotent)."""

    def __init__(
        self,
        path: Path,
        params: ModelParams = ModelParams(),
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.params = params
        params.validate()
        # Every file llama.cpp loads, the model or a draft, goes through the same rules first: metadata that would
        # abort llama.cpp is refused in one line (GGUFError) instead.
        validate_loadable(self.path)
        mparams = model_params_struct(params)
        if progress is not None:

            def on_progress(fraction: float, _user_data: Any) -> bool:
                progress(float(fraction))
                return True

            # Kept on self: llama.cpp calls it during loading and ctypes must not collect it.
            self._progress_cb = C.llama_progress_callback(on_progress)
            mparams.progress_callback = self._progress_cb
        handle = C.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not handle:
            raise ModelLoadError(
                f"llama.cpp could not load {self.path}: the file is not a model this llama.cpp build "
                "supports, or it is damaged (the engine log has llama.cpp's reason)"
            )
        self._handle: Any = handle
        self.vocab: Any = C.llama_model_get_vocab(handle)
        self.n_vocab = int(C.llama_vocab_n_tokens(self.vocab))
        self._piece_buf = ctypes.create_string_buffer(256)
        self._special_texts: tuple[str, ...] | None = None
        self.embedder: Any = None  # engine_ext.embedding.Embedder once the model was asked for embeddings
        self._before_free: list[Callable[[], None]] = []

    @property
    def handle(self) -> Any:
        if self._handle is None:
            raise ContextError("the model has been unloaded")
        return self._handle

    def on_close(self, free: Callable[[], None]) -> None:
        """`free` runs when the model closes, before the model is freed (a context of its own over it)."""
        self._before_free.append(free)

    def close(self) -> None:
        while self._before_free:
            self._before_free.pop()()
        self.embedder = None
        if self._handle is not None:
            C.llama_model_free(self._handle)
            self._handle = None

    # ----- metadata ---------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp renders it, or None."""
        buf = ctypes.create_string_buffer(1024)
        n = C.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            C.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.handle, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        raw = C.llama_model_chat_template(self.handle, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def n_ctx_train(self) -> int:
        return int(C.llama_model_n_ctx_train(self.handle))

    @property
    def n_embd(self) -> int:
        return int(C.llama_model_n_embd(self.handle))

    @property
    def n_layer(self) -> int:
        return int(C.llama_model_n_layer(self.handle))

    @property
    def n_layer_nextn(self) -> int:
        return int(C.llama_model_n_layer_nextn(self.handle))

    @property
    def n_params(self) -> int:
        return int(C.llama_model_n_params(self.handle))

    @property
    def size_bytes(self) -> int:
        return int(C.llama_model_size(self.handle))

    @property
    def is_recurrent(self) -> bool:
        return bool(C.llama_model_is_recurrent(self.handle))

    @property
    def is_hybrid(self) -> bool:
        return bool(C.llama_model_is_hybrid(self.handle))

    # ----- tokens -----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Every text the engine tokenises comes here. A BPE vocabulary's text with a run longer than MAX_TOKENIZED_RUN
        is tokenised in pieces (split_long_runs; see there why); any other text whole, as llama.cpp would."""
        pieces = [text]
        if len(text) > MAX_TOKENIZED_RUN and int(C.llama_vocab_type(self.vocab)) == C.LLAMA_VOCAB_TYPE_BPE:
            pieces = split_long_runs(text, MAX_TOKENIZED_RUN, self.special_texts() if parse_special else ())
        if len(pieces) == 1:
            return self._tokenize(text, add_special=add_special, parse_special=parse_special)
        tokens = [self.bos_token] if add_special and self.add_bos else []
        for piece in pieces:
            tokens += self._tokenize(piece, add_special=False, parse_special=parse_special)
        if add_special and C.llama_vocab_get_add_eos(self.vocab):
            tokens.append(self.eos_token)
        return tokens

    def special_texts(self) -> tuple[str, ...]:
        """The texts llama.cpp matches as special tokens when it parses them (control, user-defined and unknown
        tokens: llama-vocab.cpp cache_special_tokens), two characters or longer; read once per model."""
        if self._special_texts is None:
            wanted = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED | C.LLAMA_TOKEN_ATTR_UNKNOWN
            texts = {
                self.token_text(t) for t in range(self.n_vocab) if int(C.llama_vocab_get_attr(self.vocab, t)) & wanted
            }
            self._special_texts = tuple(sorted(t for t in texts if len(t) >= 2))
        return self._special_texts

    def _tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        with phase("tokenize"):
            return self._tokenize_whole(text, add_special=add_special, parse_special=parse_special)

    def _tokenize_whole(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n < 0:
                raise ContextError("tokenization failed (the text is too long)")
        return list(buf[:n])

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token; control tokens render as b'' unless `special`."""
        buf = self._piece_buf
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, big, len(big), 0, special)
            return big.raw[:n]
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        raw = C.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    @property
    def bos_token(self) -> int:
        return int(C.llama_vocab_bos(self.vocab))

    @property
    def eos_token(self) -> int:
        return int(C.llama_vocab_eos(self.vocab))

    @property
    def add_bos(self) -> bool:
        return bool(C.llama_vocab_get_add_bos(self.vocab))

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The fill-in-the-middle tokens (prefix, suffix, middle: llama_vocab_fim_pre/suf/mid); None when the model
        lacks any of them."""
        found = (
            C.llama_vocab_fim_pre(self.vocab),
            C.llama_vocab_fim_suf(self.vocab),
            C.llama_vocab_fim_mid(self.vocab),
        )
        return None if any(int(t) < 0 for t in found) else (int(found[0]), int(found[1]), int(found[2]))

    def infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        """Fill in the middle: [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID (llama-server's format_prompt_infill, its
        prefix-suffix-middle order, without a repository's extra files); the files' text is only text (a special
        token's name in it is not that token)."""
        fim = self.fim_tokens()
        if fim is None:
            raise EngineError(
                f"{self.path.name} has no fill-in-the-middle tokens, so it cannot complete with a suffix; use a "
                "code model that has them (Qwen2.5-Coder, StarCoder2, CodeLlama, Codestral)"
            )
        pre, suf, mid = fim
        bos = [self.bos_token] if self.add_bos and self.bos_token >= 0 else []
        prefix_tokens = self.tokenize(prefix, add_special=False, parse_special=False)
        suffix_tokens = self.tokenize(suffix, add_special=False, parse_special=False)
        return [*bos, pre, *prefix_tokens, suf, *suffix_tokens, mid]


@dataclass
class Checkpoint:
    """A saved sequence state (the part llama.cpp cannot truncate) after `tokens`."""

    tokens: tuple[int, ...]
    data: bytes


_LIVE_CONTEXTS: dict[int, Any] = {}  # every llama_context this process made, by address (set_threads reaches all)


def _address(handle: Any) -> int:
    return handle if isinstance(handle, int) else int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def init_context(model_handle: Any, cparams: Any) -> Any:
    """llama_init_from_model, remembered so that `set_threads` reaches the context (None when llama.cpp refuses)."""
    handle = C.llama_init_from_model(model_handle, cparams)
    if handle:
        _LIVE_CONTEXTS[_address(handle)] = handle
    return handle


def free_context(handle: Any) -> None:
    _LIVE_CONTEXTS.pop(_address(handle), None)
    C.llama_free(handle)


def set_threads(n_threads: int) -> None:
    """Every live context (the target's, the drafts') computes with `n_threads` from its next graph on (prompt
    batches too): llama_set_n_threads, which only sets what the next llama_decode reads."""
    for handle in list(_LIVE_CONTEXTS.values()):
        C.llama_set_n_threads(handle, n_threads, n_threads)


class Context:
    """A llama_context over a Model with one reusable batch; `close()` frees both (idempotent)."""

    def __init__(self, model: Model, params: ContextParams = ContextParams()) -> None:
        params.validate()
        self.model = model
        self.params = params
        n_threads = capped_threads(params.n_threads) if params.n_threads else default_threads()
        cparams = C.llama_context_default_params()
        cparams.n_ctx = params.n_ctx
        cparams.n_batch = params.n_batch
        cparams.n_ubatch = min(params.n_ubatch, params.n_batch)
        cparams.n_seq_max = params.n_seq_max
        cparams.n_rs_seq = params.n_rs_seq
        if params.n_seq_max > 1:
            cparams.kv_unified = params.kv_unified
        # Outputs per sequence a backend sampler may sample in one batch (llama.h default 1): 0 lifts the limit to
        # n_outputs_max (= n_batch), so a greedy verify batch of any length samples on the backend. Nothing else
        # reads it (llama-context.cpp decode's check and the samplers' backend_init; greedy ignores it).
        cparams.n_outputs_max_per_seq = 0
        cparams.n_threads = n_threads
        cparams.n_threads_batch = capped_threads(params.n_threads_batch) if params.n_threads_batch else n_threads
        cparams.flash_attn_type = _FLASH_ATTN[params.flash_attn]
        cparams.type_k = _GGML_TYPES[params.type_k]
        cparams.type_v = _GGML_TYPES[params.type_v]
        cparams.no_perf = False
        self._stack = ExitStack()
        handle = init_context(model.handle, cparams)
        if not handle:
            raise ContextError(
                f"llama.cpp could not create a context (n_ctx={params.n_ctx}, n_batch={params.n_batch}); "
                "try a smaller context size or KV cache type (the engine log has the reason)"
            )
        self._handle: Any = handle
        self._stack.callback(self._free_handle)
        self.n_ctx = int(C.llama_n_ctx(handle))
        self.n_batch = int(C.llama_n_batch(handle))
        self.n_ctx_seq = int(C.llama_n_ctx_seq(handle))  # what one sequence may hold (n_ctx unless KV is split)
        self.clears = 0  # times clear() dropped every sequence (parallel sequences know their memory is gone)
        self.decodes = 0  # llama_decode calls on this context (llama-server's n_decode_total; not a draft's own)
        self.memory: Any = C.llama_get_memory(handle)
        self._batch = C.llama_batch_init(self.n_batch, 0, 1)
        self._stack.callback(C.llama_batch_free, self._batch)
        # Every token of this batch is on sequence 0 alone: those fields are set once, here (only decode() and
        # decode_one() write the batch). Token ids, positions and output flags are written through ctypes arrays
        # over the batch's buffers, a slice assignment each rather than a write per token: fewer Python steps, and
        # less code to run right after llama_decode has pushed the interpreter out of the CPU caches.
        batch, n = self._batch, self.n_batch
        for i in range(n):
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
        self._batch_tokens = array_at(batch.token, n)
        self._batch_pos = array_at(batch.pos, n)
        self._batch_logits = array_at(batch.logits, n)
        # A greedy sampler chain attached to sequence 0 (llama.cpp backend sampling): while it is attached,
        # llama_decode samples every output row itself and copies no logits (llama_get_sampled_token_ith).
        self._greedy_chain: Any = None
        self.backend_greedy_broken = False  # the device gave no sampled token once: keep sampling in llmtui
        self.one_output = False  # the last decode gave exactly one logits row (then row -1 is the buffer's first)

    @property
    def n_threads(self) -> int:
        """The threads the next decode runs on (engine_ext.threads may change them between steps)."""
        return int(C.llama_n_threads(self._handle))

    def _free_handle(self) -> None:
        free_context(self._handle)
        self._handle = None
        if self._greedy_chain is not None:  # the context held it: free it only once the context is gone
            C.llama_sampler_free(self._greedy_chain)
            self._greedy_chain = None

    @property
    def backend_greedy(self) -> bool:
        """Whether decoding samples greedily on the backend: output rows then have token ids, not logits."""
        return self._greedy_chain is not None

    def set_backend_greedy(self, on: bool) -> bool:
        """Attach (or detach) a greedy sampler chain for sequence 0; returns whether it is attached now.

        Attached, `llama_decode` takes the argmax of every output row in its own graph and skips copying the
        logits out (llama-context.cpp `needs_raw_logits`), so nothing may read this context's logits then.
        Each change makes llama.cpp re-reserve its compute graph on the next decode (`sched_need_reserve`),
        and a chain can be backend-initialized once only, so a detached chain is freed, not kept.
        """
        if on and self.backend_greedy_broken:
            on = False
        if on == (self._greedy_chain is not None):
            return on
        handle = self.handle
        if not on:
            C.llama_set_sampler(handle, 0, None)
            C.llama_sampler_free(self._greedy_chain)
            self._greedy_chain = None
            return False
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        chain = C.llama_sampler_chain_init(chain_params)
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        if not C.llama_set_sampler(handle, 0, chain):  # the backend cannot run it (e.g. -sm tensor)
            C.llama_sampler_free(chain)
            return False
        self._greedy_chain = chain
        return True

    @property
    def handle(self) -> Any:
        if self._handle is None:
            raise ContextError("the context has been closed")
        return self._handle

    def close(self) -> None:
        self._stack.close()

    # ----- decoding ---------------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], pos0: int, *, logits_last: bool = True, logits_all: bool = False) -> None:
        """Decode tokens at positions pos0.. on sequence 0 (one call; len(tokens) ≤ n_batch).

        Output rows: the last token's (`logits_last`), every token's (`logits_all`, for verifying drafts), or none.
        """
        handle = self.handle  # first: the batch is freed with the context
        n = len(tokens)
        self._batch_tokens[:n] = tokens
        self._batch_pos[:n] = range(pos0, pos0 + n)
        self._batch_logits[:n] = b"\x01" * n if logits_all else bytes(n)
        if logits_last:
            self._batch_logits[n - 1] = 1
        batch = self._batch
        batch.n_tokens = n
        self.one_output = (n == 1 or not logits_all) and logits_last
        previous = entered("decode")  # the phase the client sees (engine_ext.engine_status)
        self.decodes += 1
        rc = C.llama_decode(handle, batch)
        left(previous)
        if rc != 0:
            if rc == 1:
                raise ContextError("the context is full: no room in the KV cache for this batch")
            if rc == 2:
                raise ContextError("decoding was aborted")
            raise ContextError(f"llama_decode failed with code {rc} (the engine log has the reason)")

    def decode_one(self, token: int, pos: int) -> None:
        """Decode a single token with logits: the hot path of plain generation."""
        handle = self.handle  # first: the batch is freed with the context
        self._batch_tokens[0] = token
        self._batch_pos[0] = pos
        self._batch_logits[0] = 1
        batch = self._batch
        batch.n_tokens = 1
        self.one_output = True
        previous = entered("decode")  # the phase the client sees (engine_ext.engine_status)
        self.decodes += 1
        rc = C.llama_decode(handle, batch)
        left(previous)
        if rc != 0:
            raise ContextError("the context is full" if rc == 1 else f"llama_decode failed with code {rc}")

    # ----- memory -----------------------------------------------------------------------------------

    def clear(self) -> None:
        C.llama_memory_clear(self.memory, True)
        self.clears += 1

    def truncate(self, n_keep: int) -> bool:
        """Drop positions ≥ n_keep from sequence 0; False when the memory cannot (recurrent state)."""
        return bool(C.llama_memory_seq_rm(self.memory, 0, n_keep, -1))

    def save_checkpoint(self, tokens: Sequence[int]) -> Checkpoint:
        """Save the non-truncatable part of sequence 0's state (recurrent / SWA) after `tokens`."""
        return Checkpoint(tuple(tokens), bytes(self.sequence_state(C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)))

    def restore_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Restore a checkpoint and drop everything after it (the caller then decodes onward)."""
        data = (ctypes.c_uint8 * len(checkpoint.data)).from_buffer_copy(checkpoint.data)
        if not self.set_sequence_state(data, C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
            raise ContextError("restoring a state checkpoint failed")
        if not self.truncate(len(checkpoint.tokens)):
            raise ContextError("could not truncate the context after restoring a checkpoint")

    def sequence_state(self, flags: int = 0) -> memoryview:
        """Sequence 0's state as llama.cpp serialises it (flags 0: all of it, KV cells and recurrent state), in a
        buffer of its own (no copy made)."""
        size = int(C.llama_state_seq_get_size_ext(self.handle, 0, flags))
        buf = (ctypes.c_uint8 * size)()
        written = int(C.llama_state_seq_get_data_ext(self.handle, buf, size, 0, flags))
        if written != size:
            raise ContextError(f"saving the sequence state wrote {written} of {size} bytes")
        return memoryview(buf).cast("B")

    def set_sequence_state(self, data: Any, flags: int = 0) -> bool:
        """Load a state `sequence_state` gave into sequence 0 (`data`: a writable buffer, read in place, or a ctypes
        byte array); False when llama.cpp refused it. Only for bytes llmtui wrote and verified: llama.cpp's state
        reader was not written for hostile input (engine_ext.disk_cache checks a file's checksum first)."""
        if not isinstance(data, ctypes.Array):
            data = (ctypes.c_uint8 * len(data)).from_buffer(data)
        size = ctypes.sizeof(data)
        return int(C.llama_state_seq_set_data_ext(self.handle, data, size, 0, flags)) == size

    def logits_row(self, idx: int) -> Any:
        """A pointer to the logits of output row `idx` (-1: the last), n_vocab floats, valid until the next decode.

        Not while `backend_greedy` is on: decoding then copies out token ids only (`sampled_token`).
        """
        return C.llama_get_logits_ith(self.handle, idx)

    def sampled_token(self, idx: int) -> int:
        """The token the backend sampler picked for output row `idx` (-1: the last); -1 when it sampled none."""
        return int(C.llama_get_sampled_token_ith(self.handle, idx))

    def perf(self) -> tuple[float, float, int, int]:
        """llama.cpp's own timing: (prompt ms, eval ms, prompt tokens, eval tokens)."""
        data = C.llama_perf_context(self.handle)
        return float(data.t_p_eval_ms), float(data.t_eval_ms), int(data.n_p_eval), int(data.n_eval)


def array_at(pointer: Any, length: int) -> Any:
    """A ctypes array of `length` items over the buffer a ctypes pointer points to (no copy)."""
    return ctypes.cast(pointer, ctypes.POINTER(pointer._type_ * length)).contents


def new_draft_context(model: Model, target: Context, *, n_outputs_max: int, mtp: bool = False, n_seq: int = 1) -> Any:
    """A raw llama_context for a model drafter, sized like the target's and linked to it (`ctx_other`).

    The draft borrows the target's embeddings/output when it has none of its own (DFlash, EAGLE3); an MTP
    context (`mtp`) holds only the NextN layer's KV cache. `n_seq` > 1: a sequence per target sequence of the
    parallel loop, each with a KV stream of its own (as the target's). None when llama.cpp refuses.
    """
    cparams = C.llama_context_default_params()
    cparams.n_ctx = target.n_ctx
    cparams.n_batch = target.n_batch
    cparams.n_ubatch = min(target.params.n_ubatch, target.n_batch)
    cparams.n_seq_max = n_seq
    if n_seq > 1:
        cparams.kv_unified = False
    cparams.n_rs_seq = 0
    cparams.n_outputs_max = n_outputs_max
    cparams.ctx_other = target.handle
    if mtp:
        cparams.ctx_type = C.LLAMA_CONTEXT_TYPE_MTP
    threads = target.params.n_threads or int(C.llama_n_threads(target.handle))
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    return init_context(model.handle, cparams)
