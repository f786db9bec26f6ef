"""Embeddings and rerank scores from the loaded model: a llama_context of its own with embeddings on and llama.cpp's
pooling (the model's `{arch}.pooling_type`, or mean for a model that names none), texts packed several to a batch.

Rerank prompts are built as llama-server builds them (`format_prompt_rerank`): the model's "rerank" template with
`{query}` and `{document}`, else BOS query EOS SEP document EOS as the vocabulary asks for them.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Sequence
from typing import Any

from engine_ext.bindings import C
from engine_ext.cpu import default_threads
from engine_ext.model import Model, array_at, free_context, init_context
from engine_ext.params import ContextError, EngineError
from engine_ext.protocol import Embed, Embedded

# llama.h's enum llama_pooling_type.
POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 0, 1, 2, 3, 4
POOLING_NAMES: dict[int, str] = {POOLING_MEAN: "mean", POOLING_CLS: "cls", POOLING_LAST: "last", POOLING_RANK: "rank"}
MAX_EMBED_CTX = 2048  # tokens one text may have (and one batch holds), at most the model's training context
MAX_SEQS_PER_BATCH = 16  # texts decoded together
MAX_TEXTS = 2048  # texts one request may embed or rerank


def model_pooling(model: Model) -> int:
    """The pooling the model's GGUF names (`{arch}.pooling_type`), POOLING_NONE when it names none or another."""
    raw = model.meta(f"{model.architecture}.pooling_type")
    try:
        value = int(raw) if raw is not None else POOLING_NONE
    except ValueError:
        return POOLING_NONE
    return value if value in POOLING_NAMES else POOLING_NONE


