"""A stdio MCP server for the tests, written with the official SDK; its first argument picks how it behaves: well
(the default), weather (get_weather alone), slow_start (sleeps before serving), garbage (writes non-protocol lines
to stdout first); and per tool: crash (the process exits mid-call), huge (a 2 MB result), hang (never answers),
fail (an error result)."""

from __future__ import annotations

import os
import sys
import time
from typing import Literal

from mcp.server.mcpserver import MCPServer

mode = sys.argv[1] if len(sys.argv) > 1 else "well"
if mode == "slow_start":
    time.sleep(30)
if mode == "garbage":
    sys.stdout.write('this is not JSON-RPC\n{"jsonrpc": 7}\n\x00\x01\n')
    sys.stdout.flush()

server = MCPServer("test-weather")


@server.tool()
def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
    """The weather in a city."""
    return f"sunny, 24 C in {city}"


if mode != "weather":  # "weather": only get_weather (a model that picks a tool picks that one)

    @server.tool()
    def crash() -> str:
        """Ends the server's process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def huge() -> str:
        """A result of two million characters."""
        return "x" * 2_000_000

    @server.tool()
    def hang() -> str:
        """Never answers."""
        time.sleep(3600)
        return ""

    @server.tool()
    def fail() -> str:
        """Raises: the result says the call failed."""
        raise ValueError("the weather service is down")


if __name__ == "__main__":
    server.run()
