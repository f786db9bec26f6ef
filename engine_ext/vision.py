"""Images through libmtmd: the projector loaded beside the model, each image tokenized and encoded once and kept by
content hash (bounded by bytes), and decoded into the context in order with the text (positions advanced as
mtmd says, M-RoPE included), so the prompt cache keeps working across turns with images in them.

In a prompt's token list an image takes one negative id per position it advances (`n_pos`; the same id for all of
them, one id per image chunk for the session's life): the prompt cache compares token lists, so an image already in
the context is reused like text, and a different image at the same place differs at its first position. Token ids
below zero never reach llama_decode: `evaluate_with_media` decodes those spans from their cached embeddings.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine_ext.bindings import C, mtmd
from engine_ext.engine_status import phase
from engine_ext.image_input import CheckedImage, ImageRefused, check_image, decode_rgb, load_decoder, read_image_file
from engine_ext.params import EngineError, ModelLoadError
from engine_ext.protocol import IMAGE_MARKER, ChatMessage, ImageRef
from engine_ext.tool_calls import template_message

if TYPE_CHECKING:
    from engine_ext.model import Context, Model

ENCODED_CACHE_BYTES = 256 * 1024 * 1024  # encoded images kept (float32 embeddings) before the oldest go
MAX_IMAGES_PER_REQUEST = 64
_MARKER_RE = re.compile(r"<__llmtui_image_([0-9a-f]{64})__>")


class NoProjector(EngineError):
    """Images were sent to a model loaded without a projector (mmproj)."""


def image_marker(sha256: str) -> str:
    """The text an image stands as in a rendered prompt: it names the image, so a prompt that only swaps an image
    for another does not extend the text (and tokens) of the one before."""
    return f"<__llmtui_image_{sha256}__>"


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them (tool calls and results as engine_ext.tool_calls gives them), each
    image as its marker: the message's IMAGE_MARKERs in order,
    the images no marker places before the text (as llama.cpp's mtmd-cli puts them)."""
    out = []
    for m in messages:
        content = m.content
        if m.images:
            parts = content.split(IMAGE_MARKER, len(m.images))
            placed = len(parts) - 1
            rest = m.images[placed:]
            content = "".join(p + (image_marker(m.images[i].sha256) if i < placed else "") for i, p in enumerate(parts))
            content = "".join(image_marker(r.sha256) + "\n" for r in rest) + content
        out.append(template_message(m) | {"content": content})
    return out


def request_images(messages: Sequence[ChatMessage]) -> list[ImageRef]:
    """Every image of a conversation, each hash once, in order."""
    seen: dict[str, ImageRef] = {}
    for m in messages:
        for ref in m.images:
            seen.setdefault(ref.sha256, ref)
    if len(seen) > MAX_IMAGES_PER_REQUEST:
        raise ImageRefused(f"{len(seen)} images in one conversation; llmtui sends {MAX_IMAGES_PER_REQUEST} at most")
    return list(seen.values())


@dataclass
class _ImageChunk:
    """One encoded image chunk: a placeholder chunk (metadata only: token grid, positions) and its embeddings."""

    span_id: int  # the negative id its positions take in a token list
    chunk: int  # mtmd_input_chunk * (a placeholder, owned)
    embd: np.ndarray[Any, np.dtype[np.float32]]
    n_tokens: int
    n_pos: int


@dataclass
class EncodedImage:
    """An image as its chunks: text tokens mtmd adds around it (the model's image-start/-end tokens) and images."""

    sha256: str
    parts: list[list[int] | _ImageChunk] = field(default_factory=list)
    encode_ms: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(p.embd.nbytes for p in self.parts if isinstance(p, _ImageChunk))

    @property
    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.parts if isinstance(p, _ImageChunk))

    def tokens(self) -> list[int]:
        out: list[int] = []
        for p in self.parts:
            out.extend(p if isinstance(p, list) else [p.span_id] * p.n_pos)
        return out


