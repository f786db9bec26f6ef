"""MCP servers' tools through the official SDK (app/core/tools/mcp_servers.py), against a stdio server written with the
SDK in tests/mcp_test_server.py: tools listed with their descriptions, calls answered; and a server that starts slowly,
crashes mid-call, hangs, sends garbage, fails or sends a huge result is one line, bounded in time, and the others go on.
Every wait is bounded by the server's configured timeouts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.tools.box import MAX_RESULT_CHARS, ToolError
from app.core.tools.mcp_servers import McpServers
from app.core.tools.tool_config import McpServerConfig, read_tool_settings, remember_always_allow

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_test_server.py")


def _config(name: str, mode: str = "well", **limits: float) -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(SERVER, mode), **limits)  # type: ignore[arg-type]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[McpServers]:
    configs = {
        "weather": _config("weather", call_timeout_s=20.0),
        "slow": _config("slow", "slow_start", start_timeout_s=3.0),
        "garbage": _config("garbage", "garbage", start_timeout_s=20.0),
        "short": _config("short", call_timeout_s=2.0),
        "missing": McpServerConfig("missing", command=str(tmp_path / "no-such-server")),
    }
    hub = McpServers(configs, tmp_path / "logs")
    try:
        yield hub
    finally:
        hub.close()


def test_tools_are_listed_with_descriptions_and_called(servers: McpServers) -> None:
    tools = {t.name: t for t in servers.tools("weather")}
    assert set(tools) == {"get_weather", "crash", "huge", "hang", "fail"}
    weather = tools["get_weather"]
    assert weather.source == "mcp:weather" and weather.definition["description"] == "The weather in a city."
    assert weather.definition["parameters"]["required"] == ["city"]
    assert weather.run is not None and weather.run({"city": "Paris"}, 10.0) == "sunny, 24 C in Paris"
    assert servers.tools("weather") == list(tools.values())  # started once


def test_misbehaving_servers_are_one_line_each_and_the_others_go_on(servers: McpServers) -> None:
    started = time.monotonic()
    with pytest.raises(
        ToolError, match="MCP server 'slow' did not start: starting MCP server 'slow' took longer than 3 s"
    ):
        servers.tools("slow")
    assert time.monotonic() - started < 15
    with pytest.raises(ToolError, match="MCP server 'missing' did not start"):
        servers.tools("missing")
    with pytest.raises(ToolError, match="no MCP server 'nope' in config.toml"):
        servers.tools("nope")
    weather = {t.name: t for t in servers.tools("weather")}
    with pytest.raises(ToolError, match="crash on MCP server 'weather'"):
        servers.call("weather", "crash", {}, 20.0)
    # The crashed server was stopped; asked again, it starts again and answers.
    assert {t.name for t in servers.tools("weather")} == set(weather)
    assert servers.call("weather", "get_weather", {"city": "Oslo"}, 10.0) == "sunny, 24 C in Oslo"
    huge = servers.call("weather", "huge", {}, 20.0)
    assert len(huge) < MAX_RESULT_CHARS + 100 and huge.endswith("[… cut: the result had 2000000 characters]")
    with pytest.raises(ToolError, match="fail on MCP server 'weather' said: Error executing tool fail"):
        servers.call("weather", "fail", {}, 10.0)
    servers.tools("short")
    started = time.monotonic()
    with pytest.raises(ToolError, match="hang on MCP server 'short' took longer than 2 s"):
        servers.call("short", "hang", {}, 2.0)
    assert time.monotonic() - started < 12
    assert {t.name for t in servers.tools("garbage")} == set(weather)  # garbage lines before the protocol: skipped
    assert servers.call("weather", "get_weather", {"city": "Lima"}, 10.0) == "sunny, 24 C in Lima"


def test_servers_are_read_from_config_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("WEATHER_TOKEN", "s3cret")
    config.write_text(
        '[mcp.servers.weather]\ncommand = "python"\nargs = ["server.py"]\nenv = { KEY = "${WEATHER_TOKEN}" }\n'
        '[mcp.servers.remote]\nurl = "https://mcp.example/mcp"\n'
        'headers = { Authorization = "Bearer ${WEATHER_TOKEN}" }\n'
        'call_timeout_s = 5\n[tools]\nbuiltin = ["datetime"]\nalways_allow = ["get_weather"]\n'
    )
    settings = read_tool_settings(config)
    assert settings.servers["weather"].args == ("server.py",) and settings.servers["weather"].env == {"KEY": "s3cret"}
    assert settings.servers["remote"].headers == {"Authorization": "Bearer s3cret"}
    assert settings.servers["remote"].call_timeout_s == 5.0
    assert settings.builtin == ("datetime",) and settings.always_allow == ("get_weather",)
    for text, words in [
        ('[mcp.servers.a]\nargs = ["x"]\n', "needs command \\(stdio\\) or url"),
        ('[mcp.servers.a]\ncommand = "x"\nenv = { K = "${NOT_SET_ANYWHERE}" }\n', "NOT_SET_ANYWHERE"),
        ('[mcp.servers.a]\nurl = "ftp://x"\n', "http:// or https://"),
        ('[mcp.servers.a]\ncommand = "x"\ncall_timeout_s = -1\n', "seconds from 0 to 3600"),
        ("[mcp\n", "not valid TOML"),
    ]:
        config.write_text(text)
        with pytest.raises(ToolError, match=words):
            read_tool_settings(config)
    assert read_tool_settings(tmp_path / "absent.toml").servers == {}


def test_always_allowing_a_tool_is_remembered_with_the_files_comments(tmp_path: Path) -> None:
    config = tmp_path / "cfg" / "config.toml"
    remember_always_allow("get_weather", config)
    config.write_text('# mine\n[tools]\nbuiltin = ["datetime"]  # the clock\n' + config.read_text())
    config.write_text('# mine\n[tools]\nbuiltin = ["datetime"]  # the clock\nalways_allow = ["get_weather"]\n')
    remember_always_allow("read_file", config)
    remember_always_allow("read_file", config)
    text = config.read_text()
    assert text.startswith("# mine") and "# the clock" in text
    assert read_tool_settings(config).always_allow == ("get_weather", "read_file")
    assert (config.stat().st_mode & 0o777) == 0o600


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_server_over_streamable_http_with_headers_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port), "t0ken"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the server listens (bounded)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP MCP server did not listen within 30 s"
                time.sleep(0.1)
        config = tmp_path / "config.toml"
        config.write_text(
            f'[mcp.servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\n'
            'headers = { Authorization = "Bearer ${TOKEN}" }\n'
            f'[mcp.servers.nokey]\nurl = "http://127.0.0.1:{port}/mcp"\nstart_timeout_s = 10\n'
        )
        monkeypatch.setenv("TOKEN", "t0ken")
        hub = McpServers(read_tool_settings(config).servers, tmp_path / "logs")
        try:
            weather = {t.name: t for t in hub.tools("web")}["get_weather"]
            assert weather.run is not None and weather.run({"city": "Lima"}, 10.0) == "sunny, 24 C in Lima"
            with pytest.raises(ToolError, match="MCP server 'nokey' did not start"):
                hub.tools("nokey")  # refused without the header
        finally:
            hub.close()
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_server_that_fails_to_start_names_its_log_and_the_last_line_it_wrote(tmp_path: Path) -> None:
    """Issue 49 item 12: a server that exited at start (a ModuleNotFoundError in its traceback) said only that the
    connection closed; the cause was in mcp-NAME.log, which nothing named."""
    broken = McpServerConfig(
        "broken", command=sys.executable, args=("-c", "import no_such_module_for_llmtui"), start_timeout_s=20.0
    )
    hub = McpServers({"broken": broken}, tmp_path / "logs")
    try:
        with pytest.raises(ToolError) as refused:
            hub.tools("broken")
    finally:
        hub.close()
    message = str(refused.value)
    log = tmp_path / "logs" / "mcp-broken.log"
    assert message.startswith("MCP server 'broken' did not start: ") and "\n" not in message
    assert "its stderr ends: ModuleNotFoundError: No module named 'no_such_module_for_llmtui'" in message
    assert message.endswith(f"(log: {log})") and "Traceback" in log.read_text()


def test_run_mcp_offers_the_servers_tools_and_built_ins_only_as_named(tmp_path: Path) -> None:
    """Issue 49 item 13: `run --mcp NAME` offered config.toml's tools.builtin too, though built-in tools are off
    unless named (--builtin-tool); tools.builtin is what the app's "built-in" choice offers."""
    import argparse
    from contextlib import ExitStack

    from app.cli.tools_args import tool_box
    from app.core.generation.tools import TOOLS_BUILTIN, ChatTools, tool_choices
    from app.core.paths import config_path

    notes = tmp_path / "notes"
    notes.mkdir()
    config = config_path()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[mcp.servers.weather]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(SERVER)}, "well"]\n'
        f'[tools]\nbuiltin = ["datetime"]\nread_folder = {json.dumps(str(notes))}\n'
    )

    def offered(*flags: str) -> set[str]:
        args = argparse.Namespace(tools_file=None, mcp=["weather"], builtin_tool=list(flags), tool_folder=None)
        args.allow_tool = []
        with ExitStack() as stack:
            box, _ = tool_box(args, stack)
            return set(box.entries)

    weather = {"get_weather", "crash", "huge", "hang", "fail"}
    assert offered() == weather
    assert offered("datetime") == weather | {"current_datetime"}
    # The app's built-in choice: tools.builtin names datetime only, so no read_file though the folder is set.
    chat_tools = ChatTools(config, tmp_path / "logs")
    try:
        made = chat_tools.prepare(1, TOOLS_BUILTIN)
    finally:
        chat_tools.close()
    assert made is not None and set(made.box.entries) == {"current_datetime"}
    assert ("built-in (current_datetime)", TOOLS_BUILTIN) in tool_choices(read_tool_settings(config))
