"""OpenAI's response shapes (chat.completion, chat.completion.chunk, text_completion), usage, and llama-server's
`timings` with llmtui's speculative figures beside them."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from app.server.tool_requests import tool_calls_json
from engine_ext.protocol import Finished, SpeculativeStats, StopReason
from engine_ext.tool_calls import CallTextFilter

_FINISH: dict[StopReason, str] = {
    "eos": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
}


def finish_reason(reason: StopReason) -> str:
    return _FINISH.get(reason, "stop")


@lru_cache(maxsize=4)
def system_fingerprint(model_path: str) -> str:
    """OpenAI's `system_fingerprint`: the engine's build and the model's hash prefix (the sha256 the Hugging Face
    cache names its blob by; for another file, a hash of its name, size and modification time: reading gigabytes
    to answer is not worth it). It changes when either does, as a client that caches answers needs."""
    try:
        build = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        build = "unknown"
    if not model_path:
        return ""
    path = Path(model_path)
    try:
        blob = path.resolve().name
        stat = path.stat()
    except OSError:
        return f"b{build}-unknown"
    digest = blob if re.fullmatch(r"[0-9a-f]{64}", blob) else None
    if digest is None:
        digest = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return f"b{build}-{digest[:12]}"


@dataclass
class Reply:
    """What one request produced so far (the backend appends; responses read)."""

    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    finished: Finished | None = None
    calls_hidden: CallTextFilter | None = None  # with tools: the answer text without the calls' markup
    fingerprint: str = ""  # system_fingerprint ("": null)

    def visible(self, text: str) -> str:
        """Answer text as the client gets it (a tool call's text is held back: it comes as tool_calls)."""
        return self.calls_hidden.feed(text) if self.calls_hidden is not None else text

    def rest(self, finished: Finished) -> str:
        """Text held back that was no call, once the reply is over."""
        return self.calls_hidden.finish(bool(finished.tool_calls)) if self.calls_hidden is not None else ""


def tool_deltas(reply: Reply, finished: Finished) -> list[dict[str, object]]:
    """The streamed deltas a reply ends with: text held back that was no call, then its calls (one delta each)."""
    rest = reply.rest(finished)
    deltas: list[dict[str, object]] = [{"content": rest}] if rest else []
    deltas += [{"content": None, "tool_calls": [call]} for call in tool_calls_json(finished.tool_calls, streamed=True)]
    return deltas


def reply_finish_reason(finished: Finished) -> str:
    return "tool_calls" if finished.tool_calls else finish_reason(finished.stop_reason)


def usage(finished: Finished) -> dict[str, int]:
    s = finished.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.prompt_tokens_cached},  # type: ignore[dict-item]
    }


def timings(finished: Finished) -> dict[str, object]:
    """llama-server's `timings` (prompt_n, predicted_per_second, draft_n, draft_n_accepted, …), and llmtui's
    speculative figures: acceptance per draft position and per drafter."""
    s = finished.stats
    predicted_ms = s.decode_ms
    out: dict[str, object] = {
        "cache_n": s.prompt_tokens_cached,
        "prompt_n": s.prompt_tokens_evaluated,
        "prompt_ms": round(s.prompt_ms, 3),
        "prompt_per_token_ms": round(s.prompt_ms / s.prompt_tokens_evaluated, 3) if s.prompt_tokens_evaluated else 0.0,
        "prompt_per_second": round(s.prompt_tps, 3),
        "predicted_n": s.generated_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / s.generated_tokens, 3) if s.generated_tokens else 0.0,
        "predicted_per_second": round(s.decode_tps, 3),
        "ttft_ms": round(s.ttft_ms, 3),
    }
    spec: SpeculativeStats | None = finished.speculative
    if spec is not None:
        out["draft_n"] = spec.drafted
        out["draft_n_accepted"] = spec.accepted
        out["speculative"] = spec.to_dict()
    return out


def chat_completion(reply: Reply, model: str, with_provenance: bool) -> dict[str, object]:
    assert reply.finished is not None
    message: dict[str, object] = {"role": "assistant", "content": "".join(reply.text)}
    if reply.reasoning:
        message["reasoning_content"] = "".join(reply.reasoning)
    if reply.finished.tool_calls:
        message["tool_calls"] = tool_calls_json(reply.finished.tool_calls)
        message["content"] = message["content"] or None  # as OpenAI answers a reply that is only calls
    choice: dict[str, object] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": reply_finish_reason(reply.finished),
    }
    if with_provenance:
        choice["provenance"] = list(reply.provenance)
    return {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": model,
        "system_fingerprint": reply.fingerprint or None,
        "choices": [choice],
        "usage": usage(reply.finished),
        "timings": timings(reply.finished),
    }


def text_completion(reply: Reply, model: str, with_provenance: bool) -> dict[str, object]:
    assert reply.finished is not None
    choice: dict[str, object] = {
        "index": 0,
        "text": "".join(reply.text),
        "logprobs": None,
        "finish_reason": finish_reason(reply.finished.stop_reason),
    }
    if with_provenance:
        choice["provenance"] = list(reply.provenance)
    return {
        "id": reply.id.replace("chatcmpl-", "cmpl-"),
        "object": "text_completion",
        "created": reply.created,
        "model": model,
        "system_fingerprint": reply.fingerprint or None,
        "choices": [choice],
        "usage": usage(reply.finished),
        "timings": timings(reply.finished),
    }


def text_completions(replies: list[Reply], model: str, with_provenance: bool) -> dict[str, object]:
    """The answer to several prompts: the first's, with a choice per prompt in order and the usage of them all."""
    answers = [text_completion(reply, model, with_provenance) for reply in replies]
    out = answers[0]
    out["choices"] = [{**answer["choices"][0], "index": i} for i, answer in enumerate(answers)]  # type: ignore[index]
    totals = {key: sum(answer["usage"][key] for answer in answers) for key in ("prompt_tokens", "completion_tokens")}  # type: ignore[index]
    cached = sum(answer["usage"]["prompt_tokens_details"]["cached_tokens"] for answer in answers)  # type: ignore[index]
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    out["usage"] = {**totals, "prompt_tokens_details": {"cached_tokens": cached}}
    return out


def chat_chunk(
    reply: Reply,
    model: str,
    delta: dict[str, object],
    finish: str | None = None,
    extra: dict[str, object] | None = None,
) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if extra:
        choice.update(extra)
    return {
        "id": reply.id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": model,
        "system_fingerprint": reply.fingerprint or None,
        "choices": [choice],
    }


def text_chunk(reply: Reply, model: str, text: str, finish: str | None = None, *, index: int = 0) -> dict[str, object]:
    return {
        "id": reply.id.replace("chatcmpl-", "cmpl-"),
        "object": "text_completion",
        "created": reply.created,
        "model": model,
        "system_fingerprint": reply.fingerprint or None,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
    }


KEEPALIVE = (
    b": keep-alive\n\n"  # an SSE comment, which every client's parser skips: a stream alive while a prompt is read
)


def sse(data: dict[str, object] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line (what OpenAI's clients read)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
