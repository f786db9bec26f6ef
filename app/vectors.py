"""Control-vector files as the app shows them (shared by the steering controller and the screens; no UI imports)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from app.paths import steering_dir
from engine_ext.params import EngineError


@dataclass(frozen=True)
class VectorInfo:
    """What the steering screen shows about a control-vector file."""

    path: str
    name: str
    n_embd: int
    layers: tuple[int, ...]
    positive: str
    negative: str
    made_for: str


@lru_cache(maxsize=64)
def _vector_info(path: str, mtime: float) -> VectorInfo | str:
    from engine_ext.steering.cvec_file import read_control_vector

    try:
        vector = read_control_vector(Path(path))
    except (EngineError, OSError, ValueError) as error:
        return str(error)
    meta = vector.metadata
    stem, prompt_set = Path(path).stem, meta.get("llmtui.prompt_set", "")
    name = prompt_set if prompt_set and stem.endswith(f"-{prompt_set}") else stem  # model-set.gguf: the set
    return VectorInfo(
        path,
        name,
        vector.n_embd,
        tuple(vector.layers),
        meta.get("llmtui.positive", "+"),
        meta.get("llmtui.negative", "−"),
        meta.get("llmtui.model", vector.model_hint),
    )


_last_read: dict[str, VectorInfo | str] = {}
"""What `vector_info` last found per path (what the UI thread uses without touching the disk)."""


def vector_info(path: str) -> VectorInfo | str:
    """The file's facts, or a message saying why it cannot be used (reads the file: call it in a worker)."""
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        info: VectorInfo | str = f"{path} does not exist"
    else:
        info = _vector_info(path, mtime)
    _last_read[path] = info
    return info


def known_vector_info(path: str) -> VectorInfo | str | None:
    """The file's facts as `vector_info` last read them (in a worker), without any I/O; None: never read."""
    return _last_read.get(path)


def vector_name(path: str) -> str:
    """The short name shown for a vector file (its prompt set when made here with the default name), from what was
    last read of it (no I/O)."""
    info = known_vector_info(path)
    return info.name if isinstance(info, VectorInfo) else Path(path).stem


def available_vectors(remembered: tuple[str, ...], n_embd: int) -> tuple[list[VectorInfo], int]:
    """Vectors for a model of this embedding size: the remembered ones, then the steering folder's; and how many
    other files were left out (made for another model, or unreadable)."""
    paths = list(dict.fromkeys([*remembered, *(str(p) for p in sorted(steering_dir().glob("*.gguf")))]))
    usable: list[VectorInfo] = []
    for path in paths:
        info = vector_info(path)
        if isinstance(info, VectorInfo) and (n_embd <= 0 or info.n_embd == n_embd):
            usable.append(info)
    return usable, len(paths) - len(usable)
