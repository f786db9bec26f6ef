"""A document cut into chunks along its structure: Markdown headings start a chunk (their titles kept as the chunk's
heading path), a fenced code block stays whole where it fits, paragraphs (blank-line separated blocks, which are
also a code file's functions and classes) are packed up to TARGET_CHARS, and a block longer than MAX_CHARS is cut
at line ends (a longer line every MAX_CHARS). Every chunk knows its first and last line (1-based) for citations."""

from __future__ import annotations

import re
from dataclasses import dataclass

TARGET_CHARS = 1200  # a chunk grows by whole blocks up to about this (some 300 tokens)
MAX_CHARS = 2400  # no chunk is longer (a longer block is cut at line ends; a longer line at this)
MAX_CHUNKS_PER_FILE = 5000

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Chunk:
    start_line: int  # 1-based, inclusive
    end_line: int
    heading: str  # the Markdown headings above it, "A > B" ("" for none)
    text: str


@dataclass
class _Block:
    start: int  # 0-based line index
    lines: list[str]
    heading: str
    starts_section: bool


def _blocks(lines: list[str]) -> list[_Block]:
    """Paragraphs, fenced code blocks and headings (a heading starts the block after it)."""
    blocks: list[_Block] = []
    titles: list[str] = []
    current: _Block | None = None
    fence: str | None = None
    for i, line in enumerate(lines):
        fenced = _FENCE.match(line)
        if fence is not None:
            assert current is not None
            current.lines.append(line)
            if fenced and fenced.group(1) == fence:
                fence, current = None, None
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            titles = [*titles[: level - 1], heading.group(2)]
            current = _Block(i, [line], " > ".join(titles), True)
            blocks.append(current)
            continue
        if fenced:
            current = _Block(i, [line], " > ".join(titles), False)
            blocks.append(current)
            fence = fenced.group(1)
            continue
        if not line.strip():
            current = None
            continue
        if current is None or (current.lines and _FENCE.match(current.lines[0])):
            current = _Block(i, [], " > ".join(titles), False)
            blocks.append(current)
        current.lines.append(line)
    return blocks


def _pieces(block: _Block) -> list[tuple[int, list[str]]]:
    """The block as runs of lines of at most MAX_CHARS (a longer line: runs of its own, cut every MAX_CHARS)."""
    runs: list[tuple[int, list[str]]] = []
    run: list[str] = []
    start, size = block.start, 0
    for offset, line in enumerate(block.lines):
        if len(line) > MAX_CHARS:
            if run:
                runs.append((start, run))
            runs += [(block.start + offset, [line[i : i + MAX_CHARS]]) for i in range(0, len(line), MAX_CHARS)]
            start, run, size = block.start + offset + 1, [], 0
            continue
        if run and size + len(line) + 1 > MAX_CHARS:
            runs.append((start, run))
            start, run, size = block.start + offset, [], 0
        run.append(line)
        size += len(line) + 1
    if run:
        runs.append((start, run))
    return runs


def chunk_text(text: str) -> list[Chunk]:
    """The chunks of one document, in order."""
    lines = text.splitlines()
    chunks: list[Chunk] = []
    pending: list[tuple[int, list[str]]] = []
    heading = ""

    def flush() -> None:
        if pending:
            first, last = pending[0][0], pending[-1][0] + len(pending[-1][1]) - 1
            body = "\n\n".join("\n".join(run) for _, run in pending)
            chunks.append(Chunk(first + 1, last + 1, heading, body))
            pending.clear()

    for block in _blocks(lines):
        if block.starts_section or block.heading != heading:
            flush()
            heading = block.heading
        for start, run in _pieces(block):
            size = sum(len(r) + 1 for _, piece in pending for r in piece)
            if pending and size + sum(len(r) + 1 for r in run) > TARGET_CHARS:
                flush()
            pending.append((start, run))
        if len(chunks) >= MAX_CHUNKS_PER_FILE:
            break
    flush()
    return chunks[:MAX_CHUNKS_PER_FILE]
