"""GGUF validation, inspection and memory estimates that read only the header, never the weights."""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeAlias, TypeVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = [
    "LAYER_LETTERS",
    "DraftInfo",
    "GGUFError",
    "GGUFInfo",
    "GGUFValidationError",
    "MemoryEstimate",
    "SSMParams",
    "describe",
    "estimate_memory",
    "format_bytes",
    "format_count",
    "inspect_gguf",
    "inspect_gguf_reader",
    "layout_string",
    "read_chat_template",
    "validate_gguf",
]


class GGUFError(Exception):
    """A GGUF file cannot be used: missing, unreadable, or (subclass) malformed."""


class GGUFValidationError(GGUFError):
    """The file is not a well-formed GGUF file that llama.cpp would accept."""


# ---------------------------------------------------------------------------
# File-format constants (ggml/src/gguf.cpp, ggml/include/ggml.h)
# ---------------------------------------------------------------------------

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_COUNT = 1_000_000  # tensors or KV pairs; real models have a few thousand at most
_MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH
_MAX_ARRAY = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS
_MAX_NAME_BYTES = 63  # GGML_MAX_NAME - 1
_MAX_DIMS = 4  # GGML_MAX_DIMS
_T = TypeVar("_T")

# llama.cpp's own limits on metadata (src/llama-hparams.h, src/llama.cpp llama_split_path)
_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: block_count, and the length of every per-layer array
_MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
_MAX_CONTEXT = 2**31 - 1  # n_ctx_train is an int32
_MAX_DIM = 1 << 20  # embedding, head, FFN and state sizes; real models stay far below
_MAX_SPLITS = 99_999  # shards are named -%05d-of-%05d
_MAX_KEY = 1 << 16  # metadata keys are short dotted names; a longer one is hostile
_KEEP_STRING = 1 << 20  # string values longer than this are skipped (None), never read into memory
_KEEP_STRINGS_TOTAL = 32 << 20  # and once this much string data is held, later values are skipped too
_KEEP_ARRAY = 4096  # arrays longer than this (vocabularies, merges, scores) are skipped, only counted
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, one key byte, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset

