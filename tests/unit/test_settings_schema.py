"""The settings model: each setting is declared once (engine_ext.settings_schema, the speculative ones in
engine_ext.spec_catalog, the UI's in app/core/app_settings_schema.py), and every surface agrees with its declaration:
the command line's flag and default, config.toml, the app's settings, the engine params, the API's range, the one range
check and its message. The F3 screen and the F9 panel are checked in tests/tui/test_tui_spec.py."""

from __future__ import annotations

import argparse
import ast
import tomllib
from pathlib import Path
from typing import Any

import pytest

from app.cli import build_parser
from app.cli.flags import flag_value
from app.core import app_settings_schema as ui
from app.core.config import (
    Config,
    ConfigError,
    EngineSettings,
    SamplingSettings,
    SpeculativeSettings,
    config_from_toml,
    config_to_toml,
)
from app.server.api_errors import ApiError
from app.server.requests import Limits, parse_chat
from engine_ext import settings_schema as s
from engine_ext.params import ContextParams, EngineError, ModelParams, SamplingParams, SpeculativeParams
from engine_ext.setting import Setting
from engine_ext.spec_catalog import CATALOGUE, SPEC_TYPE_NAMES, markdown_table

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "engine_ext", "models_catalog")


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "-p", "hi", *argv])


def refused_by_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        parsed(*argv)
    assert caught.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def above(setting: Setting[Any]) -> Any:
    """A value just past the declared maximum."""
    assert setting.maximum is not None
    return setting.maximum + (1 if setting.kind is int else 0.5)


# ----- a speculative setting's default, range and flag exist once ------------------------------------------


