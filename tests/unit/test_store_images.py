"""Images in the chat history (issue 36): kept once by content hash, owner-only, referenced by messages and their
branches, carried by exports, freed when nothing refers to them, and a v1 history migrated to hold them."""

from __future__ import annotations

import base64
import json
import sqlite3
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from app.core.store import HISTORY_FILE_NAME, ImportFormatError, Store
from engine_ext.image_input import CheckedImage, check_image
from tests.tiny_mmproj import png_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / HISTORY_FILE_NAME) as opened:
        yield opened


def picture(seed: int = 0, size: int = 8) -> CheckedImage:
    return check_image(png_bytes(size, size, seed=seed), "picture.png")


def test_an_image_is_kept_once_owner_only_and_referenced_by_its_messages(store: Store) -> None:
    image = picture()
    first = store.images.keep_image(image, "cat.png")
    second = store.images.keep_image(image, "same-cat.png")
    assert first.sha256 == second.sha256 == image.sha256
    assert first.describe() == "PNG 8×8, " + image.describe().split(", ")[1]
    files = list(store.images.image_folder.iterdir())
    assert files == [store.images.image_path(image.sha256)]
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(store.images.image_folder.stat().st_mode) == 0o700
    conversation = store.conversations.create_conversation()
    one = store.tree.add_user_message(conversation.id, "what is this?", (first,))
    store.tree.add_user_message(conversation.id, "and again", (second,))
    assert store.tree.get_message(one.id).images == (first,)
    assert [m.images for m in store.tree.active_path(conversation.id)] == [(first,), (second,)]
    assert store.images.referenced_images() == {image.sha256}
    assert store.images.read_image(first) == image.data


def test_an_edited_question_keeps_its_images_on_the_new_branch(store: Store) -> None:
    kept = store.images.keep_image(picture(), "cat.png")
    conversation = store.conversations.create_conversation()
    question = store.tree.add_user_message(conversation.id, "what is this?", (kept,))
    edited = store.tree.edit_user_message(question.id, "what colour is it?")
    assert edited.images == (kept,)
    assert store.tree.siblings(edited.id).messages[0].images == (kept,)


def test_purging_a_deleted_conversation_frees_the_images_nothing_else_uses(store: Store) -> None:
    shared, alone = store.images.keep_image(picture(1), "shared.png"), store.images.keep_image(picture(2), "alone.png")
    kept_conversation, purged = store.conversations.create_conversation(), store.conversations.create_conversation()
    store.tree.add_user_message(kept_conversation.id, "one", (shared,))
    store.tree.add_user_message(purged.id, "two", (shared, alone))
    pending = store.images.keep_image(picture(3), "typed-not-sent.png")  # attached to a message not sent yet
    (store.images.image_folder / "notes.txt").write_text("not ours")
    store.conversations.delete_conversation(purged.id)
    assert store.images.free_unused_images() == 0  # a soft-deleted conversation can come back: its images stay
    assert store.conversations.purge_deleted(timedelta(0)) == 1
    names = {path.name for path in store.images.image_folder.iterdir()}
    assert names == {shared.sha256, pending.sha256, "notes.txt"}


def test_a_missing_or_damaged_file_is_said_not_read(store: Store) -> None:
    kept = store.images.keep_image(picture(), "cat.png")
    assert store.images.image_problem(kept) is None
    store.images.image_path(kept.sha256).write_bytes(b"not the picture")
    assert store.images.image_problem(kept) == "damaged" and store.images.read_image(kept) is None
    store.images.image_path(kept.sha256).unlink()
    assert store.images.image_problem(kept) == "missing"
    store.images.keep_image(picture(), "cat.png")  # attaching it again writes it again
    assert store.images.image_problem(kept) is None


