"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): a Messages body becomes the chat
completions body it means and goes through `parse_chat` (so every bound and check is the one chat completions has),
the answer is a `message` with its content blocks or Anthropic's SSE event sequence, and errors take its shape.

Claude Code starts its system prompt with a line that changes on every request (`x-anthropic-billing-header: …;
cch=<nonce>;`): it is left out of the prompt, so the prompt cache keeps the whole prefix from one turn to the next.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import replace

from app.server.api_errors import ApiError, bad_request
from app.server.blocks import Block, BlockKind, BlockShaper, PromptCount, StreamEvent
from app.server.requests import Job, Limits, parse_chat
from engine_ext.params import SamplingParams
from engine_ext.protocol import Finished, StopReason

# Anthropic's fields we take; those in _IGNORED change nothing here (accepted, ignored: the prompt cache is
# automatic, there is one speed and one place).
_IGNORED = frozenset(
    {
        "metadata", "service_tier", "context_management", "cache_control", "diagnostics", "inference_geo", "speed",
        "user_profile_id", "workspace_id",
    }
)  # fmt: skip
_FIELDS = _IGNORED | {
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "output_config", "container",
}  # fmt: skip
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
_PASSED = ("model", "max_tokens", "stream", "temperature", "top_p", "top_k")  # the same in both APIs
_BILLING_LINE = re.compile(r"x-anthropic-billing-header:(?:[^\n]*?cch=[^;\n]*;|[^\n]*)[ \t]*\n?")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_STOP: dict[StopReason, str] = {
    "eos": "end_turn",
    "stop_string": "stop_sequence",
    "max_tokens": "max_tokens",
    "context_full": "model_context_window_exceeded",
    "cancelled": "end_turn",
}


def error_body(error: ApiError) -> dict[str, object]:
    """An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def parse_messages(
    body: Mapping[str, object], defaults: SamplingParams, limits: Limits, model: str, *, count_only: bool = False
) -> Job:
    """A Messages body as a Job (count_tokens: `count_only`, where max_tokens may be left out); 400s name the field."""
    unknown = sorted(k for k in body if k not in _FIELDS)
    if unknown:
        raise bad_request(f"{unknown[0][:60]}: Extra inputs are not permitted", unknown[0][:60])
    if body.get("max_tokens") is None and not count_only:
        raise bad_request("max_tokens: Field required", "max_tokens")
    chat: dict[str, object] = {k: body[k] for k in _PASSED if k in body}
    chat["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
    if body.get("stop_sequences") is not None:
        if not isinstance(body["stop_sequences"], list):
            raise bad_request("stop_sequences must be a list of strings", "stop_sequences")
        chat["stop"] = body["stop_sequences"]
    if body.get("tools") not in (None, []):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("container") is not None:
        raise bad_request("container: code execution containers are not available here", "container")
    chat.update(_thinking(body.get("thinking")))
    chat.update(_output_config(body.get("output_config")))
    try:
        job = parse_chat(chat, defaults, limits, model)
    except ApiError as e:  # the chat field's name → this API's
        if e.param == "stop":
            raise replace(e, message=e.message.replace("stop", "stop_sequences", 1), param="stop_sequences") from None
        raise
    return replace(job, count_only=True, stream=False) if count_only else job


def strip_billing_line(text: str) -> str:
    """`text` without Claude Code's per-request `x-anthropic-billing-header: …; cch=…;` line at its start."""
    head = _BILLING_LINE.match(text)
    return text[head.end() :] if head else text


def _system(value: object) -> list[dict[str, object]]:
    if value is None:
        return []
    if isinstance(value, str):
        text = strip_billing_line(value)
        return [{"role": "system", "content": text}] if text else []
    if not isinstance(value, list):
        raise bad_request("system must be a string or a list of text blocks", "system")
    parts: list[dict[str, object]] = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"system[{i}] must be a text block", "system")
        text = strip_billing_line(block["text"])
        if text:
            parts.append({"type": "text", "text": text})
    return [{"role": "system", "content": parts}] if parts else []


