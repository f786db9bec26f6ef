"""Images from outside are bounded before anything decodes them (engine_ext.image_input), and messages place their
images as markers the prompt's tokens are split at (engine_ext.vision, its pure parts)."""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

import pytest

from engine_ext.image_input import MAX_IMAGE_BYTES, ImageRefused, check_image, read_image_file
from engine_ext.params import SpeculativeParams
from engine_ext.protocol import IMAGE_MARKER, ChatMessage, ImageRef
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.driver import MEDIA_PAUSE_STATUS, SpeculativeDriver
from engine_ext.vision import EncodedImage, image_marker, message_dicts, request_images, tokenize_with_media
from tests.tiny_mmproj import png_bytes


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims `width`×`height` (a decompression bomb's shape)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 4096, 9)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xda\x00\x02" + b"\x12\x34" + b"\xff\xd9"


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
