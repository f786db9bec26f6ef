"""A generation with tools, in the worker: the template's tool support checked (a model without it is named, not
guessed at), the lazy grammar that holds calls to their schemas, and the calls parsed from the reply for Finished."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from engine_ext.chat import ChatTemplateError, render_chat
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
from engine_ext.tool_grammar import ToolGrammar, tool_grammar


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


class ToolTurn:
    """The tools of one request: what the template gets, the grammar, and the calls its reply made."""

    def __init__(self, request: Generate, template: str | None, model_name: str, user_grammar: bool) -> None:
        self.tools: list[dict[str, Any]] = tools_of(request.tools, request.tool_choice)
        self.format = template_format(template)
        self.required = request.tool_choice == "required"
        if user_grammar:
            raise ToolsError("give tools or a grammar/JSON schema, not both")
        if not supports_tools(template):
            raise ToolsError(
                f"the chat template of {model_name} has no tool support (it does not show the tools it is given); "
                "use a model whose template takes tools (Qwen 2.5/3, Llama 3.1+, Mistral, Hermes)"
            )
        self.token_ids: list[int] = []

    @staticmethod
    def of(request: Generate, template: str | None, model_name: str) -> ToolTurn | None:
        """The request's tools, or None when it offers none (no tools, or tool choice "none")."""
        if not tools_of(request.tools, request.tool_choice):
            return None
        user_grammar = request.grammar is not None or request.json_schema is not None
        return ToolTurn(request, template, model_name, user_grammar)

    def grammar(self) -> ToolGrammar:
        return tool_grammar(self.tools, self.format, required=self.required)

    def watch(self, emit: Callable[[Event], None]) -> Callable[[Event], None]:
        """`emit` that also keeps the reply's token ids (the calls are parsed from them, special tokens written)."""

        def watched(event: Event) -> None:
            if isinstance(event, TokenChunk):
                self.token_ids.extend(event.token_ids)
            emit(event)

        return watched

    def finish(self, finished: Finished, piece: Callable[[int], bytes], opens_reasoning: bool) -> Finished:
        """`finished` with the calls of the reply (and a notice when a call it started was refused)."""
        text = b"".join(map(piece, self.token_ids)).decode("utf-8", errors="replace")
        parsed = parse_reply(text, tool_names(self.tools), self.format, opens_reasoning=opens_reasoning)
        notices = finished.notices + ((parsed.refusal,) if parsed.refusal else ())
        return dataclasses.replace(finished, tool_calls=parsed.calls, notices=notices)
