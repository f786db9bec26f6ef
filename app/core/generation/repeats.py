"""A reply that repeats itself: the same line (or the same few lines) written again and again in a row, as a small
model does when it loops, or the same stretch of text again and again within one line (a JSON string that loops
never breaks its line). `RepeatWatch` reads the reply's text as it streams and says so in one line; the chat shows
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
MAX_RUN_CHARS: Final = 200
"""The longest stretch of text looked for repeating within one line."""
_RUN_WINDOW: Final = MAX_RUN_CHARS * REPEATS
_RUN_STEP: Final = 16  # characters read between two looks within a line


class RepeatWatch:
    """Watches one reply's text for a block of lines written REPEATS times or more in a row."""

    def __init__(self) -> None:
        self._partial = ""  # the line being written
        self._lines: deque[str] = deque(maxlen=_KEPT)  # the last whole lines, stripped, blank ones left out
        self.period = 0  # the lines of the block that repeats (0: none found)
        self.times = 0  # how many times in a row it was written
        self._in_block = 0  # lines of the block read since its last whole repeat
        self.run = 0  # the characters of the stretch that repeats within a line (0: none found)
        self._tail = ""  # the end of the line being written, up to _RUN_WINDOW characters
        self._unread = 0  # characters of it not looked at yet
        self._run_chars = 0  # characters of the line written since the stretch was found repeating

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
        return self._check_run(text) or grew

    def _check_run(self, text: str) -> bool:
        """The line being written: does it end in a stretch of text written REPEATS times or more in a row?"""
        if "\n" in text:
            self._tail, self._unread, self.run, self._run_chars = "", 0, 0, 0
            text = text.rpartition("\n")[2]
        self._tail = (self._tail + text)[-_RUN_WINDOW:]
        self._unread += len(text)
        if self._unread < _RUN_STEP:
            return False
        read, self._unread = self._unread, 0
        tail = self._tail
        if self.run:  # found: does the line go on with it?
            if tail[-self.run :] == tail[-2 * self.run : -self.run]:
                before = self._run_chars // self.run
                self._run_chars += read
                if self._run_chars // self.run > before:
                    self.times += self._run_chars // self.run - before
                    return True
                return False
            self.run = self.times = self._run_chars = 0
        for run in range(MIN_BLOCK_CHARS, min(MAX_RUN_CHARS, len(tail) // REPEATS) + 1):
            unit = tail[-run:]
            if len(set(unit)) > 1 and tail[-run * REPEATS :] == unit * REPEATS and not _repeats_within(list(unit)):
                times = REPEATS
                while tail[-run * (times + 1) : len(tail) - run * times] == unit:
                    times += 1  # copies before, within the window
                self.run, self.times, self._run_chars = run, times, 0
                return True
        return False

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
        if self.run:
            return f"The reply repeats itself: the same {self.run} characters {self.times} times in a row."
        if not self.period:
            return ""
        what = "the same line" if self.period == 1 else f"the same {self.period} lines"
        return f"The reply repeats itself: {what} {self.times} times in a row."


def _repeats_within(block: list[str]) -> bool:
    """Whether the block is a shorter block written several times."""
    n = len(block)
    return any(n % d == 0 and block == block[:d] * (n // d) for d in range(1, n))
