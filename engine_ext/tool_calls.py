"""Tool calling through the model's own chat template, as pure functions: the bounded reader of tool definitions
(OpenAI's shape), the call format a template declares, messages with calls and results as templates expect them,
and the parser of the calls in a reply (Qwen/Hermes ``<tool_call>`` JSON, Llama 3.x JSON and ``<|python_tag|>``,
Mistral ``[TOOL_CALLS]``).

Replies and definitions are text from outside: every limit is checked before parsing, and whatever the text holds
(huge, nested, truncated or invalid JSON) the parser gives calls or a one-line refusal, never an exception.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from engine_ext.params import EngineError
from engine_ext.protocol import ChatMessage, ToolCall
from engine_ext.untrusted_text import one_line

MAX_TOOLS_CHARS = 256 * 1024  # the tool definitions' JSON
MAX_TOOLS = 128
MAX_REPLY_CHARS = 512 * 1024  # reply text the parser reads (a longer reply is refused, not parsed)
MAX_CALLS = 32  # calls taken from one reply
MAX_ARGUMENTS_CHARS = 128 * 1024  # one call's arguments, as JSON text
TOOL_CHOICES = ("auto", "required", "none")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

HERMES = "hermes"  # <tool_call>{"name": …, "arguments": {…}}</tool_call> (Qwen 2.5/3, Hermes, many fine-tunes)
LLAMA3 = "llama3"  # {"name": …, "parameters": {…}}, after <|python_tag|> or as the whole reply (Llama 3.1-3.3)
MISTRAL = "mistral"  # [TOOL_CALLS][{"name": …, "arguments": {…}}] (Mistral, Mixtral, Ministral)
FORMATS = (HERMES, LLAMA3, MISTRAL)

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_OPEN = "[TOOL_CALLS]"
_THINK_CLOSE = "</think>"


class ToolsError(EngineError):
    """Tool definitions, a tool choice or a model's template that cannot take tools (one line)."""


@dataclass(frozen=True)
class ParsedReply:
    """What a reply said (its text without the calls) and the calls it made; `refusal` says, in one line, why a
    call it started could not be taken (the calls before it are kept)."""

    content: str
    calls: tuple[ToolCall, ...]
    refusal: str = ""


# ----- tool definitions ---------------------------------------------------------------------------------------------


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def loads_json(text: str) -> Any:
    """json.loads without NaN/Infinity; ValueError (with RecursionError folded in) for anything else."""
    try:
        return json.loads(text, parse_constant=_no_constant, strict=False)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_tools(text: str) -> list[dict[str, Any]]:
    """The tool definitions in `text` (a JSON array of ``{"type": "function", "function": {"name", "description",
    "parameters"}}``, or of bare functions), normalized to OpenAI's shape; ToolsError says what is wrong."""
    if len(text) > MAX_TOOLS_CHARS:
        raise ToolsError(f"the tool definitions have {len(text)} characters; at most {MAX_TOOLS_CHARS}")
    try:
        data = loads_json(text)
    except ValueError as e:
        raise ToolsError(f"the tool definitions are not JSON: {one_line(str(e), 120)}") from None
    if isinstance(data, dict):
        data = data.get("tools", [data])
    if not isinstance(data, list):
        raise ToolsError("the tool definitions are a JSON array of tools")
    if len(data) > MAX_TOOLS:
        raise ToolsError(f"{len(data)} tools; at most {MAX_TOOLS}")
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        function = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(function, dict) or (isinstance(item, dict) and item.get("type", "function") != "function"):
            raise ToolsError(f"tool {i + 1} is not a function tool ({{'type': 'function', 'function': {{…}}}})")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolsError(f"tool {i + 1} has no valid name (letters, digits, _ . -; at most 64)")
        if name in seen:
            raise ToolsError(f"two tools are named {name!r}")
        seen.add(name)
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolsError(f"tool {name!r}: parameters is a JSON schema object")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise ToolsError(f"tool {name!r}: description is text")
        tools.append(
            {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
        )
    return tools


@lru_cache(maxsize=8)
def _cached_tools(text: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_tools(text))


def tools_of(text: str | None, tool_choice: str) -> list[dict[str, Any]]:
    """The tools a request offers the model: none without definitions or with tool choice "none"."""
    if tool_choice not in TOOL_CHOICES:
        raise ToolsError(f"unknown tool choice {one_line(tool_choice, 40)!r}: auto, required or none")
    if text is None or tool_choice == "none":
        return []
    tools = [dict(t) for t in _cached_tools(text)]
    if not tools and tool_choice == "required":
        raise ToolsError("tool choice 'required' needs at least one tool")
    return tools


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(t["function"]["name"]) for t in tools]


# ----- templates ----------------------------------------------------------------------------------------------------


