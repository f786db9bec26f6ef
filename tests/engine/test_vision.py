"""Images through libmtmd for real: the tiny llama with a tiny random-weight projector (tests/tiny_mmproj.py).

Image tokens are counted and decoded at their positions, output is deterministic, a second turn encodes nothing
(the encoded-image cache) and reuses the prompt cache, speculation stays lossless. Skipped, saying so, where the
engine was built without libmtmd."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine_ext.bindings import MultimodalUnavailable, mtmd
from engine_ext.client import EngineClient
from engine_ext.generate import Session
from engine_ext.image_input import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, MAX_READ_BYTES, ImageRefused
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, ModelLoadError, ModelParams, SpeculativeParams
from engine_ext.protocol import ChatMessage, Crashed, Failed, Finished, Generate, ImageRef
from engine_ext.speculative.driver import MEDIA_PAUSE_STATUS
from engine_ext.speculative.factory import build_driver
from engine_ext.vision import NoProjector, Vision
from tests.image_files import png
from tests.tiny_mmproj import IMAGE_TOKENS, png_bytes, write_tiny_mmproj

try:
    mtmd()
    NO_MTMD = ""
except MultimodalUnavailable:
    NO_MTMD = "this engine was built without libmtmd (scripts/build_engine.sh builds it)"

pytestmark = pytest.mark.skipif(bool(NO_MTMD), reason=NO_MTMD)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-llama-f32.gguf")


@contextmanager
def vision_session(model_path: Path, mmproj: Path, vision: Vision | None = None) -> Iterator[Session]:
    model = Model(model_path)
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_threads=2))
    own = vision is None
    try:
        session = Session(model, ctx)
        session.vision = Vision(mmproj, model, n_threads=2, use_gpu=False) if own else vision
        yield session
    finally:
        if own and session.vision is not None:
            session.vision.close()
        ctx.close()
        model.close()


def image(seed: int = 0) -> ImageRef:
    data = png_bytes(40, 30, seed=seed)
    return ImageRef(hashlib.sha256(data).hexdigest(), data=data, name=f"picture-{seed}.png")


def ask(session: Session, messages: tuple[ChatMessage, ...], n: int = 12) -> tuple[list[int], Finished]:
    ids: list[int] = []

    def emit(event: object) -> None:
        ids.extend(getattr(event, "token_ids", ()))

    request = Generate(request_id=1, messages=messages, sampling=GREEDY, max_tokens=n, ignore_eos=True)
    return ids, session.generate(request, emit, lambda: False)


def test_an_image_is_encoded_counted_and_decoded_deterministically(tiny_models: dict[str, Path], mmproj: Path) -> None:
    turn = (ChatMessage("user", "what is in the picture?", images=(image(),)),)
    with vision_session(tiny_models["llama"], mmproj) as session:
        ids, done = ask(session, turn)
        assert done.stats.image_tokens == IMAGE_TOKENS
        assert done.stats.images_encoded == 1 and done.stats.image_encode_ms > 0
        text_only, _ = ask(session, (ChatMessage("user", "what is in the picture?"),))
        other, other_done = ask(session, (ChatMessage("user", "what is in the picture?", images=(image(seed=1),)),))
        # The image's positions are in the context: prompt tokens count them, text-only is shorter by them.
        assert other_done.stats.prompt_tokens == done.stats.prompt_tokens
    with vision_session(tiny_models["llama"], mmproj) as fresh:
        again, _ = ask(fresh, turn)
    assert again == ids  # deterministic across sessions (its own projector, encode and decode)
    assert ids != text_only and ids != other  # the image reaches the model: another image or none reads differently


def test_a_second_turn_encodes_nothing_and_reuses_the_prompt_cache(tiny_models: dict[str, Path], mmproj: Path) -> None:
    picture = image()
    first = (ChatMessage("user", "describe it", images=(picture,)),)
    with vision_session(tiny_models["llama"], mmproj) as session:
        ids, done = ask(session, first)
        second = (*first, ChatMessage("assistant", "a picture"), ChatMessage("user", "and the colours?"))
        _, again = ask(session, second)
        assert again.stats.images_encoded == 0
        assert again.stats.image_tokens == IMAGE_TOKENS
        # The first turn's prompt, image included, came from the cache.
        assert again.stats.prompt_tokens_cached >= done.stats.prompt_tokens - 1
        assert session.vision is not None and session.vision.encodes == 1
        # A fresh context (the prompt cache empty) on the same projector: decoded again, not encoded again.
        with vision_session(tiny_models["llama"], mmproj, session.vision) as fresh:
            ids_fresh, redo = ask(fresh, first)
        assert redo.stats.images_encoded == 0 and ids_fresh == ids


@pytest.mark.parametrize("spec_type", ["ngram-simple", "draft-simple"])
def test_speculation_with_an_image_is_lossless(tiny_models: dict[str, Path], mmproj: Path, spec_type: str) -> None:
    turn = (ChatMessage("user", "the picture, twice: the picture", images=(image(), image())),)
    with vision_session(tiny_models["llama"], mmproj) as session:
        plain, _ = ask(session, turn, n=24)
        session.reset_cache()
        params = SpeculativeParams(types=(spec_type,), draft_model=str(tiny_models["llama"]))
        session.spec = build_driver(params, session.model, session.ctx)
        try:
            drafted, done = ask(session, turn, n=24)
        finally:
            session.spec.close()
            session.spec = None
    assert drafted == plain
    assert done.speculative is not None
    if spec_type == "draft-simple":  # the draft model cannot see the image: paused for this reply, saying why
        assert done.speculative.status == MEDIA_PAUSE_STATUS and done.speculative.drafted == 0


def test_images_without_a_projector_and_hostile_images_are_one_line(
    tiny_models: dict[str, Path], mmproj: Path, tmp_path: Path
) -> None:
    with vision_session(tiny_models["llama"], mmproj) as session:
        vision, session.vision = session.vision, None
        with pytest.raises(NoProjector, match="without a projector"):
            ask(session, (ChatMessage("user", "see", images=(image(),)),))
        session.vision = vision
        bad = png_bytes(40, 30)[:-40] + png_bytes(4, 4)[-12:]  # pixel data cut short, the file's end kept
        ref = ImageRef(hashlib.sha256(bad).hexdigest(), data=bad, name="cut.png")
        with pytest.raises(ImageRefused, match=r"cut\.png|could not decode") as refused:
            ask(session, (ChatMessage("user", "see", images=(ref,)),))
        assert "\n" not in str(refused.value)
        webp = b"RIFF\x16\x00\x00\x00WEBPVP8X" + bytes(4) + b"\x00" * 4 + (9).to_bytes(3, "little") * 2
        with pytest.raises(ImageRefused, match="WebP"):
            ask(session, (ChatMessage("user", "see", images=(ImageRef(hashlib.sha256(webp).hexdigest(), data=webp),)),))
        # After refusals the session still answers with an image.
        _, done = ask(session, (ChatMessage("user", "see", images=(image(),)),))
        assert done.stats.image_tokens == IMAGE_TOKENS
    not_a_projector = tiny_models["qwen3"]
    with pytest.raises(ModelLoadError, match="projector"):
        model = Model(tiny_models["llama"])
        try:
            Vision(not_a_projector, model, n_threads=2, use_gpu=False)
        finally:
            model.close()


def _memory(pid: int, field: str) -> int:
    """A VmXXX line of /proc/<pid>/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_the_costliest_image_stays_within_the_read_bound_in_the_worker(
    tiny_models: dict[str, Path], mmproj: Path, tmp_path: Path
) -> None:
    # A 16-bit RGBA Adam7 PNG at the most pixels llmtui takes (6.6 MB): stb_image inside libmtmd took 651 MiB.
    data = png(MAX_IMAGE_SIDE, MAX_IMAGE_PIXELS // MAX_IMAGE_SIDE, color_type=6, bit_depth=16, interlace=True)
    picture = ImageRef(hashlib.sha256(data).hexdigest(), data=data, name="deep.png")
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(mmproj=str(mmproj)), ContextParams(n_ctx=256, n_threads=2))
        pid = client.pid
        assert pid is not None
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the worker's peak (VmHWM) starts again from here
        before = _memory(pid, "VmRSS")
        messages = (ChatMessage("user", "what is it?", images=(picture,)),)
        client.send(Generate(request_id=1, messages=messages, sampling=GREEDY, max_tokens=1, ignore_eos=True))
        deadline = time.monotonic() + 120
        done = None
        while done is None and time.monotonic() < deadline:
            event = client.next_event(timeout=deadline - time.monotonic())
            assert not isinstance(event, Failed | Crashed), event
            done = event if isinstance(event, Finished) else None
        assert done is not None, "no reply within 120 s"
        assert done.stats.image_tokens == IMAGE_TOKENS
        grown = _memory(pid, "VmHWM") - before
    # The bound counts what reading costs; the file's bytes come on top, as the worker received them.
    assert grown <= MAX_READ_BYTES + len(data), f"the worker grew by {grown / 2**20:.0f} MiB reading one image"


