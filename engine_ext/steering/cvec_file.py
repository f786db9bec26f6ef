"""llama.cpp's control-vector GGUF: read, validate and write (common/common.cpp loader, cvector-generator writer).

Layout: `general.architecture = controlvector`, `controlvector.model_hint` (the target architecture),
`controlvector.layer_count` (n_layer - 1), and F32 1-D tensors `direction.N` (N ≥ 1) applied at the end of
layer N. The loader sums several tensors for one layer and ignores the metadata; so do we.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from engine_ext.params import EngineError

ARCH = "controlvector"


class ControlVectorError(EngineError):
    """A control-vector file that cannot be used (the message names the file and the problem)."""


@dataclass
class ControlVector:
    """Per-layer directions: `directions[il]` is applied at the end of layer il (il ≥ 1)."""

    directions: dict[int, np.ndarray]
    model_hint: str = ""
    metadata: dict[str, str] = field(default_factory=dict)  # llmtui.* provenance (prompt set, method, model)
    path: Path | None = None

    @property
    def n_embd(self) -> int:
        return next(iter(self.directions.values())).shape[0] if self.directions else 0

    @property
    def layers(self) -> list[int]:
        return sorted(self.directions)

    @property
    def name(self) -> str:
        return self.path.stem if self.path else self.metadata.get("llmtui.name", "vector")


def write_control_vector(vector: ControlVector, path: Path) -> Path:
    """Write in upstream's exact layout (plus llmtui.* string keys, which llama.cpp ignores)."""
    if not vector.directions:
        raise ControlVectorError("a control vector needs at least one layer direction")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Owner-only, like llmtui's other files: created 0600 here, GGUFWriter then truncates it and keeps the mode.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600))
    writer = GGUFWriter(str(path), ARCH)
    try:
        writer.add_string("controlvector.model_hint", vector.model_hint)
        writer.add_int32("controlvector.layer_count", max(vector.directions))
        for key, value in sorted(vector.metadata.items()):
            writer.add_string(key, value)
        for il in vector.layers:
            writer.add_tensor(f"direction.{il}", np.ascontiguousarray(vector.directions[il], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def read_control_vector(path: Path, *, n_embd: int | None = None, n_layer: int | None = None) -> ControlVector:
    """Read and validate a control vector; with the model's n_embd/n_layer, check it fits that model."""
    from engine_ext.gguf_info import GGUFError, validate_gguf

    path = Path(path)
    if not path.is_file():
        raise ControlVectorError(f"control vector not found: {path}")
    try:
        validate_gguf(path)
    except GGUFError as exc:
        raise ControlVectorError(str(exc)) from exc
    reader = GGUFReader(str(path))
    strings: dict[str, str] = {}
    for key, fld in reader.fields.items():
        if key == "controlvector.model_hint" or key.startswith("llmtui."):
            strings[key] = bytes(fld.parts[fld.data[0]]).decode("utf-8", errors="replace")
    directions: dict[int, np.ndarray] = {}
    for tensor in reader.tensors:
        name = tensor.name
        if not name.startswith("direction."):
            continue
        try:
            il = int(name.split(".", 1)[1])
        except ValueError:
            raise ControlVectorError(f"{path.name}: tensor {name!r} is not direction.<layer>") from None
        if il < 1:
            raise ControlVectorError(f"{path.name}: {name} is invalid (layer 0 has no control vector)")
        if tensor.tensor_type != GGMLQuantizationType.F32:
            raise ControlVectorError(f"{path.name}: {name} is {tensor.tensor_type.name}, llama.cpp needs F32")
        if len(tensor.shape) != 1:
            raise ControlVectorError(f"{path.name}: {name} must be one-dimensional")
        data = np.array(tensor.data, dtype=np.float32).reshape(-1)
        if not np.isfinite(data).all():
            raise ControlVectorError(f"{path.name}: {name} contains NaN or infinite values")
        if directions and data.shape[0] != next(iter(directions.values())).shape[0]:
            raise ControlVectorError(f"{path.name}: {name} has a different size than the other directions")
        directions[il] = directions[il] + data if il in directions else data
    if not directions:
        raise ControlVectorError(f"{path.name} holds no direction.N tensors: not a control vector")
    vector = ControlVector(
        directions,
        model_hint=strings.pop("controlvector.model_hint", ""),
        metadata=strings,
        path=path,
    )
    if n_embd is not None and vector.n_embd != n_embd:
        raise ControlVectorError(
            f"{path.name} was made for embedding size {vector.n_embd}, the model has {n_embd}"
        )
    if n_layer is not None and max(directions) >= n_layer:
        raise ControlVectorError(
            f"{path.name} steers layer {max(directions)}, the model has layers 1..{n_layer - 1}"
        )
    return vector


def norm_summary(vector: ControlVector) -> list[tuple[int, float]]:
    """(layer, L2 norm) per layer, for `steer show` and the heat strip."""
    return [(il, float(math.sqrt(float(np.dot(d, d))))) for il, d in sorted(vector.directions.items())]