@pytest.mark.parametrize("setting", s.DRAFT_NUMBERS, ids=lambda setting: setting.name)
def test_a_draft_setting_has_one_default_range_and_flag_on_every_surface(
    setting: Setting[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # The default: the CLI's, config.toml's (a file without the key, and a new file), the app's and the engine's.
    assert flag_value(parsed(), setting) == setting.default
    assert getattr(config_from_toml("").speculative, setting.name) == setting.default
    written = tomllib.loads(config_to_toml(Config()))["speculative"]
    assert written[setting.name] == setting.default
    assert getattr(SpeculativeSettings(), setting.name) == setting.default
    assert getattr(SpeculativeParams(), setting.name) == setting.default
    assert getattr(SpeculativeSettings().params(enabled=True), setting.name) == setting.default
    # The flag: llama.cpp's, on the command line, in the README's table and in the engine's own messages.
    assert flag_value(parsed(setting.flag, str(setting.maximum)), setting) == setting.maximum
    assert f"`{setting.flag}`" in markdown_table()
    # The range: the most allowed passes everywhere; one past it is refused everywhere, by the one check.
    most = {s.DRAFT_N_MAX.name: s.DRAFT_N_MAX.maximum, setting.name: setting.maximum}  # n_min <= n_max
    SpeculativeSettings(**most).validate()  # type: ignore[arg-type]
    assert setting.refusal(setting.maximum) is None
    too_many = above(setting)
    why = setting.refusal(too_many)
    assert why is not None and why.startswith(setting.flag)
    with pytest.raises(ConfigError, match=f"^{why}$"):
        SpeculativeSettings(**{setting.name: too_many}).validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=why):
        config_from_toml(f"[speculative]\n{setting.name} = {too_many}\n")
    with pytest.raises(EngineError, match=f"^{why}$"):
        SpeculativeParams(**{setting.name: too_many}).validate()  # type: ignore[arg-type]
    assert setting.flag in refused_by_cli(capsys, setting.flag, str(too_many))
    with pytest.raises(ApiError) as caught:
        parse_chat(
            {"messages": [{"role": "user", "content": "hi"}], "speculative": {setting.name: too_many}},
            SamplingParams(),
            Limits(),
            "m",
        )
    assert caught.value.param == "speculative"
    job = parse_chat(
        {"messages": [{"role": "user", "content": "hi"}], "speculative": {setting.name: setting.maximum}},
        SamplingParams(),
        Limits(),
        "m",
    )
    assert job.speculative is not None and getattr(job.speculative, setting.name) == setting.maximum


def _string_constants(path: Path) -> list[str]:
    """The string literals of a module's code (f-string parts included), docstrings and comments left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_each_speculative_flag_is_written_in_the_catalogue_only() -> None:
    """No module spells a speculative setting's flag in its code but the catalogue, which declares
    them (llmtui's messages and tables name them from there)."""
    flags = [setting.flag for setting in (*s.SPECULATIVE, *s.DRAFT_NUMBERS) if setting.flag]
    written: dict[str, set[str]] = {flag: set() for flag in flags}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for text in _string_constants(path):
                for flag in flags:
                    if flag in text:
                        written[flag].add(str(path.relative_to(ROOT)))
    assert written == {flag: {"engine_ext/spec_catalog.py"} for flag in flags}


# ----- every declared setting: the engine params, the app's settings and the CLI take their defaults from it ----


def _default_of(values: object, setting: Setting[Any]) -> Any:
    return getattr(values, setting.name)


@pytest.mark.parametrize("setting", s.ENGINE, ids=lambda setting: setting.name)
def test_every_engine_setting_defaults_to_its_declaration(setting: Setting[Any]) -> None:
    params = ModelParams() if setting in (*s.MODEL, *s.MODEL_LISTS) else ContextParams()
    engine = EngineSettings()
    if setting in s.MODEL_LISTS:  # a list: empty, its declared text form "" on the command line
        assert setting.default == "" and getattr(engine, setting.name) == getattr(params, setting.name) == ()
        assert getattr(parsed(), setting.flag.lstrip("-").replace("-", "_")) == ""
        return
    assert _default_of(engine, setting) == _default_of(params, setting) == setting.default
    assert flag_value(parsed(), setting) == setting.default
    assert _default_of(config_from_toml("").engine, setting) == setting.default
    assert setting.saved_in == "engine"


@pytest.mark.parametrize("setting", s.SAMPLING, ids=lambda setting: setting.name)
def test_every_sampling_setting_defaults_to_its_declaration(setting: Setting[Any]) -> None:
    assert _default_of(SamplingParams(), setting) == setting.default
    assert flag_value(parsed(), setting) == setting.default
    if setting in ui.PRESET_SAMPLING:
        assert _default_of(SamplingSettings(), setting) == setting.default


def test_the_ui_settings_and_the_preset_default_to_their_declarations() -> None:
    config = Config()
    for setting in ui.UI:
        assert getattr(config, setting.name) == setting.default
        assert setting.saved_in == "ui"
    assert config.speculative.enabled is ui.SPEC_ENABLED.default
    preset = SamplingSettings()
    for setting in ui.PRESET:
        assert getattr(preset, setting.name) == setting.default


def test_the_speculative_type_choices_are_the_catalogues() -> None:
    assert s.SPEC_TYPE.choices == SPEC_TYPE_NAMES == tuple(t.name for t in CATALOGUE)
    assert s.SPEC_TYPE.default in SPEC_TYPE_NAMES
    with pytest.raises(ConfigError, match="speculative type must be one of auto, ngram-simple"):
        SpeculativeSettings(spec_type="draft-wishful").validate()


def test_declarations_are_whole_and_their_names_unique() -> None:
    for group in (s.ENGINE, s.SAMPLING, s.SPECULATIVE, ui.UI, ui.SPECULATIVE, ui.PRESET):
        names = [setting.name for setting in group]
        assert len(names) == len(set(names)), names
    for setting in (*s.ENGINE, *s.SAMPLING, *s.SPECULATIVE, *ui.UI, *ui.PRESET):
        assert setting.help and isinstance(setting.default, setting.kind), setting.name
        assert setting.refusal(setting.default) is None or setting in s.MODEL_LISTS, setting.name
        assert not setting.choices or setting.default in setting.choices, setting.name