def test_cli_run_with_an_image(tiny_models: dict[str, Path], mmproj: Path, tmp_path: Path) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes(40, 30))
    base = [sys.executable, "-m", "app", "run", "-m", str(tiny_models["llama"]), "-p", "what is it?", "-n", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lacking = subprocess.run([*base, "--image", str(picture)], capture_output=True, text=True, env=env, timeout=120)
    assert lacking.returncode != 0 and "no projector (mmproj)" in lacking.stderr
    # The sidecar beside the model is paired automatically (llama.cpp's rule).
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tiny-llama.gguf").symlink_to(tiny_models["llama"])
    (folder / "mmproj-tiny-llama-f32.gguf").symlink_to(mmproj)
    base[5] = str(folder / "tiny-llama.gguf")
    done = subprocess.run(
        [*base, "--image", str(picture), "--image", str(picture), "--json", "--temp", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert stats["image_tokens"] == 2 * IMAGE_TOKENS and stats["images_encoded"] == 1
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    refused = subprocess.run([*base, "--image", str(fifo)], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "not a regular file" in refused.stderr


def test_serve_takes_image_url_data_urls(tiny_models: dict[str, Path], mmproj: Path) -> None:
    import base64

    import httpx2 as httpx

    from tests.serve_process import free_port, running_serve

    port = free_port()
    args = ["-m", str(tiny_models["llama"]), "--mmproj", str(mmproj), "-t", "2", "--port", str(port), "--temp", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMTUI_ADAPTIVE_THREADS": "off"}
    url = "data:image/png;base64," + base64.b64encode(png_bytes(40, 30)).decode()

    def ask_api(parts: list[dict[str, object]]) -> httpx.Response:
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}
        return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)

    with running_serve(args, env, port) as base:
        text = {"type": "text", "text": "what is it?"}
        with_image = ask_api([{"type": "image_url", "image_url": {"url": url}}, text])
        assert with_image.status_code == 200, with_image.text
        plain = ask_api([text])
        assert plain.status_code == 200, plain.text
        grown = with_image.json()["usage"]["prompt_tokens"] - plain.json()["usage"]["prompt_tokens"]
        assert grown >= IMAGE_TOKENS  # the image's tokens (and the marker's line break) are in the prompt
        remote = ask_api([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, text])
        assert remote.status_code == 400 and "not fetched" in remote.text


def test_doctor_says_the_engine_reads_images() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "doctor", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["images"] is True
