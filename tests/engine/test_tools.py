"""Tool calling in the generation loop, in-process on a tiny model that carries Qwen 2.5's tool-aware template: calls
that parse under the grammar (tool choice "required"), the lazy grammar that starts at its trigger, greedy output
equal with and without n-gram speculation under both, tool results fed back, and a template without tool support
given llama.cpp's generic format (tools in a system message, the reply a JSON call or response)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import engine_ext.tool_turn
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, SpeculativeParams
from engine_ext.protocol import ChatMessage, Event, Finished, Generate, TokenChunk, ToolCall
from engine_ext.speculative.factory import build_driver
from engine_ext.tool_calls import calls_to_json
from engine_ext.tool_grammar import ToolGrammar
from engine_ext.vision import message_dicts
from tests.tiny_models import write_tiny_model
from tests.tool_templates import QWEN25_TEMPLATE

CITY_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
        },
    },
}
TOOLS = json.dumps([CITY_TOOL])
ASK = (ChatMessage("user", "What is the weather in Paris?"),)


@pytest.fixture(scope="module")
def qwen_tools_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        "llama", tmp_path_factory.mktemp("tools") / "qwen-tools.gguf", chat_template=QWEN25_TEMPLATE
    )


@pytest.fixture
def session(qwen_tools_model: Path) -> Iterator[Session]:
    model = Model(qwen_tools_model)
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=2048, n_threads=2))
    try:
        yield Session(model, ctx)
    finally:
        ctx.close()
        model.close()


def _generate(session: Session, request: Generate) -> tuple[str, list[int], Finished]:
    events: list[Event] = []
    finished = session.generate(request, events.append, lambda: False)
    chunks = [e for e in events if isinstance(e, TokenChunk)]
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], finished


def _spec_and_plain(session: Session, request: Generate) -> tuple[list[int], list[int]]:
    plain = _generate(session, request)[1]
    session.reset_cache()
    session.spec = build_driver(SpeculativeParams(types=("ngram-simple",), n_max=8), session.model, session.ctx)
    try:
        drafted = _generate(session, request)[1]
    finally:
        session.spec.close()
        session.spec = None
    return plain, drafted


def test_tool_choice_required_makes_a_call_that_parses_and_follows_the_schema(session: Session) -> None:
    text, _, finished = _generate(
        session, Generate(1, ASK, sampling=GREEDY, max_tokens=300, tools=TOOLS, tool_choice="required")
    )
    assert text.startswith("<tool_call>"), text
    assert finished.stop_reason == "eos"  # the grammar ended with the call: only end-of-generation was left
    (call,) = finished.tool_calls
    assert call.name == "get_weather" and len(call.id) == 9
    arguments = json.loads(call.arguments)
    assert arguments in ({"city": "Paris"}, {"city": "Oslo"}, {"city": "Lima"})
    # Without tools this model writes no call (so the grammar above is what made one).
    free = _generate(session, Generate(2, ASK, sampling=GREEDY, max_tokens=60))[0]
    assert "<tool_call>" not in free


def test_results_are_fed_back_and_the_next_reply_goes_on(session: Session) -> None:
    call = ToolCall("abcdefghi", "get_weather", '{"city": "Paris"}')
    messages = ASK + (
        ChatMessage("assistant", "", calls_to_json([call])),
        ChatMessage("tool", "sunny, 24 C", tool_call_id=call.id, name=call.name),
    )
    plan = session.plan(Generate(3, messages, tools=TOOLS))
    assert plan.text is not None and "<tool_response>\nsunny, 24 C\n</tool_response>" in plan.text
    assert '"arguments": {"city": "Paris"}' in plan.text and '"name": "get_weather"' in plan.text
    _, ids, finished = _generate(session, Generate(4, messages, sampling=GREEDY, max_tokens=16, tools=TOOLS))
    assert finished.stats.generated_tokens == len(ids) > 0


def test_speculation_stays_lossless_under_the_tool_grammar(session: Session) -> None:
    for choice in ("required", "auto"):
        request = Generate(5, ASK, sampling=GREEDY, max_tokens=160, tools=TOOLS, tool_choice=choice)
        plain, drafted = _spec_and_plain(session, request)
        assert drafted == plain and plain, choice


def test_the_lazy_grammar_starts_at_its_trigger_and_speculation_stays_lossless(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = Generate(6, ASK, sampling=GREEDY, max_tokens=120, tools=TOOLS)
    free = _generate(session, request)[0]  # the lazy tool grammar never triggers: this model writes no call
    found = re.search("[A-Za-z0-9]", free[1:])
    assert found is not None, free
    trigger = found.group()  # a character this model writes on its own, after its first
    lazy = ToolGrammar(f'root ::= "{trigger}" [a-z]*', (f"({trigger})",))
    monkeypatch.setattr(engine_ext.tool_turn, "tool_grammar", lambda *_a, **_k: lazy)
    session.reset_cache()
    text = _generate(session, request)[0]
    start = text.find(trigger)
    assert text[:start] == free[:start]  # free text until the trigger…
    assert start > 0 and re.fullmatch("[a-z]*", text[start + 1 :]), text  # …then the grammar's
    assert text[start + 1 :] != free[start + 1 :]
    plain, drafted = _spec_and_plain(session, request)
    assert drafted == plain


def test_a_template_without_tools_gets_the_generic_format(tiny_models: dict[str, Path]) -> None:
    model = Model(tiny_models["llama"])  # plain ChatML: it never shows the tools
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=2048, n_threads=2))
    try:
        session = Session(model, ctx)
        required = Generate(8, ASK, sampling=GREEDY, max_tokens=200, tools=TOOLS, tool_choice="required")
        text, _ids, done = _generate(session, required)
        (call,) = done.tool_calls
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo", "Lima")
        assert text == "" and done.stop_reason == "eos"  # the call's JSON is not shown as text
        assert any("generic JSON format" in line and tiny_models["llama"].name in line for line in done.notices)
        # The prompt describes the tools; an earlier call and its result are written in as JSON.
        history = (
            *ASK,
            ChatMessage("assistant", "", calls_to_json([ToolCall("abcd1234", "get_weather", '{"city": "Paris"}')])),
            ChatMessage("tool", "sunny", tool_call_id="abcd1234", name="get_weather"),
        )
        prompt = session._render(Generate(9, history, tools=TOOLS), message_dicts(history))[0]
        assert "You can call any of the following tools" in prompt and '"name": "get_weather"' in prompt
        assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}' in prompt
        assert '{"tool_response": {"tool": "get_weather", "content": "sunny"' in prompt
        # Tool choice "auto": a call, or the response's text streamed as text (never the JSON around it).
        auto = Generate(10, ASK, sampling=GREEDY, max_tokens=200, tools=TOOLS)
        text, _ids, done = _generate(session, auto)
        assert done.tool_calls or (text and not text.lstrip().startswith("{")), (text, done)
        # tool choice "none" offers no tools, so the template is used as it is
        done = _generate(session, Generate(11, ASK, sampling=GREEDY, max_tokens=4, tools=TOOLS, tool_choice="none"))[2]
        assert done.tool_calls == () and done.stats.generated_tokens > 0 and not done.notices
    finally:
        ctx.close()
        model.close()
