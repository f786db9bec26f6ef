"""Images in the chat (issue 36): attaching by F12 (a path prompt with Tab completion) and by a dropped file's pasted
path, refusals in one line, a model without a projector saying so, the pending row and its Delete, the picture in the
transcript, and what the engine is sent (ImageRefs by hash; a file missing in the history is left out, once said).
A scripted engine stands behind the app's real bridge: it records each request and answers in three words."""

from __future__ import annotations

import shutil
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets import Input

from app.tui.app import LlmtuiApp
from app.tui.modals.text_prompt import PathPromptModal
from app.tui.screens.chat_screen import ChatScreen
from app.tui.widgets.image_block import ImageBlock
from engine_ext.protocol import Finished, Generate, GenerationStats, LoadModel, ModelInfo, TokenChunk
from tests.fakes import ScriptedEngine, scripted_app, scripted_model_info
from tests.pilot import chat_of
from tests.tiny_mmproj import png_bytes
from tests.waits import wait_until

pytestmark = pytest.mark.anyio


class PictureEngine(ScriptedEngine):
    """Loads with whatever projector it is given (as the worker does) and answers every request in three words."""

    def model_info(self, request: LoadModel) -> ModelInfo:
        return replace(scripted_model_info(request.path), mmproj=request.model.mmproj or "")

    def stream(self, request: Generate) -> None:
        for n, word in enumerate(("a ", "red ", "square")):
            self.events.put(TokenChunk(request.request_id, word, "", (n,), ("target",)))
        self.events.put(Finished(request.request_id, "eos", GenerationStats(5, 0, 5, 1.0, 3, 3.0, 1.0, 4096, 8)))


@pytest.fixture
def vision_llama(lone_llama: Path, tmp_path: Path) -> Path:
    """The tiny llama with an mmproj sidecar beside it (the scripted engine does not read it: its name pairs it)."""
    folder = tmp_path / "vision-model"
    folder.mkdir()
    model = folder / lone_llama.name
    shutil.copyfile(lone_llama, model)
    (folder / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF")
    return model


@pytest.fixture
def pictures(tmp_path: Path) -> Path:
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "red square.png").write_bytes(png_bytes(16, 16, seed=1))
    (folder / "notes.png").write_text("not a picture")
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    ihdr = struct.pack(">I", 13) + b"IHDR" + header + struct.pack(">I", zlib.crc32(b"IHDR" + header))
    body = b"WEBP" + b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", 15 | (15 << 14))
    (folder / "photo.webp").write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    (folder / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + ihdr + b"\x00\x00\x00\x00IEND\xaeB`\x82")
    return folder


async def chat_ready(pilot: Pilot[None], app: LlmtuiApp) -> ChatScreen:
    """The chat once the scripted engine has loaded, its message box focused (pastes go to the focused widget)."""
    await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
    chat = chat_of(app)
    chat.prompt.focus()
    await pilot.pause()
    return chat


def first_question_images(request: Generate) -> list[str]:
    return [ref.sha256 for ref in next(m for m in request.messages if m.role == "user").images]


def notified(app: LlmtuiApp, text: str) -> bool:
    return any(text in str(n.message) for n in app._notifications)


def sent_requests(app: LlmtuiApp) -> list[Generate]:
    client = app.bridge._client  # type: ignore[attr-defined]
    return [r for r in client.requests if isinstance(r, Generate)]


