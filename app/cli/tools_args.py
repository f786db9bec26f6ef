"""`run`'s tool options: --tools FILE.json, --mcp NAME, --builtin-tool, --allow-tool, --tool-choice, --max-tool-calls,
--tool-timeout; the tool box they make, and consent on a terminal (no prompt in a pipe: a call not allowed is refused
and said on stderr)."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from app.cli.session import CliError
from app.cli.types import read_text_file
from app.core import paths
from app.core.tools.box import DEFAULT_CALL_TIMEOUT_S, ToolBox, ToolEntry, ToolError
from app.core.tools.builtin import BUILTIN_NAMES, datetime_tool, read_file_tool
from app.core.tools.loop import DEFAULT_MAX_TOOL_CALLS, AllowList, CallRecord
from app.core.tools.mcp_servers import McpServers
from app.core.tools.tool_config import read_tool_settings
from engine_ext.protocol import ToolCall
from engine_ext.tool_calls import TOOL_CHOICES, ToolsError, read_tools
from engine_ext.untrusted_text import one_line, shown


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if not 0 <= value <= 256:
        raise argparse.ArgumentTypeError("expected 0 to 256")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("expected more than 0 and at most 3600 seconds")
    return value


def add_tool_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("tools (the model calls them only with your consent)")
    group.add_argument(
        "--tools",
        dest="tools_file",
        metavar="FILE.json",
        help="tool definitions (OpenAI's shape); their calls are printed (--json: returned), not run",
    )
    group.add_argument(
        "--mcp", action="append", default=[], metavar="NAME", help="offer the tools of MCP server NAME (config.toml)"
    )
    group.add_argument(
        "--builtin-tool", action="append", default=[], choices=BUILTIN_NAMES, help="offer a built-in tool"
    )
    group.add_argument("--tool-folder", metavar="DIR", help="the folder read_file reads under (else tools.read_folder)")
    group.add_argument(
        "--allow-tool", action="append", default=[], metavar="NAME", help="let tool NAME run without asking"
    )
    group.add_argument("--tool-choice", choices=TOOL_CHOICES, default="auto", help="required: the reply is a call")
    group.add_argument(
        "--max-tool-calls", type=_positive_int, default=DEFAULT_MAX_TOOL_CALLS, help="calls per reply at most"
    )
    group.add_argument(
        "--tool-timeout", type=_seconds, default=DEFAULT_CALL_TIMEOUT_S, metavar="S", help="a call's time limit"
    )


def wants_tools(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "tools_file", None) or getattr(args, "mcp", None) or getattr(args, "builtin_tool", None))


def tool_box(args: argparse.Namespace, stack: ExitStack) -> tuple[ToolBox, AllowList]:
    """The tools `args` ask for and the consent for them; MCP servers are stopped when `stack` closes."""
    try:
        settings = read_tool_settings()
        box = ToolBox()
        if args.tools_file:
            path = Path(args.tools_file).expanduser()
            for tool in read_tools(read_text_file(path)):
                box.add(ToolEntry(tool["function"], path.name, None))
        # Built-in tools only as --builtin-tool names them: config.toml's tools.builtin is the app's choice
        # ("built-in" in the conversation settings), never added to `run --mcp NAME` (issue 49, 13).
        for name in dict.fromkeys(args.builtin_tool):
            if name == "datetime":
                box.add(datetime_tool())
            else:
                folder = args.tool_folder or settings.read_folder
                if not folder:
                    raise CliError("read_file reads under a folder: give --tool-folder DIR (or tools.read_folder)")
                box.add(read_file_tool(Path(folder)))
        if args.mcp:
            servers = McpServers(settings.servers, paths.log_dir())
            stack.callback(servers.close)
            for name in dict.fromkeys(args.mcp):
                for entry in servers.tools(name):
                    box.add(entry)
                box.notices.extend(servers.notices(name))
    except (ToolError, ToolsError, OSError, ValueError) as error:
        raise CliError(str(error)) from None
    for notice in box.notices:
        print(f"note: {notice}", file=sys.stderr)
    ask = _ask_on_terminal if sys.stdin.isatty() and sys.stderr.isatty() else None
    return box, AllowList(set(args.allow_tool) | set(settings.always_allow), ask)


def _ask_on_terminal(call: ToolCall, entry: ToolEntry) -> bool:
    sys.stderr.write(f"\nallow {describe_call(call, entry.source)}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline(64)
    return answer.strip().lower() in ("y", "yes")


def describe_call(call: ToolCall, source: str) -> str:
    """`name(arguments) from source` in one line, its text made harmless."""
    return one_line(f"{call.name}({call.arguments}) from {source or 'nowhere'}", 240)


def say_record(record: CallRecord) -> None:
    """A call and its outcome on stderr (stdout carries only the reply)."""
    head = describe_call(record.call, record.source)
    if not record.allowed:
        how = "not offered" if not record.source else f"not allowed (--allow-tool {record.call.name} allows it)"
        print(f"llmtui: refused tool call {head}: {how}", file=sys.stderr)
        return
    outcome = "failed" if record.failed else f"{len(record.result)} characters"
    print(f"tool: {head} → {outcome} in {record.seconds:.1f} s", file=sys.stderr)
    if record.failed:
        print(f"  {one_line(record.result, 200)}", file=sys.stderr)


def pending_json(calls: tuple[ToolCall, ...]) -> list[dict[str, object]]:
    return [{"id": c.id, "name": c.name, "arguments": json.loads(c.arguments)} for c in calls]


def say_pending(calls: tuple[ToolCall, ...]) -> None:
    for call in calls:
        print(f"tool call (not run): {shown(describe_call(call, 'the reply'))}", file=sys.stderr)
