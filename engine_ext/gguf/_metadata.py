"""Typed, checked access to one header's metadata (``Metadata``), and llama.cpp's limits on metadata values."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeAlias

from engine_ext.gguf._reader import HINT_METADATA, VALUE_TYPE_NAMES, VT, MetadataValue, validation_error

# llama.cpp's own limits on metadata (src/llama-hparams.h, src/llama.cpp llama_split_path)
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: block_count, and the length of every per-layer array
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
MAX_CONTEXT = 2**31 - 1  # n_ctx_train is an int32
MAX_DIM = 1 << 20  # embedding, head, FFN and state sizes; real models stay far below
MAX_SPLITS = 99_999  # shards are named -%05d-of-%05d

# A per-layer hyperparameter as stored: one int for every block, or an array with one entry per block
IntOrLayers: TypeAlias = int | tuple[int, ...]


class Metadata:
    """Typed access to one header's metadata.

    ``entries`` maps each key to its stored value; ``arch`` is general.architecture, the prefix of the
    architecture keys. The ``*_value`` methods take a full key, the ``arch_*`` methods a suffix after ``{arch}.``;
    both answer None when the key is absent or holds another type. ``checked_int`` and ``check_int_or_layers``
    raise GGUFValidationError on a value llama.cpp would refuse.
    """

    def __init__(self, entries: dict[str, MetadataValue], arch: str | None) -> None:
        self.entries = entries
        self.arch = arch

    def value(self, key: str) -> Any:
        """The value stored at ``key``, whatever its type."""
        entry = self.entries.get(key)
        return None if entry is None else entry.value

    def arch_value(self, suffix: str) -> Any:
        """The value at ``{arch}.{suffix}``, whatever its type."""
        return None if self.arch is None else self.value(f"{self.arch}.{suffix}")

    def int_value(self, key: str) -> int | None:
        """The integer at ``key`` (a bool is not one)."""
        value = self.value(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def arch_int(self, suffix: str) -> int | None:
        """The integer at ``{arch}.{suffix}``."""
        return None if self.arch is None else self.int_value(f"{self.arch}.{suffix}")

    def str_value(self, key: str) -> str | None:
        """The string at ``key``."""
        value = self.value(key)
        return value if isinstance(value, str) else None

    def bool_value(self, key: str) -> bool | None:
        """The flag at ``key``: a bool, an integer (non-zero) or a string ("true")."""
        value = self.value(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str):  # llama.cpp reads these with meta_val_str, so "true" works too
            return value.strip().lower() == "true"
        if isinstance(value, int):
            return value != 0
        return None

    def checked_int(self, key: str, path: Path | str, low: int, high: int) -> int | None:
        """The integer at ``key`` (None if absent), refused unless an integer in [low, high]."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        value = entry.value
        if not isinstance(value, int):
            raise validation_error(path, f"{key} must be an integer but is {value_type_name(entry)}", HINT_METADATA)
        if not low <= value <= high:
            raise validation_error(path, f"{key} is {value} (must be {low} to {high})", HINT_METADATA)
        return int(value)

    def check_int_or_layers(self, key: str, path: Path | str, high: int, n_layers: int | None) -> None:
        """An integer, or an array of integers with one entry per block, each in [0, high]."""
        entry = self.entries.get(key)
        if entry is None or entry.vtype != int(VT.ARRAY):
            self.checked_int(key, path, 0, high)
            return
        n_max = MAX_LAYERS if n_layers is None else n_layers
        if entry.count != n_max and (n_layers is not None or entry.count > n_max):
            want = f"block_count is {n_layers}" if n_layers is not None else f"at most {MAX_LAYERS} are allowed"
            raise validation_error(
                path,
                f"{key} has {entry.count} entries but {want} (wrong array length)",
                HINT_METADATA,
            )
        values = entry.value if isinstance(entry.value, list) else []
        bad = next((v for v in values if not isinstance(v, int) or not 0 <= v <= high), None)
        if bad is not None or entry.subtype in (int(VT.STRING), int(VT.FLOAT32), int(VT.FLOAT64)):
            shown = bad if bad is not None else value_type_name(entry)
            raise validation_error(path, f"{key} has an entry {shown!r} (must be integers 0 to {high})", HINT_METADATA)

    def arch_int_or_layers(self, suffix: str) -> IntOrLayers | None:
        """The per-layer value at ``{arch}.{suffix}``: an int, or a tuple when the file stores an array of integers."""
        value = self.arch_value(suffix)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, list) and all(isinstance(v, int | bool) for v in value):
            return tuple(int(v) for v in value)
        return None


def value_type_name(entry: MetadataValue) -> str:
    """How a message names an entry's type: ``a u32``, ``an array of str``."""
    if entry.vtype == int(VT.ARRAY):
        sub = entry.subtype if entry.subtype is not None else -1
        return f"an array of {VALUE_TYPE_NAMES.get(sub, str(sub))}"
    return f"a {VALUE_TYPE_NAMES.get(entry.vtype, str(entry.vtype))}"


def per_layer_values(value: IntOrLayers | None, n: int, default: int = 0) -> list[int]:
    """Broadcast a scalar, or pad/trim an array, to ``n`` entries (wrong lengths are reported separately)."""
    if value is None:
        return [default] * n
    if isinstance(value, int):
        return [value] * n
    return [value[i] if i < len(value) else 0 for i in range(n)]
