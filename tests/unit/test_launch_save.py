"""`llmtui launch CLIENT --save`'s config writers (app/cli/launch_save.py), in the test's own HOME: each agent's file
made fresh (0600), merged into the user's keeping their other keys and comments (and its mode), a backup of the
previous one beside it, a file that does not parse refused untouched, the clients' own folder variables honoured,
a symlinked file written through its link, and a key named by its variable, never written."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from app.cli import launch_save
from app.cli.launch_clients import SLOW_MS, Endpoint
from app.cli.session import CliError

END = Endpoint("http://127.0.0.1:8080", "tiny.gguf", 32768)
MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL")


@pytest.fixture(autouse=True)
def no_client_homes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients' own folder variables, when the one running the tests has them set, would lead out of the test's
    HOME: left out."""
    for name in launch_save.CLIENT_HOMES:
        monkeypatch.delenv(name, raising=False)


def save(client: str, key_env: str = "") -> list[str]:
    return launch_save.save(client, END, key_env, os.environ)


def files(client: str) -> list[Path]:
    return launch_save.config_files(client, os.environ)


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.*.bak"))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_files_are_where_each_client_reads_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    assert files("claude") == [home / ".claude" / "settings.json"]
    assert files("codex") == [home / ".codex" / "config.toml", home / ".codex" / "llmtui.config.toml"]
    assert files("opencode") == [Path(os.environ["XDG_CONFIG_HOME"]) / "opencode" / "opencode.json"]
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert files("claude") == [tmp_path / "claude" / "settings.json"]
    assert files("codex") == [tmp_path / "codex" / "config.toml", tmp_path / "codex" / "llmtui.config.toml"]
    assert files("opencode") == [tmp_path / "xdg" / "opencode" / "opencode.json"]
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert files("opencode") == [home / ".config" / "opencode" / "opencode.json"]


@pytest.mark.parametrize("client", ["claude", "codex", "opencode"])
def test_each_clients_file_is_made_fresh_owner_only(client: str) -> None:
    lines = save(client)
    for path in files(client):
        assert mode(path) == 0o600 and backups(path) == []
        assert f"wrote {path} (new):" in lines and f"  to undo: rm {path}" in lines
    assert mode(files(client)[0].parent) == 0o700
    if client == "claude":
        settings = json.loads(files(client)[0].read_text())
        env = settings["env"]
        assert env["ANTHROPIC_BASE_URL"] == END.base and env["ANTHROPIC_AUTH_TOKEN"] == "llmtui"
        assert all(env[name] == "tiny.gguf" for name in MODEL_VARS)
        assert env["API_TIMEOUT_MS"] == str(SLOW_MS) and "apiKeyHelper" not in settings
        assert '  env.ANTHROPIC_BASE_URL = "http://127.0.0.1:8080"' in lines
    elif client == "codex":
        config, profile = (tomllib.loads(p.read_text()) for p in files(client))
        assert config == {
            "model_providers": {
                "llmtui": {
                    "name": "llmtui",
                    "base_url": f"{END.base}/v1",
                    "wire_api": "responses",
                    "stream_idle_timeout_ms": SLOW_MS,
                }
            }
        }
        assert profile == {"model_provider": "llmtui", "model": "tiny.gguf", "model_context_window": 32768}
    else:
        config = json.loads(files(client)[0].read_text())
        provider = config["provider"]["llmtui"]
        assert provider["npm"] == "@ai-sdk/openai-compatible"
        assert provider["options"] == {"baseURL": f"{END.base}/v1", "timeout": SLOW_MS}
        assert provider["models"]["tiny.gguf"]["limit"]["context"] == 32768
        assert "model" not in config  # the user's default model is not changed


