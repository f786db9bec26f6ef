"""Images from outside, bounded before anything decodes them: size in bytes, the format from its signature, the
pixel dimensions and what decoding will cost from its header (PNG, JPEG, GIF, BMP, WebP), and a file that is whole;
then decoded within that cost into the 8-bit RGB pixels libmtmd takes (`decode_rgb`, in the engine worker)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

from engine_ext.params import EngineError
from engine_ext.untrusted_text import one_line

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # larger files are refused before they are read
MAX_IMAGE_SIDE = 8192  # pixels per side
MAX_IMAGE_PIXELS = 32 * 1024 * 1024  # width × height
# What reading an image costs the engine worker at most, counted from its header before anything decodes it: Pillow's
# decoded image (`_PILLOW_BYTES`: 1 byte a pixel for grey, palette and 1-bit images, 2 for 16-bit grey, 4 for the
# rest, Pillow keeping RGB as 4) beside the packed 8-bit RGB copy filled from it (3), then libmtmd's bitmap and the
# copy its preprocessing makes (3 + 3); a progressive or multi-scan JPEG adds libjpeg's coefficients (2 bytes each,
# 64 a block, every component's blocks) while it decodes. Add the bands converted at a time and the interpreter's own
# working memory (READ_WORKING_BYTES: 2 MiB measured). 7 bytes a pixel at the pixel bound and that: 232 MiB, besides
# the file's own bytes; scripts/bench_image_memory.py measures 226 MiB at most over every format, and the README
# promises this figure.
READ_BAND_BYTES = 256 * 1024  # packed RGB converted at a time (a band of rows)
READ_WORKING_BYTES = 8 * 1024 * 1024
MAX_READ_BYTES = 7 * MAX_IMAGE_PIXELS + READ_WORKING_BYTES
JPEG_SEGMENTS_MAX = 512  # markers read looking for the frame header: a bounded walk over a hostile file
FORMATS: tuple[str, ...] = ("PNG", "JPEG", "GIF", "BMP", "WebP")
"""The formats whose headers are checked; the engine's decoder reads all but WebP (READ_FORMATS)."""
READ_FORMATS: tuple[str, ...] = ("PNG", "JPEG", "GIF", "BMP")
"""The formats the engine's projector decodes (libmtmd's stb_image): what a message says llmtui takes."""


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
    pillow_bytes: int = 4  # bytes a pixel of the image Pillow decodes it into (what its header says)
    read_bytes: int = 0  # what reading it costs the engine at most (MAX_READ_BYTES's count)

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
        raise ImageRefused(f"{name}: not an image llmtui reads (it takes {', '.join(READ_FORMATS)})")
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
    try:
        pillow_bytes, decoder_bytes, what = _READ_COST[kind](data, width, height)
    except (struct.error, IndexError, ValueError):
        raise ImageRefused(f"{name}: a damaged or truncated {kind} header") from None
    pixels = width * height
    read_bytes = max(pixels * pillow_bytes + decoder_bytes, pixels * (pillow_bytes + 3), pixels * 6)
    read_bytes += READ_WORKING_BYTES
    if read_bytes > MAX_READ_BYTES:
        raise ImageRefused(
            f"{name}: reading this {width}×{height} {what} would take {read_bytes / 2**20:.0f} MiB, more than the "
            f"{MAX_READ_BYTES // 2**20} MiB llmtui gives an image; save it as a baseline JPEG or scale it down"
        )
    return CheckedImage(data, hashlib.sha256(data).hexdigest(), kind, width, height, pillow_bytes, read_bytes)


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
    frame, _ = _jpeg_frame(data)
    height, width = struct.unpack(">HH", frame[2:6])
    return width, height


def _jpeg_frame(data: bytes) -> tuple[bytes, bytes]:
    """The frame header's (SOFn) marker byte and body, and the first scan header's (SOS) body, or b"" if the file
    ends before it (a bounded walk over the markers)."""
    frame = b""
    i = 2
    try:
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
            if length < 2:
                raise ValueError("bad segment length")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and not frame:  # the frame header
                frame = bytes([marker]) + data[i + 2 : i + length]
                if len(frame) < 7:
                    raise ValueError("short frame header")
            elif marker == 0xDA and frame:  # the first scan: its header is all that is read of it
                return frame, data[i + 2 : i + length]
            i += length
    except (IndexError, struct.error):
        if not frame:
            raise
    if not frame:
        raise ValueError("no frame header")
    return frame, b""


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


def _png_cost(data: bytes, width: int, height: int) -> tuple[int, int, str]:
    """Pillow's bytes a pixel, a decoder's own buffers, and what the image is, from the PNG's IHDR (bit depth, colour
    type, Adam7: Pillow decodes the passes into the image, with no buffer of the whole)."""
    depth, colour, interlace = data[24], data[25], data[28]
    grey = colour in (0, 3)
    pillow_bytes = 2 if grey and depth == 16 else 1 if grey else 4
    return pillow_bytes, 0, f"{depth}-bit PNG{' (interlaced)' if interlace else ''}"


