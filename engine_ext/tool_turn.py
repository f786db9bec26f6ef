"""A generation with tools, in the worker: the template's tool support checked (a template that shows no tools gets
llama.cpp's generic format, engine_ext.generic_tools), the grammar that holds calls to their schemas (lazy in the
template's own format), and the calls parsed from the reply for Finished."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from engine_ext.chat_prompt import ChatTemplateError, render_chat
from engine_ext.generic_tools import (
    GENERIC,
    GenericReplyText,
    generic_messages,
    generic_notice,
    generic_schema,
    parse_generic,
)
from engine_ext.grammar import MAX_SCHEMA_CHARS, ReplyGrammar, reply_grammar
from engine_ext.protocol import Event, Finished, Generate, TokenChunk
from engine_ext.tool_calls import (
    PROBE_MESSAGES,
    PROBE_TOOL,
    ToolsError,
    parse_reply,
    probe_tools,
    template_format,
    tool_names,
    tools_of,
)
from engine_ext.tool_grammar import countable, fitting_tools, tool_grammar
from engine_ext.untrusted_text import one_line


def offered_tools(text: str | None, tool_choice: str) -> tuple[list[dict[str, Any]], str]:
    """The tools a request offers the model (in the template and the call grammar): those whose calls fit the
    grammar's budget; and one line naming those left out ("" when none is)."""
    tools = tools_of(text, tool_choice)
    kept, left_out = fitting_tools(tools)
    if not left_out:
        return tools, ""
    notice = one_line(
        f"{len(left_out)} of {len(tools)} tools left out, their calls past the grammar's {MAX_SCHEMA_CHARS}-character"
        f" budget: {', '.join(left_out)}"
    )
    return [dict(tool) for tool in kept], notice


@lru_cache(maxsize=4)
def supports_tools(template: str | None) -> bool:
    """Whether a chat template shows the tools it is given (renders a tool's name); no template: no tools."""
    if not template or "tools" not in template:
        return False
    try:
        text = render_chat(template, PROBE_MESSAGES, bos_token="", eos_token="", tools=probe_tools())
    except ChatTemplateError:
        return False
    return PROBE_TOOL in text


def tool_format(template: str | None) -> str:
    """How a model with this template writes tool calls: its template's format (hermes, llama3, mistral; "json":
    bare JSON), or llama.cpp's generic one when the template shows no tools."""
    if not supports_tools(template):
        return GENERIC
    return template_format(template) or "json"


def template_inputs(
    template: str | None, messages: Sequence[Mapping[str, Any]], tools_text: str | None, tool_choice: str
) -> tuple[Sequence[Mapping[str, Any]], list[dict[str, Any]]]:
    """The messages and tools a request's prompt is rendered with: the tools it offers go to a template that shows
    them; for one that does not, they are described in the messages instead (the generic format)."""
    tools = offered_tools(tools_text, tool_choice)[0]
    if tools and not supports_tools(template):
        return generic_messages(messages, tools), []
    return messages, tools


class ToolTurn:
    """The tools of one request: what the template gets, the grammar, and the calls its reply made."""

    def __init__(self, request: Generate, template: str | None, model_name: str, user_grammar: bool) -> None:
        self.tools, self.notice = offered_tools(request.tools, request.tool_choice)
        if not self.tools:
            raise ToolsError(self.notice)
        self.required = request.tool_choice == "required"
        if user_grammar:
            raise ToolsError("give tools or a grammar/JSON schema, not both")
        self.format = template_format(template) if supports_tools(template) else GENERIC  # None: bare JSON
        # The generic format's reply is JSON: the text shown is its response, decoded as it streams.
        self.generic = GenericReplyText() if self.format == GENERIC else None
        if self.format == GENERIC:
            self.notice = "; ".join(line for line in (generic_notice(model_name), self.notice) if line)
        self.token_ids: list[int] = []

    @staticmethod
    def of(request: Generate, template: str | None, model_name: str) -> ToolTurn | None:
        """The request's tools, or None when it offers none (no tools, or tool choice "none")."""
        if not tools_of(request.tools, request.tool_choice):
            return None
        user_grammar = request.grammar is not None or request.json_schema is not None
        return ToolTurn(request, template, model_name, user_grammar)

    def grammar(self, opens_reasoning: bool) -> ReplyGrammar:
        """The calls' grammar: lazy, from a call's opening, in the template's format; from the first token (after
        the thinking of a reply that opens in it) in the generic format."""
        tools = countable(self.tools)
        if self.generic is not None:
            schema = json.dumps(generic_schema(tools, required=self.required))
            return reply_grammar(None, schema, opens_reasoning=opens_reasoning)
        calls = tool_grammar(tools, self.format, required=self.required)
        return ReplyGrammar(calls.gbnf, calls.triggers)

    def watch(self, emit: Callable[[Event], None]) -> Callable[[Event], None]:
        """`emit` that also keeps the reply's token ids (the calls are parsed from them, special tokens written);
        in the generic format, the answer text it passes on is the response's, not the JSON."""

        def watched(event: Event) -> None:
            if isinstance(event, TokenChunk):
                self.token_ids.extend(event.token_ids)
                if self.generic is not None:
                    event = dataclasses.replace(event, text=self.generic.feed(event.text), text_ends=())
            emit(event)

        return watched

    def finish(self, finished: Finished, piece: Callable[[int], bytes], opens_reasoning: bool) -> Finished:
        """`finished` with the calls of the reply (and a notice when a call it started was refused)."""
        if self.generic is not None:
            parsed = parse_generic(self.generic.raw, tool_names(self.tools))
        else:
            text = b"".join(map(piece, self.token_ids)).decode("utf-8", errors="replace")
            parsed = parse_reply(text, tool_names(self.tools), self.format, opens_reasoning=opens_reasoning)
        refusal = parsed.refusal
        if refusal and finished.stop_reason in ("max_tokens", "context_full"):
            refusal = cut_off(finished, responding=self.generic is not None and self.generic.responding)
        notices = finished.notices + tuple(line for line in (self.notice, refusal) if line)
        return dataclasses.replace(finished, tool_calls=parsed.calls, notices=notices)


def cut_off(finished: Finished, *, responding: bool) -> str:
    """What a reply cut short by its token limit or a full context says, where its unfinished call (or, in the
    generic format, its unfinished JSON response) would otherwise read as refused: it was cut off, not refused."""
    n = finished.stats.generated_tokens
    why = (
        f"the reply limit ({n} tokens; raise max tokens)"
        if finished.stop_reason == "max_tokens"
        else f"the full context ({finished.stats.n_ctx} tokens)"
    )
    if responding:
        return f"the reply was cut off by {why}"
    return f"a tool call was cut off by {why} before it was complete; it was not made"