def _messages(value: object) -> list[dict[str, object]]:
    """Anthropic's turns as chat messages (system turns as system messages): tool_result blocks become tool messages
    (before the user's text, as they answer the calls of the turn before), tool_use blocks the assistant's
    tool_calls; earlier turns' thinking is not replayed (Anthropic's own API drops it too)."""
    if not isinstance(value, list) or not value:
        raise bad_request("messages: at least one message is required", "messages")
    out: list[dict[str, object]] = []
    names: dict[str, str] = {}  # tool_use id → its tool's name, for the results
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict) or item.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"{where}.role must be user, assistant or system", "messages")
        role = item["role"]
        content = item.get("content")
        if role == "system":  # Claude Code 2.1 sends system turns between the others: as llama-server, kept there
            out += _system(content)
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"{where}.content must be a string or a list of blocks", "messages")
        parts: list[dict[str, object]] = []
        calls: list[dict[str, object]] = []
        results: list[dict[str, object]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(block, dict):
                raise bad_request(f"{at} must be a content block", "messages")
            kind = block.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": block.get("text")})
            elif kind == "image" and role == "user":
                parts.append(_image(block.get("source"), at))
            elif kind == "tool_use" and role == "assistant":
                calls.append(_call(block, at, names))
            elif kind == "tool_result" and role == "user":
                results.append(_result(block, at, names))
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue
            else:
                shown = kind[:40] if isinstance(kind, str) else "untyped"
                raise bad_request(f"{at}: {shown!r} blocks are not supported in {role} messages", "messages")
        out += results
        if calls:
            out.append({"role": "assistant", "content": parts or None, "tool_calls": calls})
        elif parts or not results:
            out.append({"role": role, "content": parts})
    return out


def _image(source: object, where: str) -> dict[str, object]:
    """A base64 image block as the data: URL chat completions takes (checked there); URLs are not fetched."""
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise bad_request(f"{where}: images must have a base64 source (URLs are not fetched)", "messages")
    media, data = source.get("media_type"), source.get("data")
    if not isinstance(media, str) or not isinstance(data, str):
        raise bad_request(f"{where}: a base64 image needs media_type and data", "messages")
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}


def _call(block: Mapping[str, object], where: str, names: dict[str, str]) -> dict[str, object]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not isinstance(arguments, dict):
        raise bad_request(f"{where}: a tool_use block needs an id, a name and an input object", "messages")
    names[call_id] = name
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _result(block: Mapping[str, object], where: str, names: dict[str, str]) -> dict[str, object]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"{where}.tool_use_id must be the id of the tool_use this answers", "messages")
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{k}]: tool results take text blocks only (no images)", "messages")
            texts.append(part["text"])
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or a list of text blocks", "messages")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "name": names.get(call_id, ""), "content": content}


def _tools(value: object) -> list[dict[str, object]]:
    if not isinstance(value, list):
        raise bad_request("tools must be a list", "tools")
    out: list[dict[str, object]] = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{i}] must be an object", "tools")
        if tool.get("type") not in (None, "custom"):
            kind = str(tool.get("type"))[:40]
            raise bad_request(f"tools[{i}]: Anthropic's server tools ({kind!r}) are not available here", "tools")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema", {"type": "object"})}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: object) -> object:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value, dict):
        return {"type": "function", "function": {"name": value.get("name")}}
    raise bad_request("tool_choice.type must be auto, any, tool or none", "tool_choice")


def _thinking(value: object) -> dict[str, object]:
    """`thinking`: enabled with a budget (the reasoning budget), disabled (the template told), adaptive (the
    template's own)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "adaptive":
        return {}
    if kind == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if kind == "enabled" and isinstance(value, dict):
        budget = value.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise bad_request("thinking.budget_tokens must be a positive integer", "thinking")
        return {"reasoning_budget": budget}
    raise bad_request("thinking.type must be enabled, disabled or adaptive", "thinking")


def _output_config(value: object) -> dict[str, object]:
    """`output_config`: `effort` as the reasoning effort templates read, `format` (a JSON schema) as the reply's."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("output_config must be an object", "output_config")
    out: dict[str, object] = {}
    effort, fmt = value.get("effort"), value.get("format")
    if effort is not None:
        if effort not in _EFFORTS:
            raise bad_request(f"output_config.effort must be one of {', '.join(_EFFORTS)}", "output_config")
        out["reasoning_effort"] = _EFFORTS[str(effort)]
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise bad_request("output_config.format must be {type: json_schema, schema: {...}}", "output_config")
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
    return out


