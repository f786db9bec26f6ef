"""MCP servers' tools, on the official SDK (`mcp`): each configured server is started on demand (a child process over
stdio, or streamable HTTP through httpx2), its tools listed with their descriptions, and each call made within its
time limit. A server that fails to start, hangs, crashes or answers garbage is one line (ToolError) and stopped
(a stdio server with its whole process group, even one that ignores TERM); the reply goes on. What a server sends is
bounded before it is parsed (mcp_transport: bytes per message, JSON values, tools), and a tool the model cannot be
offered (a bad name or schema, past MAX_TOOLS) is left out with one line (`notices`). The SDK is asynchronous: one
event loop in a daemon thread serves every server, and callers from any thread (the CLI, a TUI worker, the API
server) wait on it with a bound."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.core.tools.box import ToolEntry, ToolError, bounded_result
from app.core.tools.mcp_transport import MAX_MESSAGE_BYTES, MAX_MESSAGE_ITEMS, end_group, stdio_streams
from app.core.tools.tool_config import McpServerConfig
from engine_ext.private_files import private_dir
from engine_ext.tool_calls import MAX_TOOLS, ToolsError, read_tools
from engine_ext.untrusted_text import one_line, shown
from models_catalog.http_client import capped_async_client

T = TypeVar("T")
_CLOSE_TIMEOUT_S = 5.0
_HTTP_TIMEOUT_S, _HTTP_READ_TIMEOUT_S = 30.0, 300.0  # the SDK's own client's (a server may hold an event stream)


@dataclass
class _Running:
    session: Any  # mcp.ClientSession, used only on the loop's thread
    tools: list[ToolEntry]
    notices: list[str]  # tools left out, and why
    stop: asyncio.Event
    task: asyncio.Task[None]


def _describe(error: BaseException) -> str:
    if isinstance(error, ToolError):
        return str(error)
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _describe(error.exceptions[0])
    detail = str(error) or type(error).__name__
    return f"{type(error).__name__}: {detail}" if str(error) else detail


LOG_TAIL_BYTES = 4096
"""How much of a server's log is read for the last line it wrote, when it did not start."""


