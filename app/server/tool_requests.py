"""The tool fields of a chat request (OpenAI's shape): `tools`, `tool_choice` (auto, none, required, or one function
by name; null is auto), the legacy `functions` and `function_call` as those, assistant messages with `tool_calls`
and `tool` messages with their results; and the tool calls of a reply as OpenAI returns them (whole, and as
streamed deltas)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from app.server.api_errors import bad_request
from engine_ext.protocol import ChatMessage, ToolCall
from engine_ext.tool_calls import ToolsError, calls_from_json, calls_to_json, read_tools


def _legacy_functions(body: Mapping[str, object]) -> Mapping[str, object]:
    """`body` with OpenAI's legacy `functions` and `function_call` as the `tools` and `tool_choice` they stand for."""
    functions, call = body.get("functions"), body.get("function_call")
    if functions is None:
        if call is not None:
            raise bad_request("function_call needs functions", "function_call")
        return body
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        raise bad_request("give tools and tool_choice, or functions and function_call (the legacy form), not both")
    if not isinstance(functions, list):
        raise bad_request("functions must be a list of functions", "functions")
    if isinstance(call, dict):
        call = {"type": "function", "function": call}
    elif call not in (None, "auto", "none"):
        raise bad_request("function_call must be auto, none or {name}", "function_call")
    return {**body, "tools": [{"type": "function", "function": f} for f in functions], "tool_choice": call}


def parse_tools(body: Mapping[str, object]) -> tuple[str | None, str]:
    """The request's tool definitions (JSON text for the engine; None: none) and its tool choice; the legacy
    `functions` and `function_call` are taken for them."""
    body = _legacy_functions(body)
    value = body.get("tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if value in (None, []):
        return None, "none" if body.get("tool_choice") == "none" else "auto"
    try:
        tools = read_tools(json.dumps(value))
    except ToolsError as e:
        raise bad_request(f"tools: {e}", "tools") from None
    choice = body.get("tool_choice") or "auto"  # null: auto, as OpenAI takes it
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        chosen = [t for t in tools if t["function"]["name"] == name]
        if choice.get("type") != "function" or not chosen:
            raise bad_request("tool_choice names a function that is not one of the tools", "tool_choice")
        return json.dumps(chosen), "required"
    if choice not in ("auto", "none", "required"):
        raise bad_request(
            "tool_choice must be auto, none, required or {type: function, function: {name}}", "tool_choice"
        )
    return json.dumps(tools), str(choice)


def tool_message(item: Mapping[str, object], role: str, content: str, where: str) -> ChatMessage:
    """A `tool` result, or an assistant message with its `tool_calls`, as the engine takes them."""
    if role == "tool":
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"{where}.tool_call_id must be the id of the call this is the result of", "messages")
        name = item.get("name", "")
        return ChatMessage("tool", content, tool_call_id=call_id, name=name if isinstance(name, str) else "")
    try:
        calls = calls_from_json(json.dumps(item.get("tool_calls")))
    except ToolsError as e:
        raise bad_request(f"{where}.tool_calls: {e}", "messages") from None
    return ChatMessage("assistant", content, calls_to_json(calls))


def tool_calls_json(calls: Sequence[ToolCall], *, streamed: bool = False) -> list[dict[str, object]]:
    """A reply's calls as OpenAI's `tool_calls` (streamed deltas carry their index)."""
    out: list[dict[str, object]] = []
    for i, call in enumerate(calls):
        item: dict[str, object] = {"id": call.id, "type": "function"}
        item["function"] = {"name": call.name, "arguments": call.arguments}
        out.append({"index": i, **item} if streamed else item)
    return out
