"""The bounded GGUF header reader: every count and length in the header is checked against the file before it is
read, and every failure is a GGUFError (missing or unreadable file) or a GGUFValidationError (malformed file) with a
one-line message. Reads local files (memory-mapped, or through a window of reads) and files known only through a
``read_at(offset, n)`` callback (remote files); never reads tensor data.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeAlias, TypeVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine_ext.untrusted_text import one_line_message


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
MAX_COUNT = 1_000_000  # tensors or KV pairs; real models have a few thousand at most
_MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH
_MAX_ARRAY = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS
_MAX_NAME_BYTES = 63  # GGML_MAX_NAME - 1
_MAX_DIMS = 4  # GGML_MAX_DIMS

# Limits of the parser itself: what a header may claim, and how much of it is kept in memory
_MAX_KEY = 1 << 16  # metadata keys are short dotted names; a longer one is hostile
_KEEP_STRING = 1 << 20  # string values longer than this are skipped (None), never read into memory
_KEEP_STRINGS_TOTAL = 32 << 20  # and once this much string data is held, later values are skipped too
_KEEP_ARRAY = 4096  # arrays longer than this (vocabularies, merges, scores) are skipped, only counted
# A header read through a callback (a remote file, over HTTP Range) is walked this far at most: real headers hold a
# few MiB (a 262,144-token vocabulary with its scores and merges is under 16 MiB), and a hostile one declaring 10^9
# token strings in a file listed as huge would otherwise be read to its end (1.95 GB in 95 s). What a header claims
# beyond this is refused before it is read. A local file is walked through a memory map, without reading it.
MAX_READ_HEADER_BYTES = 64 << 20
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, one key byte, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset

VT = GGUFValueType
# value type -> (struct format, size, numpy dtype) for fixed-size scalars
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    int(VT.UINT8): (struct.Struct("<B"), "<u1"),
    int(VT.INT8): (struct.Struct("<b"), "<i1"),
    int(VT.UINT16): (struct.Struct("<H"), "<u2"),
    int(VT.INT16): (struct.Struct("<h"), "<i2"),
    int(VT.UINT32): (struct.Struct("<I"), "<u4"),
    int(VT.INT32): (struct.Struct("<i"), "<i4"),
    int(VT.FLOAT32): (struct.Struct("<f"), "<f4"),
    int(VT.BOOL): (struct.Struct("<B"), "<u1"),
    int(VT.UINT64): (struct.Struct("<Q"), "<u8"),
    int(VT.INT64): (struct.Struct("<q"), "<i8"),
    int(VT.FLOAT64): (struct.Struct("<d"), "<f8"),
}
VALUE_TYPE_NAMES: dict[int, str] = {
    int(VT.UINT8): "u8",
    int(VT.INT8): "i8",
    int(VT.UINT16): "u16",
    int(VT.INT16): "i16",
    int(VT.UINT32): "u32",
    int(VT.INT32): "i32",
    int(VT.FLOAT32): "f32",
    int(VT.BOOL): "bool",
    int(VT.STRING): "str",
    int(VT.ARRAY): "array",
    int(VT.UINT64): "u64",
    int(VT.INT64): "i64",
    int(VT.FLOAT64): "f64",
}
_U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from gguf-py plus the vendored ggml's extras."""
    types = {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    # The vendored ggml knows Q2_0 = 42 (block_q2_0: f16 scale + 64 2-bit values); gguf 0.19 does not.
    types.setdefault(42, ("Q2_0", 64, 2 + 64 // 4))
    return types


GGML_TYPES = _ggml_types()


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
def open_file_source(path: Path) -> Iterator[_Source]:
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
class MetadataValue:
    """One metadata value; ``value`` is None for arrays longer than _KEEP_ARRAY (only ``count`` is kept)."""

    vtype: int
    value: Any
    subtype: int | None = None
    count: int = 1


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]  # ggml order {ne0, ne1, ...}
    n_elements: int
    n_bytes: int
    offset: int  # relative to the data section


@dataclass(frozen=True)
class Header:
    path: Path
    file_size: int
    version: int
    alignment: int
    data_offset: int
    kv: dict[str, MetadataValue]
    tensors: tuple[TensorInfo, ...]
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # where each array's elements lie in the file


# One-line error messages (untrusted_text.one_line_message), and the net that turns any other exception from reading
# a header into one


def gguf_error(path: Path | str, problem: str, hint: str = "") -> GGUFError:
    """A GGUFError (missing or unreadable file) with a short one-line message."""
    return GGUFError(one_line_message(path, problem, hint))


def validation_error(path: Path | str, problem: str, hint: str) -> GGUFValidationError:
    """A GGUFValidationError (malformed file) with a short one-line message."""
    return GGUFValidationError(one_line_message(path, problem, hint))


_HINT_REDOWNLOAD = "the file is incomplete or corrupt, re-download it"
HINT_CORRUPT = "the file is corrupt or was not written by a GGUF writer, re-download or re-convert it"
HINT_METADATA = "llama.cpp would refuse this metadata; re-download or re-convert the model"


def some_items(items: Sequence[str], n: int = 3) -> str:
    """The first ``n`` items and how many more, for messages about long lists."""
    shown = ", ".join(str(i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


_T = TypeVar("_T")
_UNEXPECTED = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    ZeroDivisionError,
    MemoryError,
    RecursionError,
    UnicodeError,
    struct.error,
)


def guarded(path: Path | str, fn: Callable[[], _T]) -> _T:
    """Last-resort net: any unexpected exception from reading a header becomes a short GGUFValidationError."""
    try:
        return fn()
    except GGUFError:
        raise
    except _UNEXPECTED as exc:
        problem = f"the header cannot be inspected ({type(exc).__name__}: {exc})"
        raise validation_error(path, problem, HINT_CORRUPT) from None


class _Parser:
    """Walks the GGUF header with a bounds check before every read; raises GGUFValidationError."""

    def __init__(self, path: Path, src: _Source, size: int, *, keep_strings: bool, limit: int | None = None) -> None:
        self.path = path
        self.src = src
        self.size = size
        self.limit = size if limit is None else min(size, limit)  # where the header must end
        self.pos = 0
        self.keep_strings = keep_strings
        self.kept = 0  # bytes of string data read into memory
        self.spans: dict[str, tuple[int, int]] = {}  # array key -> [start, end) of its elements

    # -- primitives --------------------------------------------------------

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise validation_error(
                self.path,
                f"truncated header: reading {what} needs {n} bytes at offset {self.pos} "
                f"but the file has only {self.size} bytes",
                _HINT_REDOWNLOAD,
            )
        self._within_limit(n, what)

    def _within_limit(self, n: int, what: str) -> None:
        """Refuse a header that would pass `limit` (MAX_READ_HEADER_BYTES for a remote one) before reading on."""
        if self.pos + n > self.limit:
            raise validation_error(
                self.path,
                f"the header does not end within its first {self.limit:,} bytes: {what} needs {n:,} bytes at offset "
                f"{self.pos}, more than a real header holds; llmtui stopped reading",
                HINT_CORRUPT,
            )

    def _unpack(self, fmt: struct.Struct, what: str) -> Any:
        self._need(fmt.size, what)
        (value,) = self.src.unpack(fmt, self.pos)
        self.pos += fmt.size
        return value

    def _string(self, what: str, *, keep: bool = True, max_len: int | None = None) -> str | None:
        n = self._unpack(U64, f"the length of {what}")
        if n > _MAX_STRING or n > self.size - self.pos:
            raise validation_error(
                self.path,
                f"{what} claims a length of {n} bytes at offset {self.pos - 8}, "
                f"but only {self.size - self.pos} bytes remain in the file",
                _HINT_REDOWNLOAD,
            )
        if max_len is not None and n > max_len:
            raise validation_error(self.path, f"{what} is {n} bytes long (at most {max_len})", HINT_CORRUPT)
        self._within_limit(n, what)
        start = self.pos
        self.pos += n
        if not keep:
            return None
        if max_len is not None:  # a key or a tensor name: always kept, so the header's total is capped
            if self.kept + n > 2 * _KEEP_STRINGS_TOTAL:
                raise validation_error(
                    self.path, f"the header's keys and names pass {2 * _KEEP_STRINGS_TOTAL >> 20} MiB", HINT_CORRUPT
                )
        elif not self.keep_strings and (n > _KEEP_STRING or self.kept + n > _KEEP_STRINGS_TOTAL):
            return None
        self.kept += n
        return self.src.read(start, n).decode("utf-8", errors="replace")

    # -- sections ----------------------------------------------------------

    def parse(self) -> Header:
        self._check_magic()
        version = self._unpack(_U32, "the version")
        if version not in _SUPPORTED_VERSIONS:
            raise self._bad_version(version)
        n_tensors = self._unpack(U64, "the tensor count")
        n_kv = self._unpack(U64, "the metadata count")
        self._check_count(n_tensors, "tensors", _MIN_TENSOR_INFO_BYTES)
        self._check_count(n_kv, "metadata entries", _MIN_KV_BYTES)
        kv = self._read_kv(n_kv)
        alignment = self._alignment(kv)
        infos = self._read_tensor_infos(n_tensors)
        data_offset = self.pos
        if n_tensors > 0:
            data_offset = -(-self.pos // alignment) * alignment
        header = Header(self.path, self.size, version, alignment, data_offset, kv, tuple(infos), self.spans)
        self._check_tensor_data(header)
        return header

    def _check_count(self, count: int, what: str, min_bytes: int) -> None:
        if count > MAX_COUNT:
            raise validation_error(
                self.path, f"the header claims {count} {what} (at most {MAX_COUNT} are plausible)", HINT_CORRUPT
            )
        need = count * min_bytes
        if need > self.size - self.pos:
            raise validation_error(
                self.path,
                f"truncated header: it declares {count} {what}, which need at least {need} more bytes, "
                f"but the file has only {self.size} bytes",
                _HINT_REDOWNLOAD,
            )
        self._within_limit(need, f"{count} {what}")

    def _check_magic(self) -> None:
        head = self.src.read(0, min(self.size, 64))
        if len(head) < 4 and _MAGIC.startswith(head):
            raise validation_error(
                self.path, f"truncated header: the file has only {self.size} bytes", _HINT_REDOWNLOAD
            )
        if head[:4] == _MAGIC:
            if self.size < 24:
                raise validation_error(
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
        raise validation_error(self.path, problem, hint)

    def _bad_version(self, version: int) -> GGUFValidationError:
        if version == 0:
            return validation_error(self.path, "GGUF version is 0", HINT_CORRUPT)
        if version & 0xFFFF == 0:
            return validation_error(
                self.path,
                f"GGUF version field reads {version:#x}, which means a big-endian file",
                "this llama.cpp reads little-endian GGUF only; get the little-endian build of the model",
            )
        if version == 1:
            return validation_error(self.path, "GGUF version 1 is no longer supported", "re-convert the model")
        return validation_error(
            self.path,
            f"GGUF version {version} is newer than this llama.cpp supports (2 and 3)",
            "upgrade llmtui, or convert the model with a matching llama.cpp",
        )

    def _read_kv(self, n_kv: int) -> dict[str, MetadataValue]:
        kv: dict[str, MetadataValue] = {}
        for i in range(n_kv):
            key = self._string(f"the key of metadata entry {i}", max_len=_MAX_KEY)
            assert key is not None
            if not key:
                raise validation_error(self.path, f"metadata entry {i} has an empty key", HINT_CORRUPT)
            if key in kv:
                raise validation_error(self.path, f"metadata key {key!r} appears twice", HINT_CORRUPT)
            vtype = self._unpack(_U32, f"the value type of {key!r}")
            if vtype == int(VT.ARRAY):
                kv[key] = self._read_array(key)
            else:
                kv[key] = MetadataValue(vtype, self._read_scalar(key, vtype))
        return kv

    def _read_scalar(self, key: str, vtype: int) -> Any:
        if vtype == int(VT.STRING):
            template = key.startswith("tokenizer.chat_template")
            start = self.pos + 8
            value = self._string(f"the value of {key!r}", keep=self.keep_strings or not template)
            if template:  # read on demand by read_chat_template, with its own cap
                self.spans[key] = (start, self.pos)
            return value
        if vtype not in _SCALARS:
            raise validation_error(self.path, f"metadata key {key!r} has unknown value type {vtype}", HINT_CORRUPT)
        fmt, _ = _SCALARS[vtype]
        value = self._unpack(fmt, f"the value of {key!r}")
        return bool(value) if vtype == int(VT.BOOL) else value

    def _read_array(self, key: str) -> MetadataValue:
        subtype = self._unpack(_U32, f"the element type of {key!r}")
        count = self._unpack(U64, f"the length of {key!r}")
        remaining = self.size - self.pos
        if subtype == int(VT.STRING):
            min_bytes = 8
        elif subtype in _SCALARS:
            min_bytes = _SCALARS[subtype][0].size
        elif subtype == int(VT.ARRAY):
            problem = f"metadata key {key!r} is an array of arrays, which llama.cpp rejects"
            raise validation_error(self.path, problem, HINT_CORRUPT)
        else:
            problem = f"metadata array {key!r} has unknown element type {subtype}"
            raise validation_error(self.path, problem, HINT_CORRUPT)
        if count > _MAX_ARRAY or count * min_bytes > remaining:
            raise validation_error(
                self.path,
                f"metadata array {key!r} claims {count} elements, more than the {remaining} bytes left can hold",
                _HINT_REDOWNLOAD,
            )
        self._within_limit(count * min_bytes, f"metadata array {key!r} of {count} elements")
        keep = count <= _KEEP_ARRAY
        if subtype == int(VT.STRING):
            start = self.pos
            if not keep:  # only walked: a tight loop, no per-element messages or objects
                self._skip_strings(key, count)
                self.spans[key] = (start, self.pos)
                return MetadataValue(int(VT.ARRAY), None, subtype, count)
            strings = [self._string(f"element {j} of {key!r}", keep=keep) for j in range(count)]
            self.spans[key] = (start, self.pos)
            return MetadataValue(int(VT.ARRAY), strings, subtype, count)
        fmt, dtype = _SCALARS[subtype]
        start = self.pos
        self.pos += count * fmt.size
        if not keep:
            return MetadataValue(int(VT.ARRAY), None, subtype, count)
        values = np.frombuffer(self.src.read(start, count * fmt.size), dtype=dtype, count=count).tolist()
        if subtype == int(VT.BOOL):
            values = [bool(v) for v in values]
        return MetadataValue(int(VT.ARRAY), values, subtype, count)

    def _skip_strings(self, key: str, count: int) -> None:
        """Walk ``count`` strings without reading them, with _string's bounds checks and messages."""
        pos, size, limit, unpack = self.pos, self.size, self.limit, self.src.unpack
        for j in range(count):
            if pos + 8 > limit:
                self.pos = pos
                self._need(8, f"the length of element {j} of {key!r}")
            (n,) = unpack(U64, pos)
            pos += 8
            if n > _MAX_STRING or n > size - pos:
                self.pos = pos
                self._string_too_long(f"element {j} of {key!r}", n)
            if pos + n > limit:
                self.pos = pos
                self._within_limit(n, f"element {j} of {key!r}")
            pos += n
        self.pos = pos

    def _string_too_long(self, what: str, n: int) -> None:
        raise validation_error(
            self.path,
            f"{what} claims a length of {n} bytes at offset {self.pos - 8}, "
            f"but only {self.size - self.pos} bytes remain in the file",
            _HINT_REDOWNLOAD,
        )

    def _alignment(self, kv: dict[str, MetadataValue]) -> int:
        entry = kv.get("general.alignment")
        if entry is None:
            return _DEFAULT_ALIGNMENT
        if entry.vtype != int(VT.UINT32):
            raise validation_error(
                self.path,
                f"general.alignment must be a u32 but is a {VALUE_TYPE_NAMES.get(entry.vtype, entry.vtype)}",
                HINT_CORRUPT,
            )
        alignment = int(entry.value)
        if alignment == 0 or alignment & (alignment - 1):
            raise validation_error(self.path, f"general.alignment {alignment} is not a power of two", HINT_CORRUPT)
        return alignment

    def _read_tensor_infos(self, n_tensors: int) -> list[TensorInfo]:
        infos: list[TensorInfo] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = self._string(f"the name of tensor {i}", max_len=_MAX_NAME_BYTES)
            assert name is not None
            if len(name.encode("utf-8", errors="replace")) > _MAX_NAME_BYTES:
                problem = f"tensor {i} name {name[:80]!r} is longer than {_MAX_NAME_BYTES} bytes"
                raise validation_error(self.path, problem, HINT_CORRUPT)
            if name in seen:
                raise validation_error(self.path, f"tensor name {name!r} appears twice", HINT_CORRUPT)
            seen.add(name)
            n_dims = self._unpack(_U32, f"the dimension count of tensor {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                problem = f"tensor {name!r} has {n_dims} dimensions (must be 1 to {_MAX_DIMS})"
                raise validation_error(self.path, problem, HINT_CORRUPT)
            shape = tuple(self._unpack(U64, f"dimension {j} of tensor {name!r}") for j in range(n_dims))
            n_elements = 1
            for j, dim in enumerate(shape):
                if dim <= 0 or dim >= 1 << 62:
                    problem = f"tensor {name!r} dimension {j} is {dim} (must be positive)"
                    raise validation_error(self.path, problem, HINT_CORRUPT)
                n_elements *= dim
            if n_elements >= 1 << 63:
                problem = f"tensor {name!r} shape {list(shape)} overflows 64 bits"
                raise validation_error(self.path, problem, HINT_CORRUPT)
            type_id = self._unpack(_U32, f"the type of tensor {name!r}")
            if type_id not in GGML_TYPES:
                raise validation_error(
                    self.path,
                    f"tensor {name!r} has unknown ggml type {type_id}",
                    "the file is corrupt or needs a newer llama.cpp than the one llmtui ships",
                )
            type_name, block, type_size = GGML_TYPES[type_id]
            if shape[0] % block:
                raise validation_error(
                    self.path,
                    f"tensor {name!r} of type {type_name} has rows of {shape[0]} elements, "
                    f"not a multiple of the block size {block}",
                    HINT_CORRUPT,
                )
            offset = self._unpack(U64, f"the data offset of tensor {name!r}")
            n_bytes = n_elements // block * type_size
            infos.append(TensorInfo(name, type_id, shape, n_elements, n_bytes, offset))
        return infos

    def _check_tensor_data(self, h: Header) -> None:
        """Alignment, bounds, overlaps, and llama.cpp's rule that data follows header order, padded."""
        for t in h.tensors:
            if t.offset % h.alignment:
                raise validation_error(
                    self.path,
                    f"tensor {t.name!r} data offset {t.offset} is not a multiple of the alignment {h.alignment}",
                    HINT_CORRUPT,
                )
        by_offset = sorted(h.tensors, key=lambda t: (t.offset, t.name))
        past_end = [t for t in by_offset if h.data_offset + t.offset + t.n_bytes > h.file_size]
        if past_end:
            t = past_end[0]
            more = f" ({len(past_end)} tensors affected)" if len(past_end) > 1 else ""
            raise validation_error(
                self.path,
                f"truncated: tensor {t.name!r} needs bytes up to {h.data_offset + t.offset + t.n_bytes} "
                f"but the file has {h.file_size}{more}",
                _HINT_REDOWNLOAD,
            )
        for prev, cur in zip(by_offset, by_offset[1:], strict=False):
            if prev.offset + prev.n_bytes > cur.offset:
                raise validation_error(
                    self.path,
                    f"tensors {prev.name!r} [{prev.offset}, {prev.offset + prev.n_bytes}) and {cur.name!r} "
                    f"[{cur.offset}, {cur.offset + cur.n_bytes}) overlap in the data section",
                    HINT_CORRUPT,
                )
        expected = 0
        for t in h.tensors:
            if t.offset != expected:
                raise validation_error(
                    self.path,
                    f"tensor {t.name!r} has data offset {t.offset} but llama.cpp expects {expected} "
                    f"(tensor data must follow the header order, each padded to {h.alignment} bytes)",
                    HINT_CORRUPT,
                )
            expected += -(-t.n_bytes // h.alignment) * h.alignment


def read_header(path: Path, *, keep_strings: bool = False) -> Header:
    """Parse and validate one file's header; every failure is a GGUFError."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise gguf_error(path, "no such file", "check the path") from None
    except OSError as exc:
        raise gguf_error(path, f"cannot be read ({exc.strerror})", "check the path and permissions") from None
    if path.is_dir():
        raise gguf_error(path, "is a directory, not a GGUF file", "pass the .gguf file inside it")
    size = stat.st_size
    if size == 0:
        raise validation_error(path, "the file is empty (0 bytes)", "the download probably failed, re-download it")
    try:
        with open_file_source(path) as src:
            return _Parser(path, src, size, keep_strings=keep_strings).parse()
    except GGUFError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise gguf_error(path, f"cannot be read ({reason})", "check the file and the disk") from None
    except (struct.error, ValueError, OverflowError, IndexError, MemoryError, UnicodeError) as exc:
        problem = f"the header could not be parsed ({type(exc).__name__}: {exc})"
        raise validation_error(path, problem, HINT_CORRUPT) from None


def validate_gguf(path: Path) -> None:
    """Check that ``path`` is a GGUF file llama.cpp would accept, reading only its header.

    One file is checked on its own, also when it is one shard of a split model. Raises GGUFValidationError
    (file-format problems) or GGUFError (missing or unreadable file); never any other exception.
    """
    read_header(path)


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


def read_header_through(name: str, size: int, read_at: ReadAt, window: int) -> Header:
    """A header read through ``read_at``: walked to MAX_READ_HEADER_BYTES at most."""
    path = Path(name)
    if size <= 0:
        raise validation_error(path, "the file is empty (0 bytes)", "the upload is broken; pick another file")
    try:
        source = _ReaderSource(read_at, size, window)
        return _Parser(path, source, size, keep_strings=False, limit=MAX_READ_HEADER_BYTES).parse()
    except (struct.error, ValueError, OverflowError, IndexError, MemoryError, UnicodeError) as exc:
        problem = f"the header could not be parsed ({type(exc).__name__}: {exc})"
        raise validation_error(path, problem, HINT_CORRUPT) from None