async def test_f12_attaches_with_tab_completion_and_the_reply_gets_the_image(
    vision_llama: Path, pictures: Path
) -> None:
    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        chat = chat_of(app)
        assert app.model is not None and app.model.mmproj.endswith("mmproj-tiny-f16.gguf")
        await wait_until(pilot, lambda: "vision" in chat.header.backend, "the header to say the model sees images")
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), "the attach prompt")
        prompt = app.screen
        assert isinstance(prompt, PathPromptModal)
        await pilot.press(*f"{pictures}/red")
        await pilot.press("tab")
        await wait_until(pilot, lambda: prompt.completions == 1, "the path completion")
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(chat.attachments.images) == 1, "the image attached")
        attached = chat.attachments.images[0]
        assert attached.name == "red square.png" and attached.describe().startswith("PNG 16×16, ")
        assert chat.attachments.display and "red square.png  PNG 16×16" in str(chat.attachments.render())
        await chat.replies.send("what is in this picture?")
        await wait_until(pilot, lambda: chat.generation is None and chat.replies.replies_started == 1, "the reply")
        await wait_until(pilot, lambda: app.engine_state == "ready", "the engine ready again")
        (request,) = sent_requests(app)
        question = request.messages[-1]
        assert question.role == "user" and [ref.sha256 for ref in question.images] == [attached.sha256]
        assert Path(question.images[0].path) == app.store.images.image_path(attached.sha256)
        assert not chat.attachments.images and not chat.attachments.display
        blocks = list(chat.transcript.query(ImageBlock))
        assert len(blocks) == 1
        await wait_until(pilot, lambda: blocks[0].state == "shown", "the picture drawn (half blocks in tests)")
        assert app.store.tree.active_path(chat.conversation_id or 0)[0].images == (attached,)
        await chat.replies.send("and its colour?")  # the image goes again (the engine encodes it once: tests/engine)
        await wait_until(pilot, lambda: len(sent_requests(app)) == 2 and chat.generation is None, "the second reply")
        assert first_question_images(sent_requests(app)[1]) == [attached.sha256]


async def test_a_dropped_path_attaches_and_other_pastes_are_typed(vision_llama: Path, pictures: Path) -> None:
    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await chat_ready(pilot, app)
        app.post_message(events.Paste(f"{pictures}/red\\ square.png "))  # as a terminal pastes a drop
        await wait_until(pilot, lambda: len(chat.attachments.images) == 1, "the pasted path attached")
        assert chat.prompt.text == ""
        app.post_message(events.Paste(f"'{pictures}/red square.png'"))  # quoted, and the same picture
        await wait_until(pilot, lambda: notified(app, "is attached already"), "the second paste said")
        app.post_message(events.Paste("see /tmp/a.png and"))
        await wait_until(pilot, lambda: chat.prompt.text == "see /tmp/a.png and", "a sentence typed")
        await pilot.press("shift+tab")
        await wait_until(
            pilot, lambda: "▶ red square.png" in str(chat.attachments.render()), "the attachments row focused"
        )
        assert "Delete removes" in str(chat.attachments.render())
        await pilot.press("delete")
        await wait_until(pilot, lambda: not chat.attachments.images, "the attachment removed")
        await wait_until(pilot, lambda: chat.prompt.has_focus, "the focus back in the message box")


async def test_a_non_image_and_a_huge_one_are_refused_in_one_line(vision_llama: Path, pictures: Path) -> None:
    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await chat_ready(pilot, app)
        app.post_message(events.Paste(str(pictures / "notes.png")))
        await wait_until(pilot, lambda: notified(app, "Not attached: notes.png: not an image"), "the refusal")
        app.post_message(events.Paste(str(pictures / "bomb.png")))
        await wait_until(pilot, lambda: notified(app, "100000×100000 pixels is more than llmtui decodes"), "refused")
        app.post_message(events.Paste(str(pictures / "photo.webp")))
        await wait_until(pilot, lambda: notified(app, "photo.webp: WebP is not decoded"), "the WebP refusal")
        app.post_message(events.Paste(str(pictures / "gone.png")))
        await wait_until(pilot, lambda: notified(app, "gone.png: no such image file"), "the missing file said")
        assert not chat.attachments.images
        assert not app.store.images.image_folder.exists() or not any(
            app.store.images.image_folder.iterdir()
        )  # nothing kept
        assert all("\n" not in str(n.message) for n in app._notifications)


async def test_a_model_without_a_projector_says_so_when_you_attach(lone_llama: Path, pictures: Path) -> None:
    app = scripted_app(lone_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        chat = chat_of(app)
        assert app.model is not None and not app.model.sees_images and "vision" not in chat.header.backend
        await pilot.press("f12")  # opens the path prompt: a document needs no projector, an image is refused
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), "the path prompt")
        app.screen.query_one("#text-prompt-input", Input).value = str(pictures / "red square.png")
        await pilot.press("enter")
        await wait_until(pilot, lambda: notified(app, "cannot see images: it has no projector (mmproj)"), "said")
        assert not isinstance(app.screen, PathPromptModal) and not chat.attachments.images
        chat.prompt.focus()
        await pilot.pause()
        app.post_message(events.Paste(str(pictures / "red square.png")))
        await pilot.pause()
        assert not chat.attachments.images


