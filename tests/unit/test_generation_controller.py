"""The generation controller without Textual: a reply's lifecycle against a real store and an engine double, as the
CLI or an API server would drive it (issue 31 item 2)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.core.config import SamplingSettings
from app.core.engine import EngineCapabilities
from app.core.generation import GenerationController, GenerationRouter
from app.core.store import Store
from engine_ext.protocol import ChatMessage

ROOT = Path(__file__).resolve().parents[2]


class Engine:
    """Takes requests like EngineBridge/RemoteBridge and keeps them (ids from 1); `tools` of each in `self.tools`."""

    capabilities = EngineCapabilities(loads_files=True, tools=True)

    def __init__(self) -> None:
        self.requests: list[tuple[list[Any], SamplingSettings, bool]] = []
        self.tools: list[str | None] = []
        self.cancelled: list[int] = []
        self.ended_thinking: list[int] = []

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        self.requests.append((list(messages), sampling, continue_reply))
        self.tools.append(tools)
        return len(self.requests)

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)

    def end_thinking(self, request_id: int) -> bool:
        self.ended_thinking.append(request_id)
        return True


class Host:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.bridge = Engine()

    def default_conversation_settings(self) -> dict[str, object]:
        return {"sampling": SamplingSettings(temperature=0.0, max_tokens=7).to_json()}


class Owner:
    """A default owner that only says it was told of a crash (a screen would draw the end)."""

    def __init__(self) -> None:
        self.crashes: list[str] = []

    async def generation_crashed(self, description: str) -> None:
        self.crashes.append(description)

    def generation_lost(self) -> None:
        raise AssertionError("the default owner is told of a crash through generation_crashed")


def test_a_reply_is_committed_sent_recorded_stopped_and_continued_without_textual(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        replies = GenerationController(host, GenerationRouter())
        conversation = replies.ensure_conversation(None)
        question = replies.commit_user_message(conversation.id, "Say hi")
        assert [m.content for m in store.tree.active_path(conversation.id)] == ["Say hi"]  # saved before generating
        reply = replies.begin(conversation.id, question.id, "tiny")
        assert replies.active is reply and replies.replies_started == 1 and reply.request_id == 0
        assert store.tree.get_message(reply.message_id).state == "streaming"
        replies.send(reply)
        assert reply.request_id == 1
        [(messages, sampling, continued)] = host.bridge.requests
        assert messages == [("user", "Say hi")] and sampling.max_tokens == 7 and not continued
        assert not replies.record(99, "other", "", 1)  # another request's tokens are not this reply's
        assert replies.record(1, "Hel", "thinking", 2) and replies.record(1, "lo", "", 1)
        replies.stop()
        assert host.bridge.cancelled == [1]
        ended = replies.end("stopped", {"stop_reason": "cancelled"})
        assert ended is not None and replies.active is None
        _, saved = ended
        assert (saved.content, saved.reasoning, saved.state, saved.token_count) == ("Hello", "thinking", "stopped", 3)
        last = replies.last_reply(conversation.id)
        assert last is not None and last.id == saved.id and last.can_continue
        resumed = replies.begin(conversation.id, question.id, "tiny", resume=last)  # ctrl+g
        replies.send(resumed)
        assert resumed.message_id == saved.id and host.bridge.requests[-1][2] is True
        assert host.bridge.requests[-1][0] == [("user", "Say hi"), ("assistant", "Hello")]
        replies.record(resumed.request_id, "!", "", 1)
        replies.end("complete", {"stop_reason": "eos"})
        assert store.tree.get_message(saved.id).content == "Hello!"


def test_stopped_before_it_is_sent_the_request_is_cancelled_at_once_and_a_crash_is_recorded(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        router = GenerationRouter()
        owner = Owner()
        router.default = owner  # type: ignore[assignment]
        replies = GenerationController(host, router)
        conversation = replies.ensure_conversation(None)
        question = replies.commit_user_message(conversation.id, "Tell a story")
        reply = replies.begin(conversation.id, question.id, "tiny")
        assert replies.stop() and host.bridge.cancelled == []  # not sent yet
        replies.send(reply)
        assert host.bridge.cancelled == [reply.request_id]  # sent and cancelled at once
        replies.record(reply.request_id, "Once", "", 1)
        asyncio.run(replies.crashed("the engine crashed (signal 11)"))
        assert owner.crashes == ["the engine crashed (signal 11)"] and replies.active is None
        saved = store.tree.get_message(reply.message_id)
        assert (saved.state, saved.content, saved.stats["error"]) == ("error", "Once", "the engine crashed (signal 11)")
        replies.send(reply)  # ended meanwhile: nothing is sent
        assert len(host.bridge.requests) == 1


def test_side_runs_go_to_their_owner_and_are_cancelled_through_the_controller(tmp_path: Path) -> None:
    with Store(tmp_path / "history.db") as store:
        host = Host(store)
        router = GenerationRouter()
        replies = GenerationController(host, router)
        side: Any = object()
        request_id = replies.run([("user", "A/B")], SamplingSettings(temperature=0.0), side)
        assert router.side_owner(request_id) is side
        replies.cancel(request_id)
        assert host.bridge.cancelled == [request_id] and router.owner(request_id) is None