def _last_log_line(log: Path) -> str:
    """The last line with text in `log` (its last LOG_TAIL_BYTES), '' when there is none or it cannot be read."""
    try:
        with log.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - LOG_TAIL_BYTES))
            tail = file.read(LOG_TAIL_BYTES)
    except OSError:
        return ""
    lines = [line.strip() for line in tail.decode("utf-8", "replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")


class McpServers:
    """The configured MCP servers; `tools(name)` starts one (once) and lists its tools, `close()` stops them all."""

    def __init__(self, configs: dict[str, McpServerConfig], log_dir: Path) -> None:
        self.configs = configs
        self.log_dir = log_dir
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: dict[str, _Running] = {}
        self._groups: dict[str, int] = {}  # a stdio server's process group, from its start until it is ended
        self._lock = threading.Lock()

    # ----- the loop thread --------------------------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="llmtui-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            loop = self._loop
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            future.cancel()
            raise ToolError(f"{what} took longer than {timeout_s:g} s") from None

    # ----- servers ----------------------------------------------------------------------------------------------

    def tools(self, name: str) -> list[ToolEntry]:
        """The tools of server `name`, started if it is not running; ToolError (one line) when it cannot be."""
        config = self.configs.get(name)
        if config is None:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ToolError(f"no MCP server {name!r} in config.toml [mcp.servers] (configured: {known})")
        running = self._running.get(name)
        if running is not None and not running.task.done():
            return running.tools
        try:
            self._submit(self._start(config), config.start_timeout_s, f"starting MCP server {name!r}")
        except Exception as error:
            self._stop(name)
            raise ToolError(self._start_failure(config, _describe(error))) from None
        return self._running[name].tools

    def log_path(self, config: McpServerConfig) -> Path:
        """Where a stdio server's stderr goes (`mcp-NAME.log` in the log folder), kept from its last start."""
        return self.log_dir / f"mcp-{config.name}.log"

    def _start_failure(self, config: McpServerConfig, detail: str) -> str:
        """Why server `config` did not start, in one line: the error, and for a stdio server the last line its
        stderr wrote (a traceback's ModuleNotFoundError, say) and the log that keeps the rest (issue 49, 12)."""
        message = f"MCP server {config.name!r} did not start: {detail}"
        if config.url:
            return message
        log = self.log_path(config)
        last = _last_log_line(log)
        if last and last not in detail:
            message += f"; its stderr ends: {one_line(shown(last), 160)}"
        return f"{message} (log: {log})"

    def notices(self, name: str) -> list[str]:
        """The tools server `name` listed that are left out, and why (one line each; empty when it is not running)."""
        running = self._running.get(name)
        return list(running.notices) if running is not None else []

    async def _start(self, config: McpServerConfig) -> None:
        ready: asyncio.Future[_Running] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._serve(config, ready, stop))
        try:
            self._running[config.name] = await ready
        except asyncio.CancelledError:  # the start timed out: the serving task goes too
            task.cancel()
            raise

    async def _serve(self, config: McpServerConfig, ready: asyncio.Future[_Running], stop: asyncio.Event) -> None:
        """Open the transport and the session, list the tools, then hold them open until `stop` (in this one task:
        the SDK's context managers are left in the task that entered them)."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(config))
                session = await stack.enter_async_context(
                    ClientSession(streams[0], streams[1], read_timeout_seconds=config.call_timeout_s)
                )
                await session.initialize()
                listed = await session.list_tools()
                entries, notices = self._entries(config, listed.tools)
                current = asyncio.current_task()
                assert current is not None
                ready.set_result(_Running(session, entries, notices, stop, current))
                await stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else ToolError("stopped"))
            if not isinstance(error, Exception):
                raise

    def _transport(self, config: McpServerConfig) -> Any:
        if config.url:
            return self._http_transport(config)
        from mcp.client.stdio import get_default_environment

        # The server's stderr goes to its log file (capped), never to the terminal the TUI draws on.
        private_dir(self.log_dir)
        log = self.log_path(config)
        env = {**get_default_environment(), **config.env}

        def spawned(pid: int) -> None:
            self._groups[config.name] = pid

        return stdio_streams(config.command, list(config.args), env, log, spawned)

    @asynccontextmanager
    async def _http_transport(self, config: McpServerConfig) -> AsyncIterator[Any]:
        from mcp.client.streamable_http import streamable_http_client

        client = capped_async_client(
            config.url,
            config.headers,
            max_body_bytes=MAX_MESSAGE_BYTES,
            max_items=MAX_MESSAGE_ITEMS,
            timeout_s=_HTTP_TIMEOUT_S,
            read_timeout_s=_HTTP_READ_TIMEOUT_S,
        )
        async with (
            client,
            streamable_http_client(config.url, http_client=client, max_sse_event_size=MAX_MESSAGE_BYTES) as streams,
        ):
            yield streams

    def _entries(self, config: McpServerConfig, tools: list[Any]) -> tuple[list[ToolEntry], list[str]]:
        """The tools the model can be offered, and one line for each group left out."""
        entries: list[ToolEntry] = []
        notices: list[str] = []
        if len(tools) > MAX_TOOLS:
            notices.append(
                f"MCP server {config.name!r} lists more than {MAX_TOOLS} tools: the first {MAX_TOOLS} are offered"
            )
        for tool in tools[:MAX_TOOLS]:
            try:
                entries.append(self._entry(config, tool))
            except ToolsError as error:
                notices.append(f"MCP server {config.name!r}: a tool is left out: {error}")
        return entries, notices

    def _entry(self, config: McpServerConfig, tool: Any) -> ToolEntry:
        """A listed tool as an entry; ToolsError (one line) when the model could not be offered it."""
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object", "properties": {}}
        listed = {"name": str(tool.name), "description": str(tool.description or ""), "parameters": schema}
        try:
            definition = read_tools(json.dumps([listed]))[0]["function"]
        except ToolsError as error:
            raise ToolsError(f"{shown(one_line(str(tool.name), 80))}: {error}") from None
        server, tool_name = config.name, str(tool.name)

        def run(arguments: dict[str, Any], timeout_s: float) -> str:
            return self.call(server, tool_name, arguments, min(timeout_s, config.call_timeout_s))

        return ToolEntry(definition, f"mcp:{server}", run)

    def call(self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float) -> str:
        """Call `tool` on a running server: its result's text (cut at the result limit); ToolError when the server
        fails, hangs past `timeout_s` (it is then stopped) or says the call failed."""
        running = self._running.get(server)
        if running is None or running.task.done():
            raise ToolError(f"MCP server {server!r} is not running")
        try:
            result = self._submit(
                running.session.call_tool(tool, arguments), timeout_s, f"{tool} on MCP server {server!r}"
            )
        except ToolError:
            self._stop(server)
            raise
        except Exception as error:
            self._stop(server)
            raise ToolError(f"{tool} on MCP server {server!r} failed: {_describe(error)}") from None
        return self._text(result, server, tool)

    @staticmethod
    def _text(result: Any, server: str, tool: str) -> str:
        parts: list[str] = []
        for item in getattr(result, "content", None) or []:
            text = getattr(item, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')} left out]")
        text = bounded_result("\n".join(parts))
        if getattr(result, "is_error", False):
            raise ToolError(f"{tool} on MCP server {server!r} said: {one_line(text, 200)}")
        return text

    def _stop(self, name: str) -> None:
        try:
            self._stop_session(name)
        finally:
            pgid = self._groups.pop(name, None)
            if pgid is not None:  # whatever of the server's group outlived its session (or a loop that stopped)
                end_group(pgid)

    def _stop_session(self, name: str) -> None:
        running = self._running.pop(name, None)
        if running is None or self._loop is None:
            return
        loop = self._loop

        async def stop() -> None:
            running.stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(running.task), _CLOSE_TIMEOUT_S)
            except (TimeoutError, Exception):
                running.task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=_CLOSE_TIMEOUT_S + 2)
        except Exception:  # stopping is best effort: the daemon thread goes with the process
            pass

    def close(self) -> None:
        """Stop every server and the loop (idempotent)."""
        for name in list(self._running) + list(self._groups):
            self._stop(name)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=_CLOSE_TIMEOUT_S)
            self._loop = None
