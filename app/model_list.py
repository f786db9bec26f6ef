"""Local model files the quick switcher offers: the starter model and the .gguf files in the user's folders."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from app.models import starter_model_path, user_path

MAX_SCAN_DEPTH: Final = 3
# Draft/MTP sidecars and split parts after the first are not models to chat with on their own.
_SKIP: Final = re.compile(r"(^mtp-|^mmproj|-0000[2-9]-of-|-000[1-9][0-9]-of-)", re.IGNORECASE)


@dataclass(frozen=True)
class LocalModel:
    """A model file that can be loaded."""

    name: str
    path: Path
    size_bytes: int
    source: str  # "starter" or the folder it was found in


def _scan(folder: Path, depth: int) -> Iterable[Path]:
    try:
        entries = sorted(folder.iterdir())
    except (OSError, ValueError):  # unreadable, gone, or a name the OS refuses (a NUL byte from config.toml)
        return
    for entry in entries:
        if entry.is_dir() and depth > 0 and not entry.name.startswith("."):
            yield from _scan(entry, depth - 1)
        elif entry.suffix.lower() == ".gguf" and entry.is_file() and not _SKIP.search(entry.name):
            yield entry


def local_models(folders: Iterable[str]) -> list[LocalModel]:
    """The starter model (when installed) then every .gguf in `folders` (three levels deep), no duplicates."""
    found: list[LocalModel] = []
    seen: set[Path] = set()
    starter = starter_model_path()
    if starter is not None:
        found.append(LocalModel("starter (SmolLM2-135M-Instruct)", starter, starter.stat().st_size, "starter"))
        seen.add(starter.resolve())
    for folder_text in folders:
        folder = user_path(folder_text)
        if folder is None:  # cannot name a folder: nothing to list there
            continue
        for path in _scan(folder, MAX_SCAN_DEPTH):
            resolved = path.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            found.append(LocalModel(path.stem, path, size, str(folder)))
    return found


def human_size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
