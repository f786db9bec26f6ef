"""`POST /v1/embeddings` in OpenAI's shape and `POST /v1/rerank` in llama-server's: bodies checked and bounded, the
engine's `Embedded` shaped into their answers (base64 too: the OpenAI SDK asks for it by default)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping

from app.server.api_errors import ApiError, bad_request
from app.server.requests import Limits, known_fields
from engine_ext.protocol import Embed, Embedded

MAX_INPUTS = 2048  # texts in one request (OpenAI's limit for embeddings)
_EMBED_FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})
_RERANK_FIELDS = frozenset({"query", "documents", "top_n", "model", "return_text"})


def _texts(value: object, name: str, limits: Limits) -> tuple[str, ...]:
    texts = (value,) if isinstance(value, str) else value
    if not isinstance(texts, list | tuple) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request(f"{name} must be a string or a non-empty list of strings", name)
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"{name} has {len(texts)} items: at most {MAX_INPUTS}", name)
    if sum(len(t) for t in texts) > limits.max_text_chars:
        raise bad_request(f"{name} is longer than this server's {limits.max_text_chars} characters", name)
    if any(not t for t in texts):
        raise bad_request(f"{name} holds an empty string", name)
    return tuple(texts)


def parse_embeddings(body: Mapping[str, object], limits: Limits) -> tuple[Embed, str]:
    """The engine's request and the answer's encoding_format (float | base64); ApiError 400, one line, otherwise."""
    known_fields(body, _EMBED_FIELDS)
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("encoding_format must be float or base64", "encoding_format")
    if body.get("dimensions") is not None:
        raise bad_request("dimensions is not supported: the model's own size is returned", "dimensions")
    return Embed(_texts(body.get("input"), "input", limits)), str(fmt)


def parse_rerank(body: Mapping[str, object], limits: Limits) -> tuple[Embed, int, bool]:
    """The engine's request, top_n (every document when absent) and return_text; ApiError 400 otherwise."""
    known_fields(body, _RERANK_FIELDS)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request("query must be a non-empty string", "query")
    documents = _texts(body.get("documents"), "documents", limits)
    top_n = body.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise bad_request("top_n must be a positive integer", "top_n")
    return_text = body.get("return_text", False)
    if not isinstance(return_text, bool):
        raise bad_request("return_text must be true or false", "return_text")
    return Embed(documents, query, normalize=False), top_n, return_text


def _encoded(vector: tuple[float, ...], fmt: str) -> list[float] | str:
    if fmt == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embeddings_answer(done: Embedded, model: str, fmt: str) -> dict[str, object]:
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(vector, fmt)} for i, vector in enumerate(done.vectors)
    ]
    usage = {"prompt_tokens": done.n_tokens, "total_tokens": done.n_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def rerank_answer(done: Embedded, request: Embed, model: str, top_n: int, return_text: bool) -> dict[str, object]:
    """llama-server's answer: results by relevance, best first, cut to top_n."""
    results: list[dict[str, object]] = [
        {"index": i, "relevance_score": scores[0]} for i, scores in enumerate(done.vectors)
    ]
    results.sort(key=lambda r: -float(r["relevance_score"]))  # type: ignore[arg-type]
    if return_text:
        for r in results:
            r["text"] = request.texts[int(r["index"])]  # type: ignore[call-overload]
    usage = {"prompt_tokens": done.n_tokens, "total_tokens": done.n_tokens}
    return {"model": model, "object": "list", "usage": usage, "results": results[:top_n]}


def refused_off(kind: str) -> ApiError:
    return ApiError(
        501,
        f"this server does not serve {kind}: start `llmtui serve` with --embeddings (or with an embedding or reranker "
        "model, whose pooling says so), --parallel 1",
    )
