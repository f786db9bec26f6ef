"""Test images of every kind the engine takes, made in the test: PNGs written chunk by chunk with zlib (any bit depth
and colour type, Adam7 interlacing, which Pillow's writer lacks) and JPEG, GIF and BMP through Pillow.

The pixels are a pattern that repeats every 256 columns, so an image at the largest pixel count llmtui accepts
compresses to a few hundred KB (the shape of the issue's 254 KiB 16-bit PNG) and writes in a second or two.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Colour type: channels a pixel has (PNG's IHDR), palette images being one index a pixel.
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7's seven passes: first column, first row, column step, row step.
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def pattern(height: int, width: int, channels: int, *, bit_depth: int = 8) -> np.ndarray[Any, Any]:
    """Pixels that vary across rows, columns and channels and repeat every 256 columns."""
    y = np.arange(height, dtype=np.uint32)[:, None, None]
    x = np.arange(width, dtype=np.uint32)[None, :, None]
    c = np.arange(channels, dtype=np.uint32)[None, None, :]
    values = (x * 7 + y * 3 + c * 50) % 256
    if bit_depth == 16:
        return (values * 257 + (y % 7)).astype(np.uint16)
    if bit_depth < 8:
        return (values % (1 << bit_depth)).astype(np.uint8)
    return values.astype(np.uint8)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _scanlines(pixels: np.ndarray[Any, Any], bit_depth: int) -> bytes:
    """Rows of `pixels` (height × width × channels) as PNG filter-0 scanlines."""
    height = pixels.shape[0]
    if bit_depth == 16:
        rows = pixels.astype(">u2").reshape(height, -1).view(np.uint8)
    elif bit_depth < 8:
        rows = np.packbits(
            np.unpackbits(pixels.reshape(height, -1, 1), axis=2)[:, :, 8 - bit_depth :].reshape(height, -1), axis=1
        )
    else:
        rows = pixels.reshape(height, -1)
    return np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()


def png(
    width: int,
    height: int,
    *,
    color_type: int = 2,
    bit_depth: int = 8,
    interlace: bool = False,
    pixels: np.ndarray[Any, Any] | None = None,
) -> bytes:
    """A PNG of `pattern` pixels (or `pixels`, height × width × channels), interlaced with Adam7 if asked; a palette
    image (colour type 3) gets a 256-entry grey-ramp palette and a tRNS chunk."""
    channels = PNG_CHANNELS[color_type]
    if pixels is None:
        pixels = pattern(height, width, channels, bit_depth=bit_depth)
    if interlace:
        passes = [pixels[y0::dy, x0::dx] for x0, y0, dx, dy in ADAM7]
        raw = b"".join(_scanlines(p, bit_depth) for p in passes if p.shape[0] and p.shape[1])
    else:
        raw = _scanlines(pixels, bit_depth)
    extra = b""
    if color_type == 3:
        ramp = bytes(v for i in range(256) for v in (i, 255 - i, (i * 5) % 256))
        extra = png_chunk(b"PLTE", ramp[: 3 << bit_depth]) + png_chunk(
            b"tRNS", bytes(range(0, 256, 2))[: 1 << bit_depth]
        )
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, int(interlace))
    body = png_chunk(b"IHDR", header) + extra + png_chunk(b"IDAT", zlib.compress(raw, 6))
    return PNG_SIGNATURE + body + png_chunk(b"IEND", b"")


def pillow_image(width: int, height: int, fmt: str, **options: Any) -> bytes:
    """`pattern` pixels saved by Pillow as `fmt` (JPEG, GIF, BMP) with its save options (mode: the image's mode)."""
    from PIL import Image

    mode = options.pop("mode", "RGB")
    picture = Image.fromarray(pattern(height, width, 3), "RGB")
    if mode != "RGB":
        picture = picture.convert(mode)
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()
