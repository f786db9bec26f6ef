"""A streamed reply's text, piece by piece: UTF-8 assembled across tokens, stop strings cut (held back while they may
still be starting), and reasoning (`<think>…</think>`) kept apart from the answer."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Literal

__all__ = ["ReasoningSplitter", "ReplyPart", "StopStringMatcher", "Utf8StreamDecoder", "prompt_opens_reasoning"]


def _partial_suffix_len(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a needle."""
    longest = max((len(n) for n in needles), default=0)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(n.startswith(tail) for n in needles):
            return k
    return 0


class StopStringMatcher:
    """Cuts a streamed reply at the first stop string, holding back possible partial matches."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = [s for s in stop_strings if s]  # an empty stop string would match at once
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was hit)."""
        if self._stopped:
            return "", True
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            self._stopped = True
            return buffer[: min(hits)], True
        keep = _partial_suffix_len(buffer, self._stops)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Held-back text at the end of generation (empty once stopped)."""
        held, self._held = self._held, ""
        return held


ReplyPart = Literal["reasoning", "answer"]


class ReasoningSplitter:
    """Splits a streamed reply into reasoning (inside ``<think>…</think>``) and answer text.

    Leading whitespace of the reasoning and of the answer is dropped (but with `starts_in_answer`, for a reply
    continued from the middle of its answer). Use one instance per reply.
    """

    def __init__(
        self,
        *,
        starts_in_reasoning: bool = False,
        starts_in_answer: bool = False,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
    ) -> None:
        if not open_tag or not close_tag:
            raise ValueError("reasoning tags must be non-empty")
        self._open = open_tag
        self._close = close_tag
        self._state: Literal["pre", "reasoning", "answer"] = "reasoning" if starts_in_reasoning else "pre"
        # At the start of a segment: drop whitespace; in reasoning, also one
        # (repeated) open tag, since some models echo the prompt's <think>.
        self._segment_start = True
        if starts_in_answer:
            self._state, self._segment_start = "answer", False
        self._held = ""

    def feed(self, text: str) -> list[tuple[ReplyPart, str]]:
        out: list[tuple[ReplyPart, str]] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._state == "answer":
                if self._segment_start:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    self._segment_start = False
                _emit(out, "answer", buf)
                break
            if self._segment_start:
                buf = buf.lstrip()
                if not buf:
                    break
                if buf.startswith(self._open):
                    buf = buf[len(self._open) :]
                    self._state = "reasoning"
                    continue  # still at segment start: skip whitespace after the tag
                if self._open.startswith(buf):
                    self._held = buf  # could still become the open tag
                    break
                self._segment_start = False
                if self._state == "pre":
                    self._state = "answer"  # no think block at all
                    continue
            # state == "reasoning"
            end = buf.find(self._close)
            if end >= 0:
                _emit(out, "reasoning", buf[:end])
                buf = buf[end + len(self._close) :]
                self._state = "answer"
                self._segment_start = True
                continue
            keep = _partial_suffix_len(buf, [self._close])
            _emit(out, "reasoning", buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return out

    def flush(self) -> list[tuple[ReplyPart, str]]:
        """Emit any held-back partial tag as plain text of the current kind."""
        held, self._held = self._held, ""
        if not held:
            return []
        kind: ReplyPart = "reasoning" if self._state == "reasoning" else "answer"
        return [(kind, held)]


def _emit(out: list[tuple[ReplyPart, str]], kind: ReplyPart, text: str) -> None:
    if not text:
        return
    if out and out[-1][0] == kind:
        out[-1] = (kind, out[-1][1] + text)
    else:
        out.append((kind, text))


def prompt_opens_reasoning(rendered_prompt: str, open_tag: str = "<think>") -> bool:
    """True when the prompt ends inside an unclosed reasoning block (``<think>`` + whitespace)."""
    return rendered_prompt.rstrip().endswith(open_tag)


class Utf8StreamDecoder:
    """Decodes UTF-8 byte pieces, emitting only complete characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """Decode what is left; an unfinished character becomes U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
