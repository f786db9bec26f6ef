"""The app's owner-only folders: `secure_app_dirs` creates or tightens them at start. How files and folders are made
owner-only is engine_ext/private_files.py's (re-exported here for the app's writers)."""

from __future__ import annotations

from app.core import paths
from engine_ext.private_files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    private_dir,
    private_file,
    take_notice,
    tighten_if_exists,
    write_private_bytes,
    write_private_text,
)

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "private_dir",
    "private_file",
    "secure_app_dirs",
    "take_notice",
    "tighten_if_exists",
    "write_private_bytes",
    "write_private_text",
]


def secure_app_dirs() -> None:
    """Create or tighten llmtui's folders (0700: settings, data, logs and the state folder holding the logs) and
    tighten the settings file (0600)."""
    for folder in paths.private_folders():
        private_dir(folder)
    tighten_if_exists(paths.config_path())
