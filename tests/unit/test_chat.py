"""Tests for engine_ext.chat_prompt: sandboxed chat templates and streamed-reply helpers (no model needed)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from engine_ext.chat_prompt import (
    FALLBACK_CHAT_TEMPLATE,
    ChatTemplateError,
    render_chat,
    truncate_messages_to_fit,
)
from engine_ext.reply_stream import ReasoningSplitter, StopStringMatcher, Utf8StreamDecoder, prompt_opens_reasoning

# ----- templates (abridged from real GGUF files) -----------------------------------------------------

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content | trim + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string
            and not(message.content.startswith('<tool_response>')
                    and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content =
                content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n')
                    + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
    {"role": "user", "content": "2+2?"},
]


def render(
    template: str | None,
    messages: Sequence[Mapping[str, str]] = CONVERSATION,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    time_limit_s: float = 2.0,
    max_output_chars: int | None = None,
) -> str:
    return render_chat(
        template,
        messages,
        bos_token="<s>",
        eos_token="</s>",
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        time_limit_s=time_limit_s,
        max_output_chars=max_output_chars,
    )


# ----- rendering ----------------------------------------------------------------------------------------


def test_chatml_template() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(CHATML_TEMPLATE, msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(CHATML_TEMPLATE, msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_llama3_template() -> None:
    msgs = [
        {"role": "system", "content": "You are helpful. "},
        {"role": "user", "content": "  Hi\n"},
    ]
    out = render_chat(LLAMA3_TEMPLATE, msgs, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


QWEN3_HISTORY = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"  # old reasoning is stripped from history
    "<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_qwen3_template_enable_thinking() -> None:
    assert render(QWEN3_TEMPLATE) == QWEN3_HISTORY
    assert render(QWEN3_TEMPLATE, enable_thinking=True) == QWEN3_HISTORY
    assert render(QWEN3_TEMPLATE, enable_thinking=False) == QWEN3_HISTORY + "<think>\n\n</think>\n\n"


def test_qwen3_template_keeps_reasoning_after_last_query() -> None:
    msgs = [*CONVERSATION, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}]
    out = render(QWEN3_TEMPLATE, msgs, add_generation_prompt=False)
    assert out.endswith(
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
    )


def test_enable_thinking_only_passed_when_set() -> None:
    probe = "{{ enable_thinking is defined }}/{{ enable_thinking }}"
    assert render(probe) == "False/"
    assert render(probe, enable_thinking=False) == "True/False"


def test_fallback_is_chatml() -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(None, msgs) == expected
    assert render("", msgs) == expected
    assert render("  \n", msgs) == expected
    assert render(FALLBACK_CHAT_TEMPLATE, msgs) == expected


def test_hf_extras() -> None:
    assert render("{{ {'name': 'größe', 'tag': '<b>', 'x': [1, 2]} | tojson }}") == (
        '{"name": "größe", "tag": "<b>", "x": [1, 2]}'
    )
    assert render("{{ [1] | tojson(indent=2) }}") == "[\n  1\n]"
    assert render("{{ {'a': 1} | tojson(separators=(',', ':')) }}") == '{"a":1}'
    loop = (
        "{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}"
        "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    assert render(loop) == "023"
    before = datetime.now().strftime("%Y")
    year = render("{{ strftime_now('%Y') }}")
    assert year in {before, datetime.now().strftime("%Y")}
    assert render("{% generation %}body{% endgeneration %}") == "body"
    assert render("{{ tools is none }} {{ bos_token }}{{ eos_token }}") == "True <s></s>"


def test_trim_and_lstrip_blocks() -> None:
    template = "{% for m in messages %}\n  {% if m.role == 'user' %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}"
    assert render(template) == "Hi\n2+2?\n"


def test_raise_exception_surfaces_message() -> None:
    template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="roles must alternate user/assistant"):
        render(template)


def test_syntax_error_reports_line() -> None:
    with pytest.raises(ChatTemplateError, match="syntax error on line 2"):
        render("{% for m in messages %}\n{{ m.content }\n{% endfor %}")


def test_runtime_error_is_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="line 3"):
        render("a\nb\n{{ messages[0].content + 1 }}")


# ----- sandbox ------------------------------------------------------------------------------------------


def escape_payloads(canary: Path) -> list[str]:
    cmd = f"touch {canary}"
    return [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        f"{{{{ cycler.__init__.__globals__.os.system('{cmd}') }}}}",
        f"{{{{ joiner.__init__.__globals__['os'].popen('{cmd}').read() }}}}",
        f"{{{{ namespace.__init__.__globals__.os.system('{cmd}') }}}}",
        f"{{{{ lipsum.__globals__['os'].system('{cmd}') }}}}",
        f"{{{{ lipsum.__globals__.__builtins__.__import__('os').system('{cmd}') }}}}",
        f"{{{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('{cmd}') }}}}",
        f"{{{{ raise_exception.__globals__['os'].system('{cmd}') }}}}",
        f"{{{{ (cycler|attr('__init__')|attr('__globals__'))['os'].system('{cmd}') }}}}",
        "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
        "{% if ''.__class__ %}probed{% endif %}",
        "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
        "{{ messages[0].update({'content': 'mutated'}) }}",
    ]


@pytest.mark.parametrize("index", range(len(escape_payloads(Path("x")))))
def test_sandbox_escape_refused(tmp_path: Path, index: int) -> None:
    canary = tmp_path / "pwned"
    payload = escape_payloads(canary)[index]
    with pytest.raises(ChatTemplateError, match="refused"):
        render(payload, [{"role": "user", "content": "hi"}])
    assert not canary.exists()


def test_sandbox_does_not_mutate_callers_messages() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        render("{{ messages[0].update({'content': 'mutated'}) }}", msgs)
    assert msgs == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "template",
    [
        # Hooks see a range() call per outer iteration.
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        # No calls or attribute lookups inside the loops at all: the per-iteration guard.
        "{% set xs = range(100000)|list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}",
        # Exponential macro recursion that only builds strings in memory.
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60)|length }}",
    ],
)
def test_endless_loop_times_out(template: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="longer than 0.3 s"):
        render(template, time_limit_s=0.3)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
        "{{ 'x' * 1000000000 }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    ],
)
def test_huge_output_refused(template: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="larger than 10000|more than 10000"):
        render(template, max_output_chars=10_000)
    assert time.monotonic() - start < 2.0


def test_size_limit_grows_with_the_conversation() -> None:
    # A pasted file longer than the fixed limit renders (the context check refuses it later, saying why); a template
    # that blows a short conversation up is still stopped.
    pasted = "x" * 1_200_000
    assert pasted in render(None, [{"role": "user", "content": pasted}])
    with pytest.raises(ChatTemplateError, match="larger than|more than"):
        render(
            "{% for i in range(2000) %}{{ messages[0].content }}{% endfor %}", [{"role": "user", "content": "y" * 1000}]
        )


def test_range_and_pow_limits() -> None:
    with pytest.raises(ChatTemplateError, match="MAX_RANGE"):
        render("{{ range(10000000)|length }}")
    with pytest.raises(ChatTemplateError, match="enormous number"):
        render("{{ 2 ** (10 ** 9) }}")


def test_recursion_refused() -> None:
    with pytest.raises(ChatTemplateError, match="recursed too deeply"):
        render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")


# ----- stop strings -------------------------------------------------------------------------------------


def run_stops(stops: list[str], pieces: Sequence[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_overlapping_prefix() -> None:
    matcher = StopStringMatcher(["abc"])
    assert matcher.feed("ab") == ("", False)
    assert matcher.feed("ab") == ("ab", False)
    assert matcher.feed("c") == ("", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_stop_every_split() -> None:
    stops = ["<|im_end|>", "\nUser:", "aab"]
    cases = {
        "Hello there<|im_end|>ignored": ("Hello there", True),
        "line\nUse this\nUser: x": ("line\nUse this", True),
        "aaaab tail": ("aa", True),
        "no stop here <|im_": ("no stop here <|im_", False),
    }
    for text, expected in cases.items():
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                assert run_stops(stops, [text[:i], text[i:j], text[j:]]) == expected, (text, i, j)
        assert run_stops(stops, list(text)) == expected


def test_stop_holds_back_only_possible_prefixes() -> None:
    matcher = StopStringMatcher(["</s>"])
    assert matcher.feed("a<") == ("a", False)
    assert matcher.feed("b") == ("<b", False)
    assert matcher.feed("</") == ("", False)
    assert matcher.flush() == "</"
    assert StopStringMatcher([]).feed("anything") == ("anything", False)


# ----- reasoning ----------------------------------------------------------------------------------------


def split_all(splitter: ReasoningSplitter, pieces: Sequence[str]) -> tuple[str, str]:
    parts = [p for piece in pieces for p in splitter.feed(piece)] + splitter.flush()
    reasoning = "".join(text for kind, text in parts if kind == "reasoning")
    answer = "".join(text for kind, text in parts if kind == "answer")
    assert all(text for _, text in parts)
    return reasoning, answer


REASONING_CASES: list[tuple[bool, str, tuple[str, str]]] = [
    (False, " \n<think>\nLet me think.\n</think>\n\nThe answer: 4", ("Let me think.\n", "The answer: 4")),
    (False, "Plain answer, no <think> tags.", ("", "Plain answer, no <think> tags.")),
    (False, "\n\nPlain", ("", "Plain")),
    (False, "<thinking>? no", ("", "<thinking>? no")),
    (False, "<think>unfinished </thi", ("unfinished </thi", "")),
    (False, "<think></think>Direct", ("", "Direct")),
    (True, "Let me think.\n</think>\n\nFour.", ("Let me think.\n", "Four.")),
    (True, "\n<think>\nEchoed tag.</think>Four.", ("Echoed tag.", "Four.")),
    (True, "a < b </ c</think> x </think> y", ("a < b </ c", "x </think> y")),
    (True, "</think>Only answer", ("", "Only answer")),
    (True, "<think", ("<think", "")),
]


@pytest.mark.parametrize(("starts_in", "text", "expected"), REASONING_CASES)
def test_reasoning_split_every_position(starts_in: bool, text: str, expected: tuple[str, str]) -> None:
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            pieces = [text[:i], text[i:j], text[j:]]
            got = split_all(ReasoningSplitter(starts_in_reasoning=starts_in), pieces)
            assert got == expected, (pieces, got)
    assert split_all(ReasoningSplitter(starts_in_reasoning=starts_in), list(text)) == expected


def test_reasoning_custom_tags() -> None:
    splitter = ReasoningSplitter(open_tag="[THINK]", close_tag="[/THINK]")
    assert split_all(splitter, ["[THI", "NK]why[/TH", "INK] because"]) == ("why", "because")


def test_reasoning_streams_incrementally() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>abc</th") == [("reasoning", "abc")]
    assert splitter.feed("ink>\n\nAns") == [("answer", "Ans")]
    assert splitter.feed("wer") == [("answer", "wer")]


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert not prompt_opens_reasoning(render(QWEN3_TEMPLATE, enable_thinking=False))


# ----- UTF-8 --------------------------------------------------------------------------------------------


def test_utf8_every_split() -> None:
    text = "héllo ✓ 😀"
    data = text.encode()
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            decoder = Utf8StreamDecoder()
            outs = [decoder.feed(data[:i]), decoder.feed(data[i:j]), decoder.feed(data[j:]), decoder.flush()]
            assert "".join(outs) == text
            assert "\ufffd" not in "".join(outs)
    decoder = Utf8StreamDecoder()
    assert "".join(decoder.feed(bytes([b])) for b in data) + decoder.flush() == text


def test_utf8_invalid_and_truncated() -> None:
    decoder = Utf8StreamDecoder()
    assert decoder.feed(b"a\xffb") == "a\ufffdb"
    assert decoder.feed("✓".encode()[:2]) == ""
    assert decoder.flush() == "\ufffd"
    assert decoder.feed(b"ok") == "ok"  # usable again after flush


# ----- context fitting ----------------------------------------------------------------------------------


def count_chars(msgs: Sequence[Mapping[str, str]]) -> int:
    return sum(len(m["content"]) for m in msgs)


HISTORY = [
    {"role": "system", "content": "S" * 10},
    {"role": "user", "content": "u" * 10},
    {"role": "assistant", "content": "a" * 10},
    {"role": "user", "content": "u" * 10},
    {"role": "assistant", "content": "a" * 10},
    {"role": "tool", "content": "t" * 10},
    {"role": "user", "content": "U" * 10},
]


def test_truncate_nothing_to_drop() -> None:
    kept, dropped = truncate_messages_to_fit(HISTORY, count_chars, 70)
    assert (kept, dropped) == (HISTORY, 0)
    assert kept is not HISTORY


def test_truncate_drops_whole_oldest_turns() -> None:
    kept, dropped = truncate_messages_to_fit(HISTORY, count_chars, 60)
    assert dropped == 2
    assert kept == [HISTORY[0], *HISTORY[3:]]
    kept, dropped = truncate_messages_to_fit(HISTORY, count_chars, 30)
    assert dropped == 5
    assert kept == [HISTORY[0], HISTORY[-1]]


def test_truncate_minimum_returned_when_nothing_fits() -> None:
    kept, dropped = truncate_messages_to_fit(HISTORY, count_chars, 5)
    assert (kept, dropped) == ([HISTORY[0], HISTORY[-1]], 5)


def test_truncate_keeps_system_messages_and_tail() -> None:
    msgs = [
        {"role": "assistant", "content": "greeting"},
        {"role": "user", "content": "old question"},
        {"role": "system", "content": "mid"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "now"},
        {"role": "assistant", "content": "partial"},  # e.g. a reply being continued
    ]
    kept, dropped = truncate_messages_to_fit(msgs, count_chars, 1)
    assert kept == [msgs[2], msgs[4], msgs[5]]
    assert dropped == 3
    kept, dropped = truncate_messages_to_fit(msgs, count_chars, count_chars(msgs) - 8)
    assert (kept, dropped) == (msgs[1:], 1)


def test_truncate_counts_few_times() -> None:
    msgs = [{"role": "system", "content": "s"}]
    for i in range(200):
        msgs += [{"role": "user", "content": f"q{i:03}"}, {"role": "assistant", "content": f"a{i:03}"}]
    calls = 0

    def counting(m: Sequence[Mapping[str, str]]) -> int:
        nonlocal calls
        calls += 1
        return count_chars(m)

    kept, dropped = truncate_messages_to_fit(msgs, counting, 41)
    assert count_chars(kept) <= 41
    assert kept[-1] == msgs[-1] and kept[0] == msgs[0]
    assert dropped == len(msgs) - len(kept)
    assert count_chars(kept) > 41 - 8  # dropped no more turns than needed (a turn is 8 chars)
    assert calls <= 12


def test_a_continued_answer_keeps_its_leading_space_and_tags() -> None:
    # Continued from the middle of its answer: nothing is dropped and no <think> opens a reasoning block.
    assert split_all(ReasoningSplitter(starts_in_answer=True), [" said", " <think>x</think>", " more"]) == (
        "",
        " said <think>x</think> more",
    )
    assert split_all(ReasoningSplitter(), [" said", " more"]) == ("", "said more")
