"""The chat's tool rounds in the generation controller, without Textual (issue 35): the tools a conversation offers
go with its requests, call markup is kept out of the reply's text, consent (once, this conversation, always: into
config.toml, deny), the bound on calls, Esc during a round, the calls kept with the reply and given back to the
engine as the rounds they were."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.engine import EngineCapabilities
from app.core.generation import GenerationController, GenerationRouter
from app.core.generation.tools import ConsentAnswer, reply_rounds
from app.core.store import Store
from app.core.tools.box import ToolEntry
from app.core.tools.loop import CallRecord, record_from_json, record_to_json, stored_calls
from app.core.tools.tool_config import read_tool_settings
from engine_ext.protocol import ChatMessage, ToolCall
from tests.unit.test_generation_controller import Host

NOW = ToolCall("call00001", "current_datetime", "{}")


class Answers:
    """The user's answers to the consent dialog, in turn; the calls asked about."""

    def __init__(self, *answers: ConsentAnswer) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, call: ToolCall, entry: ToolEntry) -> ConsentAnswer:
        self.asked.append(call.name)
        return self.answers.pop(0)


async def no_show(record: CallRecord) -> None:
    pass


def begin_with_tools(replies: GenerationController, text: str) -> Any:
    conversation = replies.ensure_conversation(None)
    replies.host.store.conversations.update_settings(conversation.id, settings={"tools": "builtin"})
    question = replies.commit_user_message(conversation.id, text)
    assert asyncio.run(replies.prepare_tools(conversation.id)) is None
    reply = replies.begin(conversation.id, question.id, "tiny")
    replies.send(reply)
    return reply


def test_a_reply_with_a_call_asks_runs_and_goes_on_and_always_is_remembered(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        replies = GenerationController(host, GenerationRouter())
        reply = begin_with_tools(replies, "What time is it?")
        [(messages, _, _)] = host.bridge.requests
        assert messages == [("user", "What time is it?")] and "current_datetime" in (host.bridge.tools[0] or "")
        # The call's markup streams as the model writes it; the reply's text keeps none of it.
        shown = [replies.visible(1, part) for part in ("Checking. <tool", '_call>{"name": "current_datetime"}', "</")]
        assert "".join(shown) == "Checking. " and replies.visible(99, "<tool_call>") == "<tool_call>"
        replies.record(1, "".join(shown), "", 3)
        assert replies.calls_ended(1, (NOW,)) == "" and replies.wants_tool_round(1, (NOW,))
        ask = Answers("always")
        assert asyncio.run(replies.tool_round((NOW,), ask, no_show)) is None
        assert ask.asked == ["current_datetime"] and read_tool_settings().always_allow == ("current_datetime",)
        sent = host.bridge.requests[1][0]
        assert reply.request_id == 2 and [m.role for m in sent[1:]] == ["assistant", "tool"]
        assert sent[1].content == "Checking. " and json.loads(sent[1].tool_calls)[0]["id"] == "call00001"
        assert sent[2].tool_call_id == "call00001" and sent[2].content  # the date and time
        replies.record(2, "It is late.", "", 3)
        assert replies.calls_ended(2, ()) == "" and not replies.wants_tool_round(2, ())
        _, saved = replies.end("complete", {"stop_reason": "eos"}) or (None, None)
        assert saved is not None and saved.content == "Checking. It is late."
        [(record, at)] = stored_calls(saved.stats)
        assert (record.call, record.allowed, at) == (NOW, True, len("Checking. "))
        # The next turn gives the engine the round as it was.
        rounds = reply_rounds(saved)
        assert [(m.role, m.content[:9]) for m in rounds] == [
            ("assistant", "Checking."),
            ("tool", sent[2].content[:9]),
            ("assistant", "It is lat"),
        ]
        follow_up = replies.commit_user_message(reply.conversation_id, "Thanks")
        replies.send(replies.begin(reply.conversation_id, follow_up.id, "tiny"))
        last = host.bridge.requests[-1][0]
        assert [m.role if isinstance(m, ChatMessage) else m[0] for m in last] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]


def test_a_denied_call_is_refused_and_too_many_calls_end_the_reply(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        replies = GenerationController(host, GenerationRouter())
        reply = begin_with_tools(replies, "Time?")
        assert asyncio.run(replies.tool_round((NOW,), Answers("deny"), no_show)) is None
        tool_message = host.bridge.requests[1][0][-1]
        assert tool_message.role == "tool" and "did not allow" in tool_message.content
        assert reply.tools is not None and not reply.tools.records[0][0].allowed
        many = tuple(ToolCall(f"call0000{i}", "current_datetime", "{}") for i in range(8))
        why = asyncio.run(replies.tool_round(many, Answers(), no_show))
        assert why is not None and "more than 8 tool calls" in why and len(host.bridge.requests) == 2
        assert not paths.config_path().exists()  # nothing was remembered


def test_esc_during_a_round_stops_it_before_the_next_call(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        replies = GenerationController(host, GenerationRouter())
        begin_with_tools(replies, "Time twice?")
        shown: list[CallRecord] = []

        async def stop_after_first(record: CallRecord) -> None:
            shown.append(record)
            replies.stop()

        two = (NOW, ToolCall("call00002", "current_datetime", "{}"))
        assert asyncio.run(replies.tool_round(two, Answers("once", "once"), stop_after_first)) == "stopped"
        assert len(shown) == 1 and len(host.bridge.requests) == 1  # nothing more is sent


def test_stored_calls_survive_a_round_trip_and_damaged_entries_are_left_out() -> None:
    record = CallRecord(NOW, "built-in", True, "2026-01-01", False, 0.25)
    stats: dict[str, object] = {
        "tool_calls": [record_to_json(record, 5), {"name": 3}, "text", {**record_to_json(record, 1), "at": -1}]
    }
    assert stored_calls(stats) == [(record, 5)]
    assert record_from_json({**record_to_json(record, 0), "seconds": True}) is None
    assert stored_calls({}) == [] and stored_calls({"tool_calls": {"a": 1}}) == []


def test_a_remote_engine_is_offered_no_tools(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        host.bridge.capabilities = EngineCapabilities(loads_files=False)
        replies = GenerationController(host, GenerationRouter())
        conversation = replies.ensure_conversation(None)
        store.conversations.update_settings(conversation.id, settings={"tools": "builtin"})
        question = replies.commit_user_message(conversation.id, "Hi")
        asyncio.run(replies.prepare_tools(conversation.id))
        replies.send(replies.begin(conversation.id, question.id, "remote"))
        assert host.bridge.requests[0][0] == [("user", "Hi")] and host.bridge.tools == [None]
