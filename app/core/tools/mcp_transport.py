"""The stdio transport of MCP servers, bounded (the SDK's `stdio_client` reads a line of any length and keeps the
server's stderr unbounded): the server starts in a session of its own (a process group) and the whole group is
ended, TERM then KILL after a short grace, however the transport ends; a message longer than MAX_MESSAGE_BYTES ends
the transport with one line; a tool list longer than MAX_TOOLS is cut before it becomes objects; the server's
stderr goes to its log, cut at MAX_LOG_BYTES with one line saying so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_ext.private_files import private_file
from engine_ext.tool_calls import MAX_TOOLS
from models_catalog.http_client import json_items

if TYPE_CHECKING:
    from mcp.shared.message import SessionMessage

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # one JSON-RPC message from a server, over stdio or HTTP
MAX_MESSAGE_ITEMS = 100_000  # JSON values in one message, counted before it is parsed (128 large tools: ~30,000)
MAX_LOG_BYTES = 4 * 1024 * 1024  # a server's stderr kept in mcp-NAME.log, per start
END_GRACE_S = 1.0  # after TERM, the group's time to exit before KILL (and the server's after its stdin closes)
_READ_CHUNK = 64 * 1024
_POLL_S = 0.01


class MessageTooLarge(Exception):
    """A server sent a message longer than MAX_MESSAGE_BYTES (the transport ends)."""


def message_too_large(limit: int) -> str:
    return f"the server sent a message of more than {limit // (1024 * 1024)} MiB (at most {limit} bytes)"


def too_many_items() -> str:
    return f"the server sent a message of more than {MAX_MESSAGE_ITEMS} JSON values"


def parse_message(line: bytes) -> SessionMessage | Exception:
    """One line from a server as a message, or the error as a value (the session logs it and goes on). A tool list
    is cut to MAX_TOOLS + 1 entries before it becomes objects (the caller says that more were left out); a message
    of more than MAX_MESSAGE_ITEMS values is MessageTooLarge, before it is parsed."""
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    if json_items(line) > MAX_MESSAGE_ITEMS:
        raise MessageTooLarge(too_many_items())
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as error:
        return ValueError(f"not JSON: {type(error).__name__}")
    result = data.get("result") if isinstance(data, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        assert isinstance(result, dict)
        result["tools"] = tools[: MAX_TOOLS + 1]
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_python(data, by_name=False))
    except (ValueError, RecursionError) as error:  # pydantic's ValidationError is a ValueError
        return ValueError(f"not a JSON-RPC message: {type(error).__name__}")


def end_group(pgid: int, grace_s: float = END_GRACE_S) -> None:
    """End the process group `pgid`: TERM, then KILL whatever is left after `grace_s` (blocking, bounded)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(_POLL_S)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _copy_log(stream: Any, log_path: Path) -> None:
    """The server's stderr into its log, at most MAX_LOG_BYTES, then one line; the rest is read and dropped (a
    server blocked on a full pipe would hang)."""
    import anyio

    written = 0
    with open(private_file(log_path), "wb") as log:
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            while True:
                chunk = await stream.receive(_READ_CHUNK)
                if written >= MAX_LOG_BYTES:
                    continue
                kept = chunk[: MAX_LOG_BYTES - written]
                log.write(kept)
                written += len(kept)
                if written >= MAX_LOG_BYTES:
                    log.write(
                        f"\n[… cut: the server's stderr passed {MAX_LOG_BYTES} bytes; the rest is dropped]\n".encode()
                    )
                log.flush()


@asynccontextmanager
async def stdio_streams(
    command: str, args: list[str], env: dict[str, str], log_path: Path, on_spawn: Callable[[int], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server (its own session) and give the session's (read, write) streams; `on_spawn(pid)` gets the
    process group's id at once, so that the caller can end the group even when this loop is gone."""
    import anyio
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(
        [command, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    on_spawn(process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async with read_writer:
            while True:
                try:
                    chunk = await process.stdout.receive(_READ_CHUNK)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                searched = len(buffer)
                buffer += chunk
                while (end := buffer.find(b"\n", searched)) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    searched = 0
                    if len(line) > MAX_MESSAGE_BYTES:
                        raise MessageTooLarge(message_too_large(MAX_MESSAGE_BYTES))
                    if line.strip():
                        try:
                            await read_writer.send(parse_message(line))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return
                if len(buffer) > MAX_MESSAGE_BYTES:
                    raise MessageTooLarge(message_too_large(MAX_MESSAGE_BYTES))

    async def write_stdin() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end rather than waiting on a dead server

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        tasks.start_soon(_copy_log, process.stderr, log_path)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _end(process)
            tasks.cancel_scope.cancel()


async def _end(process: Any) -> None:
    """Close the server's stdin, give it END_GRACE_S to exit, then end its whole group (bounded)."""
    import anyio

    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    with anyio.move_on_after(END_GRACE_S):
        while process.returncode is None:
            await anyio.sleep(_POLL_S)
    await anyio.to_thread.run_sync(end_group, process.pid)
    with anyio.move_on_after(END_GRACE_S), suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.aclose()
