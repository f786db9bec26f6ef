"""Hostile chat templates stop within the time, size and memory limits (issue 21, item 4), and real templates
render exactly as they did before those limits (tests/fixtures/template_renders.json, captured before the change).

Every payload goes through render_chat, the function the engine renders a conversation with.
"""

from __future__ import annotations

import json
import random
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from engine_ext.chat_prompt import ChatTemplateCancelled, ChatTemplateError, render_chat
from tests.unit.test_chat import CHATML_TEMPLATE, CONVERSATION, LLAMA3_TEMPLATE, QWEN3_TEMPLATE

TIME_LIMIT_S = 2.0
MAX_WALL_S = 2.5
MAX_PEAK_BYTES = 64 * 2**20

SIZE = r"larger than \d+ characters|more than \d+ characters"
TIME = "took longer than 2 s"
ALLOC = r"allocated more than \d+ MB"
Y2000 = "y" * 2000

# name: (template, what the error must say)
HOSTILE: dict[str, tuple[str, str]] = {
    # lipsum: the 90 s hang of the campaign.
    "lipsum": ("{{ lipsum(10**8) }}", "lipsum of more than 100 paragraphs"),
    "lipsum_words": ("{{ lipsum(1, false, 10**8, 10**8 + 1) }}", "1000 words per paragraph"),
    # range
    "range_list": ("{{ range(10**12)|list }}", "range of more than 100000 items"),
    "range_loop": ("{% for i in range(10**12) %}{% endfor %}", "range of more than 100000 items"),
    # multiplication and powers
    "str_mul": ("{{ 'a' * 10**9 }}", SIZE),
    "list_mul": ("{{ [1] * 10**9 }}", SIZE),
    "list_mul_zero": ("{{ [0] * 10**9 }}", SIZE),
    "bytes_mul": ("{{ 'a'.encode() * 10**9 }}", SIZE),
    "pow_huge": ("{{ 10 ** (10 ** 10) }}", "enormous number"),
    "int_squaring": (
        "{% set ns = namespace(x=10**1000) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        "enormous number",
    ),
    # formatting widths
    "format_filter": ("{{ '%1000000000s'|format(1) }}", SIZE),
    "format_filter_star": ("{{ '%*s'|format(10**9, 'x') }}", r"'\*' width"),
    "percent_width": ("{{ '%1000000000s' % 1 }}", SIZE),
    "percent_precision": ("{{ '%.1000000000f' % 1.0 }}", SIZE),
    "percent_many_args": ("{{ ('%s' * 1000) % (('y' * 1000000,) * 1000) }}", SIZE),
    "str_format": ("{{ '{:>1000000000}'.format(1) }}", SIZE),
    "str_format_nested": ("{{ '{:>{w}}'.format('x', w=10**9) }}", SIZE),
    "str_format_repeat": ("{{ ('{0}' * 100000).format('y' * 1000) }}", SIZE),
    # string filters and methods with widths or growth
    "center": ("{{ 'x'|center(10**9) }}", SIZE),
    "center_method": ("{{ 'x'.center(10**9) }}", SIZE),
    "ljust_method": ("{{ 'x'.ljust(10**9) }}", SIZE),
    "zfill_method": ("{{ '1'.zfill(10**9) }}", SIZE),
    "expandtabs": ("{{ ('\\t' * 100000).expandtabs(100000) }}", SIZE),
    "indent": ("{{ 'x\\ny'|indent(10**9) }}", SIZE),
    "wordwrap": ("{{ ('a ' * 400000)|wordwrap(1, wrapstring='b' * 100000) }}", SIZE),
    "join_filter": ("{{ (['y' * 1000000] * 10000)|join }}", SIZE),
    "join_method": ("{{ ('y' * 1000000).join(['a'] * 10000) }}", SIZE),
    "replace_filter": ("{{ ('x' * 1000000)|replace('x', 'y' * 1000000) }}", SIZE),
    "replace_method": ("{{ ('x' * 1000000).replace('x', 'y' * 1000000) }}", SIZE),
    "translate": ("{{ ('a' * 1000000).translate({97: 'b' * 100000}) }}", SIZE),
    "batch": ("{{ [1]|batch(10**9, 0)|list }}", SIZE),
    "slice": ("{{ [1]|slice(10**9)|list|length }}", "slice of more than"),
    "sum_lists": ("{{ ([[0] * 100000] * 100000)|sum(start=[]) }}", SIZE),
    "tojson_indent": ("{{ [[1]]|tojson(indent=10**9) }}", "JSON indent wider than"),
    # printing a list that holds the same big list many times
    "print_nested": ("{% set a = range(100000)|list %}{{ [a] * 100000 }}", SIZE),
    "pprint_nested": ("{% set a = range(100000)|list %}{{ ([a] * 100000)|pprint }}", SIZE),
    # ~ concatenation
    "concat_doubling": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        SIZE,
    ),
    "concat_many": ("{% set x = 'a' * 1000000 %}{{ (" + " ~ ".join(["x"] * 64) + ")|length }}", SIZE),
    # loops (capped ranges, nested), recursion
    "nested_loops": ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", TIME),
    "nested_loops_output": (
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        f"{TIME}|{SIZE}",
    ),
    "nested_loops_lists": (
        "{% set xs = range(100000)|list %}{% for a in xs %}{% for b in xs %}{{ '' }}{% endfor %}{% endfor %}",
        TIME,
    ),
    "recursive_macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "exponential_macro": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60)|length }}",
        TIME,
    ),
    "recursive_loop": ("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", "recursed too deeply"),
    # output that never reaches the stream: macro bodies and {% set %} blocks
    "macro_body": (
        "{% macro m() %}{% for i in range(100000) %}" + Y2000 + "{% endfor %}{% endmacro %}{{ m()|length }}",
        SIZE,
    ),
    "set_block": (
        "{% set x %}{% for i in range(100000) %}" + Y2000 + "{% endfor %}{% endset %}{{ x|length }}",
        SIZE,
    ),
    # many values each under the size limit, kept
    "accumulate_strings": (
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
        "{% set ns.l = ns.l + [('x' * 1000000) ~ i] %}{% endfor %}",
        f"{ALLOC}|{SIZE}",
    ),
    "accumulate_lists": (
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
        "{% set ns.l = ns.l + [('x' * 1000000)|list] %}{% endfor %}",
        f"{ALLOC}|{SIZE}",
    ),
    "accumulate_macro_output": (
        "{% macro m() %}{% for i in range(400) %}" + Y2000 + "{% endfor %}{% endmacro %}"
        "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}{% set ns.l = ns.l + [m()] %}{% endfor %}",
        f"{ALLOC}|{SIZE}",
    ),
    "temporaries": ("{% for i in range(100000) %}{% set x = 'x' * 1000000 %}{% endfor %}", ALLOC),
    # [x, x] sixty times over: printing, comparing or hashing it takes 2**60 steps
    "dag_compare": (
        "{% set ns = namespace(a=[0], b=[0]) %}{% for i in range(60) %}"
        "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
        SIZE,
    ),
    "dag_compare_macro": (
        "{% macro f(x, y, n) %}{% if n %}{{ f([x, x], [y, y], n - 1) }}{% else %}{{ x == y }}{% endif %}"
        "{% endmacro %}{{ f([0], [0], 60) }}",
        SIZE,
    ),
    "dag_hash": (
        "{% macro f(x, n) %}{% if n %}{{ f((x,) + (x,), n - 1) }}{% else %}{{ [x]|unique|list|length }}{% endif %}"
        "{% endmacro %}{{ f((0,), 60) }}",
        SIZE,
    ),
    "dag_dict": (
        "{% set ns = namespace(d={}) %}{% for i in range(60) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}"
        "{{ ns.d|tojson|length }}",
        SIZE,
    ),
    # the stream itself
    "output_flood": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", SIZE),
}

