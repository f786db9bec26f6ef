"""Tool calls through the chat template (engine_ext.tool_calls, pure): a scripted reply in each call format parses
into the calls it makes; tool definitions are read with bounds; templates get calls and results as they expect them;
and hostile replies (huge, nested, truncated, invalid) are a bounded one-line refusal, never an exception."""

from __future__ import annotations

import json
import random

import pytest

from engine_ext.chat_prompt import FALLBACK_CHAT_TEMPLATE, render_chat
from engine_ext.protocol import ChatMessage, ToolCall
from engine_ext.tool_calls import (
    HERMES,
    LLAMA3,
    MAX_REPLY_CHARS,
    MISTRAL,
    CallTextFilter,
    ToolsError,
    calls_from_json,
    calls_to_json,
    parse_reply,
    read_tools,
    template_format,
    template_message,
    tools_of,
)
from engine_ext.tool_grammar import tool_grammar
from engine_ext.tool_turn import supports_tools
from tests.tool_templates import LLAMA31_TEMPLATE, MISTRAL_TEMPLATE, QWEN25_TEMPLATE
from tests.tool_templates import WEATHER_TOOL as WEATHER

NAMES = ("get_weather", "now")

# (format, reply as the model writes it with its special tokens, expected calls as (name, arguments), content)
SCRIPTED = [
    (
        HERMES,
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [("get_weather", {"city": "Paris"})],
        "Let me check.",
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
        [("get_weather", {"city": "Oslo"}), ("now", {})],
        "",
    ),
    (  # stopped at end-of-generation before the closing tag
        HERMES,
        '<tool_call>\n{"name": "now", "arguments": "{}"}',
        [("now", {})],
        "",
    ),
    (  # stopped (max tokens) inside the closing tag
        HERMES,
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_',
        [("now", {})],
        "",
    ),
    (
        HERMES,
        '<think>maybe <tool_call>{"name": "now", "arguments": {}}</tool_call></think>It is late.',
        [],
        "It is late.",
    ),
    (
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
        [("get_weather", {"city": "Rome"})],
        "",
    ),
    (
        LLAMA3,
        '{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "now", "parameters": {}}',
        [("get_weather", {"city": "Rome"}), ("now", {})],
        "",
    ),
    (  # a JSON answer that names no tool stays an answer
        LLAMA3,
        '{"city": "Rome", "temperature": 21}',
        [],
        '{"city": "Rome", "temperature": 21}',
    ),
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}, "id": "abcdefghi"}, '
        '{"name": "now", "arguments": {}}]',
        [("get_weather", {"city": "Lima"}), ("now", {})],
        "",
    ),
    (None, "Paris is sunny today.", [], "Paris is sunny today."),
]


@pytest.mark.parametrize(("fmt", "reply", "calls", "content"), SCRIPTED)
def test_a_reply_in_each_format_gives_its_calls(
    fmt: str | None, reply: str, calls: list[tuple[str, dict[str, object]]], content: str
) -> None:
    for declared in (fmt, None):  # the template's format first, or every format in turn
        parsed = parse_reply(reply, NAMES, declared)
        assert parsed.refusal == ""
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
        assert parsed.content == content
        assert all(len(c.id) == 9 and c.id.isalnum() for c in parsed.calls)
    if fmt == MISTRAL:
        assert parse_reply(reply, NAMES).calls[0].id == "abcdefghi"  # the model's own id is kept


def test_a_call_of_an_unknown_tool_or_with_bad_arguments_is_refused_in_one_line() -> None:
    unknown = parse_reply('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', NAMES)
    assert unknown.calls == () and "'rm_rf', which is not one of the tools" in unknown.refusal
    bad = parse_reply('<tool_call>{"name": "now", "arguments": [1, 2]}</tool_call>', NAMES)
    assert bad.calls == () and "arguments that are not a JSON object" in bad.refusal
    truncated = parse_reply('<tool_call>{"name": "now", "argum', NAMES)
    assert truncated.calls == () and truncated.refusal.startswith("a tool call was refused")


def _hostile(rng: random.Random) -> str:
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "<|python_tag|>",
        "</think>",
        '{"name": "now", "arguments": ',
        '{"name": "get_weather", "parameters": {"city": ',
        "{",
        "}",
        "[",
        "]",
        '"',
        "\\",
        ";",
        ",",
        "NaN",
        "1e999999",
        "\x00",
        "\u202e",
        "\ud800",
        " ",
        "\n",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60)))


