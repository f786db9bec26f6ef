"""Per-model presets (app/core/model_presets.py): read from config.toml's [models."ID"] tables and checked by their
declarations, written back keeping the user's comments, and applied by `llmtui serve` without -m (a request's own
fields win over the preset, the preset over serve's flags)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.cli import build_parser
from app.cli.serve_models import CliStarter, routed_models
from app.core.config import Config, ConfigError, config_from_toml, config_to_toml
from app.core.model_list import LocalModel
from app.core.model_presets import ModelPreset, PresetError, serve_id, vector_entries, with_preset
from app.server.backend import ServerSettings
from app.server.model_router import RoutedModel
from app.server.requests import Limits, parse_chat
from engine_ext.params import GPU_LAYERS_AUTO
from models_catalog import fit

CONFIG = """# my settings
[models]
folders = ["/models"]

# the small fast one
[models."tiny-llama"]
alias = "fast"  # what my editor asks for
n_ctx = 256
n_gpu_layers = "auto"
temperature = 0
top_k = 5
reasoning_budget = 64
pin = true
"""


def test_a_preset_is_read_checked_and_written_back_with_the_users_comments() -> None:
    config = config_from_toml(CONFIG)
    (preset,) = config.model_presets
    assert preset.model == "tiny-llama" and preset.pinned
    assert dict(preset.values) == {
        "alias": "fast",
        "n_ctx": 256,
        "n_gpu_layers": GPU_LAYERS_AUTO,
        "temperature": 0.0,
        "top_k": 5,
        "reasoning_budget": 64,
        "pin": True,
    }
    assert preset.summary() == (
        "alias fast · context size 256 · GPU layers auto · temperature 0.0 · top-k 5 · reasoning budget 64 · pinned"
    )
    table = CONFIG[CONFIG.index('[models."tiny-llama"]') :]
    assert table in config_to_toml(config, CONFIG)  # nothing changed: the preset stays as written
    edited = ModelPreset("tiny-llama", (("alias", "fast"), ("n_ctx", 512)))
    other = ModelPreset("org/repo:Q4_K_M", (("pin", True),))
    text = config_to_toml(Config(model_folders=("/models",), model_presets=with_preset((edited,), other)), CONFIG)
    assert "# the small fast one" in text and 'alias = "fast"  # what my editor asks for' in text
    assert "temperature" not in text and "n_ctx = 512" in text
    reread = config_from_toml(text).model_presets
    assert [p.model for p in reread] == ["tiny-llama", "org/repo:Q4_K_M"] and reread[1].pinned
    emptied = with_preset(reread, ModelPreset("org/repo:Q4_K_M"))
    assert "org/repo" not in config_to_toml(Config(model_folders=("/models",), model_presets=emptied), text)


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('[models."m"]\ntemprature = 1', "[models.\"m\"]: no setting 'temprature' (a preset sets alias, n_ctx"),
        ('[models."m"]\ntemperature = -1', '[models."m"]: temperature must not be negative'),
        ('[models."m"]\nn_gpu_layers = "most"', "GPU layers should be auto, -1 (all), 0 (none)"),
        ('[models."m"]\nreasoning_effort = "max"', "reasoning effort must be one of default, low, medium, high"),
        ('[models."m"]\npin = "yes"', "pinned should be bool"),
        ("[models]\nm = 3", "models.m should be a table of the model's settings"),
    ],
)
def test_a_bad_preset_is_one_line_naming_the_model_and_the_setting(table: str, words: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_from_toml(table, "config.toml")
    message = str(error.value)
    assert message.startswith("config.toml: ") and words in message and "\n" not in message, message


def test_preset_ids_aliases_and_pins_of_the_models_served() -> None:
    found = [
        LocalModel("starter (SmolLM2)", Path("/site/smol.gguf"), 1, "starter"),
        LocalModel("org/repo:Q4_K_M", Path("/hf/blobs/repo-Q4_K_M.gguf"), 1, "hf-cache"),
        LocalModel("tiny-llama", Path("/models/tiny-llama.gguf"), 1, "/models"),
        LocalModel("tiny-llama", Path("/more/tiny-llama.gguf"), 1, "/more"),
    ]
    assert [serve_id(m.source, m.name, m.path) for m in found] == ["starter", "org/repo:Q4_K_M", *["tiny-llama"] * 2]
    presets = config_from_toml(CONFIG).model_presets + (ModelPreset("repo-Q4_K_M.gguf", (("alias", "big"),)),)
    models = routed_models(found, presets)
    assert [(m.id, m.aliases, m.pinned) for m in models] == [
        ("starter", ("smol.gguf",), False),
        ("org/repo:Q4_K_M", ("big", "repo-Q4_K_M.gguf"), False),  # its preset found by its file's name
        ("tiny-llama", ("fast", "tiny-llama.gguf"), True),
        ("tiny-llama-2", (), False),  # its file's name is the first one's alias already
    ]


def serve_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


def test_serve_applies_a_preset_over_its_flags_and_a_request_over_both(tmp_path: Path) -> None:
    (preset,) = config_from_toml(CONFIG).model_presets
    starter = CliStarter(serve_args("--temp", "0.7", "-c", "4096", "--top-p", "0.5"), ServerSettings(""), (preset,))
    model = RoutedModel("tiny-llama", tmp_path / "tiny-llama.gguf", ("fast",))
    args = starter.args_for(model)
    assert (args.ctx_size, args.n_gpu_layers, args.temp, args.top_k, args.top_p) == (256, GPU_LAYERS_AUTO, 0.0, 5, 0.5)
    settings = starter.settings(model)
    assert settings.model_id == "tiny-llama" and settings.sampling.temperature == 0.0
    hi = [{"role": "user", "content": "hi"}]
    plain = parse_chat({"messages": hi}, settings.sampling, Limits(), settings.model_id)
    own = parse_chat({"messages": hi, "temperature": 1.5, "reasoning_budget": 8}, settings.sampling, Limits(), "m")
    assert plain.sampling.temperature == 0.0 and own.sampling.temperature == 1.5
    assert starter.job(model, plain).reasoning_budget == 64 and starter.job(model, own).reasoning_budget == 8
    other = RoutedModel("other", tmp_path / "other.gguf")
    assert starter.settings(other).sampling.temperature == 0.7 and starter.args_for(other).ctx_size == 4096


def test_control_vectors_by_name_or_file_each_with_its_strength(tmp_path: Path) -> None:
    calm = tmp_path / "calm.gguf"
    calm.write_bytes(b"")
    entries = vector_entries(f"calm:0.5, {calm}", {"calm": str(calm)})
    assert [(e.path, e.strength) for e in entries] == [(str(calm), 0.5), (str(calm), 1.0)]
    with pytest.raises(PresetError, match="control vector 'nope': no vector of that name, and no such file"):
        vector_entries("nope:2", {})


def test_a_preset_whose_projector_or_draft_cannot_load_is_refused_before_any_model_unloads(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """The router unloads idle models for a load only after `check`: a preset naming a missing or damaged projector
    or draft was found out in the worker, after another model had been unloaded for it. What it gives the router is
    the model's memory need at the context it loads with (the memory check used F4's, at the model's context)."""
    from app.server.api_errors import ApiError
    from tests.tiny_mmproj import write_tiny_mmproj

    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    projector = write_tiny_mmproj(tmp_path / "mmproj-tiny.gguf")
    model = RoutedModel("tiny-llama", tiny_models["llama"])
    for table, words in (
        (f'mmproj = "{tmp_path / "missing.gguf"}"', "missing.gguf: no such file"),
        (f'mmproj = "{damaged}"', "damaged.gguf: the header claims"),
        ('draft_model = "nowhere/draft.gguf"', "nowhere/draft.gguf"),
        (f'spec_type = "draft-simple"\ndraft_model = "{damaged}"', "damaged.gguf: the header claims"),
    ):
        presets = config_from_toml(f'[models."tiny-llama"]\n{table}\n').model_presets
        with pytest.raises(ApiError) as refused:
            CliStarter(serve_args(), ServerSettings(""), presets).check(model)
        message = refused.value.message
        assert message.startswith("tiny-llama could not be loaded: ") and words in message, message
    presets = config_from_toml(f'[models."tiny-llama"]\nmmproj = "{projector}"\n').model_presets
    starter = CliStarter(serve_args(), ServerSettings(""), presets)
    assert starter.check(model) == fit.need_at_context(tiny_models["llama"], 4096)  # serve's -c, not F4's figure
    assert starter._plans["tiny-llama"].model.mmproj == str(projector)  # noqa: SLF001 (what start loads with)
    presets = config_from_toml('[models."tiny-llama"]\nn_ctx = 65536\n').model_presets
    need = CliStarter(serve_args("-c", "256"), ServerSettings(""), presets).check(model)
    assert need == fit.need_at_context(tiny_models["llama"], 65536) > fit.need_at_context(tiny_models["llama"], 4096)
