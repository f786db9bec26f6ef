"""A reply's events as content blocks in order (its thinking, its text, then its tool calls), for the APIs whose
answers are lists of blocks (Anthropic's Messages, OpenAI's Responses): one state machine, fed the ticket's events,
that a subclass maps to its API's stream events and whole answer, streamed or not alike."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

from app.server.api_errors import ApiError
from app.server.requests import Job
from app.server.responses import KEEPALIVE, Reply
from engine_ext.protocol import Finished, PromptEvaluated, TokenChunk, ToolCall
from engine_ext.tool_calls import CallTextFilter

BlockKind = Literal["thinking", "text"]
StreamEvent = tuple[str, dict[str, object]]  # the SSE event's name and its data


@dataclass
class Block:
    """One block of the answer: thinking or text, as it grew."""

    kind: BlockKind
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True)
class PromptCount:
    """The prompt's tokens, and of them those read from the prompt cache."""

    tokens: int
    cached: int


class BlockShaper(ABC):
    """Events in (`feed`), the API's SSE events out (when streaming), and the whole answer (`answer`) once the
    reply's Finished was fed. A subclass says what each step is in its API."""

    def __init__(self, job: Job, model: str) -> None:
        self.job = job
        self.model = model
        self.reply = Reply(calls_hidden=CallTextFilter() if job.tools and job.tool_choice != "none" else None)
        self.blocks: list[Block] = []
        self.prompt: PromptCount | None = None
        self.finished: Finished | None = None
        self._open = False
        self._early = False  # the stream opened before the prompt was read (opened_early)

    def feed(self, event: object) -> list[bytes]:
        """The SSE bytes `event` adds to the stream (none when the job is not streamed)."""
        steps: list[StreamEvent] = []
        if self.prompt is None and isinstance(event, PromptEvaluated | Finished):
            self.prompt = (
                PromptCount(event.prompt_tokens, event.prompt_tokens_cached)
                if isinstance(event, PromptEvaluated)
                else PromptCount(event.stats.prompt_tokens, event.stats.prompt_tokens_cached)
            )
            steps += [] if self._early else self.on_start(self.prompt)
        if isinstance(event, TokenChunk):
            if self.prompt is None:
                self.prompt = PromptCount(0, 0)
                steps += [] if self._early else self.on_start(self.prompt)
            if event.reasoning:
                steps += self._grow("thinking", event.reasoning)
            text = self.reply.visible(event.text)
            if text:
                steps += self._grow("text", text)
        elif isinstance(event, Finished):
            rest = self.reply.rest(event)
            if rest:
                steps += self._grow("text", rest)
            steps += self._close()
            self.finished = event
            steps += self.on_finish(event)
        return [self.sse(name, data) for name, data in steps] if self.job.stream else []

    def opened_early(self) -> bytes:
        """The stream's opening, sent before the prompt is read (a long prompt, a request waiting for the engine) so
        that a client which counts silence sees its request alive; its usage comes with the end."""
        self._early = True
        return b"".join(self.sse(name, data) for name, data in self.on_start(PromptCount(0, 0)))

    def keepalive(self) -> bytes:
        """What the stream sends while the prompt is read: an SSE comment (Anthropic's stream: a ping)."""
        return KEEPALIVE

    def _grow(self, kind: BlockKind, text: str) -> list[StreamEvent]:
        steps: list[StreamEvent] = []
        if not self._open or self.blocks[-1].kind != kind:
            steps += self._close()
            self.blocks.append(Block(kind))
            self._open = True
            steps += self.on_open(len(self.blocks) - 1, kind)
        self.blocks[-1].parts.append(text)
        return steps + self.on_delta(len(self.blocks) - 1, kind, text)

    def _close(self) -> list[StreamEvent]:
        if not self._open:
            return []
        self._open = False
        return self.on_close(len(self.blocks) - 1, self.blocks[-1])

    @staticmethod
    def sse(name: str, data: dict[str, object]) -> bytes:
        """One named server-sent event (`event:` and `data:` lines), as both APIs stream them."""
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"event: {name}\ndata: {payload}\n\n".encode()

    @staticmethod
    def arguments(call: ToolCall) -> dict[str, object]:
        """A call's arguments as an object (the engine gives a JSON object's text; anything else: empty)."""
        try:
            value = json.loads(call.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    @abstractmethod
    def on_start(self, prompt: PromptCount) -> list[StreamEvent]: ...

    @abstractmethod
    def on_open(self, index: int, kind: BlockKind) -> list[StreamEvent]: ...

    @abstractmethod
    def on_delta(self, index: int, kind: BlockKind, text: str) -> list[StreamEvent]: ...

    @abstractmethod
    def on_close(self, index: int, block: Block) -> list[StreamEvent]: ...

    @abstractmethod
    def on_finish(self, finished: Finished) -> list[StreamEvent]:
        """The events after the last block: the tool calls', then the end of the answer."""

    @abstractmethod
    def answer(self) -> dict[str, object]:
        """The whole answer (after Finished)."""

    @abstractmethod
    def error(self, error: ApiError) -> bytes:
        """The stream's last event when the request fails midway."""
