"""An MCP server for the tests, written with the official SDK; its first argument picks how it behaves: well (the
default), weather (get_weather alone), slow_start (sleeps before serving), garbage (writes non-protocol lines to
stdout first), http PORT TOKEN (streamable HTTP, only for that bearer token); and per tool: crash (the process exits
mid-call), huge (a 2 MB result), hang (never answers), fail (an error result). Hostile servers speak JSON-RPC by
hand (no SDK, to send what the SDK would not): raw_tools COUNT (COUNT tools and one named "bad name!"), raw_endless
(an endless line), raw_stubborn PIDFILE (ignores TERM, as does its child; writes both pids, never answers),
raw_stderr (floods stderr, then serves)."""

from __future__ import annotations

import os
import sys
import time
from typing import Literal

mode = sys.argv[1] if len(sys.argv) > 1 else "well"


def _raw(mode: str) -> None:
    """A JSON-RPC server by hand, for the hostile modes."""
    import json
    import signal
    import subprocess

    if mode == "raw_stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
        )
        with open(sys.argv[2], "w") as pids:
            pids.write(f"{os.getpid()} {child.pid}\n")
        time.sleep(600)
    if mode == "raw_stderr":
        chunk = "e" * 65536 + "\n"
        for _ in range(200):  # 12.5 MiB
            sys.stderr.write(chunk)
        sys.stderr.flush()
    if mode == "raw_endless":
        sys.stdin.readline()
        while True:
            sys.stdout.write("x" * 65536)
            sys.stdout.flush()
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue
        if request["method"] == "initialize":
            result: dict[str, object] = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
        elif request["method"] == "tools/list":
            schema = {"type": "object", "properties": {}}
            tools = [{"name": "bad name!", "inputSchema": schema}]
            tools += [{"name": f"tool_{i}", "inputSchema": schema} for i in range(count)]
            result = {"tools": tools}
        else:
            result = {"content": [{"type": "text", "text": "done"}]}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}) + "\n")
        sys.stdout.flush()
    sys.exit(0)


if mode.startswith("raw_"):
    _raw(mode)

from mcp.server.mcpserver import MCPServer  # noqa: E402 (the hostile modes above speak without the SDK)

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


def serve_http(port: int, token: str) -> None:
    """Streamable HTTP on 127.0.0.1:`port`, answering only requests that carry `Authorization: Bearer <token>`."""
    import uvicorn
    from starlette.responses import PlainTextResponse

    inner = server.streamable_http_app()
    wanted = f"Bearer {token}".encode()

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != wanted:
            await PlainTextResponse("no", status_code=401)(scope, receive, send)
            return
        await inner(scope, receive, send)  # lifespan too: the SDK's session manager starts there

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if mode == "http":
        serve_http(int(sys.argv[2]), sys.argv[3])
    else:
        server.run()
