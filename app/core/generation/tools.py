"""Tools in the chat's replies, without Textual: which tools a conversation offers (its "tools" setting: none, the
built-in ones, or one MCP server of config.toml), the consent it remembers, and a reply's tool rounds. A reply that
ends with calls → each call asked about (`Ask`: the TUI's dialog) → the allowed ones run off the event loop within
their limit → the results added to what the engine answers next, at most `max_calls` calls per reply. Stopping the
reply (Esc) stops the round; a call already running is left to its own limit.

The per-call steps are app/core/tools/loop.py's (`not_offered`, `refused`, `run_allowed`), shared with the CLI's loop;
this module is the same loop driven by engine events instead of a blocking `generate`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from app.core import paths
from app.core.tools.box import DEFAULT_CALL_TIMEOUT_S, ToolBox, ToolEntry, ToolError
from app.core.tools.builtin import BUILTIN_NAMES, datetime_tool, read_file_tool
from app.core.tools.loop import (
    DEFAULT_MAX_TOOL_CALLS,
    AllowList,
    CallRecord,
    not_offered,
    record_to_json,
    refused,
    run_allowed,
    stored_calls,
    too_many_calls,
)
from app.core.tools.mcp_servers import McpServers
from app.core.tools.tool_config import ToolSettings, read_tool_settings, remember_always_allow
from engine_ext.protocol import ChatMessage, ToolCall
from engine_ext.tool_calls import CallTextFilter, calls_to_json

if TYPE_CHECKING:
    from app.core.store import Conversation, Message

TOOLS_NONE = "none"
TOOLS_BUILTIN = "builtin"
MCP_PREFIX = "mcp:"

ConsentAnswer = Literal["once", "conversation", "always", "deny"]
# ask(call, entry) -> the user's answer (the TUI's consent dialog)
Ask = Callable[[ToolCall, ToolEntry], Awaitable[ConsentAnswer]]


def tools_choice(conversation: Conversation) -> str:
    """The conversation's tools setting: "none", "builtin" or "mcp:NAME"."""
    value = conversation.settings.get("tools", TOOLS_NONE)
    return value if isinstance(value, str) else TOOLS_NONE


def tool_choices(settings: ToolSettings) -> list[tuple[str, str]]:
    """(label, value) of each choice the conversation settings offer."""
    named = settings.builtin or BUILTIN_NAMES  # config.toml's tools.builtin, else both
    offered = ["current_datetime"] if "datetime" in named else []
    if "read_file" in named and settings.read_folder:
        offered.append(f"read_file under {settings.read_folder}")
    choices = [("none", TOOLS_NONE), (f"built-in ({', '.join(offered) or 'none: see tools.builtin'})", TOOLS_BUILTIN)]
    choices += [(f"MCP server {name}", MCP_PREFIX + name) for name in sorted(settings.servers)]
    return choices


@dataclass
class ConversationTools:
    """The tools one conversation offers and the calls the user allowed for it."""

    choice: str
    box: ToolBox
    allow: AllowList
    max_calls: int = DEFAULT_MAX_TOOL_CALLS
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S


class ChatTools:
    """Each conversation's tools (made once, in a thread: an MCP server starts on demand) and the MCP servers they
    use, stopped by `close()`."""

    def __init__(self, config: Path | None = None, log_dir: Path | None = None) -> None:
        self.config = config
        self.log_dir = log_dir
        self._servers: McpServers | None = None
        self._conversations: dict[int, ConversationTools] = {}

    def ready(self, conversation_id: int, choice: str) -> ConversationTools | None:
        """The tools made for this conversation with this choice (None: none, or not made yet)."""
        tools = self._conversations.get(conversation_id)
        return tools if tools is not None and tools.choice == choice else None

    def prepare(self, conversation_id: int, choice: str) -> ConversationTools | None:
        """Make the conversation's tools (blocking: run it in a thread); None for "none". ToolError (one line) when
        the config or a server fails; the conversation then has no tools until asked again."""
        if choice == TOOLS_NONE:
            self._conversations.pop(conversation_id, None)
            return None
        made = self.ready(conversation_id, choice)
        if made is not None:
            return made
        settings = read_tool_settings(self.config)
        box = ToolBox()
        if choice == TOOLS_BUILTIN:  # those config.toml's tools.builtin names, else both
            named = settings.builtin or BUILTIN_NAMES
            if "datetime" in named:
                box.add(datetime_tool())
            if "read_file" in named and settings.read_folder:
                box.add(read_file_tool(Path(settings.read_folder)))
        elif choice.startswith(MCP_PREFIX):
            if self._servers is None:
                self._servers = McpServers(settings.servers, self.log_dir or paths.log_dir())
            for entry in self._servers.tools(choice.removeprefix(MCP_PREFIX)):
                box.add(entry)
            box.notices.extend(self._servers.notices(choice.removeprefix(MCP_PREFIX)))
        else:
            raise ToolError(f"unknown tools choice {choice!r}: none, builtin or mcp:NAME")
        previous = self._conversations.get(conversation_id)
        allowed = set(settings.always_allow) | (previous.allow.allowed if previous is not None else set())
        tools = ConversationTools(choice, box, AllowList(allowed))
        self._conversations[conversation_id] = tools
        return tools

    def remember(self, tool: str) -> None:
        """ "Always" in the consent dialog: the tool is added to config.toml's always_allow (blocking)."""
        remember_always_allow(tool, self.config)

    def close(self) -> None:
        if self._servers is not None:
            self._servers.close()
            self._servers = None