class Embedder:
    """A llama_context over `model` for pooled outputs; `close()` frees it (idempotent). One per model: `embed`."""

    def __init__(self, model: Model) -> None:
        self.model = model
        named = model_pooling(model)
        self.pooling = named if named != POOLING_NONE else POOLING_MEAN
        self.n_ctx = min(max(model.n_ctx_train, 64), MAX_EMBED_CTX)
        cparams = C.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = self.n_ctx
        cparams.n_seq_max = MAX_SEQS_PER_BATCH
        cparams.kv_unified = True
        cparams.embeddings = True
        cparams.pooling_type = self.pooling
        cparams.n_threads = cparams.n_threads_batch = default_threads()
        handle = init_context(model.handle, cparams)
        if not handle:
            raise ContextError(
                f"llama.cpp could not create an embedding context of {self.n_ctx} tokens (the log says why)"
            )
        self._handle: Any = handle
        self._batch = C.llama_batch_init(self.n_ctx, 0, 1)
        self.n_out = (
            int(C.llama_model_n_cls_out(model.handle)) if self.rank else int(C.llama_model_n_embd_out(model.handle))
        )

    @property
    def rank(self) -> bool:
        return self.pooling == POOLING_RANK

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES[self.pooling]

    def close(self) -> None:
        if self._handle is not None:
            free_context(self._handle)
            self._handle = None
            C.llama_batch_free(self._batch)

    def run(self, request: Embed) -> Embedded:
        """The request's vectors (or scores); EngineError, one line, for what this model cannot answer."""
        t0 = time.perf_counter()
        if not request.texts:
            raise EngineError("no input to embed")
        if len(request.texts) > MAX_TEXTS:
            raise EngineError(f"{len(request.texts)} inputs: at most {MAX_TEXTS} in one request")
        if request.query is not None and not self.rank:
            raise EngineError("this model does not rerank: load a reranker (a GGUF whose pooling type is rank)")
        if request.query is None and self.rank:
            raise EngineError("this model is a reranker (rank pooling): it scores pairs, it does not embed")
        if request.query is None:
            prompts = [self._tokens(text, i) for i, text in enumerate(request.texts)]
        else:
            prompts = [self._pair_tokens(request.query, text, i) for i, text in enumerate(request.texts)]
        vectors = self._pooled(prompts)
        if request.query is not None:
            vectors = [v[:1] for v in vectors]
        elif request.normalize:
            vectors = [_unit(v) for v in vectors]
        n_tokens = sum(len(p) for p in prompts)
        return Embedded(tuple(tuple(v) for v in vectors), n_tokens, self.pooling_name, (time.perf_counter() - t0) * 1e3)

    # ----- prompts ----------------------------------------------------------------------------------

    def _checked(self, tokens: list[int], index: int) -> list[int]:
        if not tokens:
            raise EngineError(f"input {index} is empty")
        if len(tokens) > self.n_ctx:
            raise EngineError(f"input {index} has {len(tokens)} tokens; this model embeds at most {self.n_ctx}")
        return tokens

    def _tokens(self, text: str, index: int) -> list[int]:
        if not text:
            raise EngineError(f"input {index} is empty")
        return self._checked(self.model.tokenize(text, add_special=True, parse_special=False), index)

    def _pair_tokens(self, query: str, document: str, index: int) -> list[int]:
        model, vocab = self.model, self.model.vocab
        raw = C.llama_model_chat_template(model.handle, b"rerank")
        if raw:
            prompt = raw.decode("utf-8", errors="replace").replace("{query}", query).replace("{document}", document)
            return self._checked(model.tokenize(prompt, add_special=False, parse_special=True), index)
        eos = int(C.llama_vocab_eos(vocab))
        if eos < 0:
            eos = int(C.llama_vocab_sep(vocab))
        add_eos, add_sep = bool(C.llama_vocab_get_add_eos(vocab)), bool(C.llama_vocab_get_add_sep(vocab))
        tokens = [model.bos_token] if model.add_bos else []
        tokens += model.tokenize(query, add_special=False, parse_special=False)
        tokens += [eos] if add_eos else []
        tokens += [int(C.llama_vocab_sep(vocab))] if add_sep else []
        tokens += model.tokenize(document, add_special=False, parse_special=False)
        tokens += [eos] if add_eos else []
        return self._checked(tokens, index)

    # ----- decoding ---------------------------------------------------------------------------------

    def _pooled(self, prompts: Sequence[list[int]]) -> list[list[float]]:
        out: list[list[float]] = []
        group: list[list[int]] = []
        for tokens in prompts:
            if group and (len(group) == MAX_SEQS_PER_BATCH or sum(map(len, group)) + len(tokens) > self.n_ctx):
                out += self._decode_group(group)
                group = []
            group.append(tokens)
        return out + self._decode_group(group)

    def _decode_group(self, group: list[list[int]]) -> list[list[float]]:
        if self._handle is None:
            raise ContextError("the embedding context has been closed")
        handle, batch = self._handle, self._batch
        memory = C.llama_get_memory(handle)
        if memory:
            C.llama_memory_clear(memory, True)
        n = sum(map(len, group))
        tokens, positions, outputs = array_at(batch.token, n), array_at(batch.pos, n), array_at(batch.logits, n)
        i = 0
        for seq, prompt in enumerate(group):
            tokens[i : i + len(prompt)] = prompt
            positions[i : i + len(prompt)] = range(len(prompt))
            for j in range(i, i + len(prompt)):
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
            i += len(prompt)
        outputs[:n] = b"\x01" * n
        batch.n_tokens = n
        rc = C.llama_decode(handle, batch)
        if rc != 0:
            raise ContextError(f"llama_decode failed with code {rc} while embedding (the engine log has the reason)")
        vectors = []
        for seq in range(len(group)):
            pointer = C.llama_get_embeddings_seq(handle, seq)
            if not pointer:
                raise ContextError("llama.cpp gave no pooled embedding (the engine log has the reason)")
            vectors.append(list(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float * self.n_out)).contents))
        return vectors


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def embed(model: Model | None, request: Embed) -> Embedded:
    """The worker's answer to an Embed: the model's embedder made on first use and freed with the model."""
    if model is None:
        raise EngineError("no model is loaded")
    embedder = getattr(model, "embedder", None)
    if embedder is None:
        embedder = Embedder(model)
        model.embedder = embedder
        model.on_close(embedder.close)
    return embedder.run(request)
