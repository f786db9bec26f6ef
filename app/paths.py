"""Where llmtui keeps its settings, data, logs and bundled assets."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import platformdirs

APP_NAME = "llmtui"


def config_dir() -> Path:
    """The user config dir (`LLMTUI_CONFIG_DIR` overrides it)."""
    override = os.environ.get("LLMTUI_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    """The user data dir (`LLMTUI_DATA_DIR` overrides it)."""
    override = os.environ.get("LLMTUI_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def log_dir() -> Path:
    """The log dir: `<data dir>/logs` when `LLMTUI_DATA_DIR` is set (tests), else the platform log dir."""
    override = os.environ.get("LLMTUI_DATA_DIR")
    return Path(override) / "logs" if override else Path(platformdirs.user_log_dir(APP_NAME))


def assets_dir() -> Path:
    """The bundled assets folder, from an installed wheel (`llmtui_assets`) or from a source checkout."""
    try:
        return Path(str(importlib.resources.files("llmtui_assets")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "assets"
