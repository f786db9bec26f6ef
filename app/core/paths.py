"""Where llmtui keeps its settings, data, logs and bundled assets."""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

if TYPE_CHECKING:
    from engine_ext.recovery import RepackMemory
    from models_catalog.library import Library

APP_NAME = "llmtui"


def config_dir() -> Path:
    """The user config dir (`LLMTUI_CONFIG_DIR` overrides it)."""
    override = os.environ.get("LLMTUI_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


CONFIG_FILE_NAME = "config.toml"


def config_path() -> Path:
    """The settings file."""
    return config_dir() / CONFIG_FILE_NAME


def data_dir() -> Path:
    """The user data dir (`LLMTUI_DATA_DIR` overrides it)."""
    override = os.environ.get("LLMTUI_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def log_dir() -> Path:
    """The log dir: `<data dir>/logs` when `LLMTUI_DATA_DIR` is set (tests), else the platform log dir."""
    override = os.environ.get("LLMTUI_DATA_DIR")
    return Path(override) / "logs" if override else Path(platformdirs.user_log_dir(APP_NAME))


def cache_dir() -> Path:
    """The user cache dir (`LLMTUI_CACHE_DIR` overrides it)."""
    override = os.environ.get("LLMTUI_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME))


def prompt_cache_dir() -> Path:
    """Where conversations' engine state is saved (engine_ext.disk_cache): `prompt-cache/` in the cache dir."""
    return cache_dir() / "prompt-cache"


def private_folders() -> list[Path]:
    """llmtui's own folders, made and kept owner-only: settings, data, logs, and the folder named llmtui that holds
    the logs (platformdirs' state folder on Linux, ~/.local/state/llmtui, where logs are its log/)."""
    folders = [config_dir(), data_dir(), log_dir()]
    if log_dir().parent.name == APP_NAME:
        folders.insert(2, log_dir().parent)
    return folders


def assets_dir() -> Path:
    """The bundled assets folder: the source checkout's beside this package where there is one (so a checkout run with
    another checkout's editable install uses its own styles), else the installed wheel's (`llmtui_assets`)."""
    beside = Path(__file__).resolve().parent.parent.parent / "assets"
    if (beside / "llmtui.tcss").is_file():
        return beside
    try:
        return Path(str(importlib.resources.files("llmtui_assets")))
    except ModuleNotFoundError:
        return beside


def steering_dir() -> Path:
    """Where control vectors the user makes are kept (llama.cpp's control-vector format)."""
    return data_dir() / "steering"


def prompt_set_folders() -> list[Path]:
    """Steering prompt sets: the user's first (editable copies win), then the bundled ones."""
    return [steering_dir() / "prompts", assets_dir() / "steering"]


def user_model_folders(config_folders: Iterable[str]) -> list[Path]:
    """The folders the library scans: LLMTUI_MODEL_DIRS then the settings' model folders."""
    folders = [Path(d) for d in os.environ.get("LLMTUI_MODEL_DIRS", "").split(os.pathsep) if d]
    return folders + [Path(d) for d in config_folders]


def library(config_folders: Iterable[str]) -> Library:
    """The local library the app sees: the Hugging Face cache and the user's model folders."""
    from models_catalog.library import Library

    return Library(user_model_folders(config_folders), usage_file=data_dir() / "model-usage.json")


def repack_memory() -> RepackMemory:
    """Which CPU extra buffer types crashed this CPU with this engine build (`<data dir>/engine-recovery.json`)."""
    from engine_ext.recovery import RepackMemory

    return RepackMemory(data_dir() / "engine-recovery.json")