def _jpeg_cost(data: bytes, width: int, height: int) -> tuple[int, int, str]:
    """A JPEG decodes straight into Pillow's image scan by scan, unless it is progressive or its first scan has fewer
    components than its frame: then libjpeg keeps every component's coefficients (jdcoefct.c's whole-image arrays:
    blocks rounded up to the sampling factors, 64 coefficients of 2 bytes each) until the last scan."""
    frame, scan = _jpeg_frame(data)
    n_components = frame[6]
    if len(frame) < 7 + 3 * n_components:
        raise ValueError("short frame header")
    factors = [(frame[8 + 3 * c] >> 4, frame[8 + 3 * c] & 15) for c in range(n_components)]
    if any(h == 0 or v == 0 for h, v in factors):
        raise ValueError("zero sampling factor")
    progressive = frame[0] in (0xC2, 0xC6, 0xCA, 0xCE)
    multi_scan = progressive or (len(scan) >= 1 and scan[0] < n_components)
    pillow_bytes = 1 if n_components == 1 else 4
    if not multi_scan:
        return pillow_bytes, 0, "JPEG"
    h_max, v_max = max(h for h, _ in factors), max(v for _, v in factors)
    coefficients = 0
    for h, v in factors:
        blocks_wide = -(-width * h // (h_max * 8))
        blocks_high = -(-height * v // (v_max * 8))
        coefficients += (-(-blocks_wide // h) * h) * (-(-blocks_high // v) * v) * 64 * 2
    return pillow_bytes, coefficients, "progressive JPEG" if progressive else "multi-scan JPEG"


def _bmp_cost(data: bytes, width: int, height: int) -> tuple[int, int, str]:
    (header_size,) = struct.unpack("<I", data[14:18])
    (bits,) = struct.unpack("<H", data[24:26] if header_size == 12 else data[28:30])
    return 1 if bits <= 8 else 4, 0, f"{bits}-bit BMP"


_READ_COST = {
    "PNG": _png_cost,
    "JPEG": _jpeg_cost,
    "GIF": lambda data, width, height: (1, 0, "GIF"),  # its first frame, as palette indices
    "BMP": _bmp_cost,
    "WebP": lambda data, width, height: (4, 0, "WebP"),
}
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


# Bytes a pixel of each mode Pillow decodes these formats into (its storage: 1, 2 or 4 bytes a pixel).
_PILLOW_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "LA": 4, "PA": 4, "RGB": 4, "RGBA": 4}
_PILLOW_BYTES |= {"CMYK": 4, "YCbCr": 4}
_SIXTEEN_BIT = {"I;16": "<u2", "I;16L": "<u2", "I;16B": ">u2"}


def load_decoder() -> None:
    """Import the decoder (Pillow and its plugins for the formats read) now, so that reading the first image does
    not load it (the engine worker calls this with the projector)."""
    from PIL import BmpImagePlugin, GifImagePlugin, JpegImagePlugin, PngImagePlugin  # noqa: F401


def decode_rgb(image: CheckedImage) -> bytearray:
    """The image's pixels as packed 8-bit RGB rows (what libmtmd's bitmap holds), decoded by Pillow within its
    `read_bytes`: the image Pillow decodes into, from its header; then converted a band of rows at a time into the
    one RGB buffer (16-bit samples to their high byte, alpha dropped, palettes expanded: as stb_image does).
    ImageRefused, in one line, if Pillow reads another size or a larger mode than the header said, or cannot
    decode it."""
    import numpy as np
    from PIL import Image

    width, height = image.width, image.height
    what = f"{image.format} image ({image.describe()})"
    try:
        with warnings.catch_warnings(), Image.open(io.BytesIO(image.data), formats=[image.format]) as picture:
            mode = picture.mode
            if picture.size != (width, height) or _PILLOW_BYTES.get(mode, 8) > image.pillow_bytes:
                raise ImageRefused(
                    f"this {what} decodes as {picture.size[0]}×{picture.size[1]} {mode}, not what its header says"
                )
            picture.load()
            warnings.simplefilter("ignore")  # palettes with transparency: converting to RGB drops it, as stb_image does
            rgb = bytearray(width * height * 3)
            view = memoryview(rgb)
            rows = max(1, READ_BAND_BYTES // (width * 3))
            for top in range(0, height, rows):
                band = picture.crop((0, top, width, min(height, top + rows)))
                if mode in _SIXTEEN_BIT:
                    grey = np.frombuffer(band.tobytes(), _SIXTEEN_BIT[mode]) >> 8
                    packed = np.repeat(grey.astype(np.uint8), 3).tobytes()
                else:
                    packed = (band if mode == "RGB" else band.convert("RGB")).tobytes()
                view[top * width * 3 : top * width * 3 + len(packed)] = packed
    except ImageRefused:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError, Image.DecompressionBombError) as exc:
        raise ImageRefused(one_line(f"could not decode this {what}: {exc}")) from None
    return rgb
