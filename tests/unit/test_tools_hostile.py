"""Hostile input to the tools (app/core/tools/): read_file under a folder that another thread keeps swapping for a link
never reads outside it; MCP servers (tests/mcp_test_server.py's raw modes, and an HTTP server written here) that
ignore TERM, flood stderr, list a tool with a bad name or 300,000 tools, or send an endless line or body are ended,
capped and bounded, each in one line; tools past the call grammar's budget are left out by name, the rest offered."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.core.tools.box import ToolError
from app.core.tools.builtin import read_file_tool, read_under
from app.core.tools.mcp_servers import McpServers
from app.core.tools.mcp_transport import MAX_LOG_BYTES
from app.core.tools.tool_config import McpServerConfig
from engine_ext.grammar import GrammarError
from engine_ext.tool_calls import HERMES, MAX_TOOLS, MISTRAL
from engine_ext.tool_grammar import tool_grammar
from engine_ext.tool_turn import offered_tools

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")
MEMORY_BOUND = 256 * 1024 * 1024  # what one hostile server may grow llmtui by (the message cap is 4 MiB)

RACE_SECONDS = 2.0


def test_read_file_never_leaves_its_folder_while_a_folder_is_swapped_for_a_link(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "note.txt").write_text("inside")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "note.txt").write_text("outside")
    parked = tmp_path / "parked"
    stop = threading.Event()
    swaps = 0

    def swap() -> None:  # the folder `sub`, then a link named `sub` to the secret folder, and back, until stopped
        nonlocal swaps
        while not stop.is_set():
            os.rename(root / "sub", parked)
            os.symlink(outside, root / "sub")
            os.unlink(root / "sub")
            os.rename(parked, root / "sub")
            swaps += 1

    tool = read_file_tool(root)
    assert tool.run is not None
    swapper = threading.Thread(target=swap, daemon=True)
    counts = {"inside": 0, "refused": 0}
    swapper.start()
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline:
            try:
                text = tool.run({"path": "sub/note.txt"}, 1.0)
            except ToolError:
                counts["refused"] += 1
                continue
            assert text == "inside", "read_file read a file outside its folder"
            counts["inside"] += 1
    finally:
        stop.set()
        swapper.join(timeout=10)
    assert not swapper.is_alive() and swaps > 10
    assert counts["inside"] > 0, counts


def test_read_file_refuses_links_dotdot_and_absolute_paths_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (root / "inner").symlink_to(root / "sub")  # even a link that stays inside is not followed
    (root / "dangling").symlink_to(tmp_path / "none")
    resolved = root.resolve()
    assert read_under(resolved, "./sub//a.txt") == "hello"
    for relative, words in [
        ("inner/a.txt", r"goes through a link \(inner\)"),
        ("dangling", r"goes through a link \(dangling\)"),
        ("sub/../sub/a.txt", r"\.\. leaves it"),
        ("/etc/passwd", "outside the folder"),
        ("sub/a.txt/x", "a.txt is not a folder"),
        (".", "not a regular file"),
    ]:
        with pytest.raises(ToolError, match=words) as refused:
            read_under(resolved, relative)
        assert "\n" not in str(refused.value)


def test_a_folder_replaced_after_read_file_was_set_up_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_text("hello")
    tool = read_file_tool(root)
    assert tool.run is not None and tool.run({"path": "a.txt"}, 1.0) == "hello"
    root.rename(tmp_path / "old")
    root.mkdir()
    (root / "a.txt").write_text("another")
    with pytest.raises(ToolError, match="was replaced since read_file was set up"):
        tool.run({"path": "a.txt"}, 1.0)


def test_without_dir_fd_the_file_opened_must_be_the_one_found_under_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.tools.builtin as builtin

    monkeypatch.setattr(builtin, "_WALKS_BY_FD", False)
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("secret")
    (root / "out").symlink_to(tmp_path / "secret.txt")
    resolved = root.resolve()
    assert read_under(resolved, "sub/a.txt") == "hello"
    with pytest.raises(ToolError, match="outside the folder"):
        read_under(resolved, "out")


# ----- MCP servers --------------------------------------------------------------------------------------------------


def _servers(tmp_path: Path, *configs: McpServerConfig) -> McpServers:
    return McpServers({config.name: config for config in configs}, tmp_path / "logs")


def _raw(name: str, *args: str, start_timeout_s: float = 20.0) -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(SERVER, *args), start_timeout_s=start_timeout_s)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_growth(action: Callable[[], object]) -> int:
    """How far this process's RSS rose above where it was while `action` ran (sampled every 5 ms)."""
    start, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join(timeout=5)
    return max(peak[0], _rss()) - start


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_server_that_ignores_term_is_ended_with_its_child_after_a_start_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    hub = _servers(tmp_path, _raw("stubborn", "raw_stubborn", str(pid_file), start_timeout_s=3.0))
    try:
        with pytest.raises(ToolError, match="'stubborn' did not start: .* took longer than 3 s"):
            hub.tools("stubborn")
        hub.close()  # as `run` does on its way out, right after the failure
        pids = [int(pid) for pid in pid_file.read_text().split()]
        deadline = time.monotonic() + 5
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, pids)), "the server or its child outlived the start timeout"
    finally:
        hub.close()


