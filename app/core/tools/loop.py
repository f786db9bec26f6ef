"""The tool-call loop every surface shares (CLI, API server, TUI): generate → take the reply's calls → ask consent
for each → run the allowed ones within their time limit → feed the results back as `tool` messages → generate
again, at most `max_calls` calls per reply. A call that is not allowed is refused, and the model is told so."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from app.core.tools.box import DEFAULT_CALL_TIMEOUT_S, ToolBox, ToolEntry, run_call
from engine_ext.protocol import ChatMessage, Finished, ToolCall
from engine_ext.tool_calls import calls_to_json

DEFAULT_MAX_TOOL_CALLS = 8
REFUSED_RESULT = "The user did not allow this call."

# consent(call, entry) -> whether the call may run (entry None: no tool of that name is offered)
Consent = Callable[[ToolCall, ToolEntry | None], bool]
# ask(call, entry) -> the user's answer for a call of an offered tool (a terminal prompt, the TUI's dialog)
Ask = Callable[[ToolCall, ToolEntry], bool]
# generate(messages) -> (the reply's text without its calls, its Finished with the calls it made)
Generator = Callable[[tuple[ChatMessage, ...]], tuple[str, Finished]]


@dataclass(frozen=True)
class CallRecord:
    """One call of a reply, as the transcript shows it (folded under the reply) and history stores it."""

    call: ToolCall
    source: str  # "built-in", "mcp:NAME", the definitions file, or "" when no such tool is offered
    allowed: bool
    result: str
    failed: bool
    seconds: float


@dataclass
class LoopResult:
    messages: tuple[ChatMessage, ...]  # the conversation with the calls and results added (not the last reply)
    text: str  # the last reply's text
    finished: Finished  # the last reply's end
    records: list[CallRecord] = field(default_factory=list)
    pending: tuple[ToolCall, ...] = ()  # calls left to the caller: tools without a runner here, or past the bound
    notices: list[str] = field(default_factory=list)


class AllowList:
    """Consent from names the user allowed beforehand (--allow-tool, config's always_allow), then `ask` if given
    (a terminal prompt, the TUI's dialog); with neither, a call is refused. `allow_for_conversation` remembers."""

    def __init__(self, allowed: set[str], ask: Ask | None = None) -> None:
        self.allowed = set(allowed)
        self.ask = ask

    def __call__(self, call: ToolCall, entry: ToolEntry | None) -> bool:
        if entry is None:
            return False
        if call.name in self.allowed:
            return True
        return self.ask is not None and self.ask(call, entry)

    def allow_for_conversation(self, name: str) -> None:
        self.allowed.add(name)


class ToolLoop:
    def __init__(
        self,
        box: ToolBox,
        consent: Consent,
        *,
        max_calls: int = DEFAULT_MAX_TOOL_CALLS,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        on_record: Callable[[CallRecord], None] | None = None,
    ) -> None:
        self.box = box
        self.consent = consent
        self.max_calls = max_calls
        self.timeout_s = timeout_s
        self.on_record = on_record

    def run(self, messages: tuple[ChatMessage, ...], generate: Generator) -> LoopResult:
        records: list[CallRecord] = []
        notices: list[str] = []
        while True:
            text, finished = generate(messages)
            calls = finished.tool_calls
            if not calls:
                return LoopResult(messages, text, finished, records, (), notices)
            if any(
                self.box.entries.get(c.name, None) is not None and self.box.entries[c.name].run is None for c in calls
            ):
                return LoopResult(messages, text, finished, records, calls, notices)
            if len(records) + len(calls) > self.max_calls:
                notices.append(too_many_calls(self.max_calls))
                return LoopResult(messages, text, finished, records, calls, notices)
            messages += (ChatMessage("assistant", text, calls_to_json(calls)),)
            for call in calls:
                record = self.run_one(call)
                records.append(record)
                if self.on_record is not None:
                    self.on_record(record)
                messages += (ChatMessage("tool", record.result, tool_call_id=call.id, name=call.name),)

    def run_one(self, call: ToolCall) -> CallRecord:
        """Ask consent for one call and run it if allowed."""
        entry = self.box.entries.get(call.name)
        if entry is None:
            return not_offered(call)
        if not self.consent(call, entry):
            return refused(call, entry)
        return run_allowed(call, entry, self.timeout_s)


def not_offered(call: ToolCall) -> CallRecord:
    """The record of a call of a tool that is not offered (the model is told so)."""
    return CallRecord(call, "", False, f"There is no tool named {call.name}.", True, 0.0)


def refused(call: ToolCall, entry: ToolEntry) -> CallRecord:
    """The record of a call the user did not allow."""
    return CallRecord(call, entry.source, False, REFUSED_RESULT, True, 0.0)


def run_allowed(call: ToolCall, entry: ToolEntry, timeout_s: float) -> CallRecord:
    """Run an allowed call within `timeout_s` (blocking: call it off the UI thread); its record."""
    started = time.monotonic()
    result, failed = run_call(entry, call, timeout_s)
    return CallRecord(call, entry.source, True, result, failed, time.monotonic() - started)


def too_many_calls(max_calls: int) -> str:
    return f"stopped: the reply asked for more than {max_calls} tool calls (--max-tool-calls)"


def record_to_json(record: CallRecord, at: int) -> dict[str, object]:
    """A call as history stores it with its reply (`at`: the length of the reply's text when the call was made)."""
    return {
        "id": record.call.id,
        "name": record.call.name,
        "arguments": record.call.arguments,
        "source": record.source,
        "allowed": record.allowed,
        "result": record.result,
        "failed": record.failed,
        "seconds": round(record.seconds, 3),
        "at": at,
    }


def record_from_json(data: object) -> tuple[CallRecord, int] | None:
    """A stored call back as its record and where it was made in the text; None when the entry is not one (a
    damaged or hand-edited history is shown without it rather than failing)."""
    if not isinstance(data, dict):
        return None
    strings = [data.get(key) for key in ("id", "name", "arguments", "source", "result")]
    seconds, at = data.get("seconds", 0.0), data.get("at", 0)
    if not all(isinstance(value, str) for value in strings):
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or isinstance(at, bool):
        return None
    if not isinstance(at, int) or at < 0:
        return None
    call_id, name, arguments, source, result = (str(value) for value in strings)
    record = CallRecord(
        ToolCall(call_id, name, arguments),
        source,
        data.get("allowed") is True,
        result,
        data.get("failed") is True,
        float(seconds),
    )
    return record, at


def stored_calls(stats: Mapping[str, object]) -> list[tuple[CallRecord, int]]:
    """The calls history keeps with a reply (its stats' "tool_calls"), with where in its text each was made."""
    stored = stats.get("tool_calls")
    if not isinstance(stored, list):
        return []
    records = [record_from_json(item) for item in stored]
    return [record for record in records if record is not None]
