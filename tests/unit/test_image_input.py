"""Images from outside are bounded before anything decodes them (engine_ext.image_input), and messages place their
images as markers the prompt's tokens are split at (engine_ext.vision, its pure parts)."""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from engine_ext.image_input import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_READ_BYTES,
    READ_WORKING_BYTES,
    ImageRefused,
    check_image,
    decode_rgb,
    read_image_file,
)
from engine_ext.params import SpeculativeParams
from engine_ext.protocol import IMAGE_MARKER, ChatMessage, ImageRef
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.driver import MEDIA_PAUSE_STATUS, SpeculativeDriver
from engine_ext.vision import EncodedImage, image_marker, message_dicts, request_images, tokenize_with_media
from tests.image_files import pillow_image, png
from tests.tiny_mmproj import png_bytes


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png_claiming(width: int, height: int, *, bit_depth: int = 8, color_type: int = 2, interlace: int = 0) -> bytes:
    """A small PNG whose header claims `width`×`height` (a decompression bomb's shape)."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    idat = zlib.compress(b"\x00" * 4096, 9)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _jpeg(width: int, height: int, *, sof: int = 0xC0, factors: tuple[int, ...] = (0x11,), scanned: int = 0) -> bytes:
    """A JPEG's headers: its frame (SOFn, a component per sampling factor `factors`, 0xHV), a first scan of
    `scanned` components (all of them if 0) and the end marker."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    components = b"".join(bytes([i + 1, hv, 0]) for i, hv in enumerate(factors))
    frame = struct.pack(">HBHHB", 8 + len(components), 8, height, width, len(factors)) + components
    n_scan = scanned or len(factors)
    scan = struct.pack(">HB", 6 + 2 * n_scan, n_scan) + b"".join(bytes([i + 1, 0]) for i in range(n_scan)) + bytes(3)
    return b"\xff\xd8" + app0 + bytes([0xFF, sof]) + frame + b"\xff\xda" + scan + b"\x12\x34" + b"\xff\xd9"


def test_the_formats_and_their_dimensions_are_read_from_headers() -> None:
    png = check_image(png_bytes(40, 30), "a.png")
    assert (png.format, png.width, png.height) == ("PNG", 40, 30)
    assert png.sha256 == hashlib.sha256(png.data).hexdigest()
    assert "PNG 40×30" in png.describe()
    jpeg = check_image(_jpeg(640, 480))
    assert (jpeg.format, jpeg.width, jpeg.height) == ("JPEG", 640, 480)
    gif = check_image(b"GIF89a" + struct.pack("<HH", 12, 7) + b"\x00" * 8 + b"\x3b")
    assert (gif.format, gif.width, gif.height) == ("GIF", 12, 7)
    bmp_header = struct.pack("<IiiHHI", 40, 5, -3, 1, 24, 0) + b"\x00" * 20
    body = bmp_header + b"\x00" * 48
    bmp = check_image(b"BM" + struct.pack("<IHHI", 14 + len(body), 0, 0, 54) + body)
    assert (bmp.format, bmp.width, bmp.height) == ("BMP", 5, 3)
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00" * 4 + (99).to_bytes(3, "little") + (49).to_bytes(3, "little")
    webp = check_image(b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x)
    assert (webp.format, webp.width, webp.height) == ("WebP", 100, 50)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_png_claiming(50_000, 50_000), "more than llmtui decodes"),  # a decompression bomb: 40 KB claiming 2.5 Gpx
        (_png_claiming(8192, 8192), "more than llmtui decodes"),  # each side allowed, the pixels not
        (_png_claiming(0, 10), "says 0×10"),
        (png_bytes(40, 30)[:-20], "truncated"),
        (png_bytes(40, 30)[:20], "damaged or truncated"),
        (_jpeg(640, 480)[:30], "truncated"),
        (_jpeg(640, 480)[:-2], "truncated"),
        (b"%PDF-1.7\n" + b"x" * 100, "not an image"),
        (b"", "empty"),
        (b"\xff\xd8\xff" + b"\x00" * 64, "damaged or truncated"),  # a JPEG with no frame header: a bounded walk
    ],
)
def test_hostile_images_are_one_line_refusals(data: bytes, why: str) -> None:
    with pytest.raises(ImageRefused, match=why) as refused:
        check_image(data, "x.img")
    assert "\n" not in str(refused.value) and str(refused.value).startswith("x.img: ")


WIDE, HIGH = 8192, MAX_IMAGE_PIXELS // 8192  # the most pixels llmtui takes
MIB = 2**20