def test_hostile_replies_are_calls_or_one_line_refusals_never_exceptions() -> None:
    rng = random.Random(35)
    replies = [_hostile(rng) for _ in range(3000)]
    replies += [
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",  # nested past the recursion limit
        '<tool_call>{"name": "now", "arguments": ' + "{" * 50_000,
        "[TOOL_CALLS]" + "[" * 200_000,
        '{"name": "now", "parameters": {}}; ' * 100,  # more calls than a reply may make
        "<tool_call>" * 10_000,
        "x" * (MAX_REPLY_CHARS + 1),
        '<|python_tag|>{"name": "now", "parameters": {"a": NaN}}',
        '<tool_call>{"name": "now", "arguments": {"s": "' + "y" * 200_000 + '"}}</tool_call>',
    ]
    for reply in replies:
        for fmt in (HERMES, LLAMA3, MISTRAL, None):
            parsed = parse_reply(reply, NAMES, fmt)
            assert len(parsed.calls) <= 32
            assert "\n" not in parsed.refusal and len(parsed.refusal) <= 300
    assert "at most" in parse_reply("x" * (MAX_REPLY_CHARS + 1), NAMES).refusal
    assert "nested too deeply" in parse_reply("<tool_call>" + "[" * 100_000 + "]" * 100_000, NAMES).refusal


def test_tool_definitions_are_read_with_bounds() -> None:
    bare = read_tools(json.dumps([WEATHER["function"]]))
    assert bare == [WEATHER]
    assert read_tools(json.dumps({"tools": [WEATHER]})) == [WEATHER]
    for text, words in [
        ("not json", "not JSON"),
        ("[1]", "not a function tool"),
        (json.dumps([{"type": "function", "function": {"name": "a b"}}]), "no valid name"),
        (json.dumps([WEATHER, WEATHER]), "two tools are named 'get_weather'"),
        (json.dumps([{"name": "x", "parameters": []}]), "parameters is a JSON schema object"),
        ("[" + ",".join([f'{{"name": "t{i}"}}' for i in range(200)]) + "]", "at most 128"),
        ("[" * 100_000, "not JSON"),
    ]:
        with pytest.raises(ToolsError, match=words):
            read_tools(text)
    with pytest.raises(ToolsError, match="unknown tool choice"):
        tools_of("[]", "always")
    assert tools_of(json.dumps([WEATHER]), "none") == []


def test_templates_get_calls_and_results_as_they_expect_them() -> None:
    call = ToolCall("abcdefghi", "get_weather", '{"city": "Paris"}')
    assert calls_from_json(calls_to_json([call])) == [call]
    messages = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", calls_to_json([call])),
        ChatMessage("tool", "sunny, 24 C", tool_call_id="abcdefghi", name="get_weather"),
    ]
    rendered = {
        t: render_chat(t, [template_message(m) for m in messages], bos_token="", eos_token="", tools=[WEATHER])
        for t in (QWEN25_TEMPLATE, LLAMA31_TEMPLATE, MISTRAL_TEMPLATE)
    }
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in rendered[QWEN25_TEMPLATE]
    )
    assert "<tool_response>\nsunny, 24 C\n</tool_response>" in rendered[QWEN25_TEMPLATE]
    assert '"description": "The weather in a city"' in rendered[QWEN25_TEMPLATE]  # the tools, listed
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in rendered[LLAMA31_TEMPLATE]
    assert (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'
        in (rendered[MISTRAL_TEMPLATE])
    )
    assert [template_format(t) for t in rendered] == [HERMES, LLAMA3, MISTRAL]
    assert all(supports_tools(t) for t in rendered)
    assert not supports_tools(FALLBACK_CHAT_TEMPLATE) and not supports_tools(None)
    with pytest.raises(ToolsError):
        calls_from_json('{"not": "a list"}')


def test_the_grammar_holds_a_call_to_its_schema_and_starts_at_the_format_marker() -> None:
    hermes = tool_grammar([WEATHER], HERMES, required=False)
    assert hermes.triggers == ("(<tool_call>)",)
    assert hermes.gbnf.startswith('root ::= "<tool_call>"') and '"\\"get_weather\\""' in hermes.gbnf
    assert tool_grammar([WEATHER], HERMES, required=True).triggers == ()
    llama = tool_grammar([WEATHER], LLAMA3, required=False)
    assert '"\\"parameters\\""' in llama.gbnf and len(llama.triggers) == 2
    assert tool_grammar([WEATHER], MISTRAL, required=False).gbnf.startswith('root ::= "[TOOL_CALLS]"')


def test_streamed_text_hides_calls_and_gives_back_json_that_was_no_call() -> None:
    shown = CallTextFilter()
    reply = 'Let me look.<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    out = "".join(shown.feed(reply[i : i + 3]) for i in range(0, len(reply), 3)) + shown.finish(True)
    assert out == "Let me look."
    partial = CallTextFilter()
    assert partial.feed("a <tool_") == "a " and partial.feed("x") == "<tool_x" and partial.finish(False) == ""
    answer = CallTextFilter()
    assert answer.feed('{"a": 1}') == "" and answer.finish(False) == '{"a": 1}'
    call = CallTextFilter()
    assert call.feed(' [{"name": "now", "arguments": {}}]') == "" and call.finish(True) == ""