# Odd but bounded: these render (quickly, in little memory).
BOUNDED = {
    # {% set %} inside a loop is local to the iteration: x is 'aa' each time, never doubled.
    "scoped_doubling": "{% set x = 'a' %}{% for i in range(30) %}{% set x = x ~ x %}{% endfor %}{{ x }}",
    "pow_left_assoc": "{{ 10**10**10 }}",  # jinja reads (10**10)**10
    "truncate": "{{ 'x'|truncate(10**9, end='y' * 1000) }}",
    "striptags": "{{ ('<' * 200000)|striptags|length }}",
    "urlize": "{{ ('a.' * 100000)|urlize|length }}",
    "lipsum_small": "{{ lipsum(2, false, 5, 10)|length > 0 }}",
    "range_max": "{{ range(100000)|list|length }}",
    "self_namespace": "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ [ns, ns]|length }}",
}

USER_HI = [{"role": "user", "content": "hi"}]


def render_measured(template: str) -> tuple[BaseException | str, float, int]:
    tracemalloc.start()
    start = time.monotonic()
    try:
        result: BaseException | str = render_chat(
            template, USER_HI, bos_token="<s>", eos_token="</s>", time_limit_s=TIME_LIMIT_S
        )
    except Exception as exc:  # the assertions say which kind was expected
        result = exc
    finally:
        wall = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, wall, peak


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_stops_within_limits(name: str) -> None:
    template, message = HOSTILE[name]
    result, wall, peak = render_measured(template)
    assert isinstance(result, ChatTemplateError), f"{name}: {result!r}"
    assert re.search(message, str(result)), f"{name}: {result}"
    assert "\n" not in str(result)
    assert wall < MAX_WALL_S, f"{name}: {wall:.2f} s"
    assert peak < MAX_PEAK_BYTES, f"{name}: {peak / 2**20:.1f} MB"


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_odd_but_bounded_template_renders(name: str) -> None:
    result, wall, peak = render_measured(BOUNDED[name])
    assert isinstance(result, str), f"{name}: {result!r}"
    assert wall < MAX_WALL_S
    assert peak < MAX_PEAK_BYTES


