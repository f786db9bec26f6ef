"""llama.cpp's generic tool format, for a model whose chat template shows no tools (as upstream's common/chat.cpp
`common_chat_params_init_generic` and minja's polyfills did): the tools described in a system message, earlier calls
and results written into the messages as JSON, and the reply held by a grammar to one JSON object, either
``{"tool_call": {"name": …, "arguments": {…}}}`` or ``{"response": "…"}`` (tool choice "required": the call only).
The reply is read back as calls or as the response's text, which streams as it is written.

Replies are text from outside: the parser gives calls, text or a one-line refusal, never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine_ext.tool_calls import MAX_CALLS, MAX_REPLY_CHARS, ParsedReply, call_of, loads_json
from engine_ext.untrusted_text import one_line

GENERIC = "generic"  # the format's name, as notices and the README give it
RESPOND_IN_JSON = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to the "
    "user's request"
)
_TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
_EXAMPLE = {"tool_call": {"name": "tool_name", "arguments": {"arg1": "some_value"}}}


def generic_notice(model_name: str) -> str:
    """The one line a reply in the generic format carries (the app shows it under the reply)."""
    return one_line(
        f"tools in llama.cpp's generic JSON format: the chat template of {model_name} shows no tools, so they are "
        "described in a system message and the reply is a JSON tool call or response"
    )


def generic_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`messages` for a template without tools: the tools and the reply's format described in the system message
    (added first, or appended to the first one), an assistant's calls as the JSON the format writes, and a tool's
    result as a user message holding ``{"tool_response": {…}}`` (templates without tools often refuse role "tool")."""
    described = (
        f"{_TOOLS_INTRO}{json.dumps(list(tools), indent=2, ensure_ascii=False)}\n\n"
        f"Example tool call syntax:\n\n{json.dumps(_EXAMPLE, indent=2)}\n\n{RESPOND_IN_JSON}"
    )
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        if item.get("tool_calls"):
            calls = [{"name": c["name"], "arguments": c["arguments"], "id": c["id"]} for c in item.pop("tool_calls")]
            written: dict[str, Any] = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
            if item.get("content"):
                written["content"] = item["content"]
            item["content"] = json.dumps(written, ensure_ascii=False)
        elif item.get("role") == "tool":
            result = {
                "tool": item.pop("name", ""),
                "content": item.get("content", ""),
                "id": item.pop("tool_call_id", ""),
            }
            item = {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
        out.append(item)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content', '')}\n\n{described}"}
    else:
        out.insert(0, {"role": "system", "content": described})
    return out


def generic_schema(tools: Sequence[Mapping[str, Any]], *, required: bool) -> dict[str, Any]:
    """The JSON schema of a reply: one call of a tool (upstream's without parallel tool calls), or the response."""
    calls = []
    for tool in tools:
        function = tool["function"]
        call: dict[str, Any] = {
            "type": "object",
            "properties": {"name": {"type": "string", "const": function["name"]}, "arguments": function["parameters"]},
            "required": ["name", "arguments"],
        }
        calls.append(call)
    one_call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    tool_call = {"type": "object", "properties": {"tool_call": one_call}, "required": ["tool_call"]}
    if required:
        return tool_call
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [tool_call, response]}


def parse_generic(text: str, known: Sequence[str]) -> ParsedReply:
    """A reply in the generic format: ``tool_call`` (one call), ``tool_calls`` (several) or ``response`` (text).
    Anything else (a reply cut short, say) is its text with the refusal saying why no call was taken."""
    if len(text) > MAX_REPLY_CHARS:
        return ParsedReply(
            "", (), f"the reply has {len(text)} characters; calls are read from at most {MAX_REPLY_CHARS}"
        )
    try:
        value = loads_json(text)
        if not isinstance(value, dict):
            raise ValueError("the reply is not a JSON object")
        if isinstance(value.get("response"), str):
            return ParsedReply(value["response"], ())
        if "tool_call" in value:
            return ParsedReply("", (call_of(value["tool_call"], known),))
        calls = value.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            raise ValueError("the reply has neither tool_call, tool_calls nor response")
        if len(calls) > MAX_CALLS:
            raise ValueError(f"the reply makes {len(calls)} calls; at most {MAX_CALLS}")
        return ParsedReply("", tuple(call_of(call, known) for call in calls))
    except (ValueError, TypeError) as e:
        return ParsedReply("", (), one_line(f"a tool call was refused: {e}", 200))


_RESPONSE_OPEN = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_KEY_OPEN = re.compile(r'\s*\{\s*"([^"\\]*)"\s*:')


class GenericReplyText:
    """The text a generic reply shows as it streams: the ``response`` string decoded as it is written (up to the last
    whole escape), nothing of a call. `feed` takes the reply's raw text in pieces and gives the new text to show."""

    def __init__(self) -> None:
        self._parts: list[str] = []  # the reply as the model wrote it (the JSON), in pieces
        self._head: str | None = ""  # the reply until its response string opens (None: it opened)
        self._tail = ""  # the response string's characters not given out yet (an escape cut in two)
        self._closed = False  # the response string ended, or the reply is no response

    @property
    def raw(self) -> str:
        """The whole reply so far, for parse_generic at the end."""
        return "".join(self._parts)

    @property
    def responding(self) -> bool:
        """Whether the reply is a response (its ``response`` string opened), not a call."""
        return self._head is None

    def feed(self, piece: str) -> str:
        self._parts.append(piece)
        if self._closed:
            return ""
        if self._head is not None:
            head = self._head + piece  # a few characters: the grammar opens the object at once
            opened = _RESPONSE_OPEN.match(head)
            if opened is None:
                key = _KEY_OPEN.match(head)
                self._head, self._closed = head, key is not None and key.group(1) != "response"  # a call: no text
                return ""
            self._head, self._tail = None, head[opened.end() :]
        else:
            self._tail += piece
        end, self._closed = _whole_escapes(self._tail)
        segment, self._tail = self._tail[:end], self._tail[end:]
        try:
            return str(json.loads(f'"{segment}"', strict=False))
        except ValueError:  # not JSON text (a grammar would not have let it through): shown as written
            return segment


def _whole_escapes(raw: str) -> tuple[int, bool]:
    """Where the decodable part of a JSON string body ends (no escape cut in two, a surrogate pair whole), and
    whether the string's closing quote was reached there."""
    i = safe = 0
    while i < len(raw):
        char = raw[i]
        if char == '"':
            return i, True
        if char != "\\":
            i += 1
        elif raw[i + 1 : i + 2] != "u":
            i += 2
        else:
            high = raw[i + 2 : i + 6]
            i += 12 if re.fullmatch(r"[dD][89abAB][0-9a-fA-F]{2}", high) else 6
        if i > len(raw):
            break
        safe = i
    return safe, False