def template_format(template: str | None) -> str | None:
    """The call format a chat template declares by its markers; None when it names none (its tool calls, if it
    takes tools at all, are then parsed as bare JSON)."""
    source = template or ""
    if HERMES_OPEN in source:
        return HERMES
    if MISTRAL_OPEN in source:
        return MISTRAL
    if PYTHON_TAG in source or ("<|start_header_id|>" in source and "parameters" in source):
        return LLAMA3
    return None


PROBE_TOOL = "llmtui_probe_tool"


def probe_tools() -> list[dict[str, Any]]:
    """One tool whose name shows in a render that lists tools (supports_tools renders with it)."""
    return [
        {
            "type": "function",
            "function": {"name": PROBE_TOOL, "description": "", "parameters": {"type": "object", "properties": {}}},
        }
    ]


PROBE_MESSAGES: tuple[dict[str, str], ...] = ({"role": "user", "content": "hi"},)


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates expect it: an assistant's calls as ``tool_calls`` with their arguments as an
    object (Qwen, Llama and Mistral templates apply ``tojson`` to them), a result with its call's id and tool."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        calls = []
        for call in calls_from_json(message.tool_calls):
            arguments = loads_json(call.arguments) if call.arguments else {}
            function = {"name": call.name, "arguments": arguments}
            calls.append({"id": call.id, "type": "function", "function": function, **function})
        out["tool_calls"] = calls
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def calls_to_json(calls: Sequence[ToolCall]) -> str:
    """Calls as OpenAI's ``tool_calls`` array (arguments as JSON text), for ChatMessage.tool_calls and the API."""
    return json.dumps(
        [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    )


def calls_from_json(text: str) -> list[ToolCall]:
    """ChatMessage.tool_calls back as calls; ToolsError when it is not that array."""
    try:
        data = loads_json(text) if len(text) <= MAX_REPLY_CHARS else None
    except ValueError:
        data = None
    if not isinstance(data, list):
        raise ToolsError("an assistant message's tool_calls is not a JSON array of calls")
    calls = []
    for item in data[:MAX_CALLS]:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ToolsError("an assistant message has a tool call without a function name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = item.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else new_call_id(), function["name"], arguments))
    return calls


def new_call_id() -> str:
    """A fresh call id: nine letters and digits (Mistral's templates refuse any other length)."""
    return uuid.uuid4().hex[:9]


# ----- parsing ------------------------------------------------------------------------------------------------------


# strict=False: a control character inside a string is taken, as the grammar's JSON strings allow it.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, strict=False)


def _json_at(text: str, start: int) -> tuple[Any, int]:
    """The JSON value that starts at `start` (after whitespace) and where it ends; ValueError when there is none."""
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def call_of(value: Any, known: Sequence[str]) -> ToolCall:
    """A call from one parsed JSON object; ValueError says what is wrong with it."""
    if not isinstance(value, dict):
        raise ValueError("a tool call is not a JSON object")
    function = value.get("function")
    if isinstance(function, dict) and "name" in function:  # OpenAI's own shape, which some fine-tunes write
        value = function
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("a tool call has no valid tool name")
    if known and name not in known:
        raise ValueError(f"the model called {name!r}, which is not one of the tools it was given")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        arguments = loads_json(arguments) if len(arguments) <= MAX_ARGUMENTS_CHARS else None
    if not isinstance(arguments, dict):
        raise ValueError(f"the call of {name!r} has arguments that are not a JSON object")
    text = json.dumps(arguments, ensure_ascii=False)
    if len(text) > MAX_ARGUMENTS_CHARS:
        raise ValueError(f"the call of {name!r} has arguments of {len(text)} characters; at most {MAX_ARGUMENTS_CHARS}")
    call_id = value.get("id")
    return ToolCall(call_id if isinstance(call_id, str) and _NAME.fullmatch(call_id) else new_call_id(), name, text)


def _hermes(text: str, known: Sequence[str]) -> Iterator[tuple[int, int, list[ToolCall]]]:
    """(start, end, calls) of each <tool_call> block; an unclosed last block runs to the end of the reply."""
    at = text.find(HERMES_OPEN)
    while at >= 0:
        close = text.find(HERMES_CLOSE, at)
        end = len(text) if close < 0 else close + len(HERMES_CLOSE)
        body = text[at + len(HERMES_OPEN) : len(text) if close < 0 else close]
        if close < 0:  # stopped inside the closing tag: what of it was written is no part of the call
            body = next(
                (body[:-n] for n in range(len(HERMES_CLOSE) - 1, 0, -1) if body.endswith(HERMES_CLOSE[:n])), body
            )
        value, used = _json_at(body, 0)
        if body[used:].strip():
            raise ValueError("a <tool_call> block holds more than one JSON object")
        yield at, end, [call_of(value, known)]
        at = text.find(HERMES_OPEN, end)


def _json_calls(text: str, start: int, known: Sequence[str]) -> tuple[list[ToolCall], int]:
    """Calls written as JSON from `start`: one object, an array of them, or objects separated by ';' (Llama 3.x)."""
    value, end = _json_at(text, start)
    values = value if isinstance(value, list) else [value]
    while True:
        rest = text[end:].lstrip()
        if not rest.startswith(";"):
            break
        value, end = _json_at(text, text.index(";", end) + 1)
        values.append(value)
    if len(values) > MAX_CALLS:
        raise ValueError(f"the reply makes {len(values)} calls; at most {MAX_CALLS}")
    return [call_of(v, known) for v in values], end


def _answer(text: str, opens_reasoning: bool) -> str:
    """The reply's answer: what follows its reasoning (a call written while thinking is no call)."""
    cut = text.rfind(_THINK_CLOSE)
    if cut >= 0:
        return text[cut + len(_THINK_CLOSE) :]
    return "" if opens_reasoning else text


def parse_reply(
    text: str, known: Sequence[str] = (), fmt: str | None = None, *, opens_reasoning: bool = False
) -> ParsedReply:
    """The calls in a reply's text (special tokens written out), in any of the formats above; `known` limits the
    tool names a call may have (and lets a bare JSON reply count as a call only when it names one of them); `fmt`
    (template_format's) is tried first. Never raises: a call that cannot be taken is the refusal."""
    if len(text) > MAX_REPLY_CHARS:
        return ParsedReply(
            text, (), f"the reply has {len(text)} characters; calls are read from at most {MAX_REPLY_CHARS}"
        )
    answer = _answer(text, opens_reasoning)
    order = ([fmt] if fmt in FORMATS else []) + [f for f in FORMATS if f != fmt]
    for name in order:
        try:
            parsed = _parse_format(name, answer, known)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            return ParsedReply(answer, (), one_line(f"a tool call was refused: {e}", 200))
        if parsed is not None:
            return parsed
    return ParsedReply(answer, ())


def _parse_format(fmt: str, text: str, known: Sequence[str]) -> ParsedReply | None:
    """The reply parsed as `fmt`, or None when it has none of that format's markers."""
    if fmt == HERMES:
        if HERMES_OPEN not in text:
            return None
        calls: list[ToolCall] = []
        content: list[str] = []
        last = 0
        for start, end, found in _hermes(text, known):
            content.append(text[last:start])
            calls += found
            last = end
            if len(calls) > MAX_CALLS:
                raise ValueError(f"the reply makes more than {MAX_CALLS} calls")
        content.append(text[last:])
        return ParsedReply("".join(content).strip(), tuple(calls))
    if fmt == MISTRAL:
        at = text.find(MISTRAL_OPEN)
        if at < 0:
            return None
        found, end = _json_calls(text, at + len(MISTRAL_OPEN), known)
        return ParsedReply((text[:at] + text[end:]).strip(), tuple(found))
    at = text.find(PYTHON_TAG)
    if at >= 0:
        found, end = _json_calls(text, at + len(PYTHON_TAG), known)
        return ParsedReply((text[:at] + text[end:]).strip(), tuple(found))
    stripped = text.strip()
    if not stripped.startswith(("{", "[")) or not known:
        return None
    # A bare JSON reply is a call only when it is one whole call (or several) of a given tool: a JSON answer stays text.
    try:
        found, end = _json_calls(stripped, 0, known)
    except ValueError:
        return None
    if stripped[end:].strip():
        return None
    return ParsedReply("", tuple(found))


class CallTextFilter:
    """The text of a streamed reply without its calls, as it streams: from a call's opening marker on, text is held
    back (a partial marker at the end too), and a reply that starts as JSON is held until the end shows whether it
    was a call. `finish(calls)` gives what was held if the reply made no call."""

    def __init__(self) -> None:
        self._seen = ""  # answer text so far
        self._shown = 0  # characters of it given out
        self._in_call = False

    def feed(self, text: str) -> str:
        self._seen += text
        if self._in_call:
            return ""
        seen = self._seen
        at = seen.find(HERMES_OPEN, max(0, self._shown - len(HERMES_OPEN)))
        if at >= 0:
            self._in_call = True
            out, self._shown = seen[self._shown : at], at
            return out
        if seen.lstrip().startswith(("{", "[")) or not seen.strip():
            return ""  # maybe a JSON call (Llama 3.x, Mistral without their control tokens in the text)
        keep = len(seen)
        for n in range(min(len(HERMES_OPEN) - 1, len(seen)), 0, -1):
            if seen.endswith(HERMES_OPEN[:n]):
                keep = len(seen) - n
                break
        out, self._shown = seen[self._shown : keep], max(self._shown, keep)
        return out

    def finish(self, made_calls: bool) -> str:
        """What is left to show once the reply is over."""
        if made_calls:
            rest = "" if self._in_call else self._seen[self._shown :]
            return "" if rest.lstrip().startswith(("{", "[")) else rest
        out, self._shown = self._seen[self._shown :], len(self._seen)
        return out
