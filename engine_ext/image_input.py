"""Images from outside, bounded before anything decodes them: size in bytes, the format from its signature, the
pixel dimensions from its header (PNG, JPEG, GIF, BMP, WebP), and a file that is whole."""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from engine_ext.params import EngineError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # larger files are refused before they are read
MAX_IMAGE_SIDE = 8192  # pixels per side
# width × height: stb_image decodes to 3 bytes a pixel (96 MiB at this bound) before the projector resizes it.
MAX_IMAGE_PIXELS = 32 * 1024 * 1024
JPEG_SEGMENTS_MAX = 512  # markers read looking for the frame header: a bounded walk over a hostile file
FORMATS: tuple[str, ...] = ("PNG", "JPEG", "GIF", "BMP", "WebP")


class ImageRefused(EngineError):
    """An image llmtui does not hand to the projector: the message says which file and why, in one line."""


@dataclass(frozen=True)
class CheckedImage:
    """An image that passed the checks: its bytes, their sha256 (hex), the format and the header's dimensions."""

    data: bytes
    sha256: str
    format: str
    width: int
    height: int

    def describe(self) -> str:
        """ "PNG 640×480, 81 KB" (what a message shows beside the image's name)."""
        return f"{self.format} {self.width}×{self.height}, {size_text(len(self.data))}"


def size_text(n: int) -> str:
    """A byte count for people: 512 B, 81 KB, 2.4 MB."""
    if n < 1000:
        return f"{n} B"
    if n < 1000 * 1000:
        return f"{n / 1000:.0f} KB"
    return f"{n / 1000 / 1000:.1f} MB"


def read_image_file(path: str | Path) -> CheckedImage:
    """Read and check an image file: a regular file (not a device, FIFO or directory), at most MAX_IMAGE_BYTES."""
    path = Path(path)
    name = path.name or str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then says what the path is.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ImageRefused(f"{name}: no such image file") from None
    except OSError as exc:
        raise ImageRefused(f"{name}: cannot open it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageRefused(f"{name}: not a regular file (a device, FIFO or folder); attach an image file")
        if info.st_size > MAX_IMAGE_BYTES:
            raise ImageRefused(f"{name}: {size_text(info.st_size)} is larger than {size_text(MAX_IMAGE_BYTES)}")
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_IMAGE_BYTES:  # the file may grow after fstat: read one byte past the bound at most
            chunk = os.read(fd, min(1 << 20, MAX_IMAGE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise ImageRefused(f"{name}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return check_image(b"".join(chunks), name)


def check_image(data: bytes, name: str = "image") -> CheckedImage:
    """Check image bytes (from a file, a paste or a data: URL) without decoding them; ImageRefused if they fail."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused(f"{name}: {size_text(len(data))} is larger than {size_text(MAX_IMAGE_BYTES)}")
    if not data:
        raise ImageRefused(f"{name}: the file is empty")
    kind = sniff_format(data)
    if kind is None:
        raise ImageRefused(f"{name}: not an image llmtui reads (it takes {', '.join(FORMATS)})")
    try:
        width, height = _DIMENSIONS[kind](data)
    except (struct.error, IndexError, ValueError):
        raise ImageRefused(f"{name}: a damaged or truncated {kind} header") from None
    if width <= 0 or height <= 0:
        raise ImageRefused(f"{name}: its {kind} header says {width}×{height} pixels")
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise ImageRefused(
            f"{name}: {width}×{height} pixels is more than llmtui decodes ({MAX_IMAGE_SIDE} a side, "
            f"{MAX_IMAGE_PIXELS // (1024 * 1024)} megapixels); scale it down"
        )
    if not _COMPLETE[kind](data):
        raise ImageRefused(f"{name}: the {kind} file is truncated (its end is missing)")
    return CheckedImage(data, hashlib.sha256(data).hexdigest(), kind, width, height)


def sniff_format(data: bytes) -> str | None:
    """The format its signature says, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data.startswith(b"BM") and len(data) >= 26:
        return "BMP"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return None


def _png_size(data: bytes) -> tuple[int, int]:
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        raise ValueError("no IHDR")
    return struct.unpack(">II", data[16:24])  # type: ignore[return-value]


def _jpeg_size(data: bytes) -> tuple[int, int]:
    i = 2
    for _ in range(JPEG_SEGMENTS_MAX):
        while data[i] != 0xFF:  # IndexError at the end: truncated
            i += 1
        while data[i] == 0xFF:  # fill bytes
            i += 1
        marker = data[i]
        i += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # standalone markers
            continue
        if marker == 0xD9:
            break
        (length,) = struct.unpack(">H", data[i : i + 2])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame header (SOFn)
            height, width = struct.unpack(">HH", data[i + 3 : i + 7])
            return width, height
        if length < 2:
            raise ValueError("bad segment length")
        i += length
    raise ValueError("no frame header")


def _gif_size(data: bytes) -> tuple[int, int]:
    return struct.unpack("<HH", data[6:10])  # type: ignore[return-value]


def _bmp_size(data: bytes) -> tuple[int, int]:
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:  # OS/2 BITMAPCOREHEADER
        return struct.unpack("<HH", data[18:22])  # type: ignore[return-value]
    width, height = struct.unpack("<ii", data[18:26])
    return width, abs(height)  # negative: rows stored top-down


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8L":
        if data[20] != 0x2F:
            raise ValueError("bad VP8L signature")
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise ValueError("bad VP8 start code")
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise ValueError("unknown WebP chunk")


_DIMENSIONS = {"PNG": _png_size, "JPEG": _jpeg_size, "GIF": _gif_size, "BMP": _bmp_size, "WebP": _webp_size}


def _bmp_complete(data: bytes) -> bool:
    declared = int.from_bytes(data[2:6], "little")
    offset = int.from_bytes(data[10:14], "little")
    # Some writers put 0 in the size field; the pixel data's offset must lie inside the file either way.
    return offset < len(data) and (declared == 0 or declared <= len(data))


_COMPLETE = {
    "PNG": lambda data: b"IEND" in data[-32:],  # the last chunk (a few writers pad after it)
    # JPEG: the end-of-image marker, allowing trailing bytes some cameras append
    "JPEG": lambda data: data.rfind(b"\xff\xd9", 2) >= 0,
    "GIF": lambda data: data.rstrip(b"\x00").endswith(b"\x3b"),
    "BMP": _bmp_complete,
    "WebP": lambda data: struct.unpack("<I", data[4:8])[0] + 8 <= len(data),
}
