"""Command-line flags made from the settings declarations (engine_ext.settings_schema): each declared setting's
llama.cpp flags, default, help and range, and the values the parsed flags give, keyed as the engine params are."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from app.cli.types import INT32_MAX, finite_float, int_range
from engine_ext.settings_schema import Setting


def flag_type(setting: Setting[Any]) -> Callable[[str], Any]:
    """argparse's `type=` for a number setting: its declared range, refused in argparse's one line."""
    low, high = setting.minimum, setting.maximum
    if setting.kind is int:
        parse: Callable[[str], Any] = int_range(
            -INT32_MAX if low is None else int(low), INT32_MAX if high is None else int(high), meaning=setting.meaning
        )
    else:
        parse = finite_float(
            -math.inf if low is None else low, math.inf if high is None else high, above=setting.above_minimum
        )
    if not setting.excluded:
        return parse

    def parse_allowed(text: str) -> Any:
        value = parse(text)
        if value in setting.excluded:
            raise argparse.ArgumentTypeError(f"expected {setting.wanted}, not {text!r}")
        return value

    return parse_allowed


def add_setting(p: argparse.ArgumentParser, setting: Setting[Any], **overrides: Any) -> None:
    """The flag of a declared setting (engine_ext.settings_schema): llama.cpp's flags, the declared default, help
    and range or choices; `overrides` for a flag with its own text form (-ngl auto, -ts 3,1)."""
    if setting.kind is bool:  # the flag turns the default over (--mlock on, --no-mmap off): see flag_value
        options: dict[str, Any] = {"action": "store_true", "help": setting.help}
    else:
        options = {"default": setting.default, "help": setting.help}
        if setting.choices:
            options["choices"] = setting.choices
        elif setting.kind in (int, float):
            options["type"] = flag_type(setting)
    options.update(overrides)
    p.add_argument(*setting.flags, **options)


def flag_value(args: argparse.Namespace, setting: Setting[Any]) -> Any:
    """The value a declared setting's flag gave (a switch: the default turned over when given)."""
    value = getattr(args, setting.flag.lstrip("-").replace("-", "_"))
    if setting.kind is bool:
        return (not setting.default) if value else setting.default
    return value


def flag_values(args: argparse.Namespace, settings: tuple[Setting[Any], ...]) -> dict[str, Any]:
    """{name: value} of `settings` from the parsed flags: the keywords of the engine params they go to."""
    return {setting.name: flag_value(args, setting) for setting in settings}
