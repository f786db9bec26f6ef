"""The tool box: each tool the model is offered, where it comes from and how it runs, and running one call within
its time limit (a tool's failure is its result, one line, never the end of the reply)."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from engine_ext.protocol import ToolCall
from engine_ext.untrusted_text import one_line, shown

MAX_RESULT_CHARS = 32 * 1024  # a result longer than this is cut (it goes into the model's context)
DEFAULT_CALL_TIMEOUT_S = 60.0


class ToolError(Exception):
    """A tool could not be set up or run; the message is one line a user understands."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


# run(arguments, timeout_s) -> result text; raises ToolError. None: the tool has no runner here (definitions from a
# file: its calls are handed back to whoever asked, not run).
Runner = Callable[[dict[str, Any], float], str]


@dataclass(frozen=True)
class ToolEntry:
    definition: dict[str, Any]  # name, description, parameters (a JSON schema)
    source: str  # "built-in", "mcp:NAME", or the definitions file's name
    run: Runner | None

    @property
    def name(self) -> str:
        return str(self.definition["name"])


@dataclass
class ToolBox:
    """The tools offered to the model, by name."""

    entries: dict[str, ToolEntry] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # tools left out, and why

    def add(self, entry: ToolEntry) -> None:
        if entry.name in self.entries:
            self.notices.append(
                f"tool {entry.name!r} of {entry.source} is named as one of {self.entries[entry.name].source}: left out"
            )
            return
        self.entries[entry.name] = entry

    def definitions_json(self) -> str | None:
        """OpenAI-shaped definitions for Generate.tools (None: no tools)."""
        if not self.entries:
            return None
        return json.dumps([{"type": "function", "function": e.definition} for e in self.entries.values()])


def bounded_result(text: str) -> str:
    """A result as the model gets it: at most MAX_RESULT_CHARS, NUL characters dropped."""
    text = text.replace("\x00", "")
    if len(text) > MAX_RESULT_CHARS:
        return text[:MAX_RESULT_CHARS] + f"\n[… cut: the result had {len(text)} characters]"
    return text


_RUNNERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llmtui-tool")


def run_call(entry: ToolEntry, call: ToolCall, timeout_s: float) -> tuple[str, bool]:
    """Run one allowed call: (result text, whether it failed). A call that runs past `timeout_s` is abandoned (MCP
    calls are cancelled by their server's client; built-in tools are bounded by their own limits)."""
    if entry.run is None:
        return f"{entry.name} cannot be run here", True
    try:
        arguments = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return "the arguments are not JSON", True
    future = _RUNNERS.submit(entry.run, arguments, timeout_s)
    try:
        return bounded_result(future.result(timeout=timeout_s + 1.0)), False
    except FutureTimeout:
        return f"{entry.name} ran longer than {timeout_s:g} s and was stopped", True
    except ToolError as error:
        return str(error), True
    except Exception as error:  # a tool's own failure is its result, not the end of the reply
        return one_line(f"{entry.name} failed: {type(error).__name__}: {error}"), True


MAX_ARGUMENTS_SHOWN = 2000


def arguments_text(call: ToolCall) -> str:
    """A call's arguments as indented JSON, control characters made visible, cut at MAX_ARGUMENTS_SHOWN."""
    try:
        text = json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)
    except ValueError:
        text = call.arguments
    if len(text) > MAX_ARGUMENTS_SHOWN:
        text = text[:MAX_ARGUMENTS_SHOWN] + f"\n… ({len(text)} characters)"
    return shown(text, multiline=True)
