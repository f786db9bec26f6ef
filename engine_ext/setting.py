"""The declaration type of a setting (engine_ext.settings_schema declares them; its docstring says how to add one):
its type, default, range or choices, help, llama.cpp's flag and config.toml table, and the one range/choices check
every surface calls. No imports from llmtui: the speculative catalogue declares its draft settings with it too."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T", bool, int, float, str)


class SettingError(ValueError):
    """A value outside its declaration's type, range or choices: one line naming the setting and what is allowed."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: what it is, its default and allowed values, and where it shows (flag, config table, screen)."""

    name: str  # the field in the params / settings dataclasses and the key in config.toml
    kind: type[T]
    default: T
    help: str  # a phrase for --help (a switch: what its flag does) and the screens' tooltips
    label: str = ""  # a few words naming it in messages and on screens ("" : the name)
    flag: str = ""  # llama.cpp's long flag ("" : none on the command line)
    short: str = ""  # llama.cpp's short flag
    saved_in: str = ""  # the config.toml table it is saved in ("" : not saved)
    minimum: int | float | None = None
    maximum: int | float | None = None
    above_minimum: bool = False  # the minimum itself is refused (a repeat penalty > 0)
    excluded: tuple[T, ...] = ()  # values refused inside the range (-n 0)
    choices: tuple[str, ...] = ()
    meaning: str = ""  # what special values mean ("0: the model's"), said in labels and messages
    wanted: str = ""  # how a message says the allowed values when the range alone says it badly
    title: str = ""  # the settings screen's label when the derived one reads badly

    @property
    def words(self) -> str:
        return self.label or self.name

    @property
    def flags(self) -> tuple[str, ...]:
        """The flags as argparse takes them: short first, as llama.cpp lists them."""
        return tuple(f for f in (self.short, self.flag) if f)

    @property
    def plain_label(self) -> str:
        """The label of a field that shows no flag: its words and what special values mean ("Seed (-1: random)")."""
        words = self.words[:1].upper() + self.words[1:]
        return f"{words} ({self.meaning})" if self.meaning else words

    @property
    def screen_label(self) -> str:
        """The label of the setting's field: its words and llama.cpp's flag ("Context size (-c; 0: the model's)")."""
        if self.title:
            return self.title
        flag = self.short or self.flag
        if self.kind is bool:
            inside = f"off: {flag}" if self.default else flag
        else:
            inside = "; ".join(part for part in (flag, self.meaning) if part)
        words = self.words[:1].upper() + self.words[1:]
        return f"{words} ({inside})" if inside else words

    def refusal(self, value: object) -> str | None:
        """Why `value` is not allowed (one line), or None when it is."""
        if self.kind is float:
            ok_type = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok_type = isinstance(value, self.kind) and not (self.kind is int and isinstance(value, bool))
        if not ok_type:
            return f"{self.words} should be {self.kind.__name__}, not {value!r}"
        if self.choices:
            if value not in self.choices:
                return f"{self.words} must be one of {', '.join(self.choices)}, not {value!r}"
            return None
        if self.kind is float and not math.isfinite(value):  # type: ignore[arg-type]
            return f"{self.words} must be a finite number, not {value}"
        if self.kind not in (int, float):
            return None
        number: float = value  # type: ignore[assignment]
        low, high = self.minimum, self.maximum
        too_low = low is not None and (number <= low if self.above_minimum else number < low)
        too_high = high is not None and number > high
        if not (too_low or too_high or number in self.excluded):
            return None
        meaning = f" ({self.meaning})" if self.meaning else ""
        if self.wanted:
            return f"{self.words} must be {self.wanted}, not {value}"
        if self.kind is float and low is not None and high is not None:
            return f"{self.words} must be between {low:g} and {high:g}{meaning}, not {value}"
        if too_high:
            return f"{self.words} must be at most {high}{meaning}, not {value}"
        if self.above_minimum:
            return f"{self.words} must be > {low:g}{meaning}, not {value}"
        if low == 0:
            return f"{self.words} must not be negative{meaning}, not {value}"
        return f"{self.words} must be at least {low}{meaning}, not {value}"

    def check(self, value: object) -> None:
        """Raise SettingError when `value` is not allowed: the one range/choices check every surface calls."""
        why = self.refusal(value)
        if why is not None:
            raise SettingError(why)

    def parse(self, text: str, where: str = "") -> T:
        """A value typed into a field ("" where: the name in the message); SettingError when it is not one."""
        text = text.strip()
        who = where or self.name
        if self.kind is bool:
            if text.casefold() in ("on", "true", "yes", "1"):
                return True  # type: ignore[return-value]
            if text.casefold() in ("off", "false", "no", "0"):
                return False  # type: ignore[return-value]
            raise SettingError(f"{who}: {text!r} should be on or off")
        if self.kind is str:
            return text  # type: ignore[return-value]
        try:
            return self.kind(text)
        except ValueError:
            whole = "whole " if self.kind is int else ""
            raise SettingError(f"{who}: {text!r} is not a {whole}number") from None


def check_all(values: object, settings: Iterable[Setting[Any]]) -> None:
    """Check each of `settings` on the attribute of `values` it names (SettingError on the first bad one)."""
    for setting in settings:
        setting.check(getattr(values, setting.name))


def values_of(values: object, settings: Iterable[Setting[Any]]) -> dict[str, Any]:
    """{name: value} of `settings` read from `values`' attributes: how one dataclass's settings become another's
    keywords, without a field-by-field copy."""
    return {setting.name: getattr(values, setting.name) for setting in settings}
