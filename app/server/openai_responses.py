"""OpenAI's Responses API (`POST /v1/responses`): a Responses body becomes the chat completions body it means and
goes through `parse_chat` (every bound and check of chat completions), the answer is a `response` object with its
output items or the Responses stream events, and `previous_response_id` reads a bounded in-memory store of earlier
conversations (`store: false` keeps nothing)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping

from app.server.api_errors import ApiError, bad_request
from app.server.blocks import Block, BlockKind, BlockShaper, PromptCount, StreamEvent
from app.server.requests import Job, Limits, parse_chat
from app.server.tool_requests import tool_calls_json
from engine_ext.params import SamplingParams
from engine_ext.protocol import Finished, ToolCall

MAX_STORED = 256  # responses kept for previous_response_id; the oldest goes first
MAX_STORED_BYTES = 64 << 20  # their conversations' JSON together

# OpenAI's fields we take; `metadata`, `user`, `include`, `service_tier`, `prompt_cache_key`, `safety_identifier`,
# `stream_options`, `truncation` and `client_metadata` (Codex's) change nothing here (accepted, ignored);
# `background` must be false.
_FIELDS = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text",
        "max_output_tokens", "temperature", "top_p", "stream", "previous_response_id", "store", "metadata", "user",
        "include", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options", "truncation",
        "background", "client_metadata",
    }
)  # fmt: skip
_PASSED = ("model", "stream", "temperature", "top_p", "parallel_tool_calls")
_EFFORTS = {"none": "none", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


class ResponseStore:
    """Conversations of earlier responses (chat messages, the answer's last), bounded in count and bytes."""

    def __init__(self, max_items: int = MAX_STORED, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[list[dict[str, object]], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict[str, object]]) -> None:
        size = len(json.dumps(messages, ensure_ascii=False))
        if size > self.max_bytes:
            return
        with self._lock:
            self._items[response_id] = (messages, size)
            self._bytes += size
            while len(self._items) > self.max_items or self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def get(self, response_id: str) -> list[dict[str, object]] | None:
        with self._lock:
            found = self._items.get(response_id)
        return None if found is None else list(found[0])

    def __len__(self) -> int:
        return len(self._items)


def parse_response_request(
    body: Mapping[str, object], defaults: SamplingParams, limits: Limits, model: str, store: ResponseStore
) -> tuple[Job, list[dict[str, object]]]:
    """A Responses body as a Job, and the conversation it continues (for the store): input after the earlier
    response's, instructions apart (they are not carried to the next response, as OpenAI does)."""
    unknown = sorted(k for k in body if k not in _FIELDS)
    if unknown:
        raise bad_request(f"Unknown parameter: '{unknown[0][:60]}'.", unknown[0][:60])
    if body.get("background") not in (None, False):
        raise bad_request("background responses are not supported by this server", "background")
    conversation: list[dict[str, object]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        found = store.get(previous) if isinstance(previous, str) else None
        if found is None:
            shown = previous[:60] if isinstance(previous, str) else "?"
            raise ApiError(
                400,
                f"Previous response with id '{shown}' not found.",
                "previous_response_id",
                "previous_response_not_found",
            )
        conversation = found
    conversation += _input(body.get("input"))
    chat: dict[str, object] = {k: body[k] for k in _PASSED if k in body}
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", "instructions")
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") not in (None, []):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    chat.update(_reasoning(body.get("reasoning")))
    chat.update(_text_format(body.get("text")))
    try:
        job = parse_chat(chat, defaults, limits, model)
    except ApiError as e:  # the chat field's name → this API's
        if e.param == "max_tokens":
            raise ApiError(
                e.status, e.message.replace("max_tokens", "max_output_tokens"), "max_output_tokens"
            ) from None
        raise
    return job, conversation


def _input(value: object) -> list[dict[str, object]]:
    """`input` as chat messages: message items, function_call items (joined to the assistant turn before them),
    function_call_output items as tool messages; reasoning items are not replayed."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("input must be a string or a non-empty list of items", "input")
    out: list[dict[str, object]] = []
    names: dict[str, str] = {}  # call_id → its function's name, for the outputs
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
                raise bad_request(f"{where}: a function_call needs a call_id and a name", "input")
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last.get("role") == "assistant":
                calls = last.setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_function_output(item, where, names))
        elif kind == "reasoning":
            continue
        else:
            shown = kind[:40] if isinstance(kind, str) else "untyped"
            raise bad_request(f"{where}: {shown!r} items are not supported by this server", "input")
    return out


def _function_output(item: Mapping[str, object], where: str, names: Mapping[str, str]) -> dict[str, object]:
    """A function_call_output as a tool message; one without a call_id that names its function (Codex adds its goal
    as `{"name": "goal_objective", "namespace": "agent", "output": …}`, answering no call) as a user turn saying
    whose output it is."""
    call_id, name, namespace = item.get("call_id"), item.get("name"), item.get("namespace")
    text = _content(item.get("output"), where)
    if not isinstance(text, str):
        if any(p["type"] != "text" for p in text):
            raise bad_request(f"{where}.output: function outputs take text only", "input")
        text = "\n".join(str(p["text"]) for p in text)
    if isinstance(call_id, str) and call_id:
        return {"role": "tool", "tool_call_id": call_id, "name": names.get(call_id, ""), "content": text}
    if isinstance(name, str) and name:
        qualified = f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name
        return {"role": "user", "content": f"Output of {qualified[:128]}:\n{text}"}
    raise bad_request(f"{where}.call_id must be the call_id of the function_call it answers", "input")


def _content(value: object, where: str) -> str | list[dict[str, object]]:
    """A message's content as chat parts: text parts, and input_image as the image_url chat completions checks."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where}.content must be a string or a list of parts", "input")
    parts: list[dict[str, object]] = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text", part.get("refusal"))})
        elif isinstance(part, dict) and kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            shown = kind[:40] if isinstance(kind, str) else "untyped"
            raise bad_request(f"{where}.content[{j}]: {shown!r} parts are not supported by this server", "input")
    return parts


# OpenAI's hosted tools: run by OpenAI's servers, not by the model's client, so none is offered here (Codex sends
# web_search with every request); a request that names one as its tool_choice gets the model's own choice.
_HOSTED_TOOLS = frozenset(
    {
        "web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
        "computer_use_preview", "mcp",
    }
)  # fmt: skip


def _tools(value: object) -> list[dict[str, object]]:
    """Function tools as chat completions takes them: a namespace's functions (Codex groups its sub-agent tools in
    one) among them, hosted tools left out."""
    if not isinstance(value, list):
        raise bad_request("tools must be a list", "tools")
    out: list[dict[str, object]] = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in _HOSTED_TOOLS:
            continue
        if kind == "namespace" and isinstance(tool, dict) and isinstance(tool.get("tools"), list):
            out += _functions(tool["tools"], f"tools[{i}].tools")
        else:
            out += _functions([tool], "tools", i)
    return out


def tool_namespaces(value: object) -> dict[str, str]:
    """The namespace of each function offered inside one (`{"type": "namespace", "name": …}`): a call to it names its
    namespace (the `namespace` of a function_call item), as Codex routes its sub-agent tools by both."""
    found: dict[str, str] = {}
    for tool in value if isinstance(value, list) else ():
        if not (isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str)):
            continue
        inners = tool.get("tools")
        for inner in inners if isinstance(inners, list) else ():
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                found.setdefault(inner["name"], tool["name"])
    return found


def _functions(tools: list[object], where: str, first: int = 0) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, tool in enumerate(tools, first):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = str(tool.get("type"))[:40] if isinstance(tool, dict) else "?"
            raise bad_request(f"{where}[{i}]: only function tools are available here, not {kind!r}", "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: object) -> object:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise bad_request("tool_choice must be auto, none, required or {type: function, name}", "tool_choice")


def _reasoning(value: object) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("reasoning must be an object", "reasoning")
    effort = value.get("effort")
    if effort is None:
        return {}
    if effort not in _EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(_EFFORTS)}", "reasoning")
    return {"reasoning_effort": _EFFORTS[str(effort)]}


def _text_format(value: object) -> dict[str, object]:
    """`text.format` (text, json_object, json_schema) as chat's response_format; `text.verbosity` is ignored."""
    fmt = value.get("format") if isinstance(value, dict) else None
    if value is not None and not isinstance(value, dict):
        raise bad_request("text must be an object", "text")
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema" and isinstance(fmt, dict):
        if fmt.get("schema") is None:
            raise bad_request("text.format json_schema needs a schema", "text")
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}}
    raise bad_request("text.format.type must be text, json_object or json_schema", "text")


