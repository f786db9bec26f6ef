"""What reading one image costs the engine worker: the peak growth of its resident memory while an image is decoded,
tokenized and encoded by the projector, for each kind of image at the largest pixel count llmtui accepts, by
stb_image inside libmtmd (the path before issue 42: `mtmd_helper_bitmap_init_from_buf`) and by llmtui's own decoder
(engine_ext.vision's), side by side.

Each measurement runs in a fresh process holding the tiny llama and the tiny projector (tests/tiny_models.py,
tests/tiny_mmproj.py): the kernel's peak (VmHWM) is reset through /proc/self/clear_refs just before the encode, and
the growth is VmHWM after it minus VmRSS before it. The image's file bytes are in memory before (not counted). The
last column says whether both paths gave the projector the same embeddings.

    python scripts/bench_image_memory.py                 # every case
    python scripts/bench_image_memory.py png-rgba16-adam7 jpeg-progressive --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine_ext.image_input import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE  # noqa: E402
from tests.image_files import pillow_image, png  # noqa: E402

WIDTH = MAX_IMAGE_SIDE
HEIGHT = MAX_IMAGE_PIXELS // MAX_IMAGE_SIDE
# 24-bit BMP is uncompressed: the most pixels under MAX_IMAGE_BYTES, a whole number of 4-byte rows
BMP24_HEIGHT = (MAX_IMAGE_BYTES - 54) // (WIDTH * 3)

CASES: dict[str, Callable[[], bytes]] = {
    "png-rgb8": lambda: png(WIDTH, HEIGHT),
    "png-rgb16": lambda: png(WIDTH, HEIGHT, bit_depth=16),
    "png-rgba16": lambda: png(WIDTH, HEIGHT, color_type=6, bit_depth=16),
    "png-rgb8-adam7": lambda: png(WIDTH, HEIGHT, interlace=True),
    "png-rgba16-adam7": lambda: png(WIDTH, HEIGHT, color_type=6, bit_depth=16, interlace=True),
    "png-gray16": lambda: png(WIDTH, HEIGHT, color_type=0, bit_depth=16),
    "png-palette": lambda: png(WIDTH, HEIGHT, color_type=3),
    "png-gray-alpha": lambda: png(WIDTH, HEIGHT, color_type=4),
    "jpeg-baseline": lambda: pillow_image(WIDTH, HEIGHT, "JPEG", quality=90),
    "jpeg-progressive": lambda: pillow_image(WIDTH, HEIGHT, "JPEG", quality=90, progressive=True),
    # 4:4:4 progressive: 6 bytes of coefficients a pixel, so the most pixels its read cost allows
    "jpeg-progressive-444": lambda: pillow_image(WIDTH, 2864, "JPEG", quality=75, subsampling=0, progressive=True),
    "jpeg-gray": lambda: pillow_image(WIDTH, HEIGHT, "JPEG", mode="L", quality=90, progressive=True),
    "gif": lambda: pillow_image(WIDTH, HEIGHT, "GIF", mode="P"),
    "bmp-1bit": lambda: pillow_image(WIDTH, HEIGHT, "BMP", mode="1"),
    "bmp-rgb24": lambda: pillow_image(WIDTH, BMP24_HEIGHT, "BMP"),
}
PATHS = ("stb", "llmtui")


def _status(field: str) -> int:
    """A VmXXX line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _stb_bitmap(vision: Any, image: Any) -> Any:
    """The path before issue 42: libmtmd's helper, stb_image decoding the file's bytes."""
    import ctypes

    m = vision.m
    buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
    bitmap = m.mtmd_helper_bitmap_init_from_buf(vision.handle, buf, len(image.data), False, None)
    if not bitmap:
        raise RuntimeError("stb_image could not decode it")
    return bitmap


def child(path: str, model_path: str, mmproj: str, image_path: str) -> None:
    """One measurement, in this (fresh) process: print its JSON line."""
    from engine_ext.image_input import check_image
    from engine_ext.model import Model
    from engine_ext.vision import Vision

    model = Model(Path(model_path))
    vision = Vision(Path(mmproj), model, n_threads=2, use_gpu=False)
    image = check_image(Path(image_path).read_bytes(), Path(image_path).name)
    if path == "stb":
        vision.bitmap_of = lambda checked: _stb_bitmap(vision, checked)  # type: ignore[method-assign]
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    before = _status("VmRSS")
    t0 = time.perf_counter()
    try:
        entry = vision._encode(image)
    except Exception as exc:  # a refusal is a result too
        print(json.dumps({"error": str(exc), "seconds": time.perf_counter() - t0}))
        return
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    embd = b"".join(p.embd.tobytes() for p in entry.parts if not isinstance(p, list))
    print(
        json.dumps({"peak_mib": (peak - before) / 2**20, "seconds": seconds, "embd": hashlib.sha256(embd).hexdigest()})
    )
    vision.close()
    model.close()


def measure(path: str, model: Path, mmproj: Path, image: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", path, str(model), str(mmproj), str(image)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all): {', '.join(CASES)}")
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    from tests.tiny_mmproj import write_tiny_mmproj
    from tests.tiny_models import write_tiny_model

    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = write_tiny_model("llama", folder / "tiny-llama.gguf")
        mmproj = write_tiny_mmproj(folder / "mmproj.gguf")
        if not args.json:
            print(f"{'case':<20} {'file':>9} {'stb MiB':>9} {'llmtui MiB':>11} {'stb s':>6} {'llmtui s':>8}  same")
        for name in args.cases or list(CASES):
            data = CASES[name]()
            image = folder / name
            image.write_bytes(data)
            results = {path: measure(path, model, mmproj, image) for path in PATHS}
            if args.json:
                print(json.dumps({"case": name, "bytes": len(data), **results}))
                continue
            cells = []
            for key, fmt in (("peak_mib", "{:.0f}"), ("seconds", "{:.1f}")):
                for path in PATHS:
                    r = results[path]
                    cells.append(fmt.format(r[key]) if key in r else "refused" if "error" in r else "-")
            same = results["stb"].get("embd") == results["llmtui"].get("embd") and "embd" in results["stb"]
            kib = f"{len(data) // 1024} KiB"
            same_text = "yes" if same else "no"
            print(f"{name:<20} {kib:>9} {cells[0]:>9} {cells[1]:>11} {cells[2]:>6} {cells[3]:>8}  {same_text}")
            for path in PATHS:
                if "error" in results[path]:
                    print(f"  {path}: {results[path]['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