def test_time_limit_names_the_limit() -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"took longer than 0.5 s"):
        render_chat(HOSTILE["nested_loops"][0], USER_HI, bos_token="", eos_token="", time_limit_s=0.5)
    assert time.monotonic() - start < 1.0


def test_renders_that_share_a_start_share_the_limit() -> None:
    # The engine renders a long conversation several times while trimming it; all those renders share one limit.
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"took longer than 2 s"):
        render_chat(HOSTILE["nested_loops"][0], USER_HI, bos_token="", eos_token="", started_at=start - 1.8)
    assert time.monotonic() - start < 1.0  # what was left of the 2 s, not 2 s more


def test_cancelled_stops_a_render() -> None:
    # Esc while a slow template renders: the callback is asked every 20 ms or so and the render stops.
    start = time.monotonic()
    asked: list[float] = []

    def cancelled() -> bool:
        asked.append(time.monotonic() - start)
        return asked[-1] > 0.2

    with pytest.raises(ChatTemplateCancelled):
        render_chat(HOSTILE["nested_loops"][0], USER_HI, bos_token="", eos_token="", cancelled=cancelled)
    assert time.monotonic() - start < 0.6
    assert 3 <= len(asked) <= 100  # rate-limited, not once per operation
    # Never cancelled: renders as without it.
    assert render_chat(CHATML_TEMPLATE, CONVERSATION, bos_token="", eos_token="", cancelled=lambda: False) == (
        render_chat(CHATML_TEMPLATE, CONVERSATION, bos_token="", eos_token="")
    )


def test_constant_expressions_are_guarded_while_compiling() -> None:
    # jinja folds constant expressions at compile time; the format filter here must not run unguarded then.
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=SIZE):
        render_chat("{{ '%2000000000s'|format('x') }}", USER_HI, bos_token="", eos_token="")
    assert time.monotonic() - start < 1.0


# ----- real templates render as before ------------------------------------------------------------------

TOOLS_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": '<think>\nCall the tool.\n</think>\n\n<tool_call>{"name": "w"}</tool_call>'},
    {"role": "tool", "content": "18 C"},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "<think>\nSum up.\n</think>\n\nIt is 18 C and sunny."},
    {"role": "user", "content": "Thanks <b>!</b> {{ not jinja }} %s"},
]
CONVERSATIONS = {"conversation": CONVERSATION, "tools": TOOLS_CONVERSATION}
EXPECTED = json.loads((Path(__file__).parents[1] / "fixtures" / "template_renders.json").read_text(encoding="utf-8"))


