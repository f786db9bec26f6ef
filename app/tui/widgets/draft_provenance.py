"""Where a reply's text came from accepted draft tokens: its draft spans, read from stored stats, and the colour of
each kind of drafter added to the rendered lines of that text."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.segment import Segment
from rich.style import Style
from textual.widget import Widget

from app.tui.messages import DraftSpan
from app.tui.widgets.markdown_render import Lines
from engine_ext.protocol import REJECTED_PREFIX

_RENDERED_TOKEN: Final = re.compile(r"\w+|[^\w\s]")
_SPACE_RUN: Final = re.compile(r" +")
WORD_LOOKAHEAD: Final = 160  # source characters a rendered word may be ahead of the last one (markup, link targets)
MARK_LOOKAHEAD: Final = 4  # the same for a lone punctuation mark, kept short so it cannot skip words
CHAR_LOOKAHEAD: Final = 16  # the same for a character of a word found only with markup inside it

DraftSpans = tuple[DraftSpan, ...]
"""(start, end, drafter) character ranges of a message's text that came from accepted draft tokens."""
NGRAM_DRAFT, MODEL_DRAFT, REJECTED_DRAFT = 1, 2, 3
"""How draft text is coloured: drafted by an n-gram drafter (or by a drafter not known), by a model, or the target's
token where a draft was rejected."""


def draft_kind(drafter: str) -> int:
    """The colour of text from `drafter`: MODEL_DRAFT for draft-simple, -mtp, -eagle3, -dflash, -dspark,
    REJECTED_DRAFT for the target's token where a draft was rejected (`rejected_by`), else NGRAM_DRAFT ("" is a span
    stored before llmtui kept the drafter)."""
    if drafter.startswith(REJECTED_PREFIX):
        return REJECTED_DRAFT
    return MODEL_DRAFT if drafter.startswith("draft-") else NGRAM_DRAFT


def draft_styles(widget: Widget, prefix: str) -> dict[int, Style]:
    """The styles of draft text by kind, from the widget's `{prefix}--draft`, `{prefix}--draft-model` and
    `{prefix}--draft-rejected` classes."""
    return {
        NGRAM_DRAFT: widget.get_component_rich_style(f"{prefix}--draft", partial=True),
        MODEL_DRAFT: widget.get_component_rich_style(f"{prefix}--draft-model", partial=True),
        REJECTED_DRAFT: widget.get_component_rich_style(f"{prefix}--draft-rejected", partial=True),
    }


def draft_spans_from_stats(stats: dict[str, Any]) -> DraftSpans:
    """The draft spans a finished reply's stats carry under "draft_spans": [start, end, drafter], or [start, end]
    as stored before llmtui kept the drafter (bad entries are skipped)."""
    raw = stats.get("draft_spans", ())
    spans: list[DraftSpan] = []
    if isinstance(raw, list | tuple):
        for item in raw:
            if not isinstance(item, list | tuple) or len(item) not in (2, 3):
                continue
            start, end, *rest = item
            drafter = rest[0] if rest else ""
            if isinstance(start, int) and isinstance(end, int) and isinstance(drafter, str) and 0 <= start < end:
                spans.append((start, end, drafter))
    return tuple(spans)


def mark_provenance(lines: Lines, source: str, spans: Sequence[DraftSpan], styles: Mapping[int, Style]) -> Lines:
    """Add the style of each span's kind of drafter (`styles`, by `draft_kind`) to the rendered characters that came
    from `spans` of the Markdown `source`.

    Rendering drops markup and re-wraps text, so each rendered word is matched to its next occurrence in the
    source (a little ahead of the previous one); characters with no match (bullets, rules) stay as they are.
    """
    if not spans or not source:
        return lines
    marked = bytearray(len(source))
    for start, end, drafter in spans:
        start, end = max(0, start), min(len(source), end)
        if start < end:
            marked[start:end] = bytes((draft_kind(drafter),)) * (end - start)
    cursor = 0
    result: Lines = []
    for line in lines:
        text = "".join(segment.text for segment in line if not segment.control)
        flags: bytearray | None = None
        for match in _RENDERED_TOKEN.finditer(text):
            token = match.group()
            lookahead = WORD_LOOKAHEAD if len(token) > 1 or token.isalnum() else MARK_LOOKAHEAD
            found = source.find(token, cursor, cursor + len(token) + lookahead)
            if found >= 0:
                cursor = found + len(token)
                if any(marked[found:cursor]):
                    if flags is None:
                        flags = bytearray(len(text))
                    flags[match.start() : match.end()] = marked[found:cursor]
                continue
            # Markup inside the word ("un**believ**able", inline HTML): match it a character at a time.
            for offset, character in enumerate(token):
                found = source.find(character, cursor, cursor + 1 + CHAR_LOOKAHEAD)
                if found < 0:
                    continue
                cursor = found + 1
                if marked[found]:
                    if flags is None:
                        flags = bytearray(len(text))
                    flags[match.start() + offset] = marked[found]
        if flags is not None:
            # Spaces between two words marked alike are marked too: one unbroken underline per drafted run.
            for gap in _SPACE_RUN.finditer(text):
                if gap.start() > 0 and gap.end() < len(text) and flags[gap.start() - 1] == flags[gap.end()] != 0:
                    flags[gap.start() : gap.end()] = bytes((flags[gap.end()],)) * (gap.end() - gap.start())
        result.append(line if flags is None else _restyle(line, flags, styles))
    return result


def _restyle(line: list[Segment], flags: bytearray, styles: Mapping[int, Style]) -> list[Segment]:
    """`line` with the style of its flag added to each character whose flag is set."""
    restyled: list[Segment] = []
    position = 0
    for segment in line:
        if segment.control:
            restyled.append(segment)
            continue
        text, base = segment.text, segment.style
        start = 0
        for index in range(1, len(text) + 1):
            if index == len(text) or flags[position + index] != flags[position + start]:
                piece = text[start:index]
                kind = flags[position + start]
                style = styles.get(kind) if kind else None
                restyled.append(Segment(piece, (base + style) if style and base else style or base))
                start = index
        position += len(text)
    return restyled
