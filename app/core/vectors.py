"""Control-vector files as the app shows them, and what making one says of its progress (shared by the steering
controller, the screens and `llmtui steer`; no UI imports)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from app.core.paths import steering_dir
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
    norms: tuple[float, ...] = ()
    """The L2 norm of its direction per layer (in `layers`' order; empty: not known, taken as unit directions)."""

    @property
    def slider_range(self) -> float:
        """How far its slider goes each way (see `slider_range`)."""
        return slider_range(self.norms, self.n_embd)


@lru_cache(maxsize=64)
def _vector_info(path: str, mtime: float) -> VectorInfo | str:
    from engine_ext.steering.cvec_file import read_control_vector

    try:
        vector = read_control_vector(Path(path))
    except (EngineError, OSError, ValueError) as error:
        return str(error)
    meta = vector.metadata
    norms = tuple(float(np.linalg.norm(vector.directions[il])) for il in vector.layers)
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
        norms,
    )


VISIBLE_SHARE = 0.25
"""A slider's end pushes each layer by this share of a hidden state's typical norm: where a vector's effect is plain
to see (a unit direction on a 64-wide model: ±2; on the 576-wide starter: ±6, as llama-cvector-generator's vectors
there steer visibly at about ±4)."""
NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)
MIN_RANGE, MAX_RANGE = 0.01, 1000.0  # MAX_RANGE: the engine's MAX_STEERING_STRENGTH


def hidden_state_norm(n_embd: int) -> float:
    """A hidden state's typical L2 norm per layer: about sqrt(n_embd) (each value of order 1 after the norms)."""
    return math.sqrt(max(1, n_embd))


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 4, 5, 6, 8 × 10^k at or above `value`."""
    if not math.isfinite(value) or value <= 0:
        return MIN_RANGE
    exponent = math.floor(math.log10(value))
    for scale in (10.0**exponent, 10.0 ** (exponent + 1)):
        for step in NICE_STEPS:
            nice = round(step * scale, 10)
            if nice >= value * (1 - 1e-9):
                return nice
    return value  # not reached: 10^(k+1) ≥ value


def slider_range(norms: Sequence[float], n_embd: int) -> float:
    """The strength at a slider's end for a vector with these per-layer norms: where strength × its typical (median)
    layer norm is VISIBLE_SHARE of a hidden state's norm, rounded up to a round number, within ±1000."""
    finite = sorted(n for n in norms if math.isfinite(n) and n > 0)
    typical = finite[len(finite) // 2] if finite else 1.0
    wanted = VISIBLE_SHARE * hidden_state_norm(n_embd) / typical
    return min(MAX_RANGE, max(MIN_RANGE, nice_ceiling(wanted)))


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


def format_seconds(seconds: float) -> str:
    """'8 s', '2 min 05 s', '1 h 03 min'."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def phase_eta(done: int, total: int, phase_seconds: float, since_step: float = 0.0) -> float | None:
    """Seconds left in a phase at the rate measured so far in it (None: no step finished yet to measure), counted
    down by the `since_step` seconds the step under way has run since: a step that runs longer than the ones before
    it counts as a step that long, so the estimate never stays up after the time it gave."""
    if done <= 0 or phase_seconds <= 0:
        return None
    left = max(0, total - done)
    per_step = max(phase_seconds / done, since_step)
    return max(0.0, per_step * left - since_step)


def vector_progress_text(phase: str, done: int, total: int, phase_seconds: float, since_step: float = 0.0) -> str:
    """What the make dialog says of a phase: the step under way and the ETA of the phase from its measured rate,
    `since_step` seconds after the step before it ended (the dialog says it again each second)."""
    current = min(done + 1, total)
    if phase == "evaluating":
        what = f"evaluating pair {current} of {total}"
    elif phase == "directions":
        what = f"computing directions: layer {current} of {total}"
    else:
        return "writing the file…" if done < total else "written"
    if done >= total:
        return f"{what} · done"
    eta = phase_eta(done, total, phase_seconds, since_step)
    if eta is not None and eta < 1 <= since_step:  # the last step runs longer than the ones before it
        return f"{what} · finishing: {format_seconds(since_step)} on this step so far"
    return f"{what} · " + ("measuring the rate…" if eta is None else f"about {format_seconds(eta)} left in this phase")
