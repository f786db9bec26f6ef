"""`llmtui run` with tools, as a user runs it (a subprocess; stdin not a terminal): a tiny model with Qwen 2.5's
template calls the MCP test server's tool (tool choice "required"), the call runs only with --allow-tool, its result
goes back to the model, and without consent the call is refused and said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import write_tiny_model
from tests.tool_templates import QWEN25_TEMPLATE

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "mcp_test_server.py"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        "llama", tmp_path_factory.mktemp("tools-cli") / "qwen-tools.gguf", chat_template=QWEN25_TEMPLATE
    )


def _run(model: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "config.toml").write_text(
        f"[mcp.servers.weather]\ncommand = {json.dumps(sys.executable)}\n"
        f'args = [{json.dumps(str(SERVER))}, "weather"]\n'
    )
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path / "data"), LLMTUI_CONFIG_DIR=str(config))
    args = ["run", "-m", str(model), "-p", "Weather in Paris?", "--temp", "0", "-n", "200", "-t", "2", "-c", "2048"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            *args,
            "--mcp",
            "weather",
            "--tool-choice",
            "required",
            "--max-tool-calls",
            "1",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_allowed_call_runs_and_its_result_goes_back(model: Path, tmp_path: Path) -> None:
    result = _run(model, tmp_path, "--allow-tool", "get_weather", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    (made,) = out["calls_made"]
    assert made["source"] == "mcp:weather" and made["allowed"] and not made["failed"]
    assert made["name"] == "get_weather" and made["result"].startswith("sunny, 24 C in ")
    assert "<tool_call>" not in out["text"]


def test_a_call_not_allowed_is_refused_and_said(model: Path, tmp_path: Path) -> None:
    result = _run(model, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "llmtui: refused tool call get_weather(" in result.stderr
    assert "not allowed (--allow-tool get_weather allows it)" in result.stderr
    assert "<tool_call>" not in result.stdout


def test_an_unknown_server_is_one_line(model: Path, tmp_path: Path) -> None:
    result = _run(model, tmp_path, "--mcp", "nowhere")
    assert result.returncode != 0 and "no MCP server 'nowhere' in config.toml" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_template_without_tools_calls_in_the_generic_format(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    result = _run(tiny_models["llama"], tmp_path, "--allow-tool", "get_weather", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    (made,) = out["calls_made"]
    assert made["name"] == "get_weather" and made["allowed"] and made["result"].startswith("sunny, 24 C in ")
    assert any("generic JSON format" in notice for notice in out["notices"]), out["notices"]
    assert '"tool_call"' not in out["text"]


HUGE_STRING = {"type": "string", "maxLength": 10**9}  # issue 42: 23.5 GB before the converter's counts were bounded


def _run_plain(model: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path / "data"), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    args = ["run", "-m", str(model), "-p", "Weather in Paris?", "--temp", "0", "-n", "8", "-t", "2", *extra]
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_schema_past_the_bounds_is_refused_in_one_line(model: Path, tmp_path: Path) -> None:
    """--json-schema reaches the bounded conversion: a count past its bounds is refused in one line."""
    result = _run_plain(model, tmp_path, "--json-schema", json.dumps(HUGE_STRING))
    assert result.returncode != 0
    assert "1000000000 repetitions" in result.stderr and "at most 100000" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_tool_count_past_the_bounds_is_left_to_the_reply_limit(model: Path, tmp_path: Path) -> None:
    """A tool's parameters (--tools) as coding agents send them (Claude Code's Workflow tool: a string of up to
    524,288 characters): an upper count past the converter's bounds is left out of the calls' grammar, so the
    string is bounded by the reply's token limit instead of refused (engine_ext.tool_grammar.countable); nothing
    grows with the count."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"city": HUGE_STRING}, "required": ["city"]},
            },
        }
    ]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    result = _run_plain(model, tmp_path, "--tools", str(path), "--tool-choice", "required")
    assert result.returncode == 0, result.stderr
    assert "repetitions" not in result.stderr, result.stderr
