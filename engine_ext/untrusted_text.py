"""Text from outside (a model file, a Hub listing or card, a remote server, a chat template) made safe to show.

One rule, used wherever such text reaches a terminal, a widget or a message: control characters are made visible
(ESC shows as ␛, BEL as ␇, a C1 or bidirectional control as <U+202E>), so no escape sequence reaches the terminal
and no text hides what follows it; a lone UTF-16 surrogate (which JSON can carry, and UTF-8 cannot) becomes U+FFFD.
Newlines and tabs are kept where a text has lines (a model card); a message is one line of at most 300 characters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_MESSAGE",
    "json_text",
    "one_line",
    "one_line_message",
    "shown",
    "has_controls",
    "valid_text",
    "without_controls",
]

MAX_MESSAGE = 300  # every message about bad input is one line of at most this many characters
_MAX_PATH_IN_MESSAGE = 100  # a longer path keeps its end

# C0 controls, DEL, C1 controls; the bidirectional and invisible format controls that reorder or hide text
# (U+061C, U+200B-U+200F, U+202A-U+202E, U+2060-U+2069, U+FEFF); the line and paragraph separators; lone
# surrogates. Tab and newline are matched too (shown(multiline=True) keeps them: _UNSAFE_IN_LINES).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
_UNSAFE_IN_LINES = re.compile(_UNSAFE.pattern.replace("\x00-\x1f", "\x00-\x08\x0b-\x1f"))
"""_UNSAFE but tab and newline: what shown(multiline=True) changes (a text of many lines costs no call per line)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control pictures: ␀ … ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"<U+{code:04X}>"


def shown(text: str, *, multiline: bool = False) -> str:
    """`text` with its control characters made visible; with `multiline`, newlines and tabs are kept (a carriage
    return is dropped before a newline, as a CRLF file's lines end)."""
    if multiline:
        return _UNSAFE_IN_LINES.sub(_visible, text.replace("\r\n", "\n"))
    return _UNSAFE.sub(_visible, text)


def without_controls(text: str) -> str:
    """`text` without the characters shown() makes visible (newlines and tabs too): for a last check of text about
    to reach the terminal, where each of them is zero cells wide and removing one moves nothing on screen."""
    return _UNSAFE.sub("", text)


def has_controls(text: str) -> bool:
    """Whether `text` holds a character shown() would make visible (a newline or tab too)."""
    return _UNSAFE.search(text) is not None


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` as one line of at most `limit` characters: whitespace runs (newlines too) folded to one space,
    control characters made visible, the end cut with "…". Only the first few times `limit` characters are read,
    so a message quoting megabytes of hostile text costs nothing."""
    text = " ".join(str(text)[: limit * 4 + 16].split())
    text = shown(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line_message(path: Path | str, problem: str, hint: str = "") -> str:
    """``<path>: <problem>; <hint>`` in one line of at most MAX_MESSAGE characters: a long path keeps its end,
    a long problem (values, keys, names read from the file) is cut so that the hint still fits."""
    where = one_line(str(path), 10_000)
    if len(where) > _MAX_PATH_IN_MESSAGE:
        where = "…" + where[-(_MAX_PATH_IN_MESSAGE - 1) :]
    hint = one_line(hint, 120)
    room = MAX_MESSAGE - len(where) - 2 - (len(hint) + 2 if hint else 0)
    text = f"{where}: {one_line(problem, max(room, 40))}" + (f"; {hint}" if hint else "")
    return one_line(text, MAX_MESSAGE)


def json_text(value: Any, indent: int | None = None) -> str:
    """`value` as JSON for a terminal: non-ASCII text kept readable, but every character shown() would change
    written as a \\u escape (JSON escapes C0 controls itself; not DEL, C1 or bidirectional controls, nor lone
    surrogates, which could not even be printed). The same value as json.dumps gives, to any JSON reader."""
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    return _UNSAFE.sub(lambda m: m.group() if m.group() in "\n\t" else f"\\u{ord(m.group()):04x}", text)


def valid_text(text: str) -> str:
    """`text` that encodes to UTF-8: each lone surrogate replaced by U+FFFD (what a server's JSON may carry as
    "\\ud800"); everything else, control characters included, as it was."""
    return _SURROGATE.sub("\ufffd", text)
