"""llama.cpp's control-vector GGUF: read, validate and write (common/common.cpp loader, cvector-generator writer).

Layout: `general.architecture = controlvector`, `controlvector.model_hint` (the target architecture),
`controlvector.layer_count` (n_layer - 1), and F32 1-D tensors `direction.N` (N ≥ 1) applied at the end of
layer N. The loader sums several tensors for one layer and ignores the metadata; so do we.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from engine_ext.params import EngineError
from engine_ext.private_files import private_dir, private_file

ARCH = "controlvector"
_GGML_TYPE_IDS = frozenset(int(t) for t in GGMLQuantizationType)


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
    # Owner-only, like llmtui's other files: created 0600 here, GGUFWriter then truncates it and keeps the mode.
    private_file(private_dir(path.parent) / path.name)
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


_DIRECTION = re.compile(r"direction\.([0-9]{1,9})")  # ASCII digits only: llama.cpp reads the layer with std::stoi
_MAX_LAYER = 512  # LLAMA_MAX_LAYERS: llama.cpp sizes the vector by the highest layer it names
_MAX_N_EMBD = 1 << 20  # as engine_ext.gguf's largest plausible width (MAX_DIM)
_MAX_METADATA = 256  # llmtui.* provenance strings kept (more are ignored)
# The largest L2 norm a layer's applied direction may have (after strength and layer weight). A direction is added
# to the hidden state at the end of its layer; real models' hidden states have norms from about 1 to a few thousand
# (the largest "massive activations" reported are about 1e4), so an addition beyond 1e5 replaces the state instead
# of steering it, and from about 1.8e19 its squares overflow float32 in the next RMS norm (inf, then NaN or a
# silent end of the reply). Vectors llmtui makes are unit directions; llama-cvector-generator's steer at ±4 or so.
MAX_STEERING_NORM = 1e5


def check_steerable(direction: np.ndarray, what: str) -> None:
    """Refuse a direction that cannot steer: a value that is not finite, or an L2 norm above MAX_STEERING_NORM.
    Used on each layer of a file (strength 1) and on each layer of a mix after scaling (the mixer)."""
    wide = direction.astype(np.float64)
    if not np.isfinite(wide).all():
        raise ControlVectorError(f"{what} contains NaN or infinite values")
    norm = float(np.linalg.norm(wide))
    if not norm <= MAX_STEERING_NORM:  # float64 holds the norm of any float32 vector llama.cpp could be given
        raise ControlVectorError(
            f"{what} has a norm of {norm:.3g}, above {MAX_STEERING_NORM:g}: far beyond any model's hidden states, "
            "it would drown them instead of steering (use a smaller strength or a unit-norm vector)"
        )


def read_control_vector(path: Path, *, n_embd: int | None = None, n_layer: int | None = None) -> ControlVector:
    """Read and validate a control vector; with the model's n_embd/n_layer, check it fits that model.

    The header goes through engine_ext.gguf's bounded reader (every count and length checked against the file before
    anything is allocated), the tensor infos are checked, and only then are the directions read, straight from
    the file: a hostile file is refused with a one-line ControlVectorError, never read into memory.
    """
    from engine_ext.gguf import GGUFError, read_header

    path = Path(path)
    if not path.is_file():
        raise ControlVectorError(f"control vector not found: {path}")
    try:
        header = read_header(path)
    except GGUFError as exc:
        raise ControlVectorError(str(exc)) from exc
    name_of = path.name if len(path.name) <= 80 else path.name[:79] + "…"
    strings: dict[str, str] = {}
    for key, entry in header.kv.items():
        if (key == "controlvector.model_hint" or key.startswith("llmtui.")) and isinstance(entry.value, str):
            if len(strings) < _MAX_METADATA and len(key) <= 200:
                strings[key] = entry.value
    chosen: list[tuple[int, str, int, int]] = []  # (layer, tensor name, file offset, elements)
    for tensor in header.tensors:
        name = tensor.name
        if not name.startswith("direction."):
            continue
        match = _DIRECTION.fullmatch(name)
        if match is None:
            raise ControlVectorError(f"{name_of}: tensor {name!r} is not direction.<layer>")
        il = int(match.group(1))
        if il < 1:
            raise ControlVectorError(f"{name_of}: {name} is invalid (layer 0 has no control vector)")
        if il > _MAX_LAYER:
            raise ControlVectorError(f"{name_of}: {name} names layer {il}, above llama.cpp's {_MAX_LAYER} layers")
        if tensor.type_id != int(GGMLQuantizationType.F32):
            type_name = GGMLQuantizationType(tensor.type_id).name if tensor.type_id in _GGML_TYPE_IDS else "unknown"
            raise ControlVectorError(f"{name_of}: {name} is {type_name}, llama.cpp needs F32")
        if len(tensor.shape) != 1:
            raise ControlVectorError(f"{name_of}: {name} must be one-dimensional")
        if tensor.shape[0] > _MAX_N_EMBD:
            raise ControlVectorError(f"{name_of}: {name} has {tensor.shape[0]} values (at most {_MAX_N_EMBD})")
        if chosen and tensor.shape[0] != chosen[0][3]:
            raise ControlVectorError(f"{name_of}: {name} has a different size than the other directions")
        chosen.append((il, name, header.data_offset + tensor.offset, tensor.shape[0]))
    if not chosen:
        raise ControlVectorError(f"{name_of} holds no direction.N tensors: not a control vector")
    directions: dict[int, np.ndarray] = {}
    try:
        with open(path, "rb") as fh:
            for il, name, offset, count in chosen:
                fh.seek(offset)
                data = np.frombuffer(fh.read(count * 4), dtype="<f4").astype(np.float32)
                if data.shape[0] != count:
                    raise ControlVectorError(f"{name_of}: {name} is cut short (the file changed while read)")
                check_steerable(data, f"{name_of}: {name}")
                directions[il] = directions[il] + data if il in directions else data
    except OSError as exc:
        raise ControlVectorError(f"{name_of}: cannot be read ({exc.strerror or exc})") from None
    for il, direction in directions.items():  # llama.cpp adds the tensors that name one layer
        check_steerable(direction, f"{name_of}: layer {il} (its direction tensors added up)")
    vector = ControlVector(
        directions,
        model_hint=strings.pop("controlvector.model_hint", ""),
        metadata=strings,
        path=path,
    )
    if n_embd is not None and vector.n_embd != n_embd:
        raise ControlVectorError(f"{name_of} was made for embedding size {vector.n_embd}, the model has {n_embd}")
    if n_layer is not None and max(directions) >= n_layer:
        raise ControlVectorError(f"{name_of} steers layer {max(directions)}, the model has layers 1..{n_layer - 1}")
    return vector


def norm_summary(vector: ControlVector) -> list[tuple[int, float]]:
    """(layer, L2 norm) per layer, for `steer show` and the heat strip."""
    return [(il, float(math.sqrt(float(np.dot(d, d))))) for il, d in sorted(vector.directions.items())]
