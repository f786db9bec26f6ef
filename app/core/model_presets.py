"""Per-model presets: config.toml's `[models."ID"]` tables, ID the model's id in `llmtui serve` (`starter`, a cached
model's `org/repo:TAG`, a file's name without `.gguf`) or its file's name; their keys are the declarations of
`app_settings_schema.MODEL_PRESET`, each checked by its declaration. `llmtui serve` without -m loads a model with its
preset (a request's own fields win), F4's model detail shows and edits it."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from app.core import app_settings_schema as ui
from engine_ext import settings_schema as s
from engine_ext.params import GPU_LAYERS_AUTO, EngineError, SteeringEntry
from engine_ext.untrusted_text import one_line

PRESET_SETTINGS: dict[str, s.Setting[Any]] = {setting.name: setting for setting in ui.MODEL_PRESET}
MODELS_TABLE_KEYS = frozenset({"folders", "last_model"})  # [models]' own keys; every other key is a model's preset
MAX_PRESETS = 1000


class PresetError(ValueError):
    """A preset config.toml cannot hold: one line naming the model and the setting."""


@dataclass(frozen=True)
class ModelPreset:
    """One model's preset: the settings it sets (the others: serve's flags and the defaults)."""

    model: str
    values: tuple[tuple[str, Any], ...] = ()

    def get(self, setting: s.Setting[Any]) -> Any:
        """The preset's value for `setting`; None when it does not set it."""
        return dict(self.values).get(setting.name)

    @property
    def pinned(self) -> bool:
        return bool(self.get(ui.PRESET_PIN))

    def summary(self) -> str:
        """One line of what it sets ("context size 8192 · pinned"), for F4's detail."""
        return " · ".join(
            f"{PRESET_SETTINGS[name].words} {value_text(PRESET_SETTINGS[name], value)}"
            if PRESET_SETTINGS[name].kind is not bool
            else PRESET_SETTINGS[name].words
            for name, value in self.values
            if PRESET_SETTINGS[name].kind is not bool or value
        )


def serve_id(source: str, name: str, path: Path) -> str:
    """A model's id in `llmtui serve` and its preset's ID: `starter`, a cached model's `org/repo:TAG`, else its
    file's name without `.gguf`."""
    if source == "starter":
        return "starter"
    if source in ("hf-cache", "llama-cache"):
        return name
    return path.stem


def value_text(setting: s.Setting[Any], value: Any) -> str:
    """A preset value as a field and the detail show it (-ngl auto as "auto")."""
    if setting is s.N_GPU_LAYERS and value == GPU_LAYERS_AUTO:
        return "auto"
    if setting.kind is bool:
        return "on" if value else "off"
    return str(value)


def checked_value(setting: s.Setting[Any], value: object, where: str) -> Any:
    """`value` for `setting` as the preset keeps it (-ngl's "auto", a whole float), PresetError saying why not."""
    if setting is s.N_GPU_LAYERS and isinstance(value, str):
        if value.strip().lower() != "auto":
            raise PresetError(f"{where}: GPU layers should be auto, -1 (all), 0 (none) or a number of layers")
        return GPU_LAYERS_AUTO
    if setting.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    why = setting.refusal(value)
    if why is not None:
        raise PresetError(f"{where}: {why}")
    return value


def presets_from_toml(models_table: dict[str, Any]) -> tuple[ModelPreset, ...]:
    """The presets in config.toml's [models] table (PresetError: one line, the model and the setting named)."""
    presets: list[ModelPreset] = []
    for key, table in models_table.items():
        if key in MODELS_TABLE_KEYS:
            continue
        where = f'[models."{one_line(key, 80)}"]'
        if not isinstance(table, dict):
            raise PresetError(f"models.{one_line(key, 80)} should be a table of the model's settings ({where})")
        if len(presets) >= MAX_PRESETS:
            raise PresetError(f"more than {MAX_PRESETS} model presets in [models]")
        values = []
        for name, value in table.items():
            setting = PRESET_SETTINGS.get(name)
            if setting is None:
                known = ", ".join(PRESET_SETTINGS)
                raise PresetError(f"{where}: no setting {one_line(name, 40)!r} (a preset sets {known})")
            values.append((name, checked_value(setting, value, where)))
        presets.append(ModelPreset(key, tuple(values)))
    return tuple(presets)


def update_presets(models_table: MutableMapping[str, Any], presets: Sequence[ModelPreset]) -> None:
    """Write `presets` into config.toml's [models] table (tomlkit): a value that did not change keeps how the user
    wrote it and its comments; a key or a preset no longer set is removed."""
    wanted = {preset.model: preset for preset in presets}
    for key in [key for key in models_table if key not in MODELS_TABLE_KEYS and key not in wanted]:
        del models_table[key]
    for preset in presets:
        table = models_table.get(preset.model)
        if not isinstance(table, MutableMapping):
            table = tomlkit.table()
            models_table[preset.model] = table
        values = {
            name: "auto" if PRESET_SETTINGS[name] is s.N_GPU_LAYERS and value == GPU_LAYERS_AUTO else value
            for name, value in preset.values
        }
        for key in [key for key in table if key not in values]:
            del table[key]
        for key, value in values.items():
            current = table.get(key)
            unwrap = getattr(current, "unwrap", None)
            if key not in table or (unwrap() if callable(unwrap) else current) != value:
                table[key] = value


def preset_for(presets: Iterable[ModelPreset], names: Iterable[str]) -> ModelPreset | None:
    """The preset of a model known by `names` (its id first, then its file's name); None when it has none."""
    by_model = {preset.model: preset for preset in presets}
    return next((by_model[name] for name in names if name in by_model), None)


def preset_of(presets: Iterable[ModelPreset], source: str, name: str, path: Path) -> ModelPreset:
    """A model's preset, found by its serve id or its file's name (an empty one under its serve id when none)."""
    model_id = serve_id(source, name, path)
    return preset_for(presets, (model_id, path.name)) or ModelPreset(model_id)


def with_preset(presets: Sequence[ModelPreset], preset: ModelPreset) -> tuple[ModelPreset, ...]:
    """`presets` with `preset` in place of the one for its model (or added); an empty one removes it."""
    kept = [p for p in presets if p.model != preset.model]
    return tuple(kept + [preset] if preset.values else kept)


def vector_entries(text: str, vectors: dict[str, str]) -> tuple[SteeringEntry, ...]:
    """A preset's control vectors ("calm, tilt:0.5, ~/v.gguf:2"): names from `vectors` (the steering folder) or
    files, each at strength 1 unless given; PresetError in one line."""
    entries = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, strength = item.rpartition(":")
        if not sep or not _number(strength):
            name, strength = item, "1"
        path = vectors.get(name) or str(Path(name).expanduser())
        if name not in vectors and not Path(path).is_file():
            raise PresetError(f"control vector {one_line(name, 80)!r}: no vector of that name, and no such file")
        entry = SteeringEntry(path, float(strength))
        try:
            entry.validate()
        except EngineError as error:
            raise PresetError(f"control vector {one_line(name, 80)!r}: {error}") from None
        entries.append(entry)
    return tuple(entries)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
