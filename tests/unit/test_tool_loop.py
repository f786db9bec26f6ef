"""The tool-call loop (app/core/tools/loop.py) with a scripted engine: calls run only with consent, results go back as
tool messages, the per-reply bound holds, a slow tool is stopped; and the built-in tools: the date and time, and
read_file that never leaves its folder (symlinks, devices, FIFOs, size)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from app.core.tools.box import ToolBox, ToolEntry, ToolError
from app.core.tools.builtin import MAX_READ_BYTES, datetime_tool, read_file_tool, read_under
from app.core.tools.loop import REFUSED_RESULT, AllowList, CallRecord, ToolLoop
from engine_ext.protocol import ChatMessage, Finished, GenerationStats, ToolCall

STATS = GenerationStats(1, 0, 1, 1.0, 1, 1.0, 1.0, 64, 2)


def _finished(*calls: ToolCall) -> Finished:
    return Finished(1, "eos", STATS, tool_calls=calls)


class ScriptedEngine:
    """Replies from a script, one per generation; records the messages each generation got."""

    def __init__(self, *replies: tuple[str, tuple[ToolCall, ...]]) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[ChatMessage, ...]] = []

    def __call__(self, messages: tuple[ChatMessage, ...]) -> tuple[str, Finished]:
        self.seen.append(messages)
        text, calls = self.replies.pop(0)
        return text, _finished(*calls)


def _echo_tool(name: str = "echo", delay: float = 0.0) -> ToolEntry:
    def run(arguments: dict[str, Any], timeout_s: float) -> str:
        time.sleep(delay)
        return f"echo: {arguments.get('text', '')}"

    return ToolEntry({"name": name, "description": "", "parameters": {"type": "object"}}, "built-in", run)


def test_allowed_calls_run_and_their_results_go_back_as_tool_messages() -> None:
    box = ToolBox()
    box.add(_echo_tool())
    box.add(_echo_tool("other"))
    calls = (ToolCall("aaaaaaaaa", "echo", '{"text": "hi"}'), ToolCall("bbbbbbbbb", "other", "{}"))
    engine = ScriptedEngine(("Let me see.", calls), ("Done.", ()))
    seen: list[CallRecord] = []
    result = ToolLoop(box, AllowList({"echo"}), on_record=seen.append).run((ChatMessage("user", "go"),), engine)
    assert result.text == "Done." and result.pending == ()
    assert [(r.call.name, r.allowed, r.result) for r in seen] == [
        ("echo", True, "echo: hi"),
        ("other", False, REFUSED_RESULT),  # not allowed, no one to ask: refused, and the model is told
    ]
    second = engine.seen[1]
    assert second[1].role == "assistant" and second[1].content == "Let me see."
    assert [c["function"]["name"] for c in json.loads(second[1].tool_calls)] == ["echo", "other"]
    assert second[2] == ChatMessage("tool", "echo: hi", tool_call_id="aaaaaaaaa", name="echo")
    assert second[3] == ChatMessage("tool", REFUSED_RESULT, tool_call_id="bbbbbbbbb", name="other")


def test_asking_the_user_the_bound_and_the_time_limit() -> None:
    box = ToolBox()
    box.add(_echo_tool())
    box.add(_echo_tool("slow", delay=5.0))
    asked: list[str] = []
    consent = AllowList(set(), ask=lambda call, entry: asked.append(call.name) or call.name == "slow")
    again = ToolCall("ccccccccc", "echo", "{}")
    engine = ScriptedEngine(("", (again,)), ("", (again, again)), ("", (again,)))
    result = ToolLoop(box, consent, max_calls=2).run((ChatMessage("user", "go"),), engine)
    assert result.pending == (again, again) and "more than 2 tool calls" in result.notices[0]
    assert asked == ["echo"] and result.records[0].result == REFUSED_RESULT
    started = time.monotonic()
    slow = ToolLoop(box, consent, timeout_s=0.5).run_one(ToolCall("ddddddddd", "slow", "{}"))
    assert slow.failed and "ran longer than 0.5 s" in slow.result and time.monotonic() - started < 4
    unknown = ToolLoop(box, consent).run_one(ToolCall("eeeeeeeee", "nope", "{}"))
    assert not unknown.allowed and unknown.source == ""


def test_calls_of_tools_without_a_runner_are_handed_back() -> None:
    box = ToolBox()
    box.add(ToolEntry({"name": "lookup", "description": "", "parameters": {}}, "tools.json", None))
    call = ToolCall("fffffffff", "lookup", '{"q": 1}')
    result = ToolLoop(box, AllowList({"lookup"})).run((ChatMessage("user", "go"),), ScriptedEngine(("", (call,))))
    assert result.pending == (call,) and result.records == []


def test_read_file_stays_in_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("secret")
    (root / "out").symlink_to(tmp_path / "secret.txt")
    (root / "big.txt").write_text("x" * (MAX_READ_BYTES + 1))
    (root / "bin").write_bytes(b"\x00\x01")
    os.mkfifo(root / "fifo")
    tool = read_file_tool(root)
    assert tool.run is not None and tool.run({"path": "sub/a.txt"}, 1.0) == "hello"
    for relative, words in [
        ("../secret.txt", "outside the folder"),
        ("out", "outside the folder"),
        ("/etc/passwd", "outside the folder"),
        ("sub", "not a regular file"),
        ("fifo", "not a regular file"),
        ("big.txt", "reads at most"),
        ("bin", "not a small text file"),
        ("nope.txt", "no such file"),
        ("", "relative to the folder"),
    ]:
        with pytest.raises(ToolError, match=words):
            read_under(root.resolve(), relative)
    with pytest.raises(ToolError):
        read_under(root.resolve(), "/dev/zero")
    now = datetime_tool()
    assert now.run is not None and str(time.localtime().tm_year) in now.run({}, 1.0)