@dataclass
class ReplyTools:
    """The tool side of the reply being written: its calls so far (with where in the text each was made), the
    filter that keeps call markup out of the streamed text, and the event Esc sets."""

    tools: ConversationTools
    records: list[tuple[CallRecord, int]] = field(default_factory=list)
    text_filter: CallTextFilter = field(default_factory=CallTextFilter)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    round_text_from: int = 0
    """Where the current round's text starts in the reply's text."""

    def stored(self) -> list[dict[str, object]]:
        return [record_to_json(record, at) for record, at in self.records]

    async def run_round(
        self,
        calls: Sequence[ToolCall],
        text: str,
        ask: Ask,
        chat_tools: ChatTools,
        on_record: Callable[[CallRecord], Awaitable[None]],
        messages: list[tuple[str, str] | ChatMessage],
    ) -> str | None:
        """Ask about and run the round's calls, adding the reply's round and the results to `messages`. None when the
        engine should answer again; else why not (stopped, or the bound on calls)."""
        if len(self.records) + len(calls) > self.tools.max_calls:
            return too_many_calls(self.tools.max_calls)
        messages.append(ChatMessage("assistant", text[self.round_text_from :], calls_to_json(calls)))
        for call in calls:
            if self.stopped.is_set():
                return "stopped"
            record = await self._one(call, ask, chat_tools)
            if record is None:
                return "stopped"
            self.records.append((record, len(text)))
            await on_record(record)
            messages.append(ChatMessage("tool", record.result, tool_call_id=call.id, name=call.name))
        self.round_text_from = len(text)
        self.text_filter = CallTextFilter()
        return "stopped" if self.stopped.is_set() else None

    async def _one(self, call: ToolCall, ask: Ask, chat_tools: ChatTools) -> CallRecord | None:
        entry = self.tools.box.entries.get(call.name)
        if entry is None:
            return not_offered(call)
        if call.name not in self.tools.allow.allowed:
            answer = await ask(call, entry)
            if answer == "deny":
                return refused(call, entry)
            if answer in ("conversation", "always"):
                self.tools.allow.allow_for_conversation(call.name)
            if answer == "always":
                await asyncio.to_thread(chat_tools.remember, call.name)
        running = asyncio.ensure_future(asyncio.to_thread(run_allowed, call, entry, self.tools.timeout_s))
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait((running, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not running.done():
            return None  # stopped: the call runs out its own limit in its thread, and its result is dropped
        return running.result()


def reply_rounds(message: Message) -> list[ChatMessage]:
    """A stored reply as the engine saw it: each round's text with its calls, the calls' results, the last text."""
    records = stored_calls(message.stats)
    if not records:
        return [ChatMessage("assistant", message.content)]
    out: list[ChatMessage] = []
    start = 0
    for at, group in groupby(records, key=lambda item: min(item[1], len(message.content))):
        round_records = [record for record, _ in group]
        out.append(ChatMessage("assistant", message.content[start:at], calls_to_json([r.call for r in round_records])))
        out.extend(ChatMessage("tool", r.result, tool_call_id=r.call.id, name=r.call.name) for r in round_records)
        start = at
    out.append(ChatMessage("assistant", message.content[start:]))
    return out


def messages_with_calls(
    plain: Sequence[tuple[str, str]], path: Sequence[Message]
) -> list[tuple[str, str] | ChatMessage]:
    """`plain` (engine_messages of `path`) with each reply that made calls replaced by its rounds."""
    replies = iter(m for m in path if m.role in ("user", "assistant"))
    offset = len(plain) - sum(1 for m in path if m.role in ("user", "assistant"))
    out: list[tuple[str, str] | ChatMessage] = list(plain[:offset])
    for item, message in zip(plain[offset:], replies, strict=True):
        if message.role == "assistant" and stored_calls(message.stats):
            out.extend(reply_rounds(message))
        else:
            out.append(item)
    return out