class Vision:
    """The projector (an mtmd context on the loaded model) and the encoded-image cache of one loaded model."""

    def __init__(self, mmproj: Path, model: Model, *, n_threads: int, use_gpu: bool) -> None:
        m = mtmd()  # MultimodalUnavailable without libmtmd
        if not mmproj.is_file():
            raise ModelLoadError(f"projector file not found: {mmproj}")
        self.m = m
        params = m.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        handle = m.mtmd_init_from_file(str(mmproj).encode(), model.handle, params)
        if not handle:
            raise ModelLoadError(
                f"{mmproj.name}: libmtmd could not load this projector for {model.architecture} (not an mmproj GGUF, "
                "or made for another model: its embedding size must match the model's); the engine log says more"
            )
        self.handle = handle
        if not m.mtmd_support_vision(handle):
            self.close()
            raise ModelLoadError(f"{mmproj.name}: this projector reads no images (audio only)")
        self.path = mmproj
        self.uses_mrope = bool(m.mtmd_decode_use_mrope(handle))
        self.n_embd = int(C.llama_model_n_embd_inp(model.handle))
        self.cache: OrderedDict[str, EncodedImage] = OrderedDict()
        self.pinned: set[str] = set()  # images of requests still decoding (parallel sequences): never evicted
        self.by_span: dict[int, _ImageChunk] = {}
        self._span_ids: dict[tuple[str, int], int] = {}
        self._span_keys: dict[int, tuple[str, int]] = {}  # span id -> (image's sha256, chunk's index in it)
        self.cache_bytes = ENCODED_CACHE_BYTES
        self.encodes = 0  # images encoded since load (tests and stats read it)
        self.encode_ms = 0.0
        load_decoder()

    # ----- images in ----------------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ImageRef]) -> dict[str, EncodedImage]:
        """Each image of a request, encoded: from the cache, else read, checked, tokenized and encoded now."""
        wanted = {r.sha256 for r in refs}
        out: dict[str, EncodedImage] = {}
        for ref in refs:
            entry = self.cache.get(ref.sha256)
            if entry is None:
                entry = self._encode(_checked(ref))
                self.cache[ref.sha256] = entry
                self._evict(keep=wanted)
            self.cache.move_to_end(ref.sha256)
            out[ref.sha256] = entry
        return out

    def _encode(self, image: CheckedImage) -> EncodedImage:
        m = self.m
        if image.format == "WebP":
            raise ImageRefused("WebP images are not read by this engine; convert it to PNG")
        bitmap = self.bitmap_of(image)
        chunks = m.mtmd_input_chunks_init()
        try:
            marker = m.mtmd_default_marker()
            text = m.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = m.mtmd_tokenize(self.handle, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise ImageRefused(f"libmtmd could not tokenize this image (error {rc}; {image.describe()})")
            return self._encode_chunks(image.sha256, chunks)
        finally:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)

    def bitmap_of(self, image: CheckedImage) -> Any:
        """libmtmd's bitmap of the image: its 8-bit RGB pixels from decode_rgb (Pillow, within the image's
        read_bytes), the decoded buffer freed before the projector's preprocessing copies the bitmap."""
        rgb = decode_rgb(image)
        pixels = (ctypes.c_uint8 * len(rgb)).from_buffer(rgb)
        bitmap = self.m.mtmd_bitmap_init(image.width, image.height, pixels)
        del pixels
        if not bitmap:
            raise ImageRefused(f"libmtmd could not take this {image.format} image ({image.describe()})")
        self.m.mtmd_bitmap_set_id(bitmap, image.sha256.encode())  # as libmtmd's helper names it: its content hash
        return bitmap

    def _encode_chunks(self, sha256: str, chunks: Any) -> EncodedImage:
        m = self.m
        entry = EncodedImage(sha256)
        try:
            for i in range(int(m.mtmd_input_chunks_size(chunks))):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                kind = int(m.mtmd_input_chunk_get_type(chunk))
                if kind == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t(0)
                    ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    entry.parts.append([int(ids[j]) for j in range(n.value)])
                    continue
                if kind != m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    raise ImageRefused("libmtmd made a non-image chunk of an image")
                n_tokens = int(m.mtmd_input_chunk_get_n_tokens(chunk))
                t0 = time.perf_counter()
                with phase("encode"):  # the phase the client sees (engine_ext.engine_status)
                    rc = m.mtmd_encode_chunk(self.handle, chunk)
                if rc != 0:
                    raise EngineError(f"the projector failed to encode the image (error {rc}); the engine log says why")
                out = m.mtmd_get_output_embd(self.handle)
                embd = np.ctypeslib.as_array(out, shape=(n_tokens * self.n_embd,)).copy()
                entry.encode_ms += (time.perf_counter() - t0) * 1000.0
                placeholder = m.mtmd_input_chunk_get_placeholder(chunk)
                if not placeholder:
                    raise EngineError("libmtmd could not keep the image's chunk")
                key = (sha256, len(entry.parts))
                span_id = self._span_ids.setdefault(key, -1 - len(self._span_ids))
                self._span_keys[span_id] = key
                part = _ImageChunk(span_id, placeholder, embd, n_tokens, int(m.mtmd_input_chunk_get_n_pos(chunk)))
                entry.parts.append(part)
                self.by_span[span_id] = part
        except BaseException:
            self._free(entry)
            raise
        self.encodes += 1
        self.encode_ms += entry.encode_ms
        return entry

    def _evict(self, keep: set[str]) -> None:
        """Drop the least recently used images past the byte bound (never one the request in hand uses)."""
        total = sum(e.nbytes for e in self.cache.values())
        for sha in list(self.cache):
            if total <= self.cache_bytes:
                break
            if sha in keep or sha in self.pinned:
                continue
            entry = self.cache.pop(sha)
            total -= entry.nbytes
            self._free(entry)

    def _free(self, entry: EncodedImage) -> None:
        for p in entry.parts:
            if isinstance(p, _ImageChunk) and p.chunk:
                if self.by_span.get(p.span_id) is p:
                    del self.by_span[p.span_id]
                self.m.mtmd_input_chunk_free(p.chunk)
                p.chunk = 0

    def close(self) -> None:
        for entry in self.cache.values():
            self._free(entry)
        self.cache.clear()
        if self.handle:
            self.m.mtmd_free(self.handle)
            self.handle = None

    def span_key(self, span_id: int) -> tuple[str, int] | None:
        """What an image span id stands for in any process: its image's content hash and the chunk's index among the
        image's parts (None: not an id of this projector)."""
        return self._span_keys.get(span_id)

    # ----- into the context ------------------------------------------------------------------------------

    def decode_span(self, ctx: Context, n_past: int, span_id: int, seq: int = 0) -> int:
        """Decode one image chunk at position `n_past` of sequence `seq` from its embeddings; returns the positions
        it took."""
        part = self.by_span.get(span_id)
        if part is None:
            raise EngineError("an image of this prompt is no longer cached; send the message again")
        new_n_past = C.llama_pos(0)
        embd = part.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = self.m.mtmd_helper_decode_image_chunk(
            self.handle, ctx.handle, part.chunk, embd, n_past, seq, ctx.n_batch, ctypes.byref(new_n_past),
            self.m.mtmd_helper_post_decode_callback(),  # NULL: no callback
            None,
        )  # fmt: skip
        if rc != 0:
            raise EngineError(f"decoding the image into the context failed (error {rc}); the engine log says why")
        return part.n_pos