def template_source(name: str) -> str | None:
    if name == "starter":
        from app.core.model_paths import starter_model_path
        from engine_ext.gguf import read_chat_template

        path = starter_model_path()
        if path is None:
            pytest.skip("the starter model is not installed")
        return read_chat_template(path)
    return {"chatml": CHATML_TEMPLATE, "fallback": None, "llama3": LLAMA3_TEMPLATE, "qwen3": QWEN3_TEMPLATE}[name]


@pytest.mark.parametrize(
    "case",
    EXPECTED,
    ids=[
        f"{c['template']}-{c['conversation']}-gen{int(c['add_generation_prompt'])}-think{c['enable_thinking']}"
        for c in EXPECTED
    ],
)
def test_real_templates_render_as_before(case: dict[str, object]) -> None:
    rendered = render_chat(
        template_source(str(case["template"])),
        CONVERSATIONS[str(case["conversation"])],
        bos_token="<s>",
        eos_token="</s>",
        add_generation_prompt=bool(case["add_generation_prompt"]),
        enable_thinking=case["enable_thinking"] if isinstance(case["enable_thinking"], bool) else None,
    )
    assert rendered == case["rendered"]


def test_long_conversation_still_renders_with_real_templates() -> None:
    # The limits grow with the conversation: a pasted 1.2 MB file in a 800-turn chat renders with every template.
    big = "y" * 1_200_000
    messages = [{"role": "system", "content": "s"}] + [
        {"role": role, "content": big if i == 3 else f"<think>r{i}</think>m{i}"}
        for i in range(400)
        for role in ("user", "assistant")
    ]
    for template in (QWEN3_TEMPLATE, LLAMA3_TEMPLATE, CHATML_TEMPLATE, None):
        out = render_chat(template, messages, bos_token="<s>", eos_token="</s>")
        assert out.count(big) == 2


# Features real templates use (macros with caller, call/filter/set blocks, %-formatting, str.format, tojson, recursive
# loops, lipsum, joins, sums, batch/slice, tuple unpacking, literals): output captured before the limits.
SAMPLER = (
    "{% macro box(t) %}[{{ t }}|{{ caller() }}]{% endmacro %}{% call box('a') %}"
    "inner {{ messages[0].content }}{% endcall %}{% filter upper %}up {{ 1 ~ 2 }}"
    "{% endfilter %}{% set b %}blk{{ [1,2]|join(',') }}{% endset %}{{ b }}"
    "{{ '%-5s|%05.1f' % ('ab', 3.14159) }}{{ '{:>6}|{}'.format('r', [1, 'x']) }}"
    "{{ {'k': messages[0].role}|tojson }}{{ (messages|map(attribute='content')|list)|string }}"
    "{% for x in [1,[2,3]] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}"
    "{% endif %}{% endfor %}{{ lipsum(1, false, 3, 5)|wordcount > 0 }}"
    "{{ 'a\\tb'.expandtabs(4) }}{{ 'x'.center(5, '*') }}{{ ('a','b')|join('-') }}"
    "{{ [[1],[2]]|sum(start=[]) }}{{ range(5)|batch(2)|list }}{{ range(5)|slice(2)|list }}"
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% for k, v in {'x': 1}.items() %}{{ k }}={{ v }}"
    "{% endfor %}{{ 'abc'.replace('b', 'BB') }}{{ '-'.join(['p', 'q']) }}"
    "{{ '%(n)s' % {'n': 'named'} }}{{ 'x'|indent(2, true) }}{{ 'aa bb'|wordwrap(2) }}"
    "{{ [1, 2] + [3] }}{{ (1, 2) * 2 }}"
)


def test_template_features_render_as_before() -> None:
    expected = (
        "[a|inner hi]UP 12blk1,2ab   |003.1     r|[1, 'x']{\"k\": \"user\"}['hi']123Truea   b**x**a-b[1, 2]"
        "[[0, 1], [2, 3], [4]][[0, 1, 2], [3, 4]]12x=1aBBcp-qnamed  xaa\nbb[1, 2, 3](1, 2, 1, 2)"
    )
    assert render_chat(SAMPLER, USER_HI, bos_token="", eos_token="") == expected


