"""Tests for app.core.store: durable chat history (crash recovery, branches, migrations, damage, export)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.core import store as store_module
from app.core.store import (
    HISTORY_FILE_NAME,
    HistoryFromNewerVersion,
    ImportFormatError,
    MessageNotStreaming,
    PresetNotFound,
    Store,
    open_default_store,
    title_from_message,
)
from app.core.store import schema as store_schema
from tests.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def history_path(tmp_path: Path) -> Path:
    return tmp_path / HISTORY_FILE_NAME


@pytest.fixture
def store(history_path: Path) -> Iterator[Store]:
    with Store(history_path) as opened:
        yield opened


def contents(messages: list[store_module.Message]) -> list[str]:
    return [message.content for message in messages]


# ----- opening ------------------------------------------------------------------------------------------


def test_default_store_lives_in_the_data_dir_with_wal_and_foreign_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTUI_DATA_DIR", str(tmp_path / "data"))
    with open_default_store() as opened:
        assert opened.path == tmp_path / "data" / "history.sqlite3"
        assert opened.path.is_file()
        pragma = opened.database.connection.execute
        assert pragma("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert pragma("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert pragma("PRAGMA foreign_keys").fetchone()[0] == 1
        assert pragma("PRAGMA user_version").fetchone()[0] == len(store_module.MIGRATIONS)
        assert opened.startup_notice is None
    assert not list((tmp_path / "data").glob("*.bak-*"))  # a new file needs no backup


def test_store_module_never_imports_textual_or_rich() -> None:
    code = (
        "import sys, app.core.store\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ----- durability ---------------------------------------------------------------------------------------


def test_prompt_and_partial_reply_survive_a_crash(history_path: Path) -> None:
    crashed = Store(history_path)
    conversation = crashed.conversations.create_conversation()
    prompt = crashed.tree.add_user_message(conversation.id, "Explain WAL mode")
    reply_id = crashed.tree.begin_assistant_message(conversation.id, prompt.id, "smollm2")
    crashed.tree.checkpoint_assistant_message(reply_id, "WAL appends pages", "Let me think")
    try:
        # A second process opening the same file while the first never closed it (it died).
        with Store(history_path) as restarted:
            user, reply = restarted.tree.active_path(conversation.id)
            assert (user.role, user.content, user.state) == ("user", "Explain WAL mode", "complete")
            assert (reply.role, reply.content, reply.reasoning) == ("assistant", "WAL appends pages", "Let me think")
            assert reply.state == "interrupted"
            assert reply.model == "smollm2"
            assert restarted.conversations.get_conversation(conversation.id).model == "smollm2"
            assert restarted.tree.recover_interrupted() == 0
        with pytest.raises(MessageNotStreaming):
            crashed.tree.checkpoint_assistant_message(reply_id, "more", "")
    finally:
        crashed.close()


def test_finished_reply_keeps_state_stats_and_token_count(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    prompt = store.tree.add_user_message(conversation.id, "hi")
    reply_id = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    assert store.tree.get_message(reply_id).state == "streaming"
    stats = {"prompt_tokens": 3, "tokens_per_s": 41.5, "stop_reason": "user"}
    store.tree.finish_assistant_message(reply_id, "Hel", "", "stopped", stats, token_count=2)
    reply = store.tree.get_message(reply_id)
    assert (reply.content, reply.state, reply.stats, reply.token_count) == ("Hel", "stopped", stats, 2)
    with pytest.raises(ValueError):
        store.tree.finish_assistant_message(reply_id, "x", "", "streaming", {})
    store.close()
    store.close()  # idempotent


def test_conversations_list_most_recently_active_first_and_auto_title(store: Store) -> None:
    older = store.conversations.create_conversation()
    newer = store.conversations.create_conversation("Named")
    store.tree.add_user_message(
        older.id, "\n  First line of a long question about   sqlite and durability, in detail\nmore"
    )
    store.tree.add_user_message(newer.id, "does not rename")
    store.tree.add_user_message(older.id, "bump")
    listed = store.conversations.list_conversations()
    assert [c.id for c in listed] == [older.id, newer.id]
    assert listed[0].title == "First line of a long question about sqlite and durability…"
    assert len(listed[0].title) <= 60
    assert listed[1].title == "Named"
    assert title_from_message("short") == "short"
    assert title_from_message(" \n ") == ""


# ----- branching ----------------------------------------------------------------------------------------


def test_edit_and_resend_keeps_the_old_branch_reachable(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    first = store.tree.add_user_message(conversation.id, "q1")
    answer_id = store.tree.begin_assistant_message(conversation.id, first.id, "m")
    store.tree.finish_assistant_message(answer_id, "a1", "", "complete", {})
    second = store.tree.add_user_message(conversation.id, "q2")
    old_reply = store.tree.begin_assistant_message(conversation.id, second.id, "m")
    store.tree.finish_assistant_message(old_reply, "a2", "", "complete", {})

    edited = store.tree.edit_user_message(second.id, "q2 edited")
    new_reply = store.tree.begin_assistant_message(conversation.id, edited.id, "m")
    store.tree.finish_assistant_message(new_reply, "a2 again", "", "complete", {})
    assert contents(store.tree.active_path(conversation.id)) == ["q1", "a1", "q2 edited", "a2 again"]

    alternatives = store.tree.siblings(edited.id)
    assert contents(alternatives.messages) == ["q2", "q2 edited"]
    assert alternatives.index == 1
    assert store.tree.siblings(second.id).index == 0

    assert contents(store.tree.switch_branch(second.id)) == ["q1", "a1", "q2", "a2"]
    assert contents(store.tree.switch_branch(edited.id)) == ["q1", "a1", "q2 edited", "a2 again"]

    # Editing the very first message makes a second root.
    root_edit = store.tree.edit_user_message(first.id, "q1 edited")
    assert contents(store.tree.active_path(conversation.id)) == ["q1 edited"]
    assert contents(store.tree.siblings(first.id).messages) == ["q1", "q1 edited"]
    assert contents(store.tree.switch_branch(first.id)) == ["q1", "a1", "q2 edited", "a2 again"]
    assert store.tree.siblings(root_edit.id).index == 1


def test_regenerate_keeps_the_old_reply_and_switch_branch_returns_to_the_latest_leaf(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    prompt = store.tree.add_user_message(conversation.id, "q")
    first_reply = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    store.tree.finish_assistant_message(first_reply, "r1", "", "complete", {})
    second_reply = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    store.tree.finish_assistant_message(second_reply, "r2", "", "complete", {})
    assert contents(store.tree.active_path(conversation.id)) == ["q", "r2"]
    regenerated = store.tree.siblings(second_reply)
    assert (contents(regenerated.messages), regenerated.index) == (["r1", "r2"], 1)

    # Continue on the first reply, then look at the second: going back to the prompt shows the
    # most recent work (the continuation below r1), not merely the newest reply.
    store.tree.switch_branch(first_reply)
    follow_up = store.tree.add_user_message(conversation.id, "q2")
    assert contents(store.tree.active_path(conversation.id)) == ["q", "r1", "q2"]
    assert contents(store.tree.switch_branch(second_reply)) == ["q", "r2"]
    assert contents(store.tree.switch_branch(prompt.id)) == ["q", "r1", "q2"]
    assert store.conversations.get_conversation(conversation.id).active_leaf_id == follow_up.id


def test_a_reply_edited_in_place_keeps_its_id_and_can_be_continued(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    prompt = store.tree.add_user_message(conversation.id, "q")
    reply = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    with pytest.raises(ValueError, match="not a finished reply"):
        store.tree.edit_assistant_message(reply, "too early")  # still streaming
    store.tree.finish_assistant_message(
        reply, "a whole answer", "", "complete", {"stop_reason": "eos", "draft_spans": [[0, 3, "ngram-mod"]]}
    )
    assert not store.tree.get_message(reply).can_continue  # it ended on its own
    with pytest.raises(MessageNotStreaming):
        store.tree.resume_assistant_message(reply)
    with pytest.raises(ValueError, match="not a finished reply"):
        store.tree.edit_assistant_message(prompt.id, "a question is resent, not edited")
    edited = store.tree.edit_assistant_message(reply, "a better")
    assert (edited.id, edited.content, edited.state) == (reply, "a better", "complete")
    assert edited.stats == {"stop_reason": "eos", "edited": True}  # the draft spans no longer match the text
    assert contents(store.tree.active_path(conversation.id)) == ["q", "a better"]
    assert edited.can_continue and store.tree.resume_assistant_message(reply).state == "streaming"
    # Cut short by max tokens: continued as is.
    other = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    store.tree.finish_assistant_message(other, "cut", "", "complete", {"stop_reason": "max_tokens"})
    assert store.tree.get_message(other).can_continue


# ----- delete, search -----------------------------------------------------------------------------------


def test_delete_undo_and_purge(store: Store) -> None:
    kept = store.conversations.create_conversation("kept")
    doomed = store.conversations.create_conversation("doomed")
    store.tree.add_user_message(doomed.id, "bye")
    store.conversations.delete_conversation(doomed.id)
    assert [c.id for c in store.conversations.list_conversations()] == [kept.id]
    assert [c.id for c in store.conversations.list_conversations(deleted=True)] == [doomed.id]
    store.conversations.undo_delete(doomed.id)
    assert {c.id for c in store.conversations.list_conversations()} == {kept.id, doomed.id}

    store.conversations.delete_conversation(doomed.id)
    assert store.conversations.purge_deleted(older_than=timedelta(days=30)) == 0
    assert store.conversations.purge_deleted(older_than=timedelta(0)) == 1
    with pytest.raises(store_module.ConversationNotFound):
        store.conversations.get_conversation(doomed.id)
    assert store.database.connection.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert [c.id for c in store.conversations.list_conversations()] == [kept.id]


def test_search_finds_titles_and_message_contents_ignoring_case(store: Store) -> None:
    by_title = store.conversations.create_conversation("Rust lifetimes")
    by_content = store.conversations.create_conversation("Cooking")
    prompt = store.tree.add_user_message(by_content.id, "How long should I boil an egg?")
    reply = store.tree.begin_assistant_message(by_content.id, prompt.id, "m")
    store.tree.finish_assistant_message(
        reply, "About " + "very " * 20 + "long: ÄRGER Nine minutes. " * 3, "", "complete", {}
    )
    hidden = store.conversations.create_conversation("Rust, deleted")
    store.conversations.delete_conversation(hidden.id)

    hits = store.search.find("RUST")
    assert [(hit.conversation_id, hit.message_id) for hit in hits] == [(by_title.id, None)]
    assert hits[0].snippet == "Rust lifetimes"

    (hit,) = store.search.find("nine MINUTES")
    assert (hit.conversation_id, hit.message_id, hit.title) == (by_content.id, reply, "Cooking")
    assert "Nine minutes" in hit.snippet and hit.snippet.startswith("…")
    assert [h.message_id for h in store.search.find("ärger")] == [reply]  # case folding beyond ASCII
    assert store.search.find("  ") == []
    assert store.search.find("100%") == []


# ----- migrations and damage ----------------------------------------------------------------------------


def test_an_unversioned_database_with_data_is_backed_up_then_migrated(history_path: Path) -> None:
    with sqlite3.connect(history_path) as old:
        old.execute("CREATE TABLE notes (body TEXT)")
        old.execute("INSERT INTO notes VALUES ('keep me')")
    old.close()
    with Store(history_path) as migrated:
        assert migrated.database.connection.execute("PRAGMA user_version").fetchone()[0] == len(store_module.MIGRATIONS)
        migrated.conversations.create_conversation("works")
    backup = history_path.with_name("history.sqlite3.bak-v0")
    assert backup.is_file()
    with sqlite3.connect(backup) as copy:
        assert copy.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
        assert copy.execute("PRAGMA user_version").fetchone()[0] == 0
    copy.close()


def test_upgrading_to_a_newer_schema_backs_up_first(history_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(history_path) as version_1:
        conversation = version_1.conversations.create_conversation("old")
    current = len(store_module.MIGRATIONS)

    def add_pinned(connection: sqlite3.Connection) -> None:
        connection.execute("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(store_schema, "MIGRATIONS", [*store_schema.MIGRATIONS, add_pinned])
    with Store(history_path) as version_2:
        assert version_2.database.connection.execute("PRAGMA user_version").fetchone()[0] == current + 1
        assert [tuple(row) for row in version_2.database.connection.execute("SELECT pinned FROM conversations")] == [
            (0,)
        ]
        assert version_2.conversations.get_conversation(conversation.id).title == "old"
    backup = history_path.with_name(f"history.sqlite3.bak-v{current}")
    with sqlite3.connect(backup) as copy:
        assert copy.execute("PRAGMA user_version").fetchone()[0] == current
        assert copy.execute("SELECT title FROM conversations").fetchall() == [("old",)]
    copy.close()


def test_a_database_from_a_newer_llmtui_is_left_alone(history_path: Path) -> None:
    with Store(history_path) as opened:
        opened.database.connection.execute("PRAGMA user_version = 99")
    with pytest.raises(HistoryFromNewerVersion, match="newer llmtui"):
        Store(history_path)
    assert history_path.is_file()


def test_a_garbage_file_is_moved_aside_and_a_fresh_history_started(history_path: Path) -> None:
    with Store(history_path) as opened:
        opened.conversations.create_conversation("lost")
    history_path.write_bytes(b"this is not sqlite " * 500)
    with Store(history_path) as fresh:
        assert fresh.conversations.list_conversations() == []
        assert fresh.startup_notice is not None
        assert str(history_path) in fresh.startup_notice and "moved to" in fresh.startup_notice
        fresh.conversations.create_conversation("new")
    (moved,) = history_path.parent.glob("history.sqlite3.corrupt-*")
    assert moved.read_bytes().startswith(b"this is not sqlite")
    with Store(history_path) as reopened:
        assert reopened.startup_notice is None
        assert [c.title for c in reopened.conversations.list_conversations()] == ["new"]


def test_damaged_pages_are_caught_by_quick_check(history_path: Path) -> None:
    with Store(history_path) as opened:
        conversation = opened.conversations.create_conversation()
        for _ in range(50):
            opened.tree.add_user_message(conversation.id, "x" * 2000)
    damaged = bytearray(history_path.read_bytes())
    page_size = int.from_bytes(damaged[16:18], "big")  # from the SQLite file header
    damaged[3 * page_size : 6 * page_size] = b"Z" * (3 * page_size)
    history_path.write_bytes(bytes(damaged))
    with Store(history_path) as fresh:
        assert fresh.startup_notice is not None and "damaged" in fresh.startup_notice
        assert fresh.conversations.list_conversations() == []
    assert len(list(history_path.parent.glob("history.sqlite3.corrupt-*"))) == 1


def test_bad_json_in_one_conversation_does_not_hide_the_others(store: Store) -> None:
    good = store.conversations.create_conversation("good", settings={"temperature": 0.7})
    bad = store.conversations.create_conversation("bad")
    prompt = store.tree.add_user_message(bad.id, "q")
    reply = store.tree.begin_assistant_message(bad.id, prompt.id, "m")
    store.tree.finish_assistant_message(reply, "a", "", "complete", {"tokens": 1})
    store.database.connection.execute("UPDATE conversations SET settings = '{not json' WHERE id = ?", (bad.id,))
    store.database.connection.execute("UPDATE messages SET stats = '[1, 2' WHERE id = ?", (reply,))
    store.presets.save_preset("broken", {})
    store.database.connection.execute("UPDATE presets SET settings = '\"a string\"'")

    listed = {c.id: c for c in store.conversations.list_conversations()}
    assert set(listed) == {good.id, bad.id}
    assert (listed[good.id].settings, listed[good.id].damaged) == ({"temperature": 0.7}, False)
    assert (listed[bad.id].settings, listed[bad.id].damaged) == ({}, True)
    user, assistant = store.tree.active_path(bad.id)
    assert (assistant.content, assistant.stats, assistant.damaged) == ("a", {}, True)
    assert not user.damaged
    assert store.presets.list_presets() == [store_module.Preset("broken", {}, damaged=True)]


# ----- export and import --------------------------------------------------------------------------------


def build_branchy_conversation(store: Store) -> int:
    conversation = store.conversations.create_conversation(
        "Ünïcode & branches", system_prompt="You are terse.", settings={"preset": "precise", "sampling": {"top_p": 0.9}}
    )
    prompt = store.tree.add_user_message(conversation.id, "Why is the sky blue? 🌤")
    first = store.tree.begin_assistant_message(conversation.id, prompt.id, "qwen3")
    stats = {"tokens_per_s": 12.25, "prompt_tokens": 9}
    store.tree.finish_assistant_message(
        first, "Rayleigh scattering.", "Short light scatters more.", "complete", stats, token_count=4
    )
    second = store.tree.begin_assistant_message(conversation.id, prompt.id, "smollm2")
    store.tree.finish_assistant_message(second, "Because", "", "stopped", {"stop": "user"}, token_count=1)
    edited = store.tree.edit_user_message(prompt.id, "Why is the sunset red?")
    store.tree.begin_assistant_message(conversation.id, edited.id, "qwen3")  # left streaming
    store.tree.switch_branch(first)
    return conversation.id


def test_markdown_export_shows_the_active_branch_with_folded_reasoning(store: Store) -> None:
    conversation_id = build_branchy_conversation(store)
    assert store.exports.export_markdown(conversation_id) == (
        "# Ünïcode & branches\n\n"
        "## System prompt\n\nYou are terse.\n\n"
        "## User\n\nWhy is the sky blue? 🌤\n\n"
        "## Assistant\n\n"
        "<details>\n<summary>Reasoning</summary>\n\nShort light scatters more.\n\n</details>\n\n"
        "Rayleigh scattering.\n"
    )
    store.tree.switch_branch(store.tree.siblings(store.tree.active_path(conversation_id)[1].id).messages[1].id)
    assert store.exports.export_markdown(conversation_id).endswith("## Assistant\n\nBecause\n\n*Reply stopped.*\n")


def test_json_export_import_export_is_byte_exact(store: Store) -> None:
    conversation_id = build_branchy_conversation(store)
    store.tree.recover_interrupted()  # the streaming reply as it would be after a restart
    exported = store.exports.export_json(conversation_id)
    document = json.loads(exported)
    assert [m["id"] for m in document["messages"]] == [0, 1, 2, 3, 4]
    assert [m["parent"] for m in document["messages"]] == [None, 0, 0, None, 3]
    assert document["conversation"]["active_leaf"] == 1
    assert document["messages"][1]["stats"] == {"prompt_tokens": 9, "tokens_per_s": 12.25}
    assert "🌤" in exported  # ensure_ascii=False

    imported_id = store.exports.import_json(exported).conversation_id
    assert imported_id != conversation_id
    assert store.exports.export_json(imported_id) == exported
    assert contents(store.tree.active_path(imported_id)) == contents(store.tree.active_path(conversation_id))
    original = store.conversations.get_conversation(conversation_id)
    copy = store.conversations.get_conversation(imported_id)
    assert (copy.created_at, copy.updated_at, copy.settings) == (
        original.created_at,
        original.updated_at,
        original.settings,
    )


FEATURES = {
    "steering": {
        "vectors": [
            {"name": "honesty", "file": "honesty.gguf", "strength": 0.5},
            {"name": "formal", "file": "formal.gguf", "strength": -0.25},
        ],
        "layers": [10, 20],
    },
    "speculative": {
        "type": "auto",
        "drafters": ["ngram-mod", "draft-mtp"],
        "n_max": 16,
        "n_min": 0,
        "p_min": 0.0,
        "draft_model": "mtp-Qwen3.5-4B.gguf",
        "accepted": 0.7375,
    },
}
FEATURES_NOTE = (
    "*Steering: honesty +0.50, formal -0.25 on layers 10–20. Speculative decoding: auto (ngram-mod+draft-mtp), n_max "
    "16, draft mtp-Qwen3.5-4B.gguf, 74% of drafted tokens accepted.*"
)


def test_exports_say_the_steering_mix_and_speculative_settings_and_import_keeps_them(store: Store) -> None:
    """Issue 37 item 5: a reply's stats record the steering and speculation it was written with (the controllers'
    `in_use`); the Markdown export says them under the reply, the JSON export carries them, an import keeps them."""
    conversation = store.conversations.create_conversation("Steered")
    prompt = store.tree.add_user_message(conversation.id, "hi")
    reply = store.tree.begin_assistant_message(conversation.id, prompt.id, "qwen3")
    store.tree.finish_assistant_message(reply, "Hello.", "", "complete", {"tokens_per_s": 9.0, **FEATURES})
    markdown = store.exports.export_markdown(conversation.id)
    assert markdown.endswith(f"## Assistant\n\nHello.\n\n{FEATURES_NOTE}\n")
    exported = store.exports.export_json(conversation.id)
    assert json.loads(exported)["messages"][1]["stats"]["speculative"]["drafters"] == ["ngram-mod", "draft-mtp"]
    imported_id = store.exports.import_json(exported).conversation_id
    assert store.exports.export_markdown(imported_id) == markdown and store.exports.export_json(imported_id) == exported

    # Hand-edited or from elsewhere: what is not as recorded is left out, the rest said; the import goes on.
    document = json.loads(exported)
    stats = document["messages"][1]["stats"]
    stats["steering"]["vectors"][1] = {"name": "formal", "strength": "strong"}
    stats["steering"]["layers"] = "all"
    stats["speculative"] = {"type": "ngram-mod", "drafters": "ngram-mod", "n_max": True, "accepted": None}
    broken_id = store.exports.import_json(json.dumps(document)).conversation_id
    assert store.exports.export_markdown(broken_id).endswith(
        "Hello.\n\n*Steering: honesty +0.50. Speculative decoding: ngram-mod.*\n"
    )
    stats["steering"], stats["speculative"] = [], "auto"
    assert store.exports.export_markdown(store.exports.import_json(json.dumps(document)).conversation_id).endswith(
        "## Assistant\n\nHello.\n"
    )


def test_import_turns_a_streaming_reply_into_an_interrupted_one(store: Store) -> None:
    conversation_id = build_branchy_conversation(store)
    imported_id = store.exports.import_json(store.exports.export_json(conversation_id)).conversation_id
    assert [m.state for m in store.tree.messages(imported_id)].count("streaming") == 0
    assert "interrupted" in [m.state for m in store.tree.messages(imported_id)]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": "something else", "version": 1}',
        '{"format": "llmtui.conversation", "version": 2}',
        '{"format": "llmtui.conversation", "version": 1, "conversation": {}, "messages": []}',
    ],
)
def test_import_rejects_what_is_not_an_export(store: Store, text: str) -> None:
    with pytest.raises(ImportFormatError):
        store.exports.import_json(text)
    assert store.conversations.list_conversations() == []


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["messages"][1].update(token_count=2**63), r"messages\[1\]\.token_count is out of range"),
        (lambda d: d["messages"][1].update(token_count=-(2**63) - 1), r"messages\[1\]\.token_count is out of range"),
        (lambda d: d["messages"][1].update(token_count=-1), r"messages\[1\]\.token_count should not be negative"),
        (lambda d: d["messages"][1]["stats"].update(n_ctx=10**400), r"messages\[1\]\.stats\.n_ctx is out of range"),
        (lambda d: d["conversation"]["settings"]["sampling"].update(seed=2**64), r"settings\.sampling\.seed"),
        (lambda d: d["messages"][1]["stats"].update(tokens_per_s="1e400"), r"stats\.tokens_per_s is not a finite"),
        (lambda d: d["messages"][1]["stats"].update(tokens_per_s="NaN"), "not JSON"),
        (lambda d: d["messages"][1].update(created_at="\x1b[6n" * 100_000), r"created_at is not a date"),
    ],
)
def test_import_refuses_numbers_past_sqlites_in_one_line_naming_the_field(
    store: Store, edit: Callable[[dict[str, Any]], None], field: str
) -> None:
    document = json.loads(store.exports.export_json(build_branchy_conversation(store)))
    edit(document)
    text = json.dumps(document).replace('"1e400"', "1e400").replace('"NaN"', "NaN")
    with pytest.raises(ImportFormatError, match=field) as refused:
        store.exports.import_json(text)
    message = str(refused.value)
    assert "\n" not in message and "\x1b" not in message and len(message) <= 300
    assert len(store.conversations.list_conversations()) == 1


def test_an_import_never_names_a_local_file_nor_turns_tools_on(store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"type": "object"}')
    conversation = store.conversations.create_conversation("Formats")
    sampling = {"temperature": 0.3, "output_format": "json_schema", "output_file": str(secret)}
    settings = {"sampling": sampling, "tools": "mcp:weather", "preset": "precise", "later": {"path": "/etc"}}
    store.conversations.update_settings(conversation.id, settings=settings)
    imported = store.exports.import_json(store.exports.export_json(conversation.id))
    kept = store.conversations.get_conversation(imported.conversation_id).settings
    assert kept == {"sampling": {"temperature": 0.3, "output_format": "text"}, "preset": "precise"}
    assert set(imported.left_out) == {"sampling.output_file", "tools", "later"}
    note = imported.note()
    assert "sampling.output_file" in note and "tools" in note and "\n" not in note and len(note) <= 300
    assert str(secret) not in store.exports.export_json(imported.conversation_id)

    sampling.update(output_format="grammar", output_file="")  # no file named: nothing to leave out
    store.conversations.update_settings(conversation.id, settings={"sampling": sampling, "tools": "none"})
    imported = store.exports.import_json(store.exports.export_json(conversation.id))
    assert imported.left_out == () and imported.note() == ""
    assert store.conversations.get_conversation(imported.conversation_id).settings["tools"] == "none"


def test_import_rejects_a_message_whose_parent_is_unknown(store: Store) -> None:
    document = json.loads(store.exports.export_json(build_branchy_conversation(store)))
    document["messages"][1]["parent"] = 7
    with pytest.raises(ImportFormatError, match=r"messages\[1\]\.parent"):
        store.exports.import_json(json.dumps(document))


# ----- settings and presets -----------------------------------------------------------------------------


def test_presets_and_conversation_settings(store: Store) -> None:
    store.presets.save_preset("precise", {"temperature": 0.2})
    store.presets.save_preset("creative", {"temperature": 1.1})
    store.presets.save_preset("precise", {"temperature": 0.1, "top_k": 20})
    assert store.presets.list_presets() == [
        store_module.Preset("creative", {"temperature": 1.1}),
        store_module.Preset("precise", {"temperature": 0.1, "top_k": 20}),
    ]
    store.presets.delete_preset("creative")
    assert [p.name for p in store.presets.list_presets()] == ["precise"]
    with pytest.raises(PresetNotFound):
        store.presets.delete_preset("creative")
    with pytest.raises(store_module.StoreError):
        store.presets.save_preset("  ", {})

    conversation = store.conversations.create_conversation()
    store.conversations.update_settings(conversation.id, system_prompt="Be brief.")
    store.conversations.update_settings(conversation.id, settings={"preset": "precise"})
    updated = store.conversations.get_conversation(conversation.id)
    assert (updated.system_prompt, updated.settings) == ("Be brief.", {"preset": "precise"})
    store.conversations.rename_conversation(conversation.id, "Renamed")
    assert store.conversations.get_conversation(conversation.id).title == "Renamed"


# ----- threads ------------------------------------------------------------------------------------------


def test_a_worker_thread_can_stream_while_the_main_thread_reads(store: Store) -> None:
    conversation = store.conversations.create_conversation()
    prompt = store.tree.add_user_message(conversation.id, "count")
    reply_id = store.tree.begin_assistant_message(conversation.id, prompt.id, "m")
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            text = ""
            for number in range(200):
                text += f"{number} "
                store.tree.checkpoint_assistant_message(reply_id, text, "")
            store.tree.finish_assistant_message(reply_id, text, "", "complete", {})
        except BaseException as error:  # reported to the main thread
            errors.append(error)

    worker = threading.Thread(target=stream, daemon=True)
    worker.start()

    def read_once_then_is_done() -> bool:
        store.conversations.list_conversations()
        store.tree.active_path(conversation.id)
        return not worker.is_alive()

    wait_for(read_once_then_is_done, "the writer thread to checkpoint 200 times while this one reads", 120, 0)
    assert errors == []
    reply = store.tree.get_message(reply_id)
    assert (reply.state, reply.content.split()[-1]) == ("complete", "199")


def test_a_replys_tool_calls_go_into_both_exports_and_come_back_with_an_import(store: Store) -> None:
    from app.core.tools.loop import CallRecord, record_to_json, stored_calls
    from engine_ext.protocol import ToolCall

    conversation = store.conversations.create_conversation("Weather")
    question = store.tree.add_user_message(conversation.id, "Paris?")
    reply = store.tree.begin_assistant_message(conversation.id, question.id, "qwen3")
    record = CallRecord(ToolCall("c1", "get_weather", '{"city": "Paris"}'), "mcp:weather", True, "18 °C", False, 0.5)
    store.tree.finish_assistant_message(
        reply, "Checking. 18 °C.", "", "complete", {"tool_calls": [record_to_json(record, 10)]}
    )
    markdown = store.exports.export_markdown(conversation.id)
    assert "<summary>Tool get_weather (mcp:weather): result</summary>" in markdown
    assert 'Arguments: `{"city": "Paris"}`' in markdown and "```text\n18 °C\n```" in markdown
    imported = store.exports.import_json(store.exports.export_json(conversation.id)).conversation_id
    copied = store.tree.active_path(imported)[-1]
    assert stored_calls(copied.stats) == [(record, 10)]