@pytest.mark.parametrize(
    ("data", "pillow_bytes", "bytes_a_pixel"),
    [
        (_png_claiming(WIDE, HIGH), 4, 7),  # Pillow keeps RGB at 4 bytes a pixel, beside the packed 3
        (_png_claiming(WIDE, HIGH, bit_depth=16), 4, 7),  # 16-bit samples decode to their high byte: no more
        (_png_claiming(WIDE, HIGH, bit_depth=16, color_type=6, interlace=1), 4, 7),  # Adam7: no buffer of the whole
        (_png_claiming(WIDE, HIGH, bit_depth=16, color_type=0), 2, 6),  # 16-bit grey: libmtmd's 6 bytes the most
        (_png_claiming(WIDE, HIGH, color_type=3), 1, 6),  # palette indices
        (_png_claiming(WIDE, HIGH, color_type=4), 4, 7),  # grey and alpha: 4 bytes in Pillow
        (_jpeg(WIDE, HIGH, factors=(0x11, 0x11, 0x11)), 4, 7),  # baseline: decoded scan by scan, even at 4:4:4
        (_jpeg(WIDE, HIGH, sof=0xC2, factors=(0x22, 0x11, 0x11)), 4, 7),  # progressive 4:2:0: + 3 bytes of coefficients
        (_jpeg(WIDE, HIGH, sof=0xC2), 1, 6),  # progressive grey: 2 bytes of coefficients beside 1
    ],
)
def test_what_reading_an_image_costs_is_counted_from_its_header(
    data: bytes, pillow_bytes: int, bytes_a_pixel: int
) -> None:
    image = check_image(data)
    assert image.pillow_bytes == pillow_bytes
    assert image.read_bytes == bytes_a_pixel * MAX_IMAGE_PIXELS + READ_WORKING_BYTES <= MAX_READ_BYTES
    assert MAX_READ_BYTES == 232 * MIB  # the README's figure


