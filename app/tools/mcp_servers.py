"""MCP servers' tools, on the official SDK (`mcp`): each configured server is started on demand (a child process over
stdio, or streamable HTTP through httpx2), its tools listed with their descriptions, and each call made within its
time limit. A server that fails to start, hangs, crashes or answers garbage is one line (ToolError) and stopped;
the reply goes on. The SDK is asynchronous: one event loop in a daemon thread serves every server, and callers from
any thread (the CLI, a TUI worker, the API server) wait on it with a bound."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from app.tools.box import ToolEntry, ToolError, bounded_result
from app.tools.settings import McpServerConfig
from engine_ext.tool_calls import MAX_TOOLS
from engine_ext.untrusted_text import one_line

T = TypeVar("T")
_CLOSE_TIMEOUT_S = 5.0


@dataclass
class _Running:
    session: Any  # mcp.ClientSession, used only on the loop's thread
    tools: list[ToolEntry]
    stop: asyncio.Event
    task: asyncio.Task[None]


def _describe(error: BaseException) -> str:
    if isinstance(error, ToolError):
        return str(error)
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _describe(error.exceptions[0])
    detail = str(error) or type(error).__name__
    return f"{type(error).__name__}: {detail}" if str(error) else detail


class McpServers:
    """The configured MCP servers; `tools(name)` starts one (once) and lists its tools, `close()` stops them all."""

    def __init__(self, configs: dict[str, McpServerConfig], log_dir: Path) -> None:
        self.configs = configs
        self.log_dir = log_dir
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: dict[str, _Running] = {}
        self._logs: list[IO[str]] = []
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
        except ToolError as error:
            self._stop(name)
            raise ToolError(f"MCP server {name!r} did not start: {error}") from None
        except Exception as error:
            self._stop(name)
            raise ToolError(f"MCP server {name!r} did not start: {_describe(error)}") from None
        return self._running[name].tools

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
                entries = [self._entry(config, tool) for tool in listed.tools[:MAX_TOOLS]]
                current = asyncio.current_task()
                assert current is not None
                ready.set_result(_Running(session, entries, stop, current))
                await stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else ToolError("stopped"))
            if not isinstance(error, Exception):
                raise

    def _transport(self, config: McpServerConfig) -> Any:
        if config.url:
            from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

            client = create_mcp_http_client(headers=config.headers)
            return streamable_http_client(config.url, http_client=client)
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        # The server's stderr goes to its log file, never to the terminal the TUI draws on.
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"mcp-{config.name}.log", "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._logs.append(log)
        env = {**get_default_environment(), **config.env}
        return stdio_client(StdioServerParameters(command=config.command, args=list(config.args), env=env), errlog=log)

    def _entry(self, config: McpServerConfig, tool: Any) -> ToolEntry:
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object", "properties": {}}
        definition = {"name": str(tool.name), "description": str(tool.description or ""), "parameters": schema}
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
        for name in list(self._running):
            self._stop(name)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=_CLOSE_TIMEOUT_S)
            self._loop = None
        for log in self._logs:
            log.close()
        self._logs.clear()
