"""Requests as the coding agents send them (shapes recorded from Claude Code 2.1.197 and Codex 0.171.0): parsed into
jobs, their tools' schemas turned into a call grammar. Each shape was a 400 before."""

from __future__ import annotations

import json

import pytest

from app.server.anthropic import parse_messages
from app.server.api_errors import ApiError
from app.server.openai_responses import ResponseShaper, ResponseStore, parse_response_request
from app.server.requests import Limits
from engine_ext.grammar import MAX_SCHEMA_COUNT, GrammarError, grammar_for
from engine_ext.params import SamplingParams
from engine_ext.protocol import ToolCall
from engine_ext.tool_grammar import ANY_VALUE, countable, tool_grammar

WORKFLOW = {  # Claude Code's Workflow tool, trimmed: an annotation-only property and a 524,288-character maximum
    "name": "Workflow",
    "description": "Run a script",
    "input_schema": {
        "type": "object",
        "properties": {
            "script": {"type": "string", "maxLength": 524288},
            "args": {"description": "Optional input value exposed to the script as the global `args`, verbatim."},
            "description": {"type": "string"},  # a property named like an annotation stays a property
        },
        "required": ["script"],
    },
}
CLAUDE_CODE = {
    "model": "m",
    "max_tokens": 32000,
    "stream": True,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=cli;"}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>date</system-reminder>"}]},
        {"role": "system", "content": "Available agent types for the Agent tool: ..."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
    ],
    "tools": [WORKFLOW],
    "metadata": {"user_id": "{}"},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
CODEX = {
    "model": "m",
    "stream": True,
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}],
    "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Tools for sub-agents.",
            "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}}}],
        },
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k",
    "client_metadata": {"turn_id": "t"},
}


def test_claude_codes_request_parses_with_its_system_turn_in_place() -> None:
    job = parse_messages(CLAUDE_CODE, SamplingParams(), Limits(), "m")
    roles = [m.role for m in job.messages]
    assert roles == ["user", "system", "user"]  # the billing line alone made no system message
    assert job.messages[1].content == "Available agent types for the Agent tool: ..."
    with pytest.raises(ApiError, match=r"messages\[0\]\.role must be user, assistant or system"):
        parse_messages({**CLAUDE_CODE, "messages": [{"role": "tool", "content": "x"}]}, SamplingParams(), Limits(), "m")


def test_codex_request_parses_its_namespace_flattened_and_hosted_tools_left_out() -> None:
    job, _ = parse_response_request(CODEX, SamplingParams(), Limits(), "m", ResponseStore())
    assert job.tools is not None
    assert [t["function"]["name"] for t in json.loads(job.tools)] == ["exec_command", "close_agent"]
    custom = {**CODEX, "tools": [{"type": "custom", "name": "apply_patch"}]}
    with pytest.raises(ApiError, match=r"tools\[0\]: only function tools are available here, not 'custom'"):
        parse_response_request(custom, SamplingParams(), Limits(), "m", ResponseStore())


def test_a_call_to_a_namespaced_function_names_its_namespace() -> None:
    """Codex routes a call by namespace and name: without the namespace, `close_agent` was "unsupported call"."""
    job, conversation = parse_response_request(CODEX, SamplingParams(), Limits(), "m", ResponseStore())
    shaper = ResponseShaper(job, "m", CODEX, conversation, ResponseStore())
    inside = shaper._call("fc_1", ToolCall("c1", "close_agent", "{}"), "{}", "completed")
    outside = shaper._call("fc_2", ToolCall("c2", "exec_command", "{}"), "{}", "completed")
    assert inside["namespace"] == "multi_agent_v1" and inside["name"] == "close_agent"
    assert "namespace" not in outside


def test_codexs_call_less_output_is_a_user_turn_naming_it() -> None:
    """Codex 0.171 adds its goal as a function_call_output with a name and namespace and no call_id (recorded after
    a create_goal call): it was refused ("input[24].call_id must be …") and the session ended."""
    called = {"type": "function_call", "call_id": "c1", "name": "create_goal", "arguments": "{}"}
    answered = {"type": "function_call_output", "call_id": "c1", "output": '{"goal": {}}'}
    goal = {"type": "function_call_output", "name": "goal_objective", "namespace": "agent", "output": "Say hi"}
    asked = CODEX["input"]
    assert isinstance(asked, list)
    body = {**CODEX, "input": [*asked, called, answered, goal]}
    job, _ = parse_response_request(body, SamplingParams(), Limits(), "m", ResponseStore())
    assert [m.role for m in job.messages] == ["user", "assistant", "tool", "user"]
    assert job.messages[-1].content == "Output of agent.goal_objective:\nSay hi"
    nameless = {"type": "function_call_output", "output": "x"}
    with pytest.raises(ApiError, match=r"input\[1\]\.call_id must be the call_id"):
        parse_response_request({**CODEX, "input": [*asked, nameless]}, SamplingParams(), Limits(), "m", ResponseStore())


def test_agent_tool_schemas_the_converter_refused_become_a_call_grammar() -> None:
    tool = {"type": "function", "function": {"name": "Workflow", "parameters": WORKFLOW["input_schema"]}}
    with pytest.raises(GrammarError):  # as given: the port refuses both the huge maximum and the bare description
        tool_grammar([tool], None, required=False)
    [ready] = countable([tool])
    properties = ready["function"]["parameters"]["properties"]
    assert properties["script"] == {"type": "string"}  # bounded by the reply's max_tokens instead
    assert properties["args"] == ANY_VALUE and properties["description"] == {"type": "string"}
    assert tool_grammar([ready], None, required=False).gbnf
    # A maximum the grammar can count is kept, and a minimum past it still refused.
    kept = {"type": "string", "maxLength": MAX_SCHEMA_COUNT}
    assert countable([{"p": kept}]) == [{"p": kept}]
    too_long = {"type": "function", "function": {"name": "t", "parameters": {"type": "string", "minLength": 10**6}}}
    with pytest.raises(GrammarError, match="at most"):
        grammar_for(None, json.dumps(countable([too_long])[0]["function"]["parameters"]))