@pytest.mark.parametrize(
    ("data", "cost"),
    [
        # 6 bytes of coefficients a pixel beside Pillow's 4: 320 MiB at 32 megapixels, and the working 8
        (_jpeg(WIDE, HIGH, sof=0xC2, factors=(0x11, 0x11, 0x11)), "progressive JPEG would take 328 MiB"),
        (_jpeg(WIDE, HIGH, factors=(0x21, 0x11, 0x11), scanned=1), "multi-scan JPEG would take 264 MiB"),  # 4:2:2
    ],
)
def test_jpegs_whose_coefficients_exceed_the_bound_are_refused_before_decoding(data: bytes, cost: str) -> None:
    with pytest.raises(ImageRefused, match=cost) as refused:
        check_image(data, "scan.jpg")
    assert "\n" not in str(refused.value) and "232 MiB" in str(refused.value)
    # The same file at two thirds of the pixels fits: refused for its cost, not its kind.
    smaller = data.replace(struct.pack(">HH", HIGH, WIDE), struct.pack(">HH", HIGH * 2 // 3, WIDE))
    assert check_image(smaller).read_bytes <= MAX_READ_BYTES


def _rgb_of(data: bytes) -> np.ndarray:
    image = check_image(data)
    return np.frombuffer(decode_rgb(image), np.uint8).reshape(image.height, image.width, 3)


def test_decoding_gives_8_bit_rgb_as_stb_image_did() -> None:
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 65536, (13, 21, 4), dtype=np.uint16)
    rgba16 = png(21, 13, color_type=6, bit_depth=16, pixels=wide)
    expected = (wide[:, :, :3] >> 8).astype(np.uint8)  # the high byte of each sample, alpha dropped
    assert np.array_equal(_rgb_of(rgba16), expected)
    assert np.array_equal(_rgb_of(png(21, 13, color_type=6, bit_depth=16, pixels=wide, interlace=True)), expected)
    grey = rng.integers(0, 65536, (13, 21, 1), dtype=np.uint16)
    assert np.array_equal(_rgb_of(png(21, 13, color_type=0, bit_depth=16, pixels=grey)), np.repeat(grey >> 8, 3, 2))
    grey_alpha = rng.integers(0, 256, (13, 21, 2), dtype=np.uint8)
    assert np.array_equal(_rgb_of(png(21, 13, color_type=4, pixels=grey_alpha)), np.repeat(grey_alpha[:, :, :1], 3, 2))
    indices = rng.integers(0, 256, (13, 21, 1), dtype=np.uint8)
    palette = _rgb_of(png(21, 13, color_type=3, pixels=indices))  # tests/image_files.py's palette: (i, 255 - i, 5i)
    assert np.array_equal(palette[:, :, 1:2], 255 - indices) and np.array_equal(palette[:, :, :1], indices)
    rgb = rng.integers(0, 256, (300, 7, 3), dtype=np.uint8)  # more rows than one band
    assert np.array_equal(_rgb_of(png(7, 300, pixels=rgb)), rgb)
    for fmt, options in (
        ("GIF", {"mode": "P"}),
        ("BMP", {"mode": "1"}),
        ("JPEG", {"quality": 90, "progressive": True}),
    ):
        assert _rgb_of(pillow_image(40, 30, fmt, **options)).shape == (30, 40, 3)


def test_an_image_pillow_cannot_decode_is_a_one_line_refusal() -> None:
    good = png(40, 30)
    at = good.index(b"IDAT") + 8
    broken = good[:at] + bytes(40) + good[at + 40 :]  # its compressed pixels overwritten, the chunks kept
    with pytest.raises(ImageRefused, match="could not decode this PNG image") as refused:
        decode_rgb(check_image(broken))
    assert "\n" not in str(refused.value)


def test_files_that_are_not_regular_or_too_large_are_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(ImageRefused, match="not a regular file"):
        read_image_file(fifo)  # opened without waiting for a writer
    with pytest.raises(ImageRefused, match="not a regular file"):
        read_image_file("/dev/zero")
    with pytest.raises(ImageRefused, match="not a regular file"):
        read_image_file(tmp_path)
    with pytest.raises(ImageRefused, match="no such image file"):
        read_image_file(tmp_path / "missing.png")
    huge = tmp_path / "huge.png"
    with huge.open("wb") as f:
        f.truncate(MAX_IMAGE_BYTES + 1)  # sparse: nothing written, nothing read
    with pytest.raises(ImageRefused, match="larger than"):
        read_image_file(huge)
    ok = tmp_path / "ok.png"
    ok.write_bytes(png_bytes(8, 8))
    assert read_image_file(ok).width == 8


def _ref(tag: str) -> ImageRef:
    return ImageRef(hashlib.sha256(tag.encode()).hexdigest(), name=tag)


def test_messages_place_images_at_markers_or_before_the_text() -> None:
    a, b, c = _ref("a"), _ref("b"), _ref("c")
    placed = message_dicts(
        [ChatMessage("user", f"left {IMAGE_MARKER} right", images=(a, b)), ChatMessage("assistant", "x")]
    )
    assert placed[0]["content"] == f"{image_marker(b.sha256)}\nleft {image_marker(a.sha256)} right"
    assert placed[1] == {"role": "assistant", "content": "x"}
    assert message_dicts([ChatMessage("user", "hi")]) == [{"role": "user", "content": "hi"}]
    assert request_images([ChatMessage("user", "", images=(a, b)), ChatMessage("user", "", images=(b, c))]) == [a, b, c]


def test_prompt_tokens_split_at_the_markers_of_known_images_only() -> None:
    a = _ref("a")
    entry = EncodedImage(a.sha256, parts=[[7]])  # an image's text part only: the shape, not an encode
    text = f"x{image_marker(a.sha256)}y{image_marker(_ref('other').sha256)}"

    def tokenize(part: str) -> list[int]:
        return [ord(ch) for ch in part]

    tokens = tokenize_with_media(text, {a.sha256: entry}, tokenize)
    assert tokens[:3] == [ord("x"), 7, ord("y")]
    assert tokens[3:] == tokenize(image_marker(_ref("other").sha256))  # an unknown marker stays text
    assert tokenize_with_media("plain", {}, tokenize) == tokenize("plain")


class _Echo(Drafter):
    """Drafts the tokens that followed the last occurrence of id_last (images' ids included, as an n-gram could)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def draft(self, tokens, id_last, n_max):  # type: ignore[no-untyped-def]
        hist = list(tokens)
        at = max((i for i, t in enumerate(hist) if t == id_last), default=-1)
        return hist[at + 1 : at + 1 + n_max] if at >= 0 else []


def test_model_drafters_pause_and_ngram_drafts_stop_before_an_image() -> None:
    ngram, model = _Echo("ngram-simple"), _Echo("draft-simple")
    driver = SpeculativeDriver(SpeculativeParams(types=("draft-simple", "ngram-simple")), [model, ngram])
    assert driver.set_media(True) is False
    driver.reset_stats()
    assert driver.status == MEDIA_PAUSE_STATUS
    draft, drafter = driver.draft([5, 6, 7, -1, -1, 8], 5, 8)
    assert drafter is ngram and draft == [6, 7]  # the model drafter skipped; the draft cut before the image
    assert driver.set_media(False) is False  # no drafter reads batches: nothing to evaluate again
    draft, drafter = driver.draft([5, 6, 7], 5, 8)
    assert drafter is model
