"""`llmtui launch claude|codex|opencode` with stand-in agents on PATH: each records the environment and arguments it
was started with, makes one real request the way its agent does (Claude Code: /v1/messages; Codex: its `-c`
provider's /responses; OpenCode: its inline config's provider's /chat/completions) to a tiny model, and exits 3.
launch starts the server when none answers on the port and stops it after; it uses one that does and leaves it
running; a missing agent and a context too small are one line each, before any server starts. `--save` writes the
agent's own config before running it (a malformed one refused before any server); `--save-only` starts nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.launch_save import CLIENT_HOMES
from tests.engine.test_serve_limits import hermetic_env
from tests.rpc_server import ROOT
from tests.serve_process import free_port, running_serve

AGENT = r'''#!{python}
"""A stand-in for a coding agent: what it was started with, and one request as the agent makes it."""
import json, os, sys, tomllib, urllib.request

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
env = {{k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC_", "CLAUDE_", "OPENCODE_", "LLMTUI_API"))}}
headers = {{"Content-Type": "application/json"}}
if name == "claude":
    url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
    headers["Authorization"] = "Bearer " + os.environ["ANTHROPIC_AUTH_TOKEN"]
    hi = [{{"role": "user", "content": "hi"}}]
    body = {{"model": os.environ["ANTHROPIC_MODEL"], "max_tokens": 4, "messages": hi}}
elif name == "codex":
    config = {{}}
    for flag, value in zip(args[::2], args[1::2]):
        if flag == "-c":
            key, text = value.split("=", 1)
            config[key] = tomllib.loads("v = " + text)["v"]
    provider = config["model_providers." + config["model_provider"]]
    url = provider["base_url"] + "/responses"
    if "env_key" in provider:
        headers["Authorization"] = "Bearer " + os.environ[provider["env_key"]]
    body = {{"model": config["model"], "input": "hi", "max_output_tokens": 4}}
else:
    config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
    provider_name, model = config["model"].split("/", 1)
    options = config["provider"][provider_name]["options"]
    url = options["baseURL"] + "/chat/completions"
    if "apiKey" in options:
        headers["Authorization"] = "Bearer " + options["apiKey"]
    body = {{"model": model, "max_tokens": 4, "messages": [{{"role": "user", "content": "hi"}}]}}
request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
try:
    with urllib.request.urlopen(request, timeout=120) as answer:
        status, reply = answer.status, json.load(answer)
except urllib.error.HTTPError as error:
    status, reply = error.code, error.read().decode()
with open(os.environ["AGENT_RECORD"], "w") as record:
    json.dump({{"name": name, "args": args, "env": env, "url": url, "status": status, "reply": reply}}, record)
sys.exit(3)
'''


def agents_bin(folder: Path, names: tuple[str, ...] = ("claude", "codex", "opencode")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        script = folder / name
        script.write_text(AGENT.format(python=sys.executable))
        script.chmod(0o755)
    return folder


def launch(
    root: Path, *args: str, agents: Path | None = None, **extra: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`llmtui launch ARGS` with the stand-in agents first on PATH (none with `agents` None), its temp folders in
    root/tmp; what it printed, and what the agent recorded ({} if it did not run)."""
    record = root / "record.json"
    record.unlink(missing_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    path = f"{agents}:/usr/bin:/bin" if agents is not None else "/usr/bin:/bin"
    env = hermetic_env(root, PATH=path, AGENT_RECORD=str(record), TMPDIR=str(root / "tmp"), **extra)
    env.pop("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", None)
    for name in CLIENT_HOMES:  # the runner's own would lead --save out of the test's HOME
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "app", "launch", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, (json.loads(record.read_text()) if record.exists() else {})


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_claude_gets_a_server_of_its_own_that_stops_when_it_exits(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    model, port = tiny_models["llama"], free_port()
    done, record = launch(
        tmp_path, "claude", "-m", str(model), "-c", "32768", "--port", str(port), "--", "-p", "say hi",
        agents=agents_bin(tmp_path / "bin"),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the agent's own exit status
    assert record["status"] == 200, record["reply"]
    assert record["reply"]["type"] == "message" and record["reply"]["model"] == model.name
    assert record["args"] == ["-p", "say hi"]
    env = record["env"]
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}" and env["ANTHROPIC_API_KEY"] == ""
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
        assert env[name] == model.name
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert f"starting llmtui serve with {model.name} on port {port} (context 32768" in done.stderr
    assert "past the 4096 tokens" in done.stderr  # -c beyond the trained context: said, not refused
    assert not listening(port)  # the server launch started is stopped
    assert list((tmp_path / "tmp").iterdir()) == []  # its temp folder (the server's log) is gone
    assert not (tmp_path / "home" / ".claude").exists()


@pytest.fixture(scope="module")
def shared_server(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    root = tmp_path_factory.mktemp("launch-shared")
    port = free_port()
    args = ["-m", str(tiny_models["llama"]), "-c", "16384", "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY"]
    with running_serve(args, hermetic_env(root, LAUNCH_TEST_KEY="sesame"), port):
        yield port, root


@pytest.mark.parametrize("client", ["codex", "opencode"])
def test_an_agent_uses_the_server_on_the_port_and_leaves_it_running(
    client: str, shared_server: tuple[int, Path], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    port, _ = shared_server
    model = tiny_models["llama"].name
    done, record = launch(
        tmp_path, client, "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY", "--", "run", "--x",
        agents=agents_bin(tmp_path / "bin"), LAUNCH_TEST_KEY="sesame",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert record["status"] == 200, record["reply"]  # the key went with the request
    assert f"using the server already on port {port} ({model})" in done.stderr
    assert record["args"][-2:] == ["run", "--x"]
    if client == "codex":
        assert record["url"] == f"http://127.0.0.1:{port}/v1/responses"
        assert record["reply"]["object"] == "response" and record["reply"]["model"] == model
        assert f'model="{model}"' in record["args"]
        assert "model_context_window=16384" in record["args"]  # the running server's /v1/models says its context
    else:
        assert record["url"] == f"http://127.0.0.1:{port}/v1/chat/completions"
        assert record["reply"]["object"] == "chat.completion"
        config = json.loads(record["env"]["OPENCODE_CONFIG_CONTENT"])
        assert config["model"] == config["small_model"] == f"llmtui/{model}"
    assert listening(port)  # not launch's to stop


def test_a_model_the_running_server_does_not_serve_is_one_line(shared_server: tuple[int, Path], tmp_path: Path) -> None:
    port, _ = shared_server
    done, record = launch(
        tmp_path, "codex", "-m", "other.gguf", "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY",
        agents=agents_bin(tmp_path / "bin"), LAUNCH_TEST_KEY="sesame",
    )  # fmt: skip
    assert done.returncode == 1 and record == {}
    assert done.stderr.strip().splitlines()[-1].startswith(f"llmtui: error: the server on port {port} serves ")
    assert "not other.gguf: stop it, or use another --port" in done.stderr


def test_a_running_server_with_too_small_a_context_is_one_line(shared_server: tuple[int, Path], tmp_path: Path) -> None:
    port, _ = shared_server  # 16,384 tokens: enough for Codex and OpenCode, not for Claude Code
    done, record = launch(
        tmp_path, "claude", "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY",
        agents=agents_bin(tmp_path / "bin"), LAUNCH_TEST_KEY="sesame",
    )  # fmt: skip
    assert done.returncode == 1 and record == {}  # the agent never ran
    assert done.stderr.strip().splitlines()[-1] == (
        "llmtui: error: Claude Code needs a context of at least 32768 tokens (its system prompt and tools take most "
        "of it); tiny-llama.gguf has 16384 (the server on the port serves it with): start that server with -c 32768 "
        "or more, or choose a model with a longer context"
    )


def test_a_missing_agent_is_one_line_with_how_to_install_it(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()
    done, _ = launch(tmp_path, "codex", "-m", str(tiny_models["llama"]), "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "llmtui: error: Codex is not installed (codex is not on PATH): install it with `npm install -g @openai/codex`"
    ]
    assert not listening(port)


def test_a_context_too_small_for_the_agent_is_one_line_before_any_server(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    port, model = free_port(), tiny_models["llama"]
    agents = agents_bin(tmp_path / "bin")
    done, record = launch(tmp_path, "claude", "-m", str(model), "--port", str(port), agents=agents)
    assert done.returncode == 1 and record == {}
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("llmtui: error: Claude Code needs a context of at least 32768 tokens")
    assert f"{model.name} has 4096 (it was trained with)" in line and "give -c N" in line
    done, _ = launch(tmp_path, "opencode", "-m", str(model), "-c", "1024", "--port", str(port), agents=agents)
    assert done.returncode == 1 and "has 1024 (-c gives it)" in done.stderr
    done, _ = launch(tmp_path, "codex", "--port", str(port), "--resume", agents=agents)
    assert done.returncode == 1 and "codex's own arguments go after --" in done.stderr
    assert not listening(port)


def test_save_only_writes_the_agents_config_and_starts_nothing(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    port, model = free_port(), tiny_models["llama"]
    done, record = launch(tmp_path, "codex", "-m", str(model), "-c", "20000", "--port", str(port), "--save-only")
    assert done.returncode == 0, done.stderr
    assert record == {} and not listening(port)
    codex = tmp_path / "home" / ".codex"
    config = tomllib.loads((codex / "config.toml").read_text())
    assert config["model_providers"]["llmtui"]["base_url"] == f"http://127.0.0.1:{port}/v1"
    assert tomllib.loads((codex / "llmtui.config.toml").read_text())["model"] == model.name
    assert f"wrote {codex / 'config.toml'} (new):" in done.stderr
    assert f"start the server first with `llmtui serve -m {model} -c 20000 --port {port}`" in done.stderr
    assert "`codex --profile llmtui` talks to llmtui serve" in done.stderr
    assert "note: Codex is not installed (codex is not on PATH)" in done.stderr  # said, not refused


def test_save_only_against_a_running_server_writes_its_context(shared_server: tuple[int, Path], tmp_path: Path) -> None:
    port, _ = shared_server
    done, _ = launch(tmp_path, "codex", "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY", "--save-only",
                     LAUNCH_TEST_KEY="sesame")  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = tomllib.loads((tmp_path / "home" / ".codex" / "llmtui.config.toml").read_text())
    assert profile["model_context_window"] == 16384  # the server's /v1/models says it (max_model_len)


def test_save_writes_the_agents_config_then_runs_it(shared_server: tuple[int, Path], tmp_path: Path) -> None:
    port, _ = shared_server
    done, record = launch(
        tmp_path, "opencode", "--port", str(port), "--api-key-env", "LAUNCH_TEST_KEY", "--save",
        agents=agents_bin(tmp_path / "bin"), LAUNCH_TEST_KEY="sesame",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert record["status"] == 200, record["reply"]  # the run itself as without --save
    saved = tmp_path / "home" / ".config" / "opencode" / "opencode.json"
    provider = json.loads(saved.read_text())["provider"]["llmtui"]
    assert provider["options"]["baseURL"] == f"http://127.0.0.1:{port}/v1"
    assert provider["options"]["apiKey"] == "{env:LAUNCH_TEST_KEY}" and "sesame" not in saved.read_text()
    assert f"wrote {saved} (new):" in done.stderr and f"to undo: rm {saved}" in done.stderr


def test_save_refuses_a_malformed_config_before_any_server(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    port, model = free_port(), tiny_models["llama"]
    settings = tmp_path / "home" / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"env": {"FOO": "bar"},}')
    done, record = launch(
        tmp_path, "claude", "-m", str(model), "-c", "32768", "--port", str(port), "--save",
        agents=agents_bin(tmp_path / "bin"),
    )  # fmt: skip
    assert done.returncode == 1 and record == {}
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"llmtui: error: {settings} is not valid JSON (") and "not changed" in line
    assert settings.read_text() == '{"env": {"FOO": "bar"},}'
    assert sorted(p.name for p in settings.parent.iterdir()) == ["settings.json"]  # no backup, no other file
    assert not listening(port)