# ----- error text (issue 32, class 2): whatever a template raises or quotes becomes one clean line ----------------

ESCAPES = "\\x1b[2J\\x1b]0;PWN\\x07\\x9b31m\\u202e"
# name: a template whose error message would quote hostile text
ERROR_TEXT: dict[str, str] = {
    "raise_huge": "{{ raise_exception('B' * 700000) }}",
    "raise_lines": "{{ raise_exception('first\\nsecond\\r\\n' * 300) }}",
    "raise_escapes": "{{ raise_exception('" + ESCAPES + "bad') }}",
    "raise_surrogate": "{{ raise_exception('\\ud800 lone') }}",
    "raise_non_string": "{{ raise_exception(['\\x1b[31m'] * 5000) }}",
    "unknown_filter": "{{ 1 | " + "f" * 6000 + " }}",
    "unknown_test": "{% if 1 is " + "t" * 6000 + " %}{% endif %}",
    "syntax_long_name": "{% " + "n" * 6000 + " %}",
    "syntax_escape_in_name": "{{ 'x' | \x1b[2Jfilter }}",
    "undefined_call": "{{ " + "u" * 6000 + "() }}",
    "unknown_tag_after_lines": "\n" * 500 + "{% " + "x\x07" * 10 + " %}",
    "format_error": "{{ ('%d' * 3) % ('\\x1b]0;T\\x07' * 2000,) }}",
}


def assert_one_clean_line(text: str) -> None:
    assert "\n" not in text and "\r" not in text, text[:200]
    assert len(text) <= 300, len(text)
    assert all(ch.isprintable() for ch in text), repr(text[:300])
    text.encode("utf-8")  # no lone surrogate


@pytest.mark.parametrize("name", sorted(ERROR_TEXT))
def test_template_error_text_is_one_clean_line(name: str) -> None:
    result, _wall, _peak = render_measured(ERROR_TEXT[name])
    assert isinstance(result, ChatTemplateError), f"{name}: {result!r}"
    assert_one_clean_line(str(result))


def test_a_raised_message_keeps_its_start_with_escapes_shown() -> None:
    result, _wall, _peak = render_measured("{{ raise_exception('\\x1b]0;PWN\\x07no system role') }}")
    assert isinstance(result, ChatTemplateError)
    assert "␛]0;PWN␇no system role" in str(result)


def _error_path_template(rng: random.Random) -> str:
    """A random template that fails, quoting random hostile text: raise_exception, unknown names, bad syntax."""
    pieces = ["\\x1b[2J", "\\x1b]0;X\\x07", "\\n", "\\r", "\\t", "\\x00", "\\x9b", "\\u202e", "\\ud800", "A", "é"]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
    repeat = rng.choice([1, 10, 1000, 100000])
    raw = "".join(rng.choice(["\x1b", "\x07", "\n", "z", "\u202e"]) for _ in range(rng.randint(1, 30)))
    name = rng.choice(["f", "g_", "ü"]) * rng.randint(1, 8000)
    kind = rng.randrange(6)
    if kind == 0:
        return "{{ raise_exception('" + text + "' * " + str(repeat) + ") }}"
    if kind == 1:
        return "{{ 1 | " + name + " }}"
    if kind == 2:
        return "{% if 1 is " + name + " %}{% endif %}"
    if kind == 3:
        return "{{ " + raw + " }}"
    if kind == 4:
        return "{% " + name + " %}"
    return "{{ ('" + text + "' * " + str(repeat) + ") | int(" + raw.replace("'", "") + ") }}"


def test_fuzzed_template_error_paths_give_one_clean_line() -> None:
    """Seeded fuzz of templates' error paths: every failure is one clean line, and nothing else escapes."""
    rng = random.Random(32)
    failures = 0
    for _ in range(300):
        try:
            result = render_chat(_error_path_template(rng), USER_HI, bos_token="<s>", eos_token="</s>")
        except ChatTemplateError as exc:
            failures += 1
            assert_one_clean_line(str(exc))
        else:
            assert isinstance(result, str), repr(result)
    assert failures > 200  # the generator makes failing templates, mostly