def test_claude_settings_are_merged_keeping_the_users_keys_mode_and_a_backup() -> None:
    [path] = files("claude")
    path.parent.mkdir()
    before = json.dumps(
        {"model": "opus", "permissions": {"allow": ["Bash(ls)"]}, "env": {"FOO": "bar", "API_TIMEOUT_MS": "5"}}
    )
    path.write_text(before)
    path.chmod(0o644)
    lines = save("claude")
    after = json.loads(path.read_text())
    assert after["model"] == "opus" and after["permissions"] == {"allow": ["Bash(ls)"]}
    env = after["env"]
    assert env["FOO"] == "bar" and env["API_TIMEOUT_MS"] == "5"  # the user's own value kept
    assert env["ANTHROPIC_BASE_URL"] == END.base and env["CLAUDE_CODE_SUBAGENT_MODEL"] == "tiny.gguf"
    assert mode(path) == 0o644
    [backup] = backups(path)
    assert backup.read_text() == before
    assert f"wrote {path} (the previous one copied to {backup}):" in lines
    assert f"  to undo: cp -p {backup} {path}" in lines
    save("claude")  # a second save in the same second: a second backup, the first kept
    assert len(backups(path)) == 2 and backup.read_text() == before


CODEX_CONFIG = """\
# my Codex settings
model = "gpt-5" # the default
approval_policy = "on-request"

[model_providers.other]
name = "other" # keep me
base_url = "https://example.com/v1"

[tui]
notifications = true
"""


def test_codex_config_keeps_comments_tables_and_the_default_profile() -> None:
    config, profile = files("codex")
    config.parent.mkdir()
    config.write_text(CODEX_CONFIG)
    profile.write_text('# llmtui profile\nmodel_reasoning_effort = "low"\nmodel = "old.gguf"\n')
    save("codex")
    text = config.read_text()
    for line in CODEX_CONFIG.splitlines():
        assert line in text  # every line of the user's, comments included
    parsed = tomllib.loads(text)
    assert parsed["model"] == "gpt-5" and "profile" not in parsed and "profiles" not in parsed
    assert parsed["model_providers"]["other"]["name"] == "other"
    assert parsed["model_providers"]["llmtui"]["base_url"] == f"{END.base}/v1"
    assert tomllib.loads(profile.read_text()) == {
        "model_reasoning_effort": "low",
        "model": "tiny.gguf",
        "model_provider": "llmtui",
        "model_context_window": 32768,
    }
    assert profile.read_text().startswith("# llmtui profile\n")
    assert [b.read_text() for b in backups(config)] == [CODEX_CONFIG]
    assert len(backups(profile)) == 1


def test_codex_inline_providers_and_a_legacy_profile_table() -> None:
    config, _ = files("codex")
    config.parent.mkdir()
    config.write_text('model_providers = { other = { name = "o" } }\n\n[profiles.llmtui]\nmodel = "x"\n')
    lines = save("codex")
    parsed = tomllib.loads(config.read_text())
    assert set(parsed["model_providers"]) == {"other", "llmtui"}
    assert any("[profiles.llmtui] table makes Codex 0.134+ refuse --profile llmtui" in line for line in lines)


def test_opencode_config_is_merged_keeping_the_users_providers_and_model() -> None:
    [path] = files("opencode")
    path.parent.mkdir(parents=True)
    before = {
        "theme": "opencode",
        "model": "anthropic/claude-sonnet-4-5",
        "provider": {"anthropic": {"options": {"apiKey": "{env:ANTHROPIC_API_KEY}"}}, "llmtui": {"name": "old"}},
    }
    path.write_text(json.dumps(before))
    save("opencode")
    after = json.loads(path.read_text())
    assert after["theme"] == "opencode" and after["model"] == "anthropic/claude-sonnet-4-5"
    assert after["provider"]["anthropic"] == before["provider"]["anthropic"]
    assert after["provider"]["llmtui"]["name"] == "llmtui"  # the last save's entry replaced
    assert json.loads(backups(path)[0].read_text()) == before


