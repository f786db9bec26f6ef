"""The reasoning budget's state machine on token pieces, the template's end of thinking, which thinking controls a
template reads, and forced tokens left uncoloured by the draft colouring."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.config import ConfigError, SamplingSettings
from app.core.output_format import OutputFormatError, output_fields, response_format_fields
from app.tui.streaming import chunk_draft_spans
from app.tui.widgets.message_view import reasoning_size
from engine_ext.chat_prompt import render_chat, template_thinking_controls
from engine_ext.grammar import JSON_OBJECT_SCHEMA
from engine_ext.protocol import FORCED, TokenChunk
from engine_ext.reasoning import DEFAULT_THINKING_END, ReasoningBudget, thinking_end_text

# token id -> bytes: a toy vocabulary where each token is one piece
PIECES = {
    1: b"<think>",
    2: b"\n",
    3: b"a",
    4: b"</",
    5: b"think>",
    6: b"\xc3",
    7: b"\xa9",
    8: b"Hi",
    9: b"<thi",
    10: b"nk>",
}
FORCED_TOKENS = (2, 4, 5, 2)


def budget(n: int, *, thinking: bool = False) -> ReasoningBudget:
    return ReasoningBudget(PIECES.__getitem__, FORCED_TOKENS, n, starts_in_reasoning=thinking)


def forced_run(b: ReasoningBudget) -> list[int]:
    out = []
    while (token := b.next_forced()) is not None:
        out.append(token)
        b.observe(token)
    return out


def test_counts_thinking_tokens_after_the_open_tag_and_forces_the_end_after_n() -> None:
    b = budget(3)
    b.observe_all([2, 9])  # whitespace, then a token that may still become the open tag: not thinking yet
    assert b.state == "idle" and b.draft_room() == 3
    b.observe(10)  # completes "<think>" across two tokens
    assert b.state == "counting" and b.thinking_tokens == 0 and b.draft_room() == 2
    b.observe_all([3, 3])
    assert b.next_forced() is None and b.draft_room() == 0
    b.observe(3)
    assert b.thinking_tokens == 3 and forced_run(b) == list(FORCED_TOKENS) and b.forced
    assert b.state == "done" and b.draft_room() is None


def test_waits_for_a_complete_character_before_forcing() -> None:
    b = budget(2, thinking=True)
    b.observe_all([3, 6])  # the budget is spent on the first byte of "é"
    assert b.state == "waiting_utf8" and b.next_forced() is None and b.draft_room() == 0
    b.observe(7)
    assert b.next_forced() == FORCED_TOKENS[0] and b.thinking_tokens == 2


def test_a_natural_end_of_thinking_and_an_answer_without_thinking_force_nothing() -> None:
    b = budget(5, thinking=True)
    b.observe_all([3, 4, 5, 3, 3, 3, 3])
    assert b.state == "done" and not b.forced and b.thinking_tokens == 2  # "a", "</"; not the token ending the tag
    direct = budget(0)
    direct.observe(8)
    assert direct.state == "done" and direct.next_forced() is None and not direct.force()


def test_stop_now_while_thinking_or_before_it_starts() -> None:
    unlimited = budget(-1, thinking=True)
    assert unlimited.draft_room() is None
    unlimited.observe(3)
    assert unlimited.force() and forced_run(unlimited) == list(FORCED_TOKENS)
    early = budget(-1)
    assert early.force() and early.draft_room() == 0  # before <think>: forced as soon as it opens
    early.observe(1)
    assert early.next_forced() == FORCED_TOKENS[0] and early.thinking_tokens == 0


def test_budget_zero_forces_at_once() -> None:
    assert budget(0, thinking=True).next_forced() == FORCED_TOKENS[0]


QWEN_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
    "{{ m.reasoning_content.strip() }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
EFFORT = "{{ 'Reasoning: ' + reasoning_effort if reasoning_effort is defined else '' }}{{ messages[0].content }}"


def test_the_end_of_thinking_comes_from_the_template() -> None:
    assert thinking_end_text(QWEN_LIKE) == "\n</think>\n\n"
    assert thinking_end_text(QWEN_LIKE.replace("\n</think>\n\n", "</think>")) == "</think>"
    assert thinking_end_text(None) == DEFAULT_THINKING_END  # ChatML shows no reasoning
    assert thinking_end_text("{{ raise_exception('no') }}") == DEFAULT_THINKING_END


def test_which_thinking_controls_a_template_reads_and_effort_reaches_it() -> None:
    assert template_thinking_controls(QWEN_LIKE) == ("enable_thinking",)
    assert template_thinking_controls(EFFORT) == ("reasoning_effort",)
    assert template_thinking_controls(None) == () and template_thinking_controls("{{ my_enable_thinking_x }}") == ()
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(EFFORT, messages, bos_token="", eos_token="", reasoning_effort="low") == "Reasoning: lowhi"
    assert render_chat(EFFORT, messages, bos_token="", eos_token="") == "hi"


def test_forced_tokens_are_not_coloured_as_drafts() -> None:
    chunk = TokenChunk(1, "ab", "", (1, 2), (FORCED, "ngram-simple"), (1, 2))
    assert chunk_draft_spans(chunk) == [(1, 2, "ngram-simple")]
    assert chunk_draft_spans(TokenChunk(1, "ab", "", (1, 2), (FORCED, FORCED), (1, 2))) == []


def test_a_folded_thinking_block_says_its_tokens_and_time_when_the_engine_counted_them() -> None:
    assert reasoning_size("a b c", {"reasoning_tokens": 412, "reasoning_ms": 3140.0}) == "412 tokens, 3.1 s"
    assert reasoning_size("a b c", {}) == "3 words"  # a remote engine's reply, or one saved before
    assert reasoning_size("a b c", {"reasoning_tokens": 0, "reasoning_ms": 0.0}) == "3 words"


def test_an_output_format_becomes_the_engines_and_a_servers_fields(tmp_path: Path) -> None:
    schema, grammar = tmp_path / "s.json", tmp_path / "g.gbnf"
    schema.write_text('{"type": "boolean"}')
    grammar.write_text('root ::= "yes" | "no"')
    assert output_fields("text", "") == (None, None) and response_format_fields("text", "") == {}
    assert output_fields("json", "") == (None, JSON_OBJECT_SCHEMA)
    assert output_fields("json_schema", str(schema)) == (None, '{"type": "boolean"}')
    assert output_fields("grammar", str(grammar)) == ('root ::= "yes" | "no"', None)
    assert response_format_fields("json", "") == {"response_format": {"type": "json_object"}}
    shaped = response_format_fields("json_schema", str(schema))["response_format"]
    assert shaped["type"] == "json_schema" and shaped["json_schema"]["schema"] == {"type": "boolean"}
    with pytest.raises(OutputFormatError, match="missing.json"):
        output_fields("json_schema", str(tmp_path / "missing.json"))
    with pytest.raises(OutputFormatError, match="not JSON"):
        response_format_fields("json_schema", str(grammar))
    with pytest.raises(ConfigError, match="Output file"):
        SamplingSettings(output_format="grammar").validate()
