"""Prompt sets: reading one (`PromptSet.load`) and finding them, the bundled ones (assets/steering/*.json) and the
user's own (a folder or a path). Plain JSON, no engine: the app's make-vector dialog reads them in the UI process."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_ext.params import EngineError


@dataclass(frozen=True)
class PromptSet:
    """Positive/negative prompt pairs; built from templates × topics or listed explicitly."""

    name: str
    positive_label: str
    negative_label: str
    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def load(cls, path: Path) -> PromptSet:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            pairs = [tuple(p) for p in raw.get("pairs", [])]
            for topic in raw.get("topics", []):
                pairs.append((raw["positive"].format(topic=topic), raw["negative"].format(topic=topic)))
            prompt_set = cls(
                name=raw.get("name", path.stem),
                positive_label=raw.get("positive_label", "positive"),
                negative_label=raw.get("negative_label", "negative"),
                pairs=tuple((str(a), str(b)) for a, b in pairs),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"prompt set {path} is not valid: {exc}") from exc
        if not prompt_set.pairs:
            raise EngineError(f"prompt set {path} has no pairs")
        return prompt_set


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