@pytest.mark.parametrize(
    ("client", "which", "text"),
    [
        ("claude", 0, '{"env": {"A": 1},}'),
        ("claude", 0, '["not", "an", "object"]'),
        ("claude", 0, '{"env": "A=1"}'),
        ("codex", 0, 'model = "gpt-5"\n[tui\n'),
        ("codex", 1, "model = = 1\n"),
        ("codex", 0, 'model_providers = "none"\n'),
        ("opencode", 0, "{ // a comment\n}"),
        ("opencode", 0, '{"provider": []}'),
    ],
)
def test_a_file_that_does_not_parse_is_refused_untouched(client: str, which: int, text: str) -> None:
    paths = files(client)
    bad = paths[which]
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    with pytest.raises(CliError) as refused:
        save(client)
    message = str(refused.value)
    assert str(bad) in message and "not changed" in message and "\n" not in message
    assert bad.read_text() == text and backups(bad) == []
    assert [p for p in paths if p.exists()] == [bad]  # nothing else written either
    with pytest.raises(CliError) as early:
        launch_save.check(client, os.environ)  # what launch --save says before it starts a server
    assert str(early.value) == message and bad.read_text() == text


def test_a_symlinked_settings_file_is_written_through_its_link(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "claude.json").write_text('{"theme": "dark"}')
    [path] = files("claude")
    path.parent.mkdir()
    path.symlink_to(dotfiles / "claude.json")
    save("claude")
    assert path.is_symlink()
    after = json.loads((dotfiles / "claude.json").read_text())
    assert after["theme"] == "dark" and after["env"]["ANTHROPIC_BASE_URL"] == END.base
    assert json.loads(backups(path)[0].read_text()) == {"theme": "dark"}


def test_a_key_is_named_by_its_variable_and_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_LLMTUI_KEY", "sesame-secret")
    [claude] = files("claude")
    claude.parent.mkdir()
    claude.write_text('{"env": {"ANTHROPIC_AUTH_TOKEN": "llmtui"}}')
    lines = save("claude", "MY_LLMTUI_KEY")
    settings = json.loads(claude.read_text())
    assert settings["apiKeyHelper"] == "printenv MY_LLMTUI_KEY"
    assert "ANTHROPIC_AUTH_TOKEN" not in settings["env"]  # it would be sent before the helper's key
    assert "  env.ANTHROPIC_AUTH_TOKEN removed (the key comes from apiKeyHelper)" in lines
    save("codex", "MY_LLMTUI_KEY")
    assert tomllib.loads(files("codex")[0].read_text())["model_providers"]["llmtui"]["env_key"] == "MY_LLMTUI_KEY"
    save("opencode", "MY_LLMTUI_KEY")
    options = json.loads(files("opencode")[0].read_text())["provider"]["llmtui"]["options"]
    assert options["apiKey"] == "{env:MY_LLMTUI_KEY}"
    for path in [*files("claude"), *files("codex"), *files("opencode")]:
        assert "sesame-secret" not in path.read_text()
    with pytest.raises(CliError, match="is not an environment variable's name"):
        save("claude", "KEY; rm -rf ~")


def test_a_file_that_cannot_be_written_is_one_line_naming_what_was(monkeypatch: pytest.MonkeyPatch) -> None:
    config, profile = files("codex")
    real = launch_save.write_private_parts

    def full_disk(path: Path, parts: object, *, durable: bool = False) -> None:
        if path == profile:
            raise OSError(28, "No space left on device")
        real(path, parts, durable=durable)  # type: ignore[arg-type]

    monkeypatch.setattr(launch_save, "write_private_parts", full_disk)
    with pytest.raises(CliError) as failed:
        save("codex")
    assert str(failed.value) == (
        f"{profile} could not be written ([Errno 28] No space left on device); already written: {config}"
    )
    assert config.exists() and not profile.exists()


def test_a_huge_deep_or_fifo_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """The agent's file is read bounded (4 MiB), its nesting past Python's limit refused, a FIFO not waited on."""
    import os

    from app.cli.launch_save import _read_json, _read_text

    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((4 << 20) + 1))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (big, fifo):
        with pytest.raises(CliError, match="cannot be read"):
            _read_text(path)
    with pytest.raises(CliError, match="is not valid JSON"):
        _read_json(deep)
