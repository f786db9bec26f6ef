"""A reply that repeats itself (app/core/generation/repeats.py): the same line or block of lines written REPEATS
times in a row is found however the text is cut into pieces; varied text, short runs and lines like "}" are not."""

from __future__ import annotations

import pytest

from app.core.generation.repeats import REPEATS, RepeatWatch


def watched(text: str, size: int) -> RepeatWatch:
    watch = RepeatWatch()
    for i in range(0, len(text), size):
        watch.feed(text[i : i + size])
    return watch


@pytest.mark.parametrize("size", [1, 3, 17, 10_000])
def test_a_line_written_again_and_again_is_a_loop_however_it_streams(size: int) -> None:
    text = "Sure! Here it is.\n" + "I am a happy little bot.\n" * 9
    watch = watched(text, size)
    assert (watch.period, watch.times) == (1, 9)
    assert watch.note() == "The reply repeats itself: the same line 9 times in a row."


def test_a_block_of_lines_repeated_is_a_loop_and_counted_by_blocks() -> None:
    watch = watched("Q: what now?\nA: the same.\n\n" * 6, 5)
    assert watch.note() == "The reply repeats itself: the same 2 lines 6 times in a row."


def test_varied_text_short_runs_and_short_lines_are_not_loops() -> None:
    assert watched("".join(f"Step {n}: do thing {n}.\n" for n in range(50)), 7).note() == ""
    assert watched("Hello there, friend.\n" * (REPEATS - 1) + "Bye.\n", 4).note() == ""
    assert watched("    }\n" * 20 + "---\n" * 20, 3).note() == ""


def test_feed_says_when_the_loop_is_first_found_and_when_it_goes_on_then_a_new_one_starts_over() -> None:
    watch = RepeatWatch()
    found = [watch.feed("The same sentence again.\n") for _ in range(REPEATS + 1)]
    assert found == [False] * (REPEATS - 1) + [True, True]
    watch.feed("Something else entirely.\n")
    assert watch.period == 0 and watch.note() == ""
    assert any(watch.feed("Another looping line here.\n") for _ in range(REPEATS))
    assert watch.times == REPEATS


@pytest.mark.parametrize("size", [1, 5, 64, 10_000])
def test_a_stretch_repeated_within_one_line_is_a_loop(size: int) -> None:
    """A JSON string that loops never breaks its line (the first-hour walk: "List three fruits." as json ran to a
    full context unsaid)."""
    text = '{"fruits": ["apple", "' + "banana, orange, " * 30
    watch = watched(text, size)
    assert watch.run == 16 and watch.times >= 25, (watch.run, watch.times)
    assert watch.note().startswith("The reply repeats itself: the same 16 characters ")


def test_runs_of_one_character_and_varied_long_lines_are_not_loops() -> None:
    assert watched("=" * 400 + " " * 400, 7).note() == ""
    assert watched(" ".join(f"word{n}" for n in range(300)), 9).note() == ""
    assert watched("ab" * 3 + "the same text here. " * (REPEATS - 1), 3).note() == ""
