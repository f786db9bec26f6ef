"""Durability of streamed replies: a writer killed with SIGKILL mid-reply, 50 times; a v1 history fixture."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.core.recording import ReplyRecorder
from app.core.store import Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KILLS = 50
DATABASES = 5  # kills run on this many history files at once, each killed KILLS / DATABASES times in a row
TOKENS_PER_S = 500

# The child streams a reply the way the app does (ReplyRecorder: a checkpoint every second or 256 tokens) and
# logs "<token index> <wall time>" for every token to a side file, unbuffered, before handing it to the recorder.
CHILD = """
import os, sys, time
from pathlib import Path
from app.core.store import Store
from app.core.recording import ReplyRecorder

db, log, round_no, rate = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
store = Store(db)
conversation = store.conversations.create_conversation()
user = store.tree.add_user_message(conversation.id, f"prompt of round {round_no}")
reply = store.tree.begin_assistant_message(conversation.id, user.id, "synthetic")
recorder = ReplyRecorder(store, reply)
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.write(fd, b"ready\\n")
start = time.monotonic()
i = 0
while True:
    due = start + i / rate
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    os.write(fd, f"{i} {time.time()}\\n".encode())
    recorder.append(f"t{i} ", "", 1)
    i += 1
"""


def _token_text(n: int) -> str:
    return "".join(f"t{i} " for i in range(n))


def _one_database(db: Path, rounds: int, seed: int) -> list[str]:
    """Kill a writer `rounds` times on one history file; the problems found (empty when all is well)."""
    rng = random.Random(seed)
    problems: list[str] = []
    for round_no in range(rounds):
        log = db.with_name(f"{db.stem}-round{round_no}.log")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db), str(log), str(round_no), str(TOKENS_PER_S)], cwd=ROOT
        )
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().startswith("ready")):
            if time.monotonic() > deadline or child.poll() is not None:
                child.kill()
                return problems + [f"{db.name} round {round_no}: the writer did not start"]
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 2.5))
        child.send_signal(signal.SIGKILL)
        killed_at = time.time()
        child.wait(timeout=30)
        produced = [line.split() for line in log.read_text().splitlines()[1:] if line.strip()]
        safe = sum(1 for _, stamp in produced if float(stamp) <= killed_at - 1.0)
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            if connection.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                problems.append(f"{db.name} round {round_no}: integrity_check failed")
                continue
            prompt = connection.execute(
                "SELECT id FROM messages WHERE role = 'user' AND content = ?", (f"prompt of round {round_no}",)
            ).fetchone()
            if prompt is None:
                problems.append(f"{db.name} round {round_no}: the prompt is missing")
                continue
            row = connection.execute("SELECT content FROM messages WHERE parent_id = ?", (prompt[0],)).fetchone()
        content = "" if row is None else row[0]
        saved = content.count(" ")
        if content != _token_text(saved):
            problems.append(f"{db.name} round {round_no}: the saved reply is not a prefix of what was streamed")
        elif saved < safe:
            problems.append(f"{db.name} round {round_no}: saved {saved} tokens, but {safe} were older than 1 s")
    # Opening the history again marks the killed replies interrupted, keeping their text.
    with Store(db) as store:
        states = {
            m.state
            for c in store.conversations.list_conversations()
            for m in store.tree.messages(c.id)
            if m.role == "assistant"
        }
        if states - {"interrupted"}:
            problems.append(f"{db.name}: replies left in states {states}")
    return problems


def test_sigkill_during_a_streamed_reply_loses_at_most_the_last_second(tmp_path: Path) -> None:
    databases = [tmp_path / f"history-{n}.sqlite3" for n in range(DATABASES)]
    with ThreadPoolExecutor(DATABASES) as pool:
        results = pool.map(lambda item: _one_database(item[1], KILLS // DATABASES, item[0]), enumerate(databases))
        problems = [problem for result in results for problem in result]
    assert not problems, "\n".join(problems)


def test_recorder_checkpoints_every_second_or_256_tokens(tmp_path: Path) -> None:
    clock = [0.0]
    with Store(tmp_path / "h.sqlite3") as store:
        conversation = store.conversations.create_conversation()
        user = store.tree.add_user_message(conversation.id, "q")
        reply = store.tree.begin_assistant_message(conversation.id, user.id, "m")
        recorder = ReplyRecorder(store, reply, clock=lambda: clock[0])
        assert not recorder.append("a", "", 255)
        assert store.tree.get_message(reply).content == ""
        assert recorder.append("b", "r", 1)  # 256 tokens
        assert (store.tree.get_message(reply).content, store.tree.get_message(reply).reasoning) == ("ab", "r")
        clock[0] = 0.5
        assert not recorder.append("c", "", 1)
        clock[0] = 1.6
        assert recorder.append("d", "", 1)  # a second since the last checkpoint
        assert store.tree.get_message(reply).content == "abcd"
        recorder.finish("stopped", {"stop_reason": "cancelled"})
        recorder.finish("complete", {})  # idempotent
        final = store.tree.get_message(reply)
        assert (final.state, final.token_count, final.stats) == ("stopped", 258, {"stop_reason": "cancelled"})


def test_resume_assistant_message_continues_a_stopped_reply(tmp_path: Path) -> None:
    from app.core.store import MessageNotStreaming

    with Store(tmp_path / "h.sqlite3") as store:
        conversation = store.conversations.create_conversation()
        user = store.tree.add_user_message(conversation.id, "q")
        reply = store.tree.begin_assistant_message(conversation.id, user.id, "m")
        with pytest.raises(MessageNotStreaming):
            store.tree.resume_assistant_message(reply)  # still streaming
        store.tree.finish_assistant_message(reply, "partial", "", "stopped", {})
        store.tree.switch_branch(user.id)
        resumed = store.tree.resume_assistant_message(reply)
        assert resumed.state == "streaming" and resumed.content == "partial"
        assert store.conversations.get_conversation(conversation.id).active_leaf_id == reply
        store.tree.checkpoint_assistant_message(reply, "partial and more", "")
        with pytest.raises(MessageNotStreaming):
            store.tree.resume_assistant_message(user.id)


def test_a_first_schema_history_fixture_keeps_every_message(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    with sqlite3.connect(db) as connection:
        connection.executescript((FIXTURES / "history-v1.sql").read_text(encoding="utf-8"))
    with sqlite3.connect(db) as connection:
        before = connection.execute("SELECT id, role, content, state FROM messages ORDER BY id").fetchall()
    assert len(before) == 7
    with Store(db) as store:
        after = [
            (m.id, m.role, m.content, m.state)
            for c in store.conversations.list_conversations()
            for m in store.tree.messages(c.id)
        ]
        titles = [c.title for c in store.conversations.list_conversations()]
        path = store.tree.active_path(1)
    assert sorted(after) == [(i, r, c, "interrupted" if s == "streaming" else s) for i, r, c, s in before]
    assert titles == ["Branches and reasoning", "Hello"]
    assert [m.content for m in path] == ["Hello", "Hi! How can I help?"]