_VT = GGUFValueType
# value type -> (struct format, size, numpy dtype) for fixed-size scalars
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    int(_VT.UINT8): (struct.Struct("<B"), "<u1"),
    int(_VT.INT8): (struct.Struct("<b"), "<i1"),
    int(_VT.UINT16): (struct.Struct("<H"), "<u2"),
    int(_VT.INT16): (struct.Struct("<h"), "<i2"),
    int(_VT.UINT32): (struct.Struct("<I"), "<u4"),
    int(_VT.INT32): (struct.Struct("<i"), "<i4"),
    int(_VT.FLOAT32): (struct.Struct("<f"), "<f4"),
    int(_VT.BOOL): (struct.Struct("<B"), "<u1"),
    int(_VT.UINT64): (struct.Struct("<Q"), "<u8"),
    int(_VT.INT64): (struct.Struct("<q"), "<i8"),
    int(_VT.FLOAT64): (struct.Struct("<d"), "<f8"),
}
_VALUE_TYPE_NAMES: dict[int, str] = {
    int(_VT.UINT8): "u8",
    int(_VT.INT8): "i8",
    int(_VT.UINT16): "u16",
    int(_VT.INT16): "i16",
    int(_VT.UINT32): "u32",
    int(_VT.INT32): "i32",
    int(_VT.FLOAT32): "f32",
    int(_VT.BOOL): "bool",
    int(_VT.STRING): "str",
    int(_VT.ARRAY): "array",
    int(_VT.UINT64): "u64",
    int(_VT.INT64): "i64",
    int(_VT.FLOAT64): "f64",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from gguf-py plus the vendored ggml's extras."""
    types = {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    # The vendored ggml knows Q2_0 = 42 (block_q2_0: f16 scale + 64 2-bit values); gguf 0.19 does not.
    types.setdefault(42, ("Q2_0", 64, 2 + 64 // 4))
    return types


_GGML_TYPES = _ggml_types()

# llama_ftype_name() in src/llama-model-loader.cpp
# fmt: off
_FTYPE_LABELS: dict[int, str] = {
    0: "all F32", 1: "F16", 32: "BF16", 40: "Q1_0", 41: "Q2_0", 2: "Q4_0", 3: "Q4_1", 8: "Q5_0", 9: "Q5_1",
    7: "Q8_0", 38: "MXFP4 MoE", 39: "NVFP4", 10: "Q2_K - Medium", 21: "Q2_K - Small", 11: "Q3_K - Small",
    12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small",
    17: "Q5_K - Medium", 18: "Q6_K", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw",
    22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 31: "IQ1_M - 1.75 bpw",
    25: "IQ4_NL - 4.5 bpw", 30: "IQ4_XS - 4.25 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
}
_FTYPE_GUESSED = 1024
# ggml type id of the most common tensor type -> llama_ftype (src/llama-model-loader.cpp, "guessed" file type)
_FTYPE_FROM_TENSOR_TYPE: dict[int, int] = {
    0: 0, 1: 1, 30: 32, 2: 2, 3: 3, 6: 8, 7: 9, 8: 7, 10: 10, 11: 12, 12: 15, 13: 17, 14: 18, 34: 36, 35: 37,
    16: 19, 17: 20, 22: 28, 18: 23, 19: 24, 29: 31, 20: 25, 23: 30, 21: 26, 40: 39, 41: 40, 42: 41,
}
# fmt: on

_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


# ---------------------------------------------------------------------------
# Bounded header parser
# ---------------------------------------------------------------------------


class _Source(Protocol):
    def unpack(self, fmt: struct.Struct, pos: int) -> tuple[Any, ...]: ...

    def read(self, pos: int, n: int) -> bytes: ...


class _MmapSource:
    """Reads from a read-only memory map of the whole file."""

    def __init__(self, mm: mmap.mmap) -> None:
        self._mm = mm

    def unpack(self, fmt: struct.Struct, pos: int) -> tuple[Any, ...]:
        return fmt.unpack_from(self._mm, pos)

    def read(self, pos: int, n: int) -> bytes:
        return self._mm[pos : pos + n]


class _WindowSource:
    """Reads through a sliding window of file reads, for files that cannot be memory-mapped."""

    _WINDOW = 4 << 20

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._start = 0
        self._buf = b""

    def read(self, pos: int, n: int) -> bytes:
        if pos < self._start or pos + n > self._start + len(self._buf):
            self._fh.seek(pos)
            self._start = pos
            self._buf = self._fh.read(max(n, self._WINDOW))
        return self._buf[pos - self._start : pos - self._start + n]

    def unpack(self, fmt: struct.Struct, pos: int) -> tuple[Any, ...]:
        return fmt.unpack(self.read(pos, fmt.size))


@contextmanager
def _open_source(path: Path) -> Iterator[_Source]:
    with open(path, "rb") as fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            yield _WindowSource(fh)
            return
        try:
            yield _MmapSource(mm)
        finally:
            mm.close()


@dataclass(frozen=True)
class _KV:
    """One metadata value; ``value`` is None for arrays longer than _KEEP_ARRAY (only ``count`` is kept)."""

    vtype: int
    value: Any
    subtype: int | None = None
    count: int = 1


@dataclass(frozen=True)
class _Tensor:
    name: str
    type_id: int
    shape: tuple[int, ...]  # ggml order {ne0, ne1, ...}
    n_elements: int
    n_bytes: int
    offset: int  # relative to the data section


@dataclass(frozen=True)
class _Header:
    path: Path
    file_size: int
    version: int
    alignment: int
    data_offset: int
    kv: dict[str, _KV]
    tensors: tuple[_Tensor, ...]
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # where each array's elements lie in the file


_MAX_MESSAGE = 300  # every GGUFError message is one line of at most this many characters
_MAX_PATH_IN_MESSAGE = 100


def _clip(text: str, limit: int) -> str:
    """One line (whitespace runs and control characters folded) of at most ``limit`` characters."""
    text = " ".join(text[: limit * 4].split())
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _message(path: Path | str, problem: str, hint: str = "") -> str:
    """``<path>: <problem>; <hint>`` in one line of at most _MAX_MESSAGE characters: a long path keeps its end,
    a long problem (values, keys, names read from the file) is cut so that the hint still fits."""
    where = _clip(str(path), 10_000)
    if len(where) > _MAX_PATH_IN_MESSAGE:
        where = "…" + where[-(_MAX_PATH_IN_MESSAGE - 1) :]
    hint = _clip(hint, 120)
    room = _MAX_MESSAGE - len(where) - 2 - (len(hint) + 2 if hint else 0)
    text = f"{where}: {_clip(problem, max(room, 40))}" + (f"; {hint}" if hint else "")
    return _clip(text, _MAX_MESSAGE)


def _error(path: Path | str, problem: str, hint: str = "") -> GGUFError:
    """A GGUFError (missing or unreadable file) with a short one-line message."""
    return GGUFError(_message(path, problem, hint))


def _fail(path: Path | str, problem: str, hint: str) -> GGUFValidationError:
    """A GGUFValidationError (malformed file) with a short one-line message."""
    return GGUFValidationError(_message(path, problem, hint))


_HINT_REDOWNLOAD = "the file is incomplete or corrupt, re-download it"
_HINT_CORRUPT = "the file is corrupt or was not written by a GGUF writer, re-download or re-convert it"
_HINT_METADATA = "llama.cpp would refuse this metadata; re-download or re-convert the model"


class _Parser:
    """Walks the GGUF header with a bounds check before every read; raises GGUFValidationError."""

    def __init__(self, path: Path, src: _Source, size: int, *, keep_strings: bool) -> None:
        self.path = path
        self.src = src
        self.size = size
        self.pos = 0
        self.keep_strings = keep_strings
        self.kept = 0  # bytes of string data read into memory
        self.spans: dict[str, tuple[int, int]] = {}  # array key -> [start, end) of its elements

    # -- primitives --------------------------------------------------------

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _fail(
                self.path,
                f"truncated header: reading {what} needs {n} bytes at offset {self.pos} "
                f"but the file has only {self.size} bytes",
                _HINT_REDOWNLOAD,
            )

    def _unpack(self, fmt: struct.Struct, what: str) -> Any:
        self._need(fmt.size, what)
        (value,) = self.src.unpack(fmt, self.pos)
        self.pos += fmt.size
        return value

    def _string(self, what: str, *, keep: bool = True, max_len: int | None = None) -> str | None:
        n = self._unpack(_U64, f"the length of {what}")
        if n > _MAX_STRING or n > self.size - self.pos:
            raise _fail(
                self.path,
                f"{what} claims a length of {n} bytes at offset {self.pos - 8}, "
                f"but only {self.size - self.pos} bytes remain in the file",
                _HINT_REDOWNLOAD,
            )
        if max_len is not None and n > max_len:
            raise _fail(self.path, f"{what} is {n} bytes long (at most {max_len})", _HINT_CORRUPT)
        start = self.pos
        self.pos += n
        if not keep:
            return None
        if max_len is not None:  # a key or a tensor name: always kept, so the header's total is capped
            if self.kept + n > 2 * _KEEP_STRINGS_TOTAL:
                raise _fail(self.path, f"the header's keys and names pass {2 * _KEEP_STRINGS_TOTAL >> 20} MiB",
                            _HINT_CORRUPT)
        elif not self.keep_strings and (n > _KEEP_STRING or self.kept + n > _KEEP_STRINGS_TOTAL):
            return None
        self.kept += n
        return self.src.read(start, n).decode("utf-8", errors="replace")

    # -- sections ----------------------------------------------------------

    def parse(self) -> _Header:
        self._check_magic()
        version = self._unpack(_U32, "the version")
        if version not in _SUPPORTED_VERSIONS:
            raise self._bad_version(version)
        n_tensors = self._unpack(_U64, "the tensor count")
        n_kv = self._unpack(_U64, "the metadata count")
        self._check_count(n_tensors, "tensors", _MIN_TENSOR_INFO_BYTES)
        self._check_count(n_kv, "metadata entries", _MIN_KV_BYTES)
        kv = self._read_kv(n_kv)
        alignment = self._alignment(kv)
        infos = self._read_tensor_infos(n_tensors)
        data_offset = self.pos
        if n_tensors > 0:
            data_offset = -(-self.pos // alignment) * alignment
        header = _Header(self.path, self.size, version, alignment, data_offset, kv, tuple(infos), self.spans)
        self._check_tensor_data(header)
        return header

    def _check_count(self, count: int, what: str, min_bytes: int) -> None:
        if count > _MAX_COUNT:
            raise _fail(
                self.path, f"the header claims {count} {what} (at most {_MAX_COUNT} are plausible)", _HINT_CORRUPT
            )
        need = count * min_bytes
        if need > self.size - self.pos:
            raise _fail(
                self.path,
                f"truncated header: it declares {count} {what}, which need at least {need} more bytes, "
                f"but the file has only {self.size} bytes",
                _HINT_REDOWNLOAD,
            )

    def _check_magic(self) -> None:
        head = self.src.read(0, min(self.size, 64))
        if len(head) < 4 and _MAGIC.startswith(head):
            raise _fail(self.path, f"truncated header: the file has only {self.size} bytes", _HINT_REDOWNLOAD)
        if head[:4] == _MAGIC:
            if self.size < 24:
                raise _fail(
                    self.path,
                    f"truncated header: the file has only {self.size} bytes, a GGUF header needs 24",
                    _HINT_REDOWNLOAD,
                )
            self.pos = 4
            return
        if head.startswith(b"version https://git-lfs"):
            problem = "not a GGUF file but a Git LFS pointer (the real file was never fetched)"
            hint = "download the file itself, e.g. with `git lfs pull` or from the Hugging Face page"
        elif head.lstrip()[:1] in (b"<", b"{", b"[") or all(32 <= b < 127 or b in b"\t\r\n" for b in head):
            problem = f"not a GGUF file but text starting with {head[:24]!r}"
            hint = "it is probably an error page saved instead of the model; re-download the .gguf file"
        else:
            problem = f"not a GGUF file: it starts with {head[:4]!r} instead of b'GGUF'"
            hint = "pass a .gguf model file (safetensors/PyTorch models must be converted first)"
        raise _fail(self.path, problem, hint)

    def _bad_version(self, version: int) -> GGUFValidationError:
        if version == 0:
            return _fail(self.path, "GGUF version is 0", _HINT_CORRUPT)
        if version & 0xFFFF == 0:
            return _fail(
                self.path,
                f"GGUF version field reads {version:#x}, which means a big-endian file",
                "this llama.cpp reads little-endian GGUF only; get the little-endian build of the model",
            )
        if version == 1:
            return _fail(self.path, "GGUF version 1 is no longer supported", "re-convert the model")
        return _fail(
            self.path,
            f"GGUF version {version} is newer than this llama.cpp supports (2 and 3)",
            "upgrade llmtui, or convert the model with a matching llama.cpp",
        )

    def _read_kv(self, n_kv: int) -> dict[str, _KV]:
        kv: dict[str, _KV] = {}
        for i in range(n_kv):
            key = self._string(f"the key of metadata entry {i}", max_len=_MAX_KEY)
            assert key is not None
            if not key:
                raise _fail(self.path, f"metadata entry {i} has an empty key", _HINT_CORRUPT)
            if key in kv:
                raise _fail(self.path, f"metadata key {key!r} appears twice", _HINT_CORRUPT)
            vtype = self._unpack(_U32, f"the value type of {key!r}")
            if vtype == int(_VT.ARRAY):
                kv[key] = self._read_array(key)
            else:
                kv[key] = _KV(vtype, self._read_scalar(key, vtype))
        return kv

    def _read_scalar(self, key: str, vtype: int) -> Any:
        if vtype == int(_VT.STRING):
            template = key.startswith("tokenizer.chat_template")
            start = self.pos + 8
            value = self._string(f"the value of {key!r}", keep=self.keep_strings or not template)
            if template:  # read on demand by read_chat_template, with its own cap
                self.spans[key] = (start, self.pos)
            return value
        if vtype not in _SCALARS:
            raise _fail(self.path, f"metadata key {key!r} has unknown value type {vtype}", _HINT_CORRUPT)
        fmt, _ = _SCALARS[vtype]
        value = self._unpack(fmt, f"the value of {key!r}")
        return bool(value) if vtype == int(_VT.BOOL) else value

    def _read_array(self, key: str) -> _KV:
        subtype = self._unpack(_U32, f"the element type of {key!r}")
        count = self._unpack(_U64, f"the length of {key!r}")
        remaining = self.size - self.pos
        if subtype == int(_VT.STRING):
            min_bytes = 8
        elif subtype in _SCALARS:
            min_bytes = _SCALARS[subtype][0].size
        elif subtype == int(_VT.ARRAY):
            problem = f"metadata key {key!r} is an array of arrays, which llama.cpp rejects"
            raise _fail(self.path, problem, _HINT_CORRUPT)
        else:
            problem = f"metadata array {key!r} has unknown element type {subtype}"
            raise _fail(self.path, problem, _HINT_CORRUPT)
        if count > _MAX_ARRAY or count * min_bytes > remaining:
            raise _fail(
                self.path,
                f"metadata array {key!r} claims {count} elements, more than the {remaining} bytes left can hold",
                _HINT_REDOWNLOAD,
            )
        keep = count <= _KEEP_ARRAY
        if subtype == int(_VT.STRING):
            start = self.pos
            if not keep:  # only walked: a tight loop, no per-element messages or objects
                self._skip_strings(key, count)
                self.spans[key] = (start, self.pos)
                return _KV(int(_VT.ARRAY), None, subtype, count)
            strings = [self._string(f"element {j} of {key!r}", keep=keep) for j in range(count)]
            self.spans[key] = (start, self.pos)
            return _KV(int(_VT.ARRAY), strings, subtype, count)
        fmt, dtype = _SCALARS[subtype]
        start = self.pos
        self.pos += count * fmt.size
        if not keep:
            return _KV(int(_VT.ARRAY), None, subtype, count)
        values = np.frombuffer(self.src.read(start, count * fmt.size), dtype=dtype, count=count).tolist()
        if subtype == int(_VT.BOOL):
            values = [bool(v) for v in values]
        return _KV(int(_VT.ARRAY), values, subtype, count)

    def _skip_strings(self, key: str, count: int) -> None:
        """Walk ``count`` strings without reading them, with _string's bounds checks and messages."""
        pos, size, unpack = self.pos, self.size, self.src.unpack
        for j in range(count):
            if pos + 8 > size:
                self.pos = pos
                self._need(8, f"the length of element {j} of {key!r}")
            (n,) = unpack(_U64, pos)
            pos += 8
            if n > _MAX_STRING or n > size - pos:
                self.pos = pos
                self._string_too_long(f"element {j} of {key!r}", n)
            pos += n
        self.pos = pos

    def _string_too_long(self, what: str, n: int) -> None:
        raise _fail(
            self.path,
            f"{what} claims a length of {n} bytes at offset {self.pos - 8}, "
            f"but only {self.size - self.pos} bytes remain in the file",
            _HINT_REDOWNLOAD,
        )

    def _alignment(self, kv: dict[str, _KV]) -> int:
        entry = kv.get("general.alignment")
        if entry is None:
            return _DEFAULT_ALIGNMENT
        if entry.vtype != int(_VT.UINT32):
            raise _fail(
                self.path,
                f"general.alignment must be a u32 but is a {_VALUE_TYPE_NAMES.get(entry.vtype, entry.vtype)}",
                _HINT_CORRUPT,
            )
        alignment = int(entry.value)
        if alignment == 0 or alignment & (alignment - 1):
            raise _fail(self.path, f"general.alignment {alignment} is not a power of two", _HINT_CORRUPT)
        return alignment

    def _read_tensor_infos(self, n_tensors: int) -> list[_Tensor]:
        infos: list[_Tensor] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = self._string(f"the name of tensor {i}", max_len=_MAX_NAME_BYTES)
            assert name is not None
            if len(name.encode("utf-8", errors="replace")) > _MAX_NAME_BYTES:
                problem = f"tensor {i} name {name[:80]!r} is longer than {_MAX_NAME_BYTES} bytes"
                raise _fail(self.path, problem, _HINT_CORRUPT)
            if name in seen:
                raise _fail(self.path, f"tensor name {name!r} appears twice", _HINT_CORRUPT)
            seen.add(name)
            n_dims = self._unpack(_U32, f"the dimension count of tensor {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                problem = f"tensor {name!r} has {n_dims} dimensions (must be 1 to {_MAX_DIMS})"
                raise _fail(self.path, problem, _HINT_CORRUPT)
            shape = tuple(self._unpack(_U64, f"dimension {j} of tensor {name!r}") for j in range(n_dims))
            n_elements = 1
            for j, dim in enumerate(shape):
                if dim <= 0 or dim >= 1 << 62:
                    problem = f"tensor {name!r} dimension {j} is {dim} (must be positive)"
                    raise _fail(self.path, problem, _HINT_CORRUPT)
                n_elements *= dim
            if n_elements >= 1 << 63:
                problem = f"tensor {name!r} shape {list(shape)} overflows 64 bits"
                raise _fail(self.path, problem, _HINT_CORRUPT)
            type_id = self._unpack(_U32, f"the type of tensor {name!r}")
            if type_id not in _GGML_TYPES:
                raise _fail(
                    self.path,
                    f"tensor {name!r} has unknown ggml type {type_id}",
                    "the file is corrupt or needs a newer llama.cpp than the one llmtui ships",
                )
            type_name, block, type_size = _GGML_TYPES[type_id]
            if shape[0] % block:
                raise _fail(
                    self.path,
                    f"tensor {name!r} of type {type_name} has rows of {shape[0]} elements, "
                    f"not a multiple of the block size {block}",
                    _HINT_CORRUPT,
                )
            offset = self._unpack(_U64, f"the data offset of tensor {name!r}")
            n_bytes = n_elements // block * type_size
            infos.append(_Tensor(name, type_id, shape, n_elements, n_bytes, offset))
        return infos

    def _check_tensor_data(self, h: _Header) -> None:
        """Alignment, bounds, overlaps, and llama.cpp's rule that data follows header order, padded."""
        for t in h.tensors:
            if t.offset % h.alignment:
                raise _fail(
                    self.path,
                    f"tensor {t.name!r} data offset {t.offset} is not a multiple of the alignment {h.alignment}",
                    _HINT_CORRUPT,
                )
        by_offset = sorted(h.tensors, key=lambda t: (t.offset, t.name))
        past_end = [t for t in by_offset if h.data_offset + t.offset + t.n_bytes > h.file_size]
        if past_end:
            t = past_end[0]
            more = f" ({len(past_end)} tensors affected)" if len(past_end) > 1 else ""
            raise _fail(
                self.path,
                f"truncated: tensor {t.name!r} needs bytes up to {h.data_offset + t.offset + t.n_bytes} "
                f"but the file has {h.file_size}{more}",
                _HINT_REDOWNLOAD,
            )
        for prev, cur in zip(by_offset, by_offset[1:], strict=False):
            if prev.offset + prev.n_bytes > cur.offset:
                raise _fail(
                    self.path,
                    f"tensors {prev.name!r} [{prev.offset}, {prev.offset + prev.n_bytes}) and {cur.name!r} "
                    f"[{cur.offset}, {cur.offset + cur.n_bytes}) overlap in the data section",
                    _HINT_CORRUPT,
                )
        expected = 0
        for t in h.tensors:
            if t.offset != expected:
                raise _fail(
                    self.path,
                    f"tensor {t.name!r} has data offset {t.offset} but llama.cpp expects {expected} "
                    f"(tensor data must follow the header order, each padded to {h.alignment} bytes)",
                    _HINT_CORRUPT,
                )
            expected += -(-t.n_bytes // h.alignment) * h.alignment


def _parse(path: Path, *, keep_strings: bool = False) -> _Header:
    """Parse and validate one file's header; every failure is a GGUFError."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise _error(path, "no such file", "check the path") from None
    except OSError as exc:
        raise _error(path, f"cannot be read ({exc.strerror})", "check the path and permissions") from None
    if path.is_dir():
        raise _error(path, "is a directory, not a GGUF file", "pass the .gguf file inside it")
    size = stat.st_size
    if size == 0:
        raise _fail(path, "the file is empty (0 bytes)", "the download probably failed, re-download it")
    try:
        with _open_source(path) as src:
            return _Parser(path, src, size, keep_strings=keep_strings).parse()
    except GGUFError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _error(path, f"cannot be read ({reason})", "check the file and the disk") from None
    except (struct.error, ValueError, OverflowError, IndexError, MemoryError, UnicodeError) as exc:
        problem = f"the header could not be parsed ({type(exc).__name__}: {exc})"
        raise _fail(path, problem, _HINT_CORRUPT) from None


def validate_gguf(path: Path) -> None:
    """Check that ``path`` is a GGUF file llama.cpp would accept, reading only its header.

    One file is checked on its own, also when it is one shard of a split model. Raises GGUFValidationError
    (file-format problems) or GGUFError (missing or unreadable file); never any other exception.
    """
    _parse(path)


_DRAFT_ARCHS = {"dflash": "a DFlash/DSpark draft", "eagle3": "an EAGLE3 draft"}  # for another model


def validate_main_model(path: Path) -> None:
    """validate_gguf, and refuse a draft that cannot run on its own: a DFlash/DSpark or EAGLE3 draft, or an ``mtp-``
    sidecar (NextN head only), opened as the model to chat with (llama.cpp aborts or segfaults on them)."""
    header = _parse(path)
    arch_kv = header.kv.get("general.architecture")
    arch = arch_kv.value if arch_kv is not None and isinstance(arch_kv.value, str) else ""
    what = _DRAFT_ARCHS.get(arch)
    if what is None:
        nextn = header.kv.get(f"{arch}.nextn_predict_layers")
        has_nextn = nextn is not None and isinstance(nextn.value, int) and nextn.value > 0
        # As inspect_gguf's is_mtp_sidecar: NextN blocks and no trunk.
        if has_nextn and not any(t.name == "blk.0.attn_norm.weight" for t in header.tensors):
            what = "an mtp- sidecar (another model's MTP head)"
    if what is not None:
        raise _fail(path, f"{what}, not a model to chat with",
                    "open the model it belongs to (its drafts are paired automatically)")
    _check_runnable(path, header)


# Rules that llama.cpp enforces with GGML_ASSERT/GGML_ABORT (a worker crash) instead of an error, found by fuzzing
# `run` (scripts/fuzz_run.py); references are to the vendored llama.cpp (llama-cpp-python 0.3.36).
_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES, src/llama-model.cpp:1034
_TENSOR_ALIGNMENT = 32  # TENSOR_ALIGNMENT, ggml/src/ggml-impl.h:44
_INTEGER_TENSOR_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64"}
_GDN_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})  # head_v_dim = d_inner / num_v_heads in the graph
# Graph builders that assert n_embd_head_k == n_embd_head_v (src/models/*.cpp, "GGML_ASSERT(n_embd_head == ...)")
# fmt: off
_HEAD_K_EQ_V_ARCHS = frozenset({
    "afmoe", "apertus", "arcee", "arctic", "baichuan", "bailingmoe2", "bert", "bitnet", "bloom", "chameleon",
    "chatglm", "codeshell", "cogvlm", "cohere2", "cohere2moe", "command-r", "dbrx", "deci", "deepseek", "dots1",
    "dream", "ernie4_5", "ernie4_5-moe", "eurobert", "exaone", "exaone-moe", "exaone4", "falcon", "glm4", "glm4moe",
    "gpt2", "gptneox", "granite", "granite_swa", "granitehybrid", "graniteswitch", "grok", "grovemoe", "hunyuan-moe",
    "hunyuan_vl", "hy_v3", "internlm2", "jais", "jais2", "laguna", "llada", "llada-moe", "llama", "llama4",
    "maincoder", "maple", "mellum", "minimax-01", "minimax-m2", "minimax-m3", "mistral3", "modern-bert", "mpt",
    "muse-glimmer", "nanbeige", "nemotron", "nemotron_h", "neo-bert", "olmo", "olmo2", "olmoe", "openelm", "orion",
    "paddleocr", "pangu-embedded", "phi2", "phi3", "plamo", "pockettts", "qwen", "qwen2", "qwen2moe", "qwen2vl",
    "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3vl", "qwen3vlmoe", "refact", "rnd1", "seed_oss",
    "smallthinker", "smollm3", "spark2_5", "stablelm", "starcoder", "starcoder2", "t5", "talkie", "xverse",
})
# ... and that also assert n_embd_head == n_rot
_ROT_EQ_HEAD_ARCHS = frozenset({
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe", "dbrx", "deci",
    "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone", "exaone-moe", "exaone4", "falcon", "granite",
    "granite_swa", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais2",
    "llada", "llada-moe", "llama", "llama4", "maincoder", "mellum", "minimax-01", "minimax-m2", "mistral3",
    "nemotron", "olmo", "olmo2", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo", "pockettts", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "rnd1", "seed_oss", "smallthinker",
    "smollm3", "starcoder2", "talkie", "xverse",
})
# Architectures that read rope.dimension_sections (multi-section rope; ggml_mrope_cache_init asserts their sum)
_MROPE_ARCHS = frozenset({
    "bailingmoe3", "deepseek32", "dflash", "ernie4_5", "glm-dsa", "glm4", "glm4moe", "hunyuan_vl", "qwen2vl",
    "qwen35", "qwen35moe", "qwen3vl", "qwen3vlmoe", "qwen4exp",
})
# Architectures without rope (llama_model_rope_type, src/llama-model.cpp:3026-3049): their rope keys are unused
_NO_ROPE_ARCHS = frozenset({
    "clip", "gpt2", "gptj", "mpt", "refact", "bloom", "mamba", "mamba2", "jamba", "jina-bert-v2", "t5", "t5encoder",
    "jais", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "wavtokenizer-dec", "nemotron_h", "nemotron_h_moe",
    "kimi-linear", "kimi-k3", "glm5-next",
})
# Architectures whose graph normalises with layer_norm_epsilon only (load_arch_hparams reads no RMS epsilon)
_LAYERNORM_ARCHS = frozenset({
    "bert", "bloom", "codeshell", "cohere2", "command-r", "dbrx", "falcon", "gpt2", "gptneox", "jais", "jais2",
    "jina-bert-v2", "jina-bert-v3", "modern-bert", "mpt", "nemotron", "nomic-bert", "nomic-bert-moe", "olmo", "orion",
    "phi2", "pockettts", "stablelm", "starcoder", "starcoder2", "wavtokenizer-dec",
})
# fmt: on


def _check_runnable(path: Path | str, header: _Header) -> None:
    """Refuse, before llama.cpp sees the file, metadata that passes llama.cpp's loader checks and then aborts it."""
    arch_kv = header.kv.get("general.architecture")
    arch = arch_kv.value if arch_kv is not None and isinstance(arch_kv.value, str) else None
    m = _Meta(header.kv, arch)
    _guarded(path, lambda: _check_experts(path, m))
    _guarded(path, lambda: _check_attention(path, m))
    _guarded(path, lambda: _check_recurrent(path, m))
    _guarded(path, lambda: _check_kv_heads(path, m, header))
    _check_tensor_types(path, header)
    _check_tokens(path, header)
    model = header.kv.get("tokenizer.ggml.model")
    if model is not None and model.value in ("none", "no_vocab"):  # llama-vocab.cpp:3422 on the first tokenize
        raise _refuse(path, f"tokenizer.ggml.model is {model.value!r}: the model has no tokenizer to chat with")


def _refuse(path: Path | str, problem: str) -> GGUFValidationError:
    return _fail(path, problem, "llama.cpp would abort on this metadata; re-download or re-convert the model")


def _check_experts(path: Path | str, m: _Meta) -> None:
    """block_count and the expert counts as load_hparams asserts them (src/llama-model.cpp:1328-1377)."""
    a = m.arch
    if a is None:
        return
    block_count = m.checked_int(f"{a}.block_count", path, 1, _MAX_LAYERS)  # llama-model.cpp:1328
    m.checked_int(f"{a}.nextn_predict_layers", path, 0, block_count or _MAX_LAYERS)  # llama-model.cpp:1330
    m.checked_int(f"{a}.expert_count", path, 0, _MAX_EXPERTS)  # llama-model.cpp:1361
    m.checked_layers(f"{a}.expert_used_count", path, _MAX_EXPERTS, block_count)
    n_expert = m.aint("expert_count") or 0
    used = m.int_or_layers("expert_used_count")
    used_max = (max(used) if used else 0) if isinstance(used, tuple) else (used or 0)
    groups = m.aint("expert_group_count") or 0
    group_used = m.aint("expert_group_used_count") or 0
    if a in ("hunyuan-dense", "hunyuan_vl") and n_expert <= 1:
        n_expert = used_max = 0
    if used_max > n_expert:
        raise _refuse(path, f"{a}.expert_used_count {used_max} exceeds expert_count {n_expert}")
    if n_expert > 0:
        if used_max == 0:
            raise _refuse(path, f"{a}.expert_count is {n_expert} but expert_used_count is 0 or missing "
                                "(an MoE model must route to at least one expert)")
        if groups >= n_expert:
            raise _refuse(path, f"{a}.expert_group_count {groups} must be below expert_count {n_expert}")
        if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            raise _refuse(path, f"{a}.expert_group_count {groups} must divide expert_count {n_expert} and "
                                f"expert_group_used_count ({group_used}) must be 1 to {groups - 1}")
    elif groups:
        raise _refuse(path, f"{a}.expert_group_count is {groups} but the model has no experts")
    if a in _NEMOTRON_ARCHS and n_expert > 0 and block_count:
        # A trunk layer with n_ff != 0 is an MoE layer whose expert width falls back to n_ff / n_expert_used(il)
        # when expert_feed_forward_length is 0 there (models/nemotron-h.cpp:102-115): SIGFPE when both are 0.
        n_ff = _per_layer(m.int_or_layers("feed_forward_length"), block_count)
        ff_exp = _per_layer(m.int_or_layers("expert_feed_forward_length"), block_count)
        used_l = _per_layer(used, block_count)
        for il in range(block_count - (m.aint("nextn_predict_layers") or 0)):
            if n_ff[il] and not ff_exp[il] and not used_l[il]:
                raise _refuse(path, f"{a}.feed_forward_length is {n_ff[il]} at layer {il} (an MoE layer) but "
                                    f"expert_used_count and expert_feed_forward_length are 0 there (divides by 0)")


def _check_attention(path: Path | str, m: _Meta) -> None:
    """Norm epsilons, rope scaling type and head sizes that the graph asserts on (ggml-cpu/ops.cpp, models/*.cpp)."""
    a = m.arch
    if a is None:
        return
    for suffix in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = m.a(suffix)
        if suffix == "attention.layer_norm_epsilon" and a not in _LAYERNORM_ARCHS:
            continue  # read but not used by this architecture's graph
        if isinstance(eps, float) and not eps >= 0.0:  # ggml-cpu/ops.cpp:4026 (norm), 4132 (rms_norm)
            raise _refuse(path, f"{a}.{suffix} is {eps} (must be >= 0)")
    scaling = m.a("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in _ROPE_SCALING_TYPES:  # llama-model.cpp:1420
        raise _refuse(path, f"{a}.rope.scaling.type {scaling!r} is unknown (one of {', '.join(_ROPE_SCALING_TYPES)})")
    heads = _per_layer(m.int_or_layers("attention.head_count"), _MAX_LAYERS if m.aint("block_count") is None
                       else int(m.aint("block_count") or 0))
    heads_kv_raw = m.int_or_layers("attention.head_count_kv")
    heads_kv = heads if heads_kv_raw is None else _per_layer(heads_kv_raw, len(heads))
    # Grouped-query attention broadcasts K/V over the heads (ggml_mul_mat asserts it): checked for the model-wide
    # values (layer 0's, which every graph uses); per-layer arrays are checked against the K tensors below.
    if heads and heads_kv and heads_kv[0] > 0 and heads[0] % heads_kv[0]:
        raise _refuse(path, f"{a}.attention.head_count_kv {heads_kv[0]} must divide head_count {heads[0]}")
    n_head = heads[0] if heads else 0
    n_embd = m.aint("embedding_length")
    if n_head <= 0 or not n_embd:
        return
    head_k = m.aint("attention.key_length") or n_embd // n_head  # llama-model.cpp:1435-1447
    head_v = m.aint("attention.value_length") or n_embd // n_head
    n_rot = m.aint("rope.dimension_count")
    sections = m.int_or_layers("rope.dimension_sections")
    if a in _MROPE_ARCHS and isinstance(sections, tuple):  # ggml-cpu/ops.cpp:6232, an int32 sum as in C
        total = sum(_int32(v) for v in sections[:4])
        if _int32(total) > head_k:
            raise _refuse(path, f"{a}.rope.dimension_sections {list(sections[:4])} add up to more than the head "
                                f"size {head_k}")
    if a in _HEAD_K_EQ_V_ARCHS and head_k != head_v:
        raise _refuse(path, f"{a}.attention.key_length {head_k} must equal value_length {head_v} for {a}")
    if n_rot is None or a in _NO_ROPE_ARCHS:
        return
    if a in _ROT_EQ_HEAD_ARCHS and n_rot != head_k:
        raise _refuse(path, f"{a}.rope.dimension_count {n_rot} must equal the head size {head_k} for {a}")
    # ggml-cpu/ops.cpp:6355-6356 assert n_dims <= ne0 and n_dims % 2 == 0; n_dims 0 spins forever in the decode
    if n_rot < 2 or n_rot % 2 or n_rot > head_k:
        raise _refuse(path, f"{a}.rope.dimension_count {n_rot} must be even, 2 to the head size {head_k}")


def _int32(value: int) -> int:
    """``value`` as a C int32_t holds it (two's complement wrap)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _check_recurrent(path: Path | str, m: _Meta) -> None:
    """The layer pattern and the gated delta net sizes the loader and graph divide by and reshape with
    (src/models/qwen35.cpp:18-21 and 341-346)."""
    a = m.arch
    if a in _INTERVAL_HYBRID_ARCHS and m.a("attention.recurrent_layers") is None:
        if m.aint("full_attention_interval") == 0:  # (i + 1) % full_attn_interval: SIGFPE
            raise _refuse(path, f"{a}.full_attention_interval is 0 (must be at least 1)")
    if a not in _GDN_ARCHS:
        return
    inner, state, rank = m.aint("ssm.inner_size"), m.aint("ssm.state_size"), m.aint("ssm.time_step_rank")
    if inner is None or state is None or rank is None:
        return  # llama.cpp refuses a missing key itself
    if rank == 0 or inner != state * rank:
        raise _refuse(path, f"{a}.ssm.inner_size {inner} must equal ssm.state_size × ssm.time_step_rank "
                            f"({state} × {rank})")


def _check_kv_heads(path: Path | str, m: _Meta, header: _Header) -> None:
    """A per-layer head_count_kv array must agree with each layer's K projection: the KV cache is sized per layer
    from the array while most graphs build K from the tensor, and ggml_set_rows asserts they match (ggml.c:4014)."""
    a = m.arch
    kv_heads = m.int_or_layers("attention.head_count_kv")
    if a is None or not isinstance(kv_heads, tuple) or m.a("attention.key_length_swa") is not None:
        return
    heads = m.int_or_layers("attention.head_count")
    n_head = heads[0] if isinstance(heads, tuple) and heads else heads
    n_embd = m.aint("embedding_length")
    if not isinstance(n_head, int) or n_head <= 0 or not n_embd:
        return
    head_k = m.aint("attention.key_length") or n_embd // n_head
    widths = {t.name: t.shape[1] for t in header.tensors if len(t.shape) == 2 and t.name.endswith(".attn_k.weight")}
    for il, hkv in enumerate(kv_heads):
        width = widths.get(f"blk.{il}.attn_k.weight")
        if width is not None and width != head_k * hkv:
            raise _refuse(path, f"{a}.attention.head_count_kv is {hkv} at layer {il} but blk.{il}.attn_k.weight "
                                f"has {width} rows ({width // head_k if head_k else '?'} heads of {head_k})")


def _check_tensor_types(path: Path | str, header: _Header) -> None:
    """Weights llama.cpp maps but cannot compute with or point at."""
    for t in header.tensors:
        # ggml-cpu binary ops and matmuls abort or crash on them; only a draft's d2t token map is I64 (eagle3.cpp:312)
        if t.type_id in _INTEGER_TENSOR_TYPES and not t.name.endswith(("d2t", "t2d")):
            raise _refuse(path, f"tensor {t.name!r} has the integer type {_INTEGER_TENSOR_TYPES[t.type_id]}, "
                                "which no model weight uses")
        start = header.data_offset + t.offset
        if start % _TENSOR_ALIGNMENT:  # ggml-backend.cpp:2527, the mapped weights must be 32-byte aligned
            raise _refuse(path, f"tensor {t.name!r} data starts at file offset {start}, not a multiple of "
                                f"{_TENSOR_ALIGNMENT} (general.alignment is {header.alignment})")


def _check_tokens(path: Path | str, header: _Header) -> None:
    """Every token text must be distinct (src/llama-vocab.cpp:2544 asserts id_to_token.size() == token_to_id.size());
    an empty token is renamed to [EMPTY_<id>] first. Reads the token array's bytes once, nothing else."""
    span = header.spans.get("tokenizer.ggml.tokens")
    if span is None:
        return
    start, end = span
    with _open_source(Path(path)) as src:
        raw = src.read(start, end - start)
    seen: dict[bytes, int] = {}
    pos, i, n = 0, 0, len(raw)
    while pos + 8 <= n:
        (length,) = _U64.unpack_from(raw, pos)
        word = raw[pos + 8 : pos + 8 + length] or f"[EMPTY_{i}]".encode()
        pos += 8 + length
        first = seen.setdefault(word, i)
        if first != i:
            shown = word[:40].decode("utf-8", errors="replace")
            raise _refuse(path, f"tokenizer.ggml.tokens has {shown!r} twice (ids {first} and {i})")
        i += 1
    model = header.kv.get("tokenizer.ggml.model")
    if model is not None and model.value == "llama":
        # SentencePiece falls back to a byte token for a piece it cannot form, and llama.cpp's byte_to_token looks
        # it up with token_to_id.at() (llama-vocab.cpp:4009-4014): a missing byte throws std::out_of_range through
        # the C API, which terminates the process on the first such character typed.
        missing = [b for b in range(256) if b"<0x%02X>" % b not in seen and bytes([b]) not in seen]
        if missing:
            raise _refuse(path, f"tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no byte "
                                f"token for {len(missing)} of the 256 bytes (first <0x{missing[0]:02X}>)")


# ---------------------------------------------------------------------------
# Inspection
# ---------------------------------------------------------------------------

IntOrLayers: TypeAlias = int | tuple[int, ...]

# Architectures whose layer layout llama.cpp derives from metadata (src/models/*.cpp load_arch_hparams).
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
_INTERVAL_HYBRID_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next", "qwen4exp", "minimax-01"})
_KV_ZERO_HYBRID_ARCHS = frozenset(
    {
        "bailingmoe3",
        "glm5-next",
        "granitehybrid",
        "jamba",
        "kimi-k3",
        "kimi-linear",
        "lfm2",
        "lfm2moe",
        "plamo2",
    }
)
_NEMOTRON_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
_HYBRID_ARCHS = (
    _INTERVAL_HYBRID_ARCHS | _KV_ZERO_HYBRID_ARCHS | _NEMOTRON_ARCHS | {"falcon-h1", "deepseek4"}
)  # llm_arch_is_hybrid
# fmt: off
_RECURRENT_TYPE: dict[str, str] = {
    "mamba": "mamba", "jamba": "mamba", "mamba2": "mamba2", "nemotron_h": "mamba2",
    "nemotron_h_moe": "mamba2", "granitehybrid": "mamba2", "falcon-h1": "mamba2", "plamo2": "mamba2",
    "qwen35": "gated delta net", "qwen35moe": "gated delta net", "qwen3next": "gated delta net",
    "qwen4exp": "gated delta net",
    "rwkv6": "rwkv", "rwkv6qwen2": "rwkv", "rwkv7": "rwkv", "arwkv7": "rwkv", "lfm2": "short conv",
    "lfm2moe": "short conv", "kimi-linear": "kimi delta attention", "kimi-k3": "kimi delta attention",
    "glm5-next": "kimi delta attention", "minimax-01": "linear attention",
}
# fmt: on
# (pattern, dense_first) used by load_swa_pattern() when the file has no sliding_window_pattern array
# fmt: off
_SWA_DEFAULTS: dict[str, tuple[int, bool]] = {
    "afmoe": (4, False), "cohere2": (4, False), "cohere2moe": (4, True), "exaone-moe": (4, False),
    "exaone4": (4, False), "gemma-embedding": (6, False), "gemma2": (2, False), "gemma3": (6, False),
    "gemma3n": (5, False), "mellum": (4, False), "modern-bert": (3, True), "muse-glimmer": (4, False),
    "olmo2": (4, False), "gpt-oss": (2, False), "plamo3": (8, False), "smallthinker": (4, True),
}
# fmt: on

LAYER_LETTERS: dict[str, str] = {
    "attention": "A",
    "recurrent": "M",
    "moe": "E",
    "ffn": "F",
    "attention+moe": "AE",
    "recurrent+moe": "ME",
    "attention+recurrent": "AM",
    "nextn": "N",
}
_LAYER_LEGEND = "A=attention M=recurrent E=MoE F=dense FFN"


@dataclass(frozen=True)
class SSMParams:
    """Recurrent-layer sizes ({arch}.ssm.*, wkv, shortconv, kda); None where the key is absent."""

    conv_kernel: int | None = None
    inner_size: int | None = None
    state_size: int | None = None
    group_count: int | None = None
    time_step_rank: int | None = None
    wkv_head_size: int | None = None
    token_shift_count: int | None = None
    shortconv_l_cache: int | None = None
    kda_head_dim: int | None = None


@dataclass(frozen=True)
class DraftInfo:
    """Speculative-draft facts: what llama.cpp would auto-detect this file as, and the draft keys."""

    draft_type: str | None = None  # None, "draft-mtp", "dflash", "dflash2", "dspark", "eagle3"
    target_layers: tuple[int, ...] | None = None
    target_hidden_size: int | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    sample_from_anchor: bool | None = None  # absent means true for DSpark
    has_confidence_head: bool | None = None
    causal_attention: bool | None = None
    selector_top_k: int | None = None


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file (with its split shards) says about the model, read from headers only.

    Per-layer values (``head_count``, ``expert_used_count``, ...) are an int when the file stores a scalar and
    a tuple (one entry per block, MTP blocks included) when it stores an array, exactly as stored.
    """

    path: str
    file_size: int
    total_size: int
    gguf_version: int
    alignment: int
    n_kv: int
    n_tensors: int
    architecture: str | None
    name: str | None
    file_type: int | None
    file_type_label: str
    file_type_guessed: bool
    n_params: int
    weights_bytes: int
    tensor_types: dict[str, int]
    tensor_type_bytes: dict[str, int]
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    n_layer_nextn: int
    n_layer_trunk: int | None
    feed_forward_length: IntOrLayers | None
    head_count: IntOrLayers | None
    head_count_kv: IntOrLayers | None  # as stored, else head_count (llama.cpp's default)
    key_length: int | None  # per-head K size: stored, else embedding_length / head_count[0]
    value_length: int | None
    key_length_swa: int | None
    value_length_swa: int | None
    is_mla: bool
    sliding_window: int | None
    swa_layers: tuple[bool, ...] | None
    layer_kinds: tuple[str, ...]
    recurrent_type: str | None
    ssm: SSMParams
    expert_count: int | None
    expert_used_count: IntOrLayers | None
    expert_feed_forward_length: IntOrLayers | None
    expert_shared_count: int | None
    expert_shared_feed_forward_length: int | None
    moe_variant: str | None
    is_mtp_sidecar: bool
    draft: DraftInfo
    vocab_size: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    has_chat_template: bool
    chat_template_names: tuple[str, ...]
    sampling_defaults: dict[str, Any]
    split_count: int
    split_paths: tuple[str, ...]
    split_missing: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    # weight bytes of each block `blk.N.*` (index N; MTP blocks included) and of the output head (`output.*`,
    # `output_norm.*`, or a duplicate of token_embd when tied): what one more GPU layer costs (engine_ext.placement)
    layer_weights_bytes: tuple[int, ...] = field(default=())
    output_weights_bytes: int = 0

    @property
    def draft_type(self) -> str | None:
        """Shortcut for ``draft.draft_type``."""
        return self.draft.draft_type

    @property
    def layout(self) -> str:
        """Compact layer layout, e.g. ``"A M E M E + 1 MTP"``."""
        return layout_string(self.layer_kinds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (tuples become lists) with the derived ``layout`` and ``draft_type``."""
        out = _json_safe(asdict(self))
        assert isinstance(out, dict)
        out["layout"] = self.layout
        out["draft_type"] = self.draft_type
        return out


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


class _Meta:
    """Typed access to one header's metadata."""

    def __init__(self, kv: dict[str, _KV], arch: str | None) -> None:
        self.kv = kv
        self.arch = arch

    def raw(self, key: str) -> Any:
        entry = self.kv.get(key)
        return None if entry is None else entry.value

    def a(self, suffix: str) -> Any:
        return None if self.arch is None else self.raw(f"{self.arch}.{suffix}")

    def int_(self, key: str) -> int | None:
        value = self.raw(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def aint(self, suffix: str) -> int | None:
        return None if self.arch is None else self.int_(f"{self.arch}.{suffix}")

    def str_(self, key: str) -> str | None:
        value = self.raw(key)
        return value if isinstance(value, str) else None

    def bool_(self, key: str) -> bool | None:
        value = self.raw(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str):  # llama.cpp reads these with meta_val_str, so "true" works too
            return value.strip().lower() == "true"
        if isinstance(value, int):
            return value != 0
        return None

    def checked_int(self, key: str, path: Path | str, low: int, high: int) -> int | None:
        """The integer at ``key`` (None if absent), refused unless an integer in [low, high]."""
        entry = self.kv.get(key)
        if entry is None:
            return None
        value = entry.value
        if not isinstance(value, int):
            raise _fail(path, f"{key} must be an integer but is {_type_name(entry)}", _HINT_METADATA)
        if not low <= value <= high:
            raise _fail(path, f"{key} is {value} (must be {low} to {high})", _HINT_METADATA)
        return int(value)

    def checked_layers(
        self, key: str, path: Path | str, high: int, n_layers: int | None
    ) -> None:
        """An integer, or an array of integers with one entry per block, each in [0, high]."""
        entry = self.kv.get(key)
        if entry is None or entry.vtype != int(_VT.ARRAY):
            self.checked_int(key, path, 0, high)
            return
        n_max = _MAX_LAYERS if n_layers is None else n_layers
        if entry.count != n_max and (n_layers is not None or entry.count > n_max):
            want = f"block_count is {n_layers}" if n_layers is not None else f"at most {_MAX_LAYERS} are allowed"
            raise _fail(
                path, f"{key} has {entry.count} entries but {want} (wrong array length)",
                _HINT_METADATA,
            )
        values = entry.value if isinstance(entry.value, list) else []
        bad = next((v for v in values if not isinstance(v, int) or not 0 <= v <= high), None)
        if bad is not None or entry.subtype in (int(_VT.STRING), int(_VT.FLOAT32), int(_VT.FLOAT64)):
            shown = bad if bad is not None else _type_name(entry)
            raise _fail(path, f"{key} has an entry {shown!r} (must be integers 0 to {high})", _HINT_METADATA)

    def int_or_layers(self, suffix: str) -> IntOrLayers | None:
        value = self.a(suffix)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, list) and all(isinstance(v, int | bool) for v in value):
            return tuple(int(v) for v in value)
        return None


def _type_name(entry: _KV) -> str:
    if entry.vtype == int(_VT.ARRAY):
        sub = entry.subtype if entry.subtype is not None else -1
        return f"an array of {_VALUE_TYPE_NAMES.get(sub, str(sub))}"
    return f"a {_VALUE_TYPE_NAMES.get(entry.vtype, str(entry.vtype))}"


def _some(items: Sequence[str], n: int = 3) -> str:
    """The first ``n`` items and how many more, for messages about long lists."""
    shown = ", ".join(str(i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


# (key suffix, largest value, may be a per-layer array) for every count or size inspection reads
_HPARAMS: tuple[tuple[str, int, bool], ...] = (
    ("context_length", _MAX_CONTEXT, False),
    ("embedding_length", _MAX_DIM, False),
    ("feed_forward_length", _MAX_DIM, True),
    ("attention.head_count", _MAX_DIM, True),
    ("attention.head_count_kv", _MAX_DIM, True),
    ("attention.key_length", _MAX_DIM, False),
    ("attention.value_length", _MAX_DIM, False),
    ("attention.key_length_swa", _MAX_DIM, False),
    ("attention.value_length_swa", _MAX_DIM, False),
    ("attention.key_length_mla", _MAX_DIM, False),
    ("attention.value_length_mla", _MAX_DIM, False),
    ("attention.sliding_window", _MAX_CONTEXT, False),
    ("expert_count", _MAX_EXPERTS, False),
    ("expert_used_count", _MAX_EXPERTS, True),
    ("expert_feed_forward_length", _MAX_DIM, True),
    ("expert_shared_count", _MAX_EXPERTS, False),
    ("expert_shared_feed_forward_length", _MAX_DIM, False),
    ("leading_dense_block_count", _MAX_LAYERS, False),
    ("interleave_moe_layer_step", _MAX_LAYERS, False),
    ("full_attention_interval", _MAX_LAYERS, False),
    ("vocab_size", _MAX_CONTEXT, False),
    ("ssm.conv_kernel", _MAX_DIM, False),
    ("ssm.inner_size", _MAX_DIM, False),
    ("ssm.state_size", _MAX_DIM, False),
    ("ssm.group_count", _MAX_DIM, False),
    ("ssm.time_step_rank", _MAX_DIM, False),
    ("wkv.head_size", _MAX_DIM, False),
    ("token_shift_count", _MAX_DIM, False),
    ("shortconv.l_cache", _MAX_DIM, False),
    ("kda.head_dim", _MAX_DIM, False),
    ("target_hidden_size", _MAX_DIM, False),
    ("block_size", _MAX_DIM, False),
    ("selector_top_k", _MAX_DIM, False),
)


def _check_hparams(path: Path | str, m: _Meta) -> None:
    """Refuse every count and size inspection uses that llama.cpp would refuse, before anything loops on it."""
    if m.arch is None:
        return
    a = m.arch
    block_count = m.checked_int(f"{a}.block_count", path, 0, _MAX_LAYERS)
    m.checked_int(f"{a}.nextn_predict_layers", path, 0, _MAX_LAYERS if block_count is None else block_count)
    for suffix, high, per_layer in _HPARAMS:
        if per_layer:
            m.checked_layers(f"{a}.{suffix}", path, high, block_count)
        else:
            m.checked_int(f"{a}.{suffix}", path, 0, high)
    expert_count = m.aint("expert_count")
    used = m.int_or_layers("expert_used_count")
    top = max(used) if isinstance(used, tuple) and used else used
    if expert_count is not None and isinstance(top, int) and top > expert_count:
        raise _fail(path, f"{a}.expert_used_count {top} exceeds expert_count {expert_count}", _HINT_METADATA)
    target = m.kv.get(f"{a}.target_layers")
    if target is not None:
        values = target.value if isinstance(target.value, list) else None
        if (
            target.vtype != int(_VT.ARRAY)
            or values is None
            or len(values) > _MAX_LAYERS
            or not all(isinstance(v, int) and 0 <= v < _MAX_LAYERS for v in values)
        ):
            raise _fail(
                path,
                f"{a}.target_layers must be an array of at most {_MAX_LAYERS} layer indices below {_MAX_LAYERS} "
                f"but is {_type_name(target)}" + (f" of {target.count}" if target.vtype == int(_VT.ARRAY) else ""),
                _HINT_METADATA,
            )
    for suffix in ("attention.recurrent_layers", "attention.sliding_window_pattern"):
        entry = m.kv.get(f"{a}.{suffix}")
        if entry is not None and entry.vtype == int(_VT.ARRAY) and entry.count > _MAX_LAYERS:
            raise _fail(path, f"{a}.{suffix} has {entry.count} entries (at most {_MAX_LAYERS})", _HINT_METADATA)


def _per_layer(value: IntOrLayers | None, n: int, default: int = 0) -> list[int]:
    """Broadcast a scalar, or pad/trim an array, to ``n`` entries (wrong lengths are reported separately)."""
    if value is None:
        return [default] * n
    if isinstance(value, int):
        return [value] * n
    return [value[i] if i < len(value) else 0 for i in range(n)]


def layout_string(kinds: Sequence[str]) -> str:
    """Letters for the trunk (periodic runs folded as ``(M M M A)×8``) plus ``+ N MTP`` for NextN blocks."""
    trunk = [LAYER_LETTERS.get(k, "?") for k in kinds if k != "nextn"]
    n_nextn = sum(1 for k in kinds if k == "nextn")
    if not trunk:
        text = ""
    elif len(trunk) <= 16:
        text = " ".join(trunk)
    else:
        text = _fold_layout(trunk)
    if n_nextn:
        text = f"{text} + {n_nextn} MTP" if text else f"{n_nextn} MTP"
    return text


def _fold_layout(letters: list[str]) -> str:
    n = len(letters)
    for period in range(1, 9):
        if n % period == 0 and letters == letters[:period] * (n // period):
            unit = " ".join(letters[:period])
            return f"{unit}×{n}" if period == 1 else f"({unit})×{n // period}"
    runs: list[str] = []
    i = 0
    while i < n:
        j = i
        while j < n and letters[j] == letters[i]:
            j += 1
        runs.append(letters[i] if j - i == 1 else f"{letters[i]}×{j - i}")
        i = j
    return " ".join(runs)


def _split_siblings(path: Path, split_count: int) -> list[Path] | None:
    match = _SPLIT_NAME.match(path.name)
    if match is None:
        return None
    prefix = match.group("prefix")
    return [path.with_name(f"{prefix}-{i:05d}-of-{split_count:05d}.gguf") for i in range(1, split_count + 1)]


_UNEXPECTED = (
    ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError, MemoryError,
    RecursionError, UnicodeError, struct.error,
)


def _guarded(path: Path | str, fn: Callable[[], _T]) -> _T:
    """Last-resort net: any unexpected exception from reading a header becomes a short GGUFValidationError."""
    try:
        return fn()
    except GGUFError:
        raise
    except _UNEXPECTED as exc:
        problem = f"the header cannot be inspected ({type(exc).__name__}: {exc})"
        raise _fail(path, problem, _HINT_CORRUPT) from None


def _split_fields(path: Path | str, meta: _Meta) -> tuple[int, int]:
    """split.count and split.no, checked (llama_split_path names shards -%05d-of-%05d)."""
    count = meta.checked_int("split.count", path, 0, _MAX_SPLITS)
    number = meta.checked_int("split.no", path, 0, _MAX_SPLITS - 1)
    meta.checked_int("split.tensors.count", path, 0, _MAX_COUNT)
    split_count = count or 1
    split_no = number or 0
    if split_no >= split_count:
        raise _fail(path, f"split.no is {split_no} but split.count is {split_count}", _HINT_CORRUPT)
    return split_count, split_no


def inspect_gguf(path: Path) -> GGUFInfo:
    """Validate and describe a GGUF model from its header(s); weights are never read.

    For a split model pass any shard: the first shard's metadata is used and the sizes and tensors of every
    shard found beside it are summed; missing shards are listed in ``split_missing``. Raises GGUFError (or its
    subclass GGUFValidationError) and nothing else, with a one-line message of at most 300 characters.
    """
    path = Path(path)
    return _guarded(path, lambda: _inspect_gguf(path))


def _inspect_gguf(path: Path) -> GGUFInfo:
    head = _parse(path)
    meta = _Meta(head.kv, None)
    split_count, split_no = _split_fields(path, meta)
    warnings: list[str] = []
    headers = [head]
    split_paths = [str(path)]
    missing: list[str] = []
    if split_count > 1:
        match = _SPLIT_NAME.match(path.name)
        if match is not None and int(match.group("count")) != split_count:
            raise _fail(
                path,
                f"split.count says {split_count} shards but the file name says {int(match.group('count'))} "
                "(llama.cpp refuses the name)",
                "re-download the shards, or restore their original names",
            )
        siblings = _split_siblings(path, split_count)
        if split_no != 0:
            if siblings is not None and siblings[0].name == path.name:
                raise _fail(
                    path,
                    f"split.no says this is shard {split_no + 1} of {split_count}, but its name says it is the first",
                    "the file is corrupt, re-download it",
                )
            if siblings is not None and siblings[0].exists():
                return _inspect_gguf(siblings[0])  # its own split.no is checked against its name there
            raise _error(
                path,
                f"is shard {split_no + 1} of {split_count} of a split model and the first shard "
                f"({siblings[0].name if siblings else '…-00001-of-….gguf'}) is not beside it",
                "download all shards and pass the -00001- file",
            )
        if siblings is None:
            warnings.append(
                f"split model with {split_count} shards, but the file name does not follow "
                "<name>-00001-of-0000N.gguf, so the other shards cannot be located"
            )
            missing = [f"shard {i}" for i in range(2, split_count + 1)]
        else:
            for index, sibling in enumerate(siblings[1:], start=1):
                if not sibling.exists():
                    missing.append(str(sibling))
                    continue
                shard = _parse(sibling)
                shard_no = _Meta(shard.kv, None).int_("split.no")
                if shard_no is not None and shard_no != index:
                    warnings.append(f"{sibling.name} says it is shard {shard_no + 1}, expected {index + 1}")
                headers.append(shard)
                split_paths.append(str(sibling))
        if missing:
            warnings.append(f"{len(missing)} of {split_count} shards are missing: " + _some(missing))
        expected_tensors = meta.int_("split.tensors.count")
        found_tensors = sum(len(h.tensors) for h in headers)
        if not missing and expected_tensors is not None and expected_tensors != found_tensors:
            warnings.append(f"split.tensors.count is {expected_tensors} but the shards hold {found_tensors}")
    return _build_info(path, headers, split_count, tuple(split_paths), tuple(missing), warnings)


def _build_info(
    path: Path,
    headers: list[_Header],
    split_count: int,
    split_paths: tuple[str, ...],
    missing: tuple[str, ...],
    warnings: list[str],
) -> GGUFInfo:
    head = headers[0]
    arch_value = head.kv.get("general.architecture")
    arch = arch_value.value if arch_value is not None and isinstance(arch_value.value, str) else None
    m = _Meta(head.kv, arch)
    _check_hparams(path, m)
    tensors = [t for h in headers for t in h.tensors]
    names = {t.name for t in tensors}

    # tensor statistics
    counts: Counter[str] = Counter()
    type_bytes: Counter[str] = Counter()
    for t in tensors:
        type_name = _GGML_TYPES[t.type_id][0]
        counts[type_name] += 1
        type_bytes[type_name] += t.n_bytes
    file_type, label, guessed = _file_type(m, tensors)

    # geometry
    block_count = m.aint("block_count")
    n_nextn = m.aint("nextn_predict_layers") or 0
    n_trunk = None if block_count is None else max(block_count - n_nextn, 0)
    n_embd = m.aint("embedding_length")
    head_count = m.int_or_layers("attention.head_count")
    head_count_kv = m.int_or_layers("attention.head_count_kv")
    if head_count_kv is None:
        head_count_kv = head_count
    n_head0 = (head_count if isinstance(head_count, int) else (head_count[0] if head_count else 0)) or 0
    key_length = m.aint("attention.key_length")
    value_length = m.aint("attention.value_length")
    if n_embd and n_head0:
        key_length = key_length if key_length is not None else n_embd // n_head0
        value_length = value_length if value_length is not None else n_embd // n_head0
    expert_used = m.int_or_layers("expert_used_count")
    expert_ff = m.int_or_layers("expert_feed_forward_length")
    feed_forward = m.int_or_layers("feed_forward_length")
    expert_count = m.aint("expert_count")

    layer_kinds = _layer_kinds(m, block_count, n_nextn, head_count_kv, feed_forward, expert_used, expert_ff)
    moe_variant = _moe_variant(arch, expert_count, expert_used, expert_ff, n_trunk)
    if expert_count and block_count:
        used = _per_layer(expert_used, block_count)
        if arch == "nemotron_h_moe" and n_nextn and used[0] == 0:
            warnings.append(
                "expert_used_count[0] is 0: llama.cpp's MTP and warm-up paths use layer 0's top-k and crash "
                "(SIGFPE); keep the first entry non-zero"
            )

    recurrent_type = None
    if any("recurrent" in kind for kind in layer_kinds):
        recurrent_type = _RECURRENT_TYPE.get(arch or "", "recurrent")
    sliding_window = m.aint("attention.sliding_window")
    swa_layers = _swa_layers(m, arch, sliding_window, block_count, n_trunk or 0)

    is_sidecar = n_nextn > 0 and "blk.0.attn_norm.weight" not in names
    draft = _draft_info(m, arch, block_count, names)
    if draft.draft_type in ("dflash", "dflash2", "dspark"):
        if draft.target_layers is None:
            warnings.append("dflash draft without dflash.target_layers; llama.cpp refuses to load it")
        if draft.mask_token_id is None:
            warnings.append("dflash draft without tokenizer.ggml.mask_token_id; drafting needs a mask token")

    n_blocks = block_count or 0
    layer_bytes = [0] * n_blocks
    output_bytes = 0
    for t in tensors:
        if t.name.startswith("blk."):
            index = t.name.split(".", 2)[1]
            if index.isdigit() and int(index) < n_blocks:
                layer_bytes[int(index)] += t.n_bytes
        elif t.name.startswith(("output.", "output_norm.")):
            output_bytes += t.n_bytes
    if "output.weight" not in names and "token_embd.weight" in names:
        # tied embeddings: llama.cpp loads a duplicate of token_embd as the output head, on the output's device
        output_bytes += next(t.n_bytes for t in tensors if t.name == "token_embd.weight")

    tokens = head.kv.get("tokenizer.ggml.tokens")
    vocab_size = m.aint("vocab_size")
    if vocab_size is None and tokens is not None and tokens.vtype == int(_VT.ARRAY):
        vocab_size = tokens.count
    template_names = tuple(
        sorted(k.removeprefix("tokenizer.chat_template.") for k in head.kv if k.startswith("tokenizer.chat_template."))
    )
    sampling = {
        k.removeprefix("general.sampling."): v.value
        for k, v in head.kv.items()
        if k.startswith("general.sampling.") and v.vtype != int(_VT.ARRAY)
    }

    return GGUFInfo(
        path=str(path),
        file_size=head.file_size,
        total_size=sum(h.file_size for h in headers),
        gguf_version=head.version,
        alignment=head.alignment,
        n_kv=len(head.kv),
        n_tensors=len(tensors),
        architecture=arch,
        name=m.str_("general.name"),
        file_type=file_type,
        file_type_label=label,
        file_type_guessed=guessed,
        n_params=sum(t.n_elements for t in tensors),
        weights_bytes=sum(t.n_bytes for t in tensors),
        tensor_types=dict(counts.most_common()),
        tensor_type_bytes=dict(type_bytes.most_common()),
        context_length=m.aint("context_length"),
        embedding_length=n_embd,
        block_count=block_count,
        n_layer_nextn=n_nextn,
        n_layer_trunk=n_trunk,
        feed_forward_length=feed_forward,
        head_count=head_count,
        head_count_kv=head_count_kv,
        key_length=key_length,
        value_length=value_length,
        key_length_swa=m.aint("attention.key_length_swa"),
        value_length_swa=m.aint("attention.value_length_swa"),
        is_mla=bool(m.aint("attention.key_length_mla")) and bool(m.aint("attention.value_length_mla")),
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        layer_kinds=layer_kinds,
        recurrent_type=recurrent_type,
        ssm=SSMParams(
            conv_kernel=m.aint("ssm.conv_kernel"),
            inner_size=m.aint("ssm.inner_size"),
            state_size=m.aint("ssm.state_size"),
            group_count=m.aint("ssm.group_count"),
            time_step_rank=m.aint("ssm.time_step_rank"),
            wkv_head_size=m.aint("wkv.head_size"),
            token_shift_count=m.aint("token_shift_count"),
            shortconv_l_cache=m.aint("shortconv.l_cache"),
            kda_head_dim=m.aint("kda.head_dim"),
        ),
        expert_count=expert_count,
        expert_used_count=expert_used,
        expert_feed_forward_length=expert_ff,
        expert_shared_count=m.aint("expert_shared_count"),
        expert_shared_feed_forward_length=m.aint("expert_shared_feed_forward_length"),
        moe_variant=moe_variant,
        is_mtp_sidecar=is_sidecar,
        draft=draft,
        vocab_size=vocab_size,
        tokenizer_model=m.str_("tokenizer.ggml.model"),
        tokenizer_pre=m.str_("tokenizer.ggml.pre"),
        bos_token_id=m.int_("tokenizer.ggml.bos_token_id"),
        eos_token_id=m.int_("tokenizer.ggml.eos_token_id"),
        has_chat_template="tokenizer.chat_template" in head.kv,
        chat_template_names=template_names,
        sampling_defaults=sampling,
        split_count=split_count,
        split_paths=split_paths,
        split_missing=missing,
        layer_weights_bytes=tuple(layer_bytes),
        output_weights_bytes=output_bytes,
        warnings=tuple(warnings),
    )


def _file_type(m: _Meta, tensors: Sequence[_Tensor]) -> tuple[int | None, str, bool]:
    """general.file_type and its llama.cpp label, else llama.cpp's guess from the commonest tensor type."""
    stored = m.int_("general.file_type")
    if stored is not None:
        base = stored & ~_FTYPE_GUESSED
        label = _FTYPE_LABELS.get(base, "unknown, may not work")
        guessed = bool(stored & _FTYPE_GUESSED)
        return stored, ("(guessed) " + label if guessed else label), guessed
    if not tensors:
        return None, "unknown (no tensors)", True
    # llama.cpp walks tensors in name order and keeps the first type to reach the highest count
    counts: Counter[int] = Counter()
    best_type, best_count = 0, 0
    for t in sorted(tensors, key=lambda t: t.name):
        counts[t.type_id] += 1
        if counts[t.type_id] > best_count:
            best_type, best_count = t.type_id, counts[t.type_id]
    ftype = _FTYPE_FROM_TENSOR_TYPE.get(best_type, 0)
    return ftype, "(guessed) " + _FTYPE_LABELS.get(ftype, "unknown, may not work"), True


def _moe_layers(m: _Meta, n_layers: int, expert_used: IntOrLayers | None, expert_ff: IntOrLayers | None) -> list[bool]:
    if not m.aint("expert_count"):
        return [False] * n_layers
    used = _per_layer(expert_used, n_layers, default=1)
    ff = _per_layer(expert_ff, n_layers, default=1) if isinstance(expert_ff, tuple) else [1] * n_layers
    dense_lead = m.aint("leading_dense_block_count") or 0
    step = m.aint("interleave_moe_layer_step") or 0
    return [
        used[il] > 0 and ff[il] > 0 and il >= dense_lead and (step <= 1 or (il + 1) % step == 0)
        for il in range(n_layers)
    ]


def _layer_kinds(
    m: _Meta,
    block_count: int | None,
    n_nextn: int,
    head_count_kv: IntOrLayers | None,
    feed_forward: IntOrLayers | None,
    expert_used: IntOrLayers | None,
    expert_ff: IntOrLayers | None,
) -> tuple[str, ...]:
    """One kind per block, following each architecture's load_arch_hparams() in llama.cpp."""
    if not block_count or block_count <= 0 or block_count > 100_000:
        return ()
    arch = m.arch or ""
    n_trunk = max(block_count - n_nextn, 0)
    kv_heads = _per_layer(head_count_kv, block_count)
    n_ff = _per_layer(feed_forward, block_count)
    moe = _moe_layers(m, block_count, expert_used, expert_ff)
    kinds: list[str] = []
    recurrent = _recurrent_flags(m, arch, block_count, n_trunk, kv_heads)
    for il in range(n_trunk):
        if arch in _NEMOTRON_ARCHS:
            if n_ff[il] > 0:
                kinds.append("moe" if m.aint("expert_count") else "ffn")
            else:
                kinds.append("attention" if kv_heads[il] > 0 else "recurrent")
            continue
        if arch == "falcon-h1":
            mixer = "attention+recurrent"
        elif arch in _RECURRENT_ARCHS:
            mixer = "recurrent"
        else:
            mixer = "recurrent" if recurrent[il] else "attention"
        kinds.append(f"{mixer}+moe" if moe[il] and mixer != "attention+recurrent" else mixer)
    kinds.extend(["nextn"] * (block_count - n_trunk))
    return tuple(kinds)


def _recurrent_flags(m: _Meta, arch: str, block_count: int, n_trunk: int, kv_heads: list[int]) -> list[bool]:
    if arch in _INTERVAL_HYBRID_ARCHS:
        stored = m.a("attention.recurrent_layers")
        if isinstance(stored, list) and stored:
            if len(stored) == block_count and all(v in (0, 1, True, False) for v in stored):
                return [bool(v) and il < n_trunk for il, v in enumerate(stored)]
            indices = {int(v) for v in stored if isinstance(v, int)}
            return [il in indices and il < n_trunk for il in range(block_count)]
        interval = m.aint("full_attention_interval") or 4
        return [il < n_trunk and (il + 1) % interval != 0 for il in range(block_count)]
    if arch in _KV_ZERO_HYBRID_ARCHS:
        return [il < n_trunk and kv_heads[il] == 0 for il in range(block_count)]
    return [False] * block_count


def _moe_variant(
    arch: str | None,
    expert_count: int | None,
    expert_used: IntOrLayers | None,
    expert_ff: IntOrLayers | None,
    n_trunk: int | None,
) -> str | None:
    if not expert_count:
        return None
    if arch == "nemotron_h_moe":
        # llama.cpp's own discriminator (src/models/nemotron-h.cpp): any trunk top-k differing from layer 0's
        trunk = list(expert_used[: n_trunk or len(expert_used)]) if isinstance(expert_used, tuple) else []
        if any(v != trunk[0] for v in trunk[1:]):
            return "Puzzle (heterogeneous expert_used_count)"
        return "Super (uniform expert_used_count)" if n_trunk == 88 else "uniform expert_used_count"
    varied = [
        key
        for key, value in (("expert_used_count", expert_used), ("expert_feed_forward_length", expert_ff))
        if isinstance(value, tuple) and len({v for v in value if v}) > 1
    ]
    if varied:
        return "heterogeneous per-layer experts (" + ", ".join(varied) + ")"
    return None


def _swa_layers(
    m: _Meta, arch: str | None, sliding_window: int | None, block_count: int | None, n_trunk: int
) -> tuple[bool, ...] | None:
    if not sliding_window or not block_count or block_count > 100_000:
        return None
    stored = m.a("attention.sliding_window_pattern")
    if isinstance(stored, list):
        flags = [bool(v) for v in stored[:block_count]]
        return tuple(flags + [False] * (block_count - len(flags)))
    if isinstance(stored, int) and not isinstance(stored, bool):
        pattern, dense_first = stored, _SWA_DEFAULTS.get(arch or "", (0, False))[1]
    elif arch in _SWA_DEFAULTS:
        pattern, dense_first = _SWA_DEFAULTS[arch]
    else:
        return None
    flags = []
    for il in range(block_count):
        if il >= n_trunk:
            flags.append(False)
        elif pattern == 0:
            flags.append(True)
        elif dense_first:
            flags.append(il % pattern != 0)
        else:
            flags.append(il % pattern < pattern - 1)
    return tuple(flags)


def _draft_info(m: _Meta, arch: str | None, block_count: int | None, names: set[str]) -> DraftInfo:
    """As common_speculative_types_from_gguf(): dflash -> dspark/dflash(2); a last-block NextN -> MTP."""
    draft_type: str | None = None
    if arch == "dflash":
        if "markov_w1.weight" in names:
            draft_type = "dspark"
        elif "selector_hidden.weight" in names or (m.aint("selector_top_k") or 0) > 0:
            draft_type = "dflash2"
        else:
            draft_type = "dflash"
    elif arch == "eagle3":
        draft_type = "eagle3"
    elif block_count and f"blk.{block_count - 1}.nextn.eh_proj.weight" in names:
        draft_type = "draft-mtp"
    target = m.a("target_layers")
    return DraftInfo(
        draft_type=draft_type,
        target_layers=tuple(int(v) for v in target) if isinstance(target, list) else None,
        target_hidden_size=m.aint("target_hidden_size"),
        block_size=m.aint("block_size") if arch in ("dflash", "eagle3") else None,
        mask_token_id=m.int_("tokenizer.ggml.mask_token_id"),
        sample_from_anchor=m.bool_(f"{arch}.sample_from_anchor") if arch else None,
        has_confidence_head=m.bool_(f"{arch}.has_confidence_head") if arch else None,
        causal_attention=m.bool_(f"{arch}.attention.causal") if arch == "dflash" else None,
        selector_top_k=m.aint("selector_top_k") if arch == "dflash" else None,
    )


_MAX_TEMPLATE = 1 << 20  # bytes of a chat template read_chat_template reads; real templates are under 64 KiB


def read_chat_template(path: Path, name: str | None = None) -> str | None:
    """The file's ``tokenizer.chat_template`` (or the named ``tokenizer.chat_template.<name>``), if any.

    Only that string is read (the header's other strings are not kept); one longer than 1 MiB is refused with a
    GGUFValidationError rather than read.
    """
    path = Path(path)
    head = _parse(path)
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    entry, span = head.kv.get(key), head.spans.get(key)
    if entry is None or entry.vtype != int(_VT.STRING) or span is None:
        return None
    start, end = span
    if end - start > _MAX_TEMPLATE:
        raise _fail(path, f"{key} is {end - start} bytes long (at most {_MAX_TEMPLATE >> 20} MiB is read)",
                    "the chat template is not usable; re-download or re-convert the model")
    try:
        with _open_source(path) as src:
            return src.read(start, end - start).decode("utf-8", errors="replace")
    except OSError as exc:
        raise _error(path, f"cannot be read ({exc.strerror or exc})", "check the file and the disk") from None


# ---------------------------------------------------------------------------
# Memory estimate
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes needed to run a model at a context length; see estimate_memory() for the formulas."""

    n_ctx: int
    n_ctx_cells: int
    n_seq: int
    kv_type_bytes: float
    weights_bytes: int
    kv_bytes: int
    recurrent_bytes: int
    compute_bytes: int
    total_bytes: int
    n_kv_layers: int
    n_recurrent_layers: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        out = _json_safe(asdict(self))
        assert isinstance(out, dict)
        return out


def _pad(x: int, n: int) -> int:
    return -(-x // n) * n


def _recurrent_row_floats(info: GGUFInfo) -> tuple[int, int]:
    """llama_hparams::n_embd_r() and n_embd_s(): conv/shift state and recurrent state, in floats per layer."""
    s = info.ssm
    n_embd = info.embedding_length or 0
    n_head0 = _per_layer(info.head_count, 1)[0]
    if s.wkv_head_size:  # RWKV
        return (s.token_shift_count or 2) * n_embd, n_embd * s.wkv_head_size
    if s.kda_head_dim:  # Kimi delta attention
        conv = (s.conv_kernel - 1) if s.conv_kernel else 3
        return 3 * conv * n_head0 * s.kda_head_dim, s.kda_head_dim * s.kda_head_dim * n_head0
    d_inner, d_state, groups = s.inner_size or 0, s.state_size or 0, s.group_count or 0
    if s.shortconv_l_cache:  # LFM2
        return n_embd * (s.shortconv_l_cache - 1), d_state * d_inner
    # mamba/mamba2 and gated delta net (d_inner = S*Hv, groups = Hk, state = S: conv (2kd+vd), state S*S*Hv)
    conv = (s.conv_kernel - 1) if s.conv_kernel else 0
    return conv * (d_inner + 2 * groups * d_state), d_state * d_inner


def kv_bytes_per_layer(info: GGUFInfo, cells: int, *, kv_type_bytes: float = 2.0, n_ubatch: int = 512) -> list[float]:
    """KV cache bytes of each block at ``cells`` cache cells (0 for blocks without attention); see estimate_memory."""
    kinds = info.layer_kinds
    n_layers = len(kinds)
    hybrid = (info.architecture or "") in _HYBRID_ARCHS
    kv_heads = _per_layer(info.head_count_kv, n_layers)
    k_len, v_len = info.key_length or 0, info.value_length or 0
    swa = info.swa_layers or ()
    swa_cells = min(cells, _pad((info.sliding_window or 0) + n_ubatch, 256))
    out = [0.0] * n_layers
    for il, kind in enumerate(kinds):
        if info.is_mtp_sidecar:
            has_kv = kind == "nextn"
        else:
            has_kv = "attention" in kind or (kind == "nextn" and not hybrid)
        if not has_kv or kv_heads[il] <= 0:
            continue
        is_swa = il < len(swa) and swa[il]
        k = (info.key_length_swa or k_len) if is_swa else k_len
        v = 0 if info.is_mla else ((info.value_length_swa or v_len) if is_swa else v_len)
        out[il] = (swa_cells if is_swa else cells) * kv_heads[il] * (k + v) * kv_type_bytes
    return out


def recurrent_bytes_per_layer(info: GGUFInfo, n_seq: int = 1, n_rs_seq: int = 0) -> int:
    """Recurrent-state bytes of one recurrent block (F32 conv + state rows); see estimate_memory."""
    r_floats, s_floats = _recurrent_row_floats(info)
    return (r_floats + s_floats) * 4 * max(1, n_seq) * (1 + max(0, n_rs_seq))


def estimate_memory(
    info: GGUFInfo,
    n_ctx: int,
    *,
    kv_type_bytes: float = 2.0,
    n_seq: int = 1,
    n_rs_seq: int = 0,
    n_ubatch: int = 512,
    flash_attn: bool = False,
) -> MemoryEstimate:
    """Estimate host+device bytes for weights, KV cache, recurrent state and compute at ``n_ctx``.

    - weights: the tensor data size (all shards).
    - KV cache: cells = n_ctx padded to 256 (shared by the ``n_seq`` sequences); for every attention layer
      ``cells * n_head_kv(il) * (key_length + value_length) * kv_type_bytes`` (MLA: K only). Hybrid models
      count trunk attention layers only; plain transformers count every block, NextN included, as llama.cpp's
      KV cache does; an ``mtp-`` sidecar counts its NextN blocks only (its MTP context's cache). Sliding-window
      layers hold ``min(cells, pad256(window + n_ubatch))`` cells.
    - recurrent state (F32): per recurrent layer ``(n_embd_r + n_embd_s) * 4 * n_seq * (1 + n_rs_seq)`` with
      mamba2/GDN ``n_embd_r = (d_conv-1) * (d_inner + 2*G*N)`` and ``n_embd_s = N * d_inner`` (GDN: N = S,
      d_inner = S*Hv, G = Hk, i.e. conv ``(d_conv-1)*(2kd+vd)`` and state ``S*S*Hv``), as llama-hparams.cpp.
    - compute: llama.cpp's graph buffer for one ubatch, ``max(layer, output)`` with layer
      ``scores + n_ub*4*(2*ff_max + n_embd)``, scores ``n_ub*cells*(n_head+1)*4`` (flash attention:
      ``n_ub*cells*2``), output ``n_ub*4*(n_vocab + 2*n_embd)``; ff_max covers ``n_ff_exp * n_expert_used``.
      Fitted to the CPU backend (within a few % on dense test models); other backends differ somewhat.
    """
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    return _guarded(
        info.path,
        lambda: _estimate_memory(
            info, n_ctx, kv_type_bytes=kv_type_bytes, n_seq=n_seq, n_rs_seq=n_rs_seq, n_ubatch=n_ubatch,
            flash_attn=flash_attn,
        ),
    )


def _estimate_memory(
    info: GGUFInfo, n_ctx: int, *, kv_type_bytes: float, n_seq: int, n_rs_seq: int, n_ubatch: int, flash_attn: bool
) -> MemoryEstimate:
    n_seq = max(1, n_seq)
    cells = _pad(n_ctx, 256)
    n_ub = min(n_ubatch, cells)
    kinds = info.layer_kinds
    n_layers = len(kinds)
    notes: list[str] = []
    sidecar = info.is_mtp_sidecar
    if sidecar:
        notes.append("mtp- sidecar: runs in an MTP context whose cache holds only the NextN block(s)")
    per_layer_kv = kv_bytes_per_layer(info, cells, kv_type_bytes=kv_type_bytes, n_ubatch=n_ubatch)
    kv_bytes = sum(per_layer_kv)
    n_kv_layers = sum(1 for b in per_layer_kv if b > 0)
    k_len = info.key_length or 0
    if n_layers and not k_len and n_kv_layers:
        notes.append("head size unknown: KV cache not estimated")

    n_recurrent = 0 if sidecar else sum(1 for k in kinds if "recurrent" in k)
    recurrent_bytes = n_recurrent * recurrent_bytes_per_layer(info, n_seq, n_rs_seq)
    if n_recurrent and info.architecture == "minimax-01":
        notes.append("minimax-01 linear-attention state is not estimated")

    n_embd = info.embedding_length or 0
    ff = _per_layer(info.feed_forward_length, n_layers)
    ff_exp = _per_layer(info.expert_feed_forward_length, n_layers)
    used = _per_layer(info.expert_used_count, n_layers)
    ff_max = max([0, *ff, *(a * b for a, b in zip(ff_exp, used, strict=True))])
    n_head_max = max([0, *_per_layer(info.head_count, n_layers)])
    # peak of the layer graph (KQ scores for all heads + KQ mask, F32; flash attention: an F16 mask) with the
    # FFN activations, or of the output head (logits) with two hidden-state buffers
    scores = n_ub * cells * (2 if flash_attn else (n_head_max + 1) * 4) if n_kv_layers else 0
    layer_peak = scores + n_ub * 4 * (2 * ff_max + n_embd)
    output_peak = n_ub * 4 * ((info.vocab_size or 0) + 2 * n_embd)
    compute_bytes = max(layer_peak, output_peak)

    total = info.weights_bytes + int(kv_bytes) + recurrent_bytes + compute_bytes
    return MemoryEstimate(
        n_ctx=n_ctx,
        n_ctx_cells=cells,
        n_seq=n_seq,
        kv_type_bytes=kv_type_bytes,
        weights_bytes=info.weights_bytes,
        kv_bytes=int(kv_bytes),
        recurrent_bytes=recurrent_bytes,
        compute_bytes=compute_bytes,
        total_bytes=total,
        n_kv_layers=n_kv_layers,
        n_recurrent_layers=n_recurrent,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------
# Human-readable description
# ---------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TiB"


def format_count(n: int) -> str:
    """``7_615_616_512`` -> ``"7.62 B"``."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {suffix}"
    return str(n)


def _fmt_layers(value: IntOrLayers | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else "[" + ", ".join(str(v) for v in value) + "]"


def describe(info: GGUFInfo, estimate: MemoryEstimate | None = None) -> list[str]:
    """Lines for ``llmtui info``: architecture, size, quant, layers, experts, MTP, draft keys, memory."""
    return _guarded(info.path, lambda: _describe(info, estimate))


def _describe(info: GGUFInfo, estimate: MemoryEstimate | None) -> list[str]:
    lines: list[str] = []

    def add(label: str, text: str) -> None:
        lines.append(f"{label:<12}{text}")

    size = format_bytes(info.total_size)
    add("File", f"{info.path} ({size}, GGUF v{info.gguf_version})")
    if info.split_count > 1:
        state = "all present" if not info.split_missing else "missing: " + _some(info.split_missing)
        add("Split", f"{info.split_count} shards ({state})")
    add("Model", f"{info.architecture or '(no architecture)'}" + (f'  "{info.name}"' if info.name else ""))
    weights = format_bytes(info.weights_bytes)
    add("Params", f"{format_count(info.n_params)} in {info.n_tensors} tensors ({weights})")
    ftype = ""
    if info.file_type is not None and not info.file_type_guessed:
        ftype = f" (general.file_type {info.file_type})"
    add("Quant", info.file_type_label + ftype)
    types = ", ".join(f"{name}×{count}" for name, count in info.tensor_types.items())
    add("Tensors", types or "none")
    if info.context_length is not None:
        add("Context", f"{info.context_length} tokens (trained)")
    if info.block_count is not None:
        add("Layers", f"{info.block_count} blocks: {info.layout}  ({_LAYER_LEGEND})")
    dims = []
    if info.embedding_length is not None:
        dims.append(f"embd {info.embedding_length}")
    if info.head_count is not None:
        dims.append(f"heads {_fmt_layers(info.head_count)}")
    if info.head_count_kv is not None and info.head_count_kv != info.head_count:
        dims.append(f"kv heads {_fmt_layers(info.head_count_kv)}")
    if info.key_length:
        v_len = "" if info.value_length == info.key_length else f"/{info.value_length}"
        dims.append(f"head dim {info.key_length}{v_len}")
    if info.feed_forward_length is not None:
        dims.append(f"ffn {_fmt_layers(info.feed_forward_length)}")
    if info.sliding_window:
        n_swa = sum(info.swa_layers or ())
        where = f" on {n_swa} layers" if info.swa_layers else ""
        dims.append(f"sliding window {info.sliding_window}{where}")
    if info.is_mla:
        dims.append("MLA")
    if dims:
        add("Dims", ", ".join(dims))
    if info.recurrent_type:
        s = info.ssm
        parts = [f"{k} {v}" for k, v in asdict(s).items() if v is not None]
        add("Recurrent", f"{info.recurrent_type}" + (f": {', '.join(parts)}" if parts else ""))
    if info.expert_count:
        experts = [f"{info.expert_count} experts"]
        experts.append(f"expert_used_count {_fmt_layers(info.expert_used_count)}")
        if info.expert_feed_forward_length is not None:
            experts.append(f"expert_feed_forward_length {_fmt_layers(info.expert_feed_forward_length)}")
        if info.expert_shared_count:
            experts.append(f"{info.expert_shared_count} shared")
        if info.expert_shared_feed_forward_length:
            experts.append(f"shared ffn {info.expert_shared_feed_forward_length}")
        add("Experts", "; ".join(experts))
        if info.moe_variant:
            add("MoE", info.moe_variant)
    if info.n_layer_nextn:
        kind = "in-model NextN head"
        if info.is_mtp_sidecar:
            kind = "mtp- sidecar: NextN head only, no trunk tensors"
        add("MTP", f"{info.n_layer_nextn} head(s), {kind}")
    d = info.draft
    if d.draft_type:
        parts = [d.draft_type]
        for label, value in (
            ("target_layers", list(d.target_layers) if d.target_layers is not None else None),
            ("target_hidden_size", d.target_hidden_size),
            ("block_size", d.block_size),
            ("mask_token_id", d.mask_token_id if d.draft_type != "draft-mtp" else None),
            ("sample_from_anchor", d.sample_from_anchor),
            ("has_confidence_head", d.has_confidence_head),
            ("causal", d.causal_attention),
            ("selector_top_k", d.selector_top_k),
        ):
            if value is not None:
                parts.append(f"{label} {value}")
        add("Draft", ", ".join(parts))
    tok = [info.tokenizer_model or "no tokenizer"]
    if info.tokenizer_pre:
        tok.append(f"pre {info.tokenizer_pre}")
    if info.vocab_size is not None:
        tok.append(f"vocab {info.vocab_size}")
    if info.bos_token_id is not None:
        tok.append(f"bos {info.bos_token_id}")
    if info.eos_token_id is not None:
        tok.append(f"eos {info.eos_token_id}")
    add("Tokenizer", ", ".join(tok))
    template = "yes" if info.has_chat_template else "no"
    if info.chat_template_names:
        template += " (named: " + ", ".join(info.chat_template_names) + ")"
    add("Chat tmpl", template)
    if estimate is not None:
        e = estimate
        add(
            "Memory",
            f"at {e.n_ctx} ctx: weights {format_bytes(e.weights_bytes)} + KV {format_bytes(e.kv_bytes)}"
            + (f" + recurrent {format_bytes(e.recurrent_bytes)}" if e.recurrent_bytes else "")
            + f" + compute ~{format_bytes(e.compute_bytes)} = {format_bytes(e.total_bytes)}",
        )
        for note in e.notes:
            add("", note)
    for warning in info.warnings:
        add("Warning", warning)
    return lines


# ---------------------------------------------------------------------------
# Headers read through a callback (remote files, fetched with HTTP Range requests)
# ---------------------------------------------------------------------------

ReadAt: TypeAlias = "Callable[[int, int], bytes]"


class _ReaderSource:
    """Reads through ``read_at(offset, n)`` a window at a time, so a remote header costs a few requests."""

    def __init__(self, read_at: ReadAt, size: int, window: int) -> None:
        self._read_at = read_at
        self._size = size
        self._window = window
        self._start = 0
        self._buf = b""

    def read(self, pos: int, n: int) -> bytes:
        if pos < self._start or pos + n > self._start + len(self._buf):
            self._start = pos
            self._buf = self._read_at(pos, min(max(n, self._window), self._size - pos))
        return self._buf[pos - self._start : pos - self._start + n]

    def unpack(self, fmt: struct.Struct, pos: int) -> tuple[Any, ...]:
        return fmt.unpack(self.read(pos, fmt.size))


def inspect_gguf_reader(
    name: str,
    size: int,
    read_at: ReadAt,
    *,
    shards: Sequence[tuple[str, int, ReadAt]] = (),
    window: int = 1 << 20,
) -> GGUFInfo:
    """inspect_gguf() for a file known only through ``read_at(offset, n)``, e.g. a remote file.

    ``name`` stands for the path in messages and ``size`` is the whole file's size; ``shards`` are the other
    shards of a split model as ``(name, size, read_at)``. Only header bytes are read. Errors from
    ``read_at`` propagate unchanged; malformed headers raise GGUFValidationError.
    """
    headers = [_parse_reader(name, size, read_at, window)]
    headers += [_parse_reader(n, s, r, window) for n, s, r in shards]

    def build() -> GGUFInfo:
        split_count, _ = _split_fields(name, _Meta(headers[0].kv, None))
        names = (name, *(n for n, _, _ in shards))
        warnings: list[str] = []
        missing: tuple[str, ...] = ()
        if split_count > len(headers):
            missing = tuple(f"shard {i}" for i in range(len(headers) + 1, split_count + 1))
            warnings.append(f"{len(missing)} of {split_count} shards were not read")
        return _build_info(Path(name), headers, split_count, names, missing, warnings)

    return _guarded(name, build)


def _parse_reader(name: str, size: int, read_at: ReadAt, window: int) -> _Header:
    path = Path(name)
    if size <= 0:
        raise _fail(path, "the file is empty (0 bytes)", "the upload is broken; pick another file")
    try:
        return _Parser(path, _ReaderSource(read_at, size, window), size, keep_strings=False).parse()
    except (struct.error, ValueError, OverflowError, IndexError, MemoryError, UnicodeError) as exc:
        problem = f"the header could not be parsed ({type(exc).__name__}: {exc})"
        raise _fail(path, problem, _HINT_CORRUPT) from None
