"""llama.cpp's generic tool format (engine_ext/generic_tools.py): the reply's response streamed as text however the
JSON is cut into pieces, calls parsed from `tool_call` and `tool_calls`, and every malformed reply a one-line
refusal; the messages a template without tools is given."""

from __future__ import annotations

import json

import pytest

from engine_ext.generic_tools import GenericReplyText, generic_messages, generic_schema, parse_generic

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "", "parameters": {"type": "object", "properties": {}}},
}


def _streamed(reply: str, size: int) -> str:
    shown = GenericReplyText()
    out = "".join(shown.feed(reply[i : i + size]) for i in range(0, len(reply), size))
    assert shown.raw == reply
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
def test_the_response_streams_as_text_with_every_escape_whole(size: int) -> None:
    text = 'Say "hi"\n\\ and \u00e9 and \U0001f600 then } and {"response": x'
    reply = '{ "response": ' + json.dumps(text) + " }"
    assert _streamed(reply, size) == text
    assert parse_generic(reply, ["get_weather"]).content == text


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_call_shows_no_text_and_parses(size: int) -> None:
    reply = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    assert _streamed(reply, size) == ""
    (call,) = parse_generic(reply, ["get_weather"]).calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    several = '{"tool_calls": [{"name": "get_weather", "arguments": {}, "id": "call_1"}, {"name": "get_weather"}]}'
    assert [c.name for c in parse_generic(several, ["get_weather"]).calls] == ["get_weather"] * 2


@pytest.mark.parametrize(
    "reply",
    [
        '{"tool_call": {"name": "get_wea',  # cut short by max_tokens
        '{"tool_call": {"name": "rm_rf", "arguments": {}}}',  # a tool it was not given
        '{"tool_calls": []}',
        '{"tool_calls": ' + json.dumps([{"name": "get_weather"}] * 40) + "}",
        '["tool_call"]',
        "[" * 100_000,
        '{"response": 1}',
        "x" * 600_000,
    ],
)
def test_a_malformed_reply_is_a_one_line_refusal(reply: str) -> None:
    parsed = parse_generic(reply, ["get_weather"])
    assert parsed.calls == () and parsed.refusal and "\n" not in parsed.refusal and len(parsed.refusal) <= 300


def test_a_cut_response_shows_what_was_written_and_no_half_escape() -> None:
    assert _streamed('{"response": "ab\\u00', 1) == "ab"
    assert _streamed('{"response": "ab\\ud83d\\ude0', 1) == "ab"


def test_messages_describe_the_tools_and_write_calls_and_results_as_json() -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"},
    ]
    out = generic_messages(history, [TOOL])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nYou can call any of the following tools")
    assert "Respond in JSON format" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {}, "id": "c1"}}
    assert json.loads(out[3]["content"]) == {"tool_response": {"tool": "get_weather", "content": "sunny", "id": "c1"}}
    assert generic_messages(history[1:2], [TOOL])[0]["role"] == "system"
    assert "response" not in json.dumps(generic_schema([TOOL], required=True))
    assert "response" in json.dumps(generic_schema([TOOL], required=False))


def test_the_app_is_told_which_models_get_the_generic_format() -> None:
    from app.tui.modals.conversation_settings import tool_format_hint
    from engine_ext.tool_turn import tool_format
    from tests.tiny_models import TINY_CHAT_TEMPLATE
    from tests.tool_templates import QWEN25_TEMPLATE

    assert tool_format(TINY_CHAT_TEMPLATE) == "generic" and tool_format(None) == "generic"
    assert tool_format(QWEN25_TEMPLATE) == "hermes"
    assert "generic JSON format" in tool_format_hint("generic") and "hermes" in tool_format_hint("hermes")
    assert tool_format_hint("") == ""


@pytest.mark.parametrize("stop_reason", ["max_tokens", "context_full", "eos"])
def test_a_call_cut_by_the_token_limit_is_reported_cut_off_not_refused(stop_reason: str) -> None:
    """Issue 49: a call the reply limit (or a full context) cut short read "a tool call was refused"."""
    from engine_ext.protocol import Finished, Generate, GenerationStats, TokenChunk
    from engine_ext.tool_turn import ToolTurn
    from tests.tool_templates import QWEN25_TEMPLATE

    stats = GenerationStats(10, 0, 10, 5.0, 24, 20.0, 6.0, 4096, 34)
    request = Generate(1, max_tokens=24, tools=json.dumps([TOOL]))
    hermes = '<tool_call>{"name": "get_weather", "argu'
    for template, text in ((QWEN25_TEMPLATE, hermes), (None, '{"tool_call": {"name": "get_we')):
        turn = ToolTurn.of(request, template, "m")
        assert turn is not None
        turn.watch(lambda event: None)(TokenChunk(1, text, "", tuple(range(len(text))), ("target",) * len(text)))
        cut = Finished(1, stop_reason, stats)  # type: ignore[arg-type]
        finished = turn.finish(cut, lambda t, text=text: text[t].encode(), False)  # type: ignore[misc]
        [notice] = [n for n in finished.notices if n.startswith("a tool call")]
        if stop_reason == "eos":
            assert notice.startswith("a tool call was refused")
        else:
            limit = "the reply limit (24 tokens" if stop_reason == "max_tokens" else "the full context (4096 tokens)"
            assert notice.startswith(f"a tool call was cut off by {limit}") and "refused" not in notice
        assert finished.tool_calls == ()
    # A generic reply whose response string was cut is a cut reply, not a call.
    turn = ToolTurn.of(request, None, "m")
    assert turn is not None
    text = '{"response": "It is sun'
    turn.watch(lambda event: None)(TokenChunk(1, text, "", (1,), ("target",)))
    finished = turn.finish(Finished(1, "max_tokens", stats), lambda t: b"", False)
    assert "the reply was cut off by the reply limit (24 tokens; raise max tokens)" in finished.notices