def _checked(ref: ImageRef) -> CheckedImage:
    name = ref.name or (Path(ref.path).name if ref.path else "image")
    image = check_image(ref.data, name) if ref.data else read_image_file(ref.path)
    if image.sha256 != ref.sha256:
        raise ImageRefused(f"{name}: the file changed since it was attached (its content hash differs)")
    return image


def tokenize_with_media(
    text: str, media: Mapping[str, EncodedImage], tokenize: Callable[[str], list[int]]
) -> list[int]:
    """Tokens of a prompt whose images stand as their markers: text between them tokenized as text (as mtmd
    splits it), each image as its chunks' tokens."""
    if not media:
        return tokenize(text)
    tokens: list[int] = []
    start = 0
    for match in _MARKER_RE.finditer(text):
        entry = media.get(match.group(1))
        if entry is None:  # text that looks like a marker but names no image of this request stays text
            continue
        if match.start() > start:
            tokens.extend(tokenize(text[start : match.start()]))
        tokens.extend(entry.tokens())
        start = match.end()
    if start < len(text):
        tokens.extend(tokenize(text[start:]))
    return tokens


def evaluate_with_media(
    cached: list[int],
    ctx: Context,
    vision: Vision,
    tokens: Sequence[int],
    evaluate_text: Callable[[Sequence[int], bool], None],
    logits_last: bool,
) -> None:
    """Evaluate `tokens` into the context: runs of text through `evaluate_text(run, logits_last)`, each image span
    from its cached embeddings (the prompt's last token is text: a plan never ends in an image)."""
    if tokens and tokens[0] < 0 and cached and cached[-1] == tokens[0]:
        raise EngineError("the prompt cache ended inside an image; send the message again")
    i, n = 0, len(tokens)
    while i < n:
        if tokens[i] < 0:
            span_id = tokens[i]
            n_pos = vision.decode_span(ctx, len(cached), span_id)
            cached.extend([span_id] * n_pos)
            i += n_pos
            continue
        j = i
        while j < n and tokens[j] >= 0:
            j += 1
        evaluate_text(tokens[i:j], logits_last and j == n)
        i = j


def image_token_count(tokens: Sequence[int], vision: Vision | None) -> int:
    """Tokens the prompt's images take in the context (their embeddings, not their positions)."""
    if vision is None:
        return 0
    total, i, n = 0, 0, len(tokens)
    while i < n:
        if tokens[i] < 0 and tokens[i] in vision.by_span:
            part = vision.by_span[tokens[i]]
            total += part.n_tokens
            i += part.n_pos
        else:
            i += 1
    return total
