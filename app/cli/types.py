"""argparse `type=` functions for the command line's numbers and texts: each checks the range llama.cpp accepts and
fails with argparse's usual one line (`llmtui run: error: argument -c/--ctx-size: ...`, exit 2)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.text_files import (  # noqa: F401 - the commands' reader of text files
    MAX_TEXT_FILE_BYTES,
    STREAM_IDLE_S,
    STREAM_TOTAL_S,
    read_text_file,
)
from engine_ext.params import DEFAULT_SEED, MAX_STEERING_STRENGTH
from engine_ext.settings_schema import INT32_MAX, MAX_CONTEXT, UINT32_MAX  # noqa: F401 - the commands' bounds


def int_range(lo: int, hi: int, *, meaning: str = "") -> Callable[[str], int]:
    """An integer in [lo, hi]; `meaning` explains special values in the message (e.g. "0: the model's")."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            extra = f" ({meaning})" if meaning else ""
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}{extra}, not {text!r}")
        return value

    return parse


def finite_float(lo: float = -math.inf, hi: float = math.inf, *, above: bool = False) -> Callable[[str], float]:
    """A finite number in [lo, hi] (in (lo, hi] with `above`); nan and inf are refused everywhere."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value > lo if above else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            if math.isinf(lo) and math.isinf(hi):
                wanted = "a finite number"
            elif math.isinf(hi):
                wanted = f"a finite number {'>' if above else '≥'} {lo:g}"
            else:
                wanted = f"a number from {lo:g} to {hi:g}"
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {text!r}")
        return value

    return parse


def shares(text: str) -> str:
    """-ts N0,N1,... (or N0/N1/...): finite shares ≥ 0 that add up to more than 0; kept as given."""
    try:
        values = [float(v) for v in text.replace("/", ",").split(",") if v.strip()]
    except ValueError:
        values = [math.nan]
    if values and (not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0):
        raise argparse.ArgumentTypeError(f"expected finite shares ≥ 0 that add up to more than 0, not {text!r}")
    return text


def seed(text: str) -> int:
    """llama.cpp's -s: 0..2^32-1, and -1 (or 2^32-1, LLAMA_DEFAULT_SEED) for a random seed per generation."""
    value = int_range(-1, UINT32_MAX, meaning="-1: random")(text)
    return DEFAULT_SEED if value == -1 else value


def utf8_error(text: str) -> str | None:
    """Where `text` (decoded with surrogateescape, as argv and stdin are) is not valid UTF-8: "byte 0x.. at offset N"
    counted in bytes; None when it is valid."""
    for index, char in enumerate(text):
        if "\udc80" <= char <= "\udcff":
            offset = len(text[:index].encode("utf-8", "surrogateescape"))
            return f"byte 0x{ord(char) - 0xDC00:02x} at offset {offset}"
        if "\ud800" <= char <= "\udfff":
            offset = len(text[:index].encode("utf-8", "surrogatepass"))
            return f"a lone surrogate at offset {offset}"
    return None


def utf8_text(text: str) -> str:
    """A text argument (-p, --system…) that must be valid UTF-8 (a shell passes raw bytes through)."""
    where = utf8_error(text)
    if where is not None:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 ({where})")
    return text


def text_file(name: str) -> str:
    """A --file argument: the text of the file (checked as read_text_file does)."""
    try:
        return read_text_file(Path(name).expanduser())
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {name}: {error.strerror or error}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def control_vector_scaled(text: str) -> str:
    """--control-vector-scaled FILE:S, with a finite strength within ±MAX_STEERING_STRENGTH, as llama.cpp takes any
    (kept as given; steering_entries parses)."""
    file, sep, strength = text.rpartition(":")
    if not sep or not file:
        raise argparse.ArgumentTypeError(f"expected FILE:STRENGTH or FILE STRENGTH, not {text!r}")
    _strength(strength, text)
    return text


def _strength(strength: str, given: str) -> None:
    try:
        finite_float(-MAX_STEERING_STRENGTH, MAX_STEERING_STRENGTH)(strength)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected FILE:STRENGTH with a strength from -{MAX_STEERING_STRENGTH:g} to {MAX_STEERING_STRENGTH:g}, "
            f"not {given!r}"
        ) from None


class ControlVectorScaled(argparse.Action):
    """--control-vector-scaled in both forms: llmtui's FILE:STRENGTH (one argument) and llama.cpp's FILE STRENGTH
    (two); each is kept as "FILE:STRENGTH" for steering_entries (issue 37)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        given = list(values)
        try:
            if len(given) == 1:
                spec = control_vector_scaled(given[0])
            elif len(given) == 2:
                if not given[0]:
                    raise argparse.ArgumentTypeError(f"expected FILE STRENGTH, not {' '.join(given)!r}")
                _strength(given[1], " ".join(given))
                spec = f"{given[0]}:{given[1]}"
            else:
                raise argparse.ArgumentTypeError(
                    f"expected FILE:STRENGTH or FILE STRENGTH, not {len(given)} arguments "
                    "(give the flag once per vector)"
                )
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        items = list(getattr(namespace, self.dest, None) or [])
        items.append(spec)
        setattr(namespace, self.dest, items)


def text_or_file(text: str) -> str:
    """A --grammar or --json-schema argument as llama.cpp takes it (the text itself), or the name of a file that holds
    it (read as --file reads: UTF-8, bounded): an existing file wins; JSON-looking text is never a file name."""
    stripped = text.lstrip()
    if stripped[:1] not in ("{", "[") and stripped not in ("true", "false") and Path(text).expanduser().is_file():
        return text_file(text)
    return text
