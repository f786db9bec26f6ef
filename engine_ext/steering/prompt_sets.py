"""Finding prompt sets: the bundled ones (assets/steering/*.json) and the user's own (a folder or a path)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine_ext.params import EngineError
from engine_ext.steering.extract import PromptSet


def find_prompt_set(name_or_path: str, folders: Sequence[Path]) -> tuple[PromptSet, Path]:
    """A prompt set and its file, by path or by name in the given folders (user folders first, then bundled)."""
    path = Path(name_or_path).expanduser()
    if path.suffix == ".json" and path.is_file():
        return PromptSet.load(path), path
    for folder in folders:
        candidate = folder / f"{name_or_path}.json"
        if candidate.is_file():
            return PromptSet.load(candidate), candidate
    names = sorted({p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.json")})
    raise EngineError(f"no prompt set {name_or_path!r}; available: {', '.join(names) or 'none'}")


def list_prompt_sets(folders: Sequence[Path]) -> list[Path]:
    seen: dict[str, Path] = {}
    for folder in folders:
        if folder.is_dir():
            for p in sorted(folder.glob("*.json")):
                seen.setdefault(p.stem, p)
    return list(seen.values())