def test_a_servers_stderr_log_is_capped_with_one_line(tmp_path: Path) -> None:
    hub = _servers(tmp_path, _raw("noisy", "raw_stderr"))
    try:
        assert [tool.name for tool in hub.tools("noisy")] == ["tool_0", "tool_1"]
    finally:
        hub.close()
    log = (tmp_path / "logs" / "mcp-noisy.log").read_bytes()
    assert MAX_LOG_BYTES <= len(log) < MAX_LOG_BYTES + 200
    assert log.endswith(f"[… cut: the server's stderr passed {MAX_LOG_BYTES} bytes; the rest is dropped]\n".encode())


def test_a_tool_with_a_bad_name_is_left_out_in_one_line_and_the_others_are_offered(tmp_path: Path) -> None:
    hub = _servers(tmp_path, _raw("odd", "raw_tools", "2"), _raw("many", "raw_tools", "200"))
    try:
        assert [tool.name for tool in hub.tools("odd")] == ["tool_0", "tool_1"]
        (notice,) = hub.notices("odd")
        assert "'odd': a tool is left out: bad name!: tool 1 has no valid name" in notice and "\n" not in notice
        assert hub.call("odd", "tool_1", {}, 10.0) == "done"
        assert len(hub.tools("many")) == MAX_TOOLS - 1  # the first MAX_TOOLS, less the bad name
        assert f"lists more than {MAX_TOOLS} tools: the first {MAX_TOOLS} are offered" in hub.notices("many")[0]
    finally:
        hub.close()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("raw_tools", "300000"), "a message of more than 4 MiB"),
        (("raw_endless",), "a message of more than 4 MiB"),
    ],
)
def test_a_server_that_sends_too_much_is_one_line_and_bounded_in_memory(
    tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    hub = _servers(tmp_path, _raw("big", *args))
    try:
        started = time.monotonic()

        def start() -> None:
            with pytest.raises(ToolError, match=f"'big' did not start: .*{words}"):
                hub.tools("big")

        assert _peak_growth(start) < MEMORY_BOUND
        assert time.monotonic() - started < 15
    finally:
        hub.close()


class _EndlessJson(BaseHTTPRequestHandler):
    """Answers every POST with an endless application/json body (chunked), until the client goes."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b'{"a": "' + b"x" * 65536
        try:
            for _ in range(100_000):  # 6 GiB at most
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endless_json() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessJson)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_http_server_with_an_endless_json_body_is_one_line_and_bounded_in_memory(
    tmp_path: Path, endless_json: str
) -> None:
    hub = _servers(tmp_path, McpServerConfig("endless", url=endless_json, start_timeout_s=20.0))
    try:
        started = time.monotonic()

        def start() -> None:
            with pytest.raises(ToolError, match="'endless' did not start: .*the response body passed 4 MiB"):
                hub.tools("endless")

        assert _peak_growth(start) < MEMORY_BOUND
        assert time.monotonic() - started < 15
    finally:
        hub.close()


# ----- the call grammar's budget ------------------------------------------------------------------------------------


def test_tools_past_the_call_grammars_budget_are_left_out_by_name_and_the_rest_offered() -> None:
    big = {"type": "string", "description": "x" * 280}
    parameters = {"type": "object", "properties": {f"p{j}": big for j in range(10)}, "required": ["p0"]}
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": parameters}} for i in range(30)]
    with pytest.raises(GrammarError, match="at most 65536"):  # all thirty: past the budget (before: no tools at all)
        tool_grammar(tools, HERMES, required=False)
    offered, notice = offered_tools(json.dumps(tools), "auto")
    assert 10 < len(offered) < 30 and [t["function"]["name"] for t in offered] == [f"t{i}" for i in range(len(offered))]
    left_out = ", ".join(f"t{i}" for i in range(len(offered), 30))
    assert notice == (
        f"{30 - len(offered)} of 30 tools left out, their calls past the grammar's 65536-character budget: {left_out}"
    )
    for fmt in (HERMES, MISTRAL, None):
        assert tool_grammar(offered, fmt, required=False).gbnf  # what is offered converts
    few, nothing_left_out = offered_tools(json.dumps(tools[:3]), "auto")
    assert len(few) == 3 and nothing_left_out == ""