class ResponseShaper(BlockShaper):
    """A reply as a `response` object and its stream events (response.created … response.completed), keeping the
    conversation in the store unless `store: false`."""

    def __init__(
        self,
        job: Job,
        model: str,
        body: Mapping[str, object],
        conversation: list[dict[str, object]],
        store: ResponseStore,
    ) -> None:
        super().__init__(job, model)
        self.id = f"resp_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.body = body
        self.conversation = conversation
        self.store = store
        self._ids: list[str] = []  # each block's item id
        self._sequence = 0
        self._namespaces = tool_namespaces(body.get("tools"))

    # ----- the whole response -------------------------------------------------------------------

    def _item(self, index: int, block: Block, status: str) -> dict[str, object]:
        if block.kind == "thinking":
            content = [{"type": "reasoning_text", "text": block.text}]
            return {"type": "reasoning", "id": self._ids[index], "summary": [], "content": content, "status": status}
        return {
            "type": "message",
            "id": self._ids[index],
            "status": status,
            "role": "assistant",
            "content": [_output_text(block.text)] if status == "completed" else [],
        }

    def _call_items(self) -> list[dict[str, object]]:
        calls = self.finished.tool_calls if self.finished else ()
        return [self._call(f"fc_{c.id}", c, c.arguments, "completed") for c in calls]

    def _call(self, item_id: str, call: ToolCall, arguments: str, status: str) -> dict[str, object]:
        item = _function_call(item_id, call.id, call.name, arguments, status)
        if call.name in self._namespaces:
            item["namespace"] = self._namespaces[call.name]
        return item

    def _response(self, status: str) -> dict[str, object]:
        output = [self._item(i, b, "completed") for i, b in enumerate(self.blocks)] if status != "in_progress" else []
        output += self._call_items() if status != "in_progress" else []
        incomplete = status == "incomplete"
        out: dict[str, object] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.body.get("parallel_tool_calls", True),
            "previous_response_id": self.body.get("previous_response_id"),
            "reasoning": {"effort": self.job.reasoning_effort, "summary": None},
            "store": self.body.get("store", True) is not False,
            "temperature": self.job.sampling.temperature,
            "text": self.body.get("text") or {"format": {"type": "text"}},
            "tool_choice": self.body.get("tool_choice", "auto"),
            "tools": self.body.get("tools") or [],
            "top_p": self.job.sampling.top_p,
            "truncation": "disabled",
            "metadata": self.body.get("metadata") or {},
            "usage": self._usage() if self.finished else None,
        }
        return out

    def _usage(self) -> dict[str, object]:
        assert self.finished is not None
        s = self.finished.stats
        return {
            "input_tokens": s.prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.prompt_tokens_cached},
            "output_tokens": s.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
            "total_tokens": s.prompt_tokens + s.generated_tokens,
        }

    def _status(self) -> str:
        assert self.finished is not None
        if self.finished.tool_calls or self.finished.stop_reason not in ("max_tokens", "context_full"):
            return "completed"
        return "incomplete"

    def answer(self) -> dict[str, object]:
        return self._response(self._status())

    # ----- the stream ---------------------------------------------------------------------------

    def _event(self, kind: str, **data: object) -> StreamEvent:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence - 1, **data}

    def on_start(self, prompt: PromptCount) -> list[StreamEvent]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def on_open(self, index: int, kind: BlockKind) -> list[StreamEvent]:
        self._ids.append(f"{'rs' if kind == 'thinking' else 'msg'}_{uuid.uuid4().hex[:24]}")
        item = self._item(index, Block(kind), "in_progress")
        steps = [self._event("response.output_item.added", output_index=index, item=item)]
        if kind == "text":
            where = {"item_id": self._ids[index], "output_index": index, "content_index": 0}
            steps.append(self._event("response.content_part.added", **where, part=_output_text("")))
        return steps

    def on_delta(self, index: int, kind: BlockKind, text: str) -> list[StreamEvent]:
        where = {"item_id": self._ids[index], "output_index": index, "content_index": 0}
        if kind == "thinking":
            return [self._event("response.reasoning_text.delta", **where, delta=text)]
        return [self._event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def on_close(self, index: int, block: Block) -> list[StreamEvent]:
        where = {"item_id": self._ids[index], "output_index": index, "content_index": 0}
        if block.kind == "thinking":
            steps = [self._event("response.reasoning_text.done", **where, text=block.text)]
        else:
            steps = [
                self._event("response.output_text.done", **where, text=block.text, logprobs=[]),
                self._event("response.content_part.done", **where, part=_output_text(block.text)),
            ]
        item = self._item(index, block, "completed")
        return [*steps, self._event("response.output_item.done", output_index=index, item=item)]

    def on_finish(self, finished: Finished) -> list[StreamEvent]:
        steps: list[StreamEvent] = []
        for index, call in enumerate(finished.tool_calls, len(self.blocks)):
            item_id = f"fc_{call.id}"
            item = self._call(item_id, call, "", "in_progress")
            where = {"item_id": item_id, "output_index": index}
            steps.append(self._event("response.output_item.added", output_index=index, item=item))
            steps.append(self._event("response.function_call_arguments.delta", **where, delta=call.arguments))
            steps.append(
                self._event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
            )
            done = self._call(item_id, call, call.arguments, "completed")
            steps.append(self._event("response.output_item.done", output_index=index, item=done))
        if self.body.get("store", True) is not False:
            self.store.put(self.id, [*self.conversation, self._answer_message(finished)])
        status = self._status()
        return [*steps, self._event(f"response.{status}", response=self._response(status))]

    def _answer_message(self, finished: Finished) -> dict[str, object]:
        """The answer as the chat message a later response's conversation holds (its thinking left out)."""
        text = "".join(b.text for b in self.blocks if b.kind == "text")
        message: dict[str, object] = {"role": "assistant", "content": text}
        if finished.tool_calls:
            message["tool_calls"] = tool_calls_json(finished.tool_calls)
        return message

    def error(self, error: ApiError) -> bytes:
        step = self._event("error", code=error.code, message=error.message, param=error.param)
        return self.sse(*step)


def _output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, object]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
