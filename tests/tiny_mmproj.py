"""A tiny random-weight multimodal projector (mmproj) for the tiny llama, written with the PyPI ``gguf`` package.

A LLaVA-style projector ("mlp", the simplest clip.cpp graph: vendored tools/mtmd/models/llava.cpp): a 2-layer ViT
over 14-pixel patches of a 56-pixel image (16 patches, a class token), whose second-to-last layer feeds mm.0 / GELU /
mm.2 into the text model's 64-wide embeddings. Every image becomes 16 image tokens at 16 positions (no M-RoPE), and
the weights are drawn from a seeded numpy generator, so encodes are deterministic.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from tests.tiny_models import N_EMBD

V_EMBD = 32
V_FF = 48
V_HEADS = 2
V_LAYERS = 2
IMAGE_SIZE = 56
PATCH_SIZE = 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # image tokens (and positions) each image takes


def write_tiny_mmproj(path: Path, *, seed: int = 0) -> Path:
    """Write the projector to ``path`` and return it."""
    rng = np.random.default_rng([seed, 36])
    tensors: dict[str, np.ndarray] = {}

    def put(name: str, ggml_shape: tuple[int, ...], std: float = 0.05, mean: float = 0.0) -> None:
        value = mean + std * rng.standard_normal(tuple(reversed(ggml_shape)))
        tensors[name] = np.ascontiguousarray(value, dtype=np.float32)

    n_pos = IMAGE_TOKENS + 1  # the patches and the class token
    put("v.patch_embd.weight", (PATCH_SIZE, PATCH_SIZE, 3, V_EMBD))
    put("v.patch_embd.bias", (V_EMBD,))
    put("v.class_embd", (V_EMBD,))
    put("v.position_embd.weight", (V_EMBD, n_pos))
    put("v.pre_ln.weight", (V_EMBD,), 0.02, 1.0)
    put("v.pre_ln.bias", (V_EMBD,))
    for i in range(V_LAYERS):
        p = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            put(f"{p}.{part}.weight", (V_EMBD, V_EMBD))
            put(f"{p}.{part}.bias", (V_EMBD,))
        for norm in ("ln1", "ln2"):
            put(f"{p}.{norm}.weight", (V_EMBD,), 0.02, 1.0)
            put(f"{p}.{norm}.bias", (V_EMBD,))
        put(f"{p}.ffn_up.weight", (V_EMBD, V_FF))
        put(f"{p}.ffn_up.bias", (V_FF,))
        put(f"{p}.ffn_down.weight", (V_FF, V_EMBD))
        put(f"{p}.ffn_down.bias", (V_EMBD,))
    put("mm.0.weight", (V_EMBD, N_EMBD), 0.2)
    put("mm.0.bias", (N_EMBD,))
    put("mm.2.weight", (N_EMBD, N_EMBD), 0.2)
    put("mm.2.bias", (N_EMBD,))

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(path, "clip")
    try:
        w.add_string("general.name", "tiny-llama-mmproj")
        w.add_uint32("general.file_type", 0)
        w.add_string("clip.projector_type", "mlp")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.use_gelu", True)
        w.add_uint32("clip.vision.embedding_length", V_EMBD)
        w.add_uint32("clip.vision.feed_forward_length", V_FF)
        w.add_uint32("clip.vision.block_count", V_LAYERS)
        w.add_uint32("clip.vision.projection_dim", N_EMBD)
        w.add_uint32("clip.vision.attention.head_count", V_HEADS)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
        w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
        w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        for name, value in tensors.items():
            w.add_tensor(name, value)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


def png_bytes(width: int, height: int, *, seed: int = 0) -> bytes:
    """A valid RGB PNG of random pixels (zlib and struct only), for attaching in tests."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
