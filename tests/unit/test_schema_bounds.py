"""Grammars made from JSON schemas are bounded like given ones (issue 42), without a model: the converter's counts
as llama.cpp's {m,n} (blocks past its 2000, read exactly), and engine_ext.grammar_bounds' measures over GBNF text."""

from __future__ import annotations

import json
import re
import time

import pytest

from engine_ext.grammar import MAX_SCHEMA_COUNT, GrammarError, grammar_for, schema_repetition
from engine_ext.grammar_bounds import MAX_EXPANSION, MAX_OPEN_READINGS, MAX_REPEAT, check_bounds
from engine_ext.untrusted_text import MAX_MESSAGE
from tests.schema_fuzz import seeded_schema


def as_regex(gbnf: str) -> re.Pattern[str]:
    """The repetition of the literal "a" as a Python regex: the same groups, alternatives and {m,n}."""
    return re.compile(gbnf.replace('"a"', "a").replace(" ", ""))


@pytest.mark.parametrize(
    ("low", "high"), [(0, 2000), (0, 2001), (2001, 2002), (0, 4999), (1, 5000), (2500, 7777), (0, MAX_SCHEMA_COUNT)]
)
def test_counts_past_llamas_limit_read_exactly_the_lengths_asked(low: int, high: int) -> None:
    written = schema_repetition('"a"', low, high)
    assert max(int(n) for n in re.findall(r"\d+", written)) <= MAX_REPEAT  # llama.cpp reads a larger bound as none
    regex = as_regex(written)
    for length in {0, low - 1, low, low + 1, 999, 1000, 1001, 1999, 2000, 2001, high - 1, high, high + 1}:
        if length >= 0:
            assert bool(regex.fullmatch("a" * length)) == (low <= length <= high), length


def test_unbounded_and_separated_counts() -> None:
    assert as_regex(schema_repetition('"a"', 2500, None)).fullmatch("a" * 4000)
    assert not as_regex(schema_repetition('"a"', 2500, None)).fullmatch("a" * 2499)
    separated = schema_repetition('"a"', 0, 3000, separator_rule='","')
    regex = re.compile(separated.replace('"a"', "a").replace('","', ",").replace(" ", ""))
    for n in (0, 1, 2, 2999, 3000, 3001):
        assert bool(regex.fullmatch(",".join("a" * n))) == (n <= 3000), n


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (
            {"type": "string", "maxLength": 10**9},
            f"1000000000 repetitions (a length, an item count or a pattern's {{m,n}}); at most {MAX_SCHEMA_COUNT}",
        ),
        (
            {"type": "array", "maxItems": MAX_SCHEMA_COUNT + 1, "items": {"type": "integer"}},
            f"at most {MAX_SCHEMA_COUNT}",
        ),
        ({"type": "string", "pattern": "^a{99999999999999999999}$"}, f"at most {MAX_SCHEMA_COUNT}"),
        ({"type": "string", "maxLength": "5"}, "not a whole number"),
        ({"type": "string", "maxLength": 2.5}, "not a whole number"),
        ({"type": "string", "minLength": -1}, "not a whole number"),
        ({"type": "string", "minLength": 9, "maxLength": 2}, "at least 9 and at most 2"),
    ],
)
def test_schema_counts_out_of_range_are_refused_in_one_line(schema: dict[str, object], words: str) -> None:
    with pytest.raises(GrammarError) as refused:
        grammar_for(None, json.dumps(schema))
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("length", [5000, 30_000, MAX_SCHEMA_COUNT])
def test_long_strings_convert_to_a_grammar_within_the_bounds(length: int) -> None:
    start = time.monotonic()
    gbnf = grammar_for(None, json.dumps({"type": "string", "maxLength": length}))
    assert gbnf is not None and len(gbnf) < 4000  # was `length` nested groups (10^9: gigabytes)
    check_bounds(gbnf)
    assert time.monotonic() - start < 1.0


NESTED_RULES = 'r1 ::= "a"{0,50}\nr2 ::= r1{0,50}\nroot ::= r2 "b"'


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        (
            'root ::= "a"{0,1000000000}',
            f"rule root repeats an item 1000000000 times; llama.cpp counts to at most {MAX_REPEAT}",
        ),
        ('root ::= x{2001,}\nx ::= "a"', f"at most {MAX_REPEAT}"),
        (
            "root ::= " + " ".join(["[a-z]{0,2000}"] * 130),
            f"expand to 260000 rules (the most in rule root); at most {MAX_EXPANSION}",
        ),
        (
            NESTED_RULES,
            f"(rule r2): 2500 readings open at once, each costing every sampling step; at most {MAX_OPEN_READINGS}",
        ),
        ('root ::= (("a"{0,50}){0,50}){0,50}', "over 100000 readings open at once"),
        ('root ::= ("a"{0,60})+ "b"', f"at most {MAX_OPEN_READINGS}"),
        ("root ::= [a-z]{0,60} [a-z]{0,60}", f"at most {MAX_OPEN_READINGS}"),
    ],
)
def test_hostile_grammars_are_refused_in_one_line(grammar: str, words: str) -> None:
    with pytest.raises(GrammarError) as refused:
        check_bounds(grammar)
    message = str(refused.value)
    assert words in message and "\n" not in message and len(message) <= MAX_MESSAGE


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "a"{0,2000}',
        'root ::= "\\"" [^"\\\\]{0,2000} "\\""',  # a JSON-like string: its end is told by the quote
        'root ::= "\\"" [^\\x0A\\x0D]{0,1000} "\\""',  # dot takes the quote: two readings at most
        'root ::= "{" ("a" ("," "a"){0,1999})? "}"',
        'root ::= ("a"{0,9}){0,9} "b"',  # nested, 90 readings: under the bound
        'root ::= x*\nx ::= "[" x* "]" | "y"',  # recursion adds no readings
        'root ::= "x{0,99999}" [{] # "a"{0,99999}\n',  # counts inside literals, classes and comments are not counts
        "root ::= " + " | ".join(f'"w{i}"' for i in range(20_000)),  # a wide alternation: not a repetition
        'root ::= ( "yes" ',  # does not parse: llama.cpp says why
    ],
    ids=[
        "count-2000",
        "json-string",
        "dot-string",
        "separated",
        "nested-9x9",
        "recursion",
        "not-counts",
        "wide-alt",
        "unparsable",
    ],
)
def test_bounded_grammars_pass(grammar: str) -> None:
    check_bounds(grammar)


def test_deep_rule_chains_are_measured_or_refused_in_one_line() -> None:
    chain = "\n".join(f"r{i} ::= r{i + 1} [a-z]?" for i in range(30_000)) + '\nr30000 ::= "a"'
    with pytest.raises(GrammarError, match="nest too deeply to measure"):
        check_bounds(chain, "r0")
    check_bounds("\n".join(f"r{i} ::= r{i + 1} [a-z]?" for i in range(2000)) + '\nr2000 ::= "a"', "r0")


@pytest.mark.parametrize("seed", range(300))
def test_seeded_schemas_convert_or_are_refused_in_one_line(seed: int) -> None:
    schema = seeded_schema(seed)
    start = time.monotonic()
    try:
        gbnf = grammar_for(None, json.dumps(schema))
        assert gbnf is not None
        check_bounds(gbnf)
    except GrammarError as refused:
        assert "\n" not in str(refused) and len(str(refused)) <= MAX_MESSAGE
    else:
        assert max((int(n) for n in re.findall(r"\{(\d+)", gbnf)), default=0) <= MAX_REPEAT
    assert time.monotonic() - start < 2.0