async def test_a_missing_image_file_shows_says_so_and_is_sent_without(vision_llama: Path, pictures: Path) -> None:
    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        chat = chat_of(app)
        chat.images.attach_image_file(pictures / "red square.png")
        await wait_until(pilot, lambda: len(chat.attachments.images) == 1, "the image attached")
        await chat.replies.send("what is this?")
        await wait_until(pilot, lambda: chat.generation is None and chat.replies.replies_started == 1, "the reply")
        await wait_until(pilot, lambda: app.engine_state == "ready", "the engine ready again")
        image = chat.attachments.images or app.store.tree.active_path(chat.conversation_id or 0)[0].images
        app.store.images.image_path(image[0].sha256).unlink()
        await chat.reload_transcript()
        (block,) = chat.transcript.query(ImageBlock)
        await wait_until(pilot, lambda: block.state == "missing", "the missing file said in the transcript")
        assert "missing from the history" in str(block.query_one(".image-label").render())
        await chat.replies.send("still there?")
        await wait_until(pilot, lambda: len(sent_requests(app)) == 2 and chat.generation is None, "the reply")
        await wait_until(pilot, lambda: app.engine_state == "ready", "the engine ready again")
        assert first_question_images(sent_requests(app)[1]) == []
        assert notified(app, "red square.png (missing): the message is sent without it")
        count = sum("sent without it" in str(n.message) for n in app._notifications)
        await chat.replies.send("and now?")
        await wait_until(pilot, lambda: len(sent_requests(app)) == 3 and chat.generation is None, "the third reply")
        assert sum("sent without it" in str(n.message) for n in app._notifications) == count  # said once


async def test_a_start_removes_conversations_deleted_a_day_before_and_frees_images_only_they_used(
    vision_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting is undone only in its session (u); a later start removes for good what was deleted a day or more
    before, with its image files, and keeps what was deleted since (a session beside it may still undo it)."""
    from datetime import UTC, datetime, timedelta

    from app.core.store import open_default_store
    from app.core.store.connection import Database
    from engine_ext.image_input import check_image

    store = open_default_store()
    old_picture = store.images.keep_image(check_image(png_bytes(8, 8, seed=2), "old.png"), "old.png")
    shared = store.images.keep_image(check_image(png_bytes(8, 8, seed=3), "shared.png"), "shared.png")
    old, recent, kept = (store.conversations.create_conversation(title) for title in ("old", "recent", "kept"))
    store.tree.add_user_message(old.id, "see", (old_picture, shared))
    store.tree.add_user_message(recent.id, "see", (shared,))
    store.tree.add_user_message(kept.id, "hello")
    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).isoformat(timespec="microseconds")
    with monkeypatch.context() as patched:
        patched.setattr(Database, "now", lambda self: two_days_ago)
        store.conversations.delete_conversation(old.id)
    store.conversations.delete_conversation(recent.id)
    old_file, shared_file = store.images.image_path(old_picture.sha256), store.images.image_path(shared.sha256)
    store.close()
    assert old_file.is_file() and shared_file.is_file()
    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await chat_ready(pilot, app)
        titles = {c.title for c in app.store.conversations.list_conversations(deleted=True)}
        assert titles == {"recent"}, titles
        assert not old_file.exists() and shared_file.is_file()


async def test_tab_right_after_fast_typing_completes_what_was_typed(vision_llama: Path, pictures: Path) -> None:
    """Tab is a priority binding, run as the app receives it: keys typed just before it (a fast typist, a paste and
    Tab) may still wait in the field's queue. Seen in tmux: Tab completed an empty path (the current folder)."""
    from textual.keys import _character_to_key
    from textual.widgets import Input

    app = scripted_app(vision_llama, PictureEngine)
    async with app.run_test(size=(100, 30)) as pilot:
        await chat_ready(pilot, app)
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, PathPromptModal), "the attach prompt")
        prompt = app.screen
        assert isinstance(prompt, PathPromptModal) and app._driver is not None
        for char in f"{pictures}/red":  # no frame between the keys, as a terminal delivers a burst
            key = char if char.isalnum() else _character_to_key(char)
            app._driver.send_message(events.Key(key, char))
        app._driver.send_message(events.Key("tab", None))
        await wait_until(pilot, lambda: prompt.completions == 1, "the path completion")
        assert prompt.query_one("#text-prompt-input", Input).value == f"{pictures}/red square.png"
