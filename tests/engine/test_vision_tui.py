"""The chat app on the tiny llama with the tiny random-weight projector beside it (tests/tiny_mmproj.py), through the
real engine worker: the app loads the pair, an attached image reaches libmtmd, and a second question about it
encodes nothing (the worker's encoded-image cache, keyed by the content hash the history keeps)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.core.config import SamplingSettings
from app.tui.app import LlmtuiApp
from app.tui.widgets.image_block import ImageBlock
from tests.engine.test_vision import NO_MTMD
from tests.pilot import ready, reply_done
from tests.tiny_mmproj import IMAGE_TOKENS, png_bytes, write_tiny_mmproj
from tests.waits import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(bool(NO_MTMD), reason=NO_MTMD)]


async def test_an_attached_image_reaches_the_projector_once(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "vision-model"
    folder.mkdir()
    model = folder / tiny_models["llama"].name
    shutil.copyfile(tiny_models["llama"], model)
    write_tiny_mmproj(folder / "mmproj-tiny-llama-f32.gguf")
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes(40, 30, seed=3))
    app = LlmtuiApp(str(model), default_sampling=SamplingSettings(temperature=0.0, max_tokens=8))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        assert app.model is not None and app.model.sees_images
        chat.images.attach_image_file(picture)
        await wait_until(pilot, lambda: len(chat.attachments.images) == 1, "the image attached")
        await chat.replies.send("what is in the picture?")
        await reply_done(pilot)
        conversation = chat.conversation_id
        assert conversation is not None
        first = app.store.tree.active_path(conversation)[-1]
        assert first.state == "complete" and first.content
        assert first.stats["image_tokens"] == IMAGE_TOKENS and first.stats["images_encoded"] == 1
        await wait_until(pilot, lambda: app.engine_state == "ready", "the engine ready again")
        await chat.replies.send("and what colour is it?")
        await reply_done(pilot)
        second = app.store.tree.active_path(conversation)[-1]
        assert second.id != first.id and second.state == "complete"
        assert second.stats["image_tokens"] == IMAGE_TOKENS and second.stats["images_encoded"] == 0
        (block,) = chat.transcript.query(ImageBlock)
        await wait_until(pilot, lambda: block.state == "shown", "the picture drawn")