def test_json_export_carries_images_and_import_restores_them(tmp_path: Path) -> None:
    with Store(tmp_path / "a" / HISTORY_FILE_NAME) as source:
        image = picture()
        kept = source.images.keep_image(image, "cat.png")
        conversation = source.conversations.create_conversation("pictures")
        question = source.tree.add_user_message(conversation.id, "what is this?", (kept,))
        source.tree.edit_user_message(question.id, "and this?", ())  # a branch without it
        exported = source.exports.export_json(conversation.id)
    document = json.loads(exported)
    assert base64.b64decode(document["images"][kept.sha256]) == image.data
    with Store(tmp_path / "b" / HISTORY_FILE_NAME) as target:
        imported = target.exports.import_json(exported).conversation_id
        messages = target.tree.messages(imported)
        assert [m.images for m in messages] == [(kept,), ()]
        assert target.images.read_image(kept) == image.data
        assert target.exports.export_json(imported) == exported


def test_an_export_with_a_forged_image_is_refused(store: Store) -> None:
    kept = store.images.keep_image(picture(), "cat.png")
    conversation = store.conversations.create_conversation("pictures")
    store.tree.add_user_message(conversation.id, "what is this?", (kept,))
    document = json.loads(store.exports.export_json(conversation.id))
    document["images"][kept.sha256] = base64.b64encode(png_bytes(8, 8, seed=9)).decode()
    with pytest.raises(ImportFormatError, match="does not hold the image its hash names"):
        store.exports.import_json(json.dumps(document))
    document["images"][kept.sha256] = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    with pytest.raises(ImportFormatError, match="refuses"):
        store.exports.import_json(json.dumps(document))
    document["messages"][0]["images"] = [{"sha256": "../../etc/passwd"}]
    with pytest.raises(ImportFormatError, match="not an image"):
        store.exports.import_json(json.dumps(document))


def test_an_imported_images_format_and_size_are_its_checked_bytes_not_the_exports_word(store: Store) -> None:
    kept = store.images.keep_image(picture(), "cat.png")
    conversation = store.conversations.create_conversation("pictures")
    store.tree.add_user_message(conversation.id, "what is this?", (kept,))
    document = json.loads(store.exports.export_json(conversation.id))
    document["messages"][0]["images"][0].update(format="\x1b]52;c;cm0gLXJmIH4=\x07", width=1, height=2, size=3)
    imported = store.exports.import_json(json.dumps(document)).conversation_id
    [message] = store.tree.messages(imported)
    assert message.images == (kept,)
    document["messages"][0]["images"][0]["width"] = 2**70
    with pytest.raises(ImportFormatError, match=r"messages\[0\]\.images\[0\]\.width is out of range"):
        store.exports.import_json(json.dumps(document))


def test_markdown_export_links_the_image_files(store: Store) -> None:
    kept = store.images.keep_image(picture(), "cat [1].png")
    conversation = store.conversations.create_conversation("pictures")
    store.tree.add_user_message(conversation.id, "what is this?", (kept,))
    markdown = store.exports.export_markdown(conversation.id, "pictures.images")
    (image, name), *_ = store.exports.export_images(conversation.id)
    assert image == kept and name == f"{kept.sha256[:16]}.png"
    assert f"![cat (1).png](pictures.images/{name}) *cat (1).png: {kept.describe()}*" in markdown


def test_a_first_schema_history_is_migrated_to_hold_images(tmp_path: Path) -> None:
    db = tmp_path / HISTORY_FILE_NAME
    with sqlite3.connect(db) as connection:
        connection.executescript((FIXTURES / "history-v1.sql").read_text(encoding="utf-8"))
    connection.close()
    with Store(db) as store:
        assert all(message.images == () for message in store.tree.messages(1))
        kept = store.images.keep_image(picture(), "cat.png")
        added = store.tree.add_user_message(1, "and a picture", (kept,))
        assert store.tree.get_message(added.id).images == (kept,)
    assert db.with_name(f"{HISTORY_FILE_NAME}.bak-v1").is_file()


def test_a_damaged_images_column_shows_the_message_without_them(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    message = store.tree.add_user_message(conversation.id, "hello")
    store.database.connection.execute("UPDATE messages SET images = '[{\"sha256\": 1}]' WHERE id = ?", (message.id,))
    damaged = store.tree.get_message(message.id)
    assert damaged.images == () and damaged.damaged