class MessageShaper(BlockShaper):
    """A reply as Anthropic's `message` and its event sequence: message_start, per block content_block_start,
    deltas and content_block_stop (a ping after the first start), message_delta with the stop reason and usage,
    message_stop."""

    def __init__(self, job: Job, model: str) -> None:
        super().__init__(job, model)
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self._pinged = False

    def usage(self) -> dict[str, int]:
        prompt = self.prompt or PromptCount(0, 0)
        return {
            "input_tokens": prompt.tokens - prompt.cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": prompt.cached,
            "output_tokens": self.finished.stats.generated_tokens if self.finished else 0,
        }

    def _stop(self) -> tuple[str | None, str | None]:
        if self.finished is None:
            return None, None
        if self.finished.tool_calls:
            return "tool_use", None
        reason = _STOP.get(self.finished.stop_reason, "end_turn")
        sequence = self.job.stop[0] if reason == "stop_sequence" and len(self.job.stop) == 1 else None
        return reason, sequence

    def _message(self, content: list[dict[str, object]]) -> dict[str, object]:
        reason, sequence = self._stop()
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(),
        }

    def _content(self) -> list[dict[str, object]]:
        blocks = [_block(b.kind, b.text) for b in self.blocks]
        calls = self.finished.tool_calls if self.finished else ()
        return blocks + [_tool_use(c.id, c.name, self.arguments(c)) for c in calls]

    def on_start(self, prompt: PromptCount) -> list[StreamEvent]:
        return [("message_start", {"type": "message_start", "message": self._message([])})]

    def keepalive(self) -> bytes:
        return self.sse("ping", {"type": "ping"})

    def _ping(self) -> list[StreamEvent]:
        if self._pinged:
            return []
        self._pinged = True
        return [("ping", {"type": "ping"})]

    def on_open(self, index: int, kind: BlockKind) -> list[StreamEvent]:
        start = {"type": "content_block_start", "index": index, "content_block": _block(kind, "")}
        return [("content_block_start", start), *self._ping()]

    def on_delta(self, index: int, kind: BlockKind, text: str) -> list[StreamEvent]:
        delta = (
            {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta", "text": text}
        )
        return [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})]

    def on_close(self, index: int, block: Block) -> list[StreamEvent]:
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def on_finish(self, finished: Finished) -> list[StreamEvent]:
        steps: list[StreamEvent] = []
        for index, call in enumerate(finished.tool_calls, len(self.blocks)):
            start = {"type": "content_block_start", "index": index, "content_block": _tool_use(call.id, call.name, {})}
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            steps += [("content_block_start", start), *self._ping()]
            steps.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            steps.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        reason, sequence = self._stop()
        end = {"stop_reason": reason, "stop_sequence": sequence}
        steps += self._ping()
        steps.append(("message_delta", {"type": "message_delta", "delta": end, "usage": self.usage()}))
        return [*steps, ("message_stop", {"type": "message_stop"})]

    def answer(self) -> dict[str, object]:
        return self._message(self._content())

    def error(self, error: ApiError) -> bytes:
        return self.sse("error", error_body(error))


class CountShaper(MessageShaper):
    """count_tokens: `{"input_tokens": N}`, the prompt as the model's template renders it."""

    def answer(self) -> dict[str, object]:
        return {"input_tokens": self.prompt.tokens if self.prompt else 0}


def _block(kind: BlockKind, text: str) -> dict[str, object]:
    if kind == "thinking":
        return {"type": "thinking", "thinking": text, "signature": ""}
    return {"type": "text", "text": text}


def _tool_use(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
