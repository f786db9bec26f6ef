"""A reply that repeats itself: the same line (or the same few lines) written again and again in a row, as a small
model does when it loops. `RepeatWatch` reads the reply's text as it streams and says so in one line; the chat shows
that line in the transcript and keeps it with the reply (its stats' "repeats")."""

from __future__ import annotations

from collections import deque
from typing import Final

REPEATS: Final = 4
"""A block of lines written this many times in a row is a loop."""
MAX_PERIOD: Final = 8
"""The longest block of lines looked for (lines written between two repeats)."""
MIN_BLOCK_CHARS: Final = 10
"""A block shorter than this (a run of "}" or "---") is not a loop."""
MAX_LINE_CHARS: Final = 2000
"""A line is compared by at most its first this many characters."""
_KEPT: Final = REPEATS * MAX_PERIOD


class RepeatWatch:
    """Watches one reply's text for a block of lines written REPEATS times or more in a row."""

    def __init__(self) -> None:
        self._partial = ""  # the line being written
        self._lines: deque[str] = deque(maxlen=_KEPT)  # the last whole lines, stripped, blank ones left out
        self.period = 0  # the lines of the block that repeats (0: none found)
        self.times = 0  # how many times in a row it was written
        self._in_block = 0  # lines of the block read since its last whole repeat

    def feed(self, text: str) -> bool:
        """Read more of the reply; True when this text showed it repeating itself (first, or once more)."""
        if not text:
            return False
        *whole, self._partial = (self._partial + text).split("\n")
        if len(self._partial) > MAX_LINE_CHARS * 2:  # a runaway line without breaks: compared by its start only
            self._partial = self._partial[: MAX_LINE_CHARS * 2]
        grew = False
        for line in whole:
            line = line.strip()[:MAX_LINE_CHARS]
            if line:
                self._lines.append(line)
                grew = self._check() or grew
        return grew

    def _check(self) -> bool:
        lines = list(self._lines)
        if self.period:  # a loop was found: does this line go on with it?
            if lines[-1] == lines[-1 - self.period]:
                if self._ends_a_block():
                    self.times += 1
                    return True
                return False
            self.period = self.times = 0  # it broke off (a later loop is told anew)
        for period in range(1, MAX_PERIOD + 1):
            if len(lines) < period * REPEATS:
                break
            block = lines[-period:]
            if sum(map(len, block)) < MIN_BLOCK_CHARS or _repeats_within(block):
                continue  # too short to be a loop, or a shorter block's loop (found at its own period, or too short)
            if all(lines[-period * (n + 1) : len(lines) - period * n] == block for n in range(1, REPEATS)):
                self.period, self.times, self._in_block = period, REPEATS, 0
                return True
        return False

    def _ends_a_block(self) -> bool:
        """Whether the line just read completes one more block (a block of several lines counts once)."""
        self._in_block = (self._in_block + 1) % self.period
        return self._in_block == 0

    def note(self) -> str:
        """One line on the loop ("" when none was found)."""
        if not self.period:
            return ""
        what = "the same line" if self.period == 1 else f"the same {self.period} lines"
        return f"The reply repeats itself: {what} {self.times} times in a row."


def _repeats_within(block: list[str]) -> bool:
    """Whether the block is a shorter block written several times."""
    n = len(block)
    return any(n % d == 0 and block == block[:d] * (n // d) for d in range(1, n))
