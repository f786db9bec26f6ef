"""Settings: config.toml round trip, validation with messages a user can act on, sampling settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from app.config import (
    Config,
    ConfigError,
    EngineSettings,
    SamplingSettings,
    config_path,
    config_to_toml,
    load_config,
    save_config,
)
from engine_ext.params import DEFAULT_SEED


def test_missing_file_gives_defaults(app_dirs: tuple[Path, Path]) -> None:
    assert load_config() == Config()
    assert config_path() == app_dirs[0] / "config.toml"


def test_save_then_load_round_trip(app_dirs: tuple[Path, Path]) -> None:
    config = Config(
        engine=EngineSettings(n_ctx=8192, n_threads=4, n_gpu_layers=20, flash_attn="on", type_k="q8_0",
                              type_v="q8_0", n_batch=512),
        model_folders=("~/models", '/data/odd "quoted" \\ folder'),
        last_model="/models/x.gguf",
        theme="light",
        show_sidebar=False,
    )
    save_config(config)
    assert load_config() == config
    assert tomllib.loads(config_path().read_text())["engine"]["n_ctx"] == 8192


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[engine]\nn_ctx = -5\n", "context size"),
        ("[engine]\nn_ctx = 'big'\n", "engine.n_ctx should be int"),
        ("[engine]\nflash_attn = 'maybe'\n", "flash attention"),
        ("[engine]\ntype_k = 'q9'\n", "KV cache type K"),
        ("[engine]\ntype_v = 'q8_0'\nflash_attn = 'off'\n", "flash attention"),
        ("[ui]\ntheme = 'pink'\n", "theme"),
        ("[models]\nfolders = 'not a list'\n", "models.folders"),
        ("this is = = not toml", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_with_a_clear_message(app_dirs: tuple[Path, Path], text: str, fragment: str) -> None:
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_config()


def test_invalid_settings_are_not_saved(app_dirs: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError):
        save_config(Config(engine=EngineSettings(n_batch=0)))
    assert not config_path().exists()


def test_unknown_keys_are_ignored_and_the_writer_escapes_control_characters() -> None:
    text = config_to_toml(Config(last_model="a\tb\x01c"))
    assert tomllib.loads(text)["models"]["last_model"] == "a\tb\x01c"


def test_sampling_settings_to_engine_params_and_back() -> None:
    sampling = SamplingSettings(temperature=0.2, top_k=10, seed=-1, max_tokens=64)
    params = sampling.sampling_params()
    assert (params.temperature, params.top_k, params.seed) == (0.2, 10, DEFAULT_SEED)
    assert SamplingSettings(seed=7).sampling_params().seed == 7
    assert SamplingSettings.from_json(sampling.to_json()) == sampling
    assert SamplingSettings.from_json({"temperature": "hot", "top_k": 5, "extra": 1}) == SamplingSettings(top_k=5)
    for bad in (SamplingSettings(temperature=-1), SamplingSettings(top_p=2), SamplingSettings(max_tokens=0),
                SamplingSettings(seed=-2), SamplingSettings(temperature=float("nan"))):
        with pytest.raises(ConfigError):
            bad.validate()
