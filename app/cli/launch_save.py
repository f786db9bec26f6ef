"""`llmtui launch CLIENT --save` (and `--save-only`): the agent pointed at llmtui's API server in its own config
files, so that `claude`, `codex --profile llmtui` or `opencode -m llmtui/MODEL` reach `llmtui serve` without launch.

- Claude Code: the `env` block of its user settings, `$CLAUDE_CONFIG_DIR/settings.json` (default ~/.claude): the
  variables launch sets for a run (app/cli/launch_clients.py: base URL, token, every model name; its timeouts only
  where the block has none). With a key, `apiKeyHelper` reads it from the key's variable (`printenv NAME`): the key
  itself is never written.
- Codex: `[model_providers.llmtui]` in `$CODEX_HOME/config.toml` (default ~/.codex), and the profile file
  `llmtui.config.toml` beside it (Codex 0.134+ reads `--profile NAME` from `NAME.config.toml`; `[profiles.NAME]`
  tables are no longer read, and a matching one makes it refuse the profile). The default profile and model are left
  as they are. Comments, order and the other tables are kept (tomlkit).
- OpenCode: `provider.llmtui` (openai-compatible, baseURL, the model) in `$XDG_CONFIG_HOME/opencode/opencode.json`
  (default ~/.config); its `model` is left as it is.

Every file is read and parsed before any is written: one that does not parse (or whose table is of another shape)
is refused in one line naming it, and nothing is written. An existing file is copied to `NAME.YYYYmmdd-HHMMSS.bak`
beside it first, then written atomically (a temporary file beside it, renamed over it; a symlink's target is written
and the link kept) with its mode kept; a new file is 0600 and the folders made for it 0700.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable, Table

from app.cli.launch_clients import PROVIDER, Endpoint, claude_setup, codex_provider, opencode_provider
from app.cli.session import CliError
from app.core.text_files import read_text_file
from engine_ext.private_files import write_private_parts
from engine_ext.untrusted_text import one_line

CLIENT_HOMES = ("CLAUDE_CONFIG_DIR", "CODEX_HOME")  # the clients' own folder variables (OpenCode's: XDG_CONFIG_HOME)
REFUSED = "not changed (fix it or move it away)"
MAX_AGENT_CONFIG_BYTES = 4 << 20  # an agent's settings file: far larger is no settings file
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass
class Change:
    """One config file to write: where, its new text, whether it existed, and what changed in it (one line each)."""

    path: Path
    text: str
    existed: bool
    said: list[str] = field(default_factory=list)


def config_files(client: str, env: Mapping[str, str]) -> list[Path]:
    """The files `--save` writes for the client, as the client finds them in this environment."""
    if client == "claude":
        return [_claude_dir(env) / "settings.json"]
    if client == "codex":
        home = _codex_home(env)
        return [home / "config.toml", home / f"{PROVIDER}.config.toml"]
    return [_xdg_config(env) / "opencode" / "opencode.json"]


def check(client: str, env: Mapping[str, str]) -> None:
    """The client's files parse and have the shape written into (or are missing): one line naming the one that does
    not. Nothing is written."""
    plan(client, Endpoint("http://127.0.0.1", "model"), "", env)


def plan(client: str, end: Endpoint, key_env: str, env: Mapping[str, str]) -> list[Change]:
    """The client's files with the server written in (nothing written yet); `key_env`: the variable that holds the
    server's key ('' for none)."""
    if key_env and not ENV_NAME.fullmatch(key_env):
        raise CliError(f"--api-key-env {one_line(key_env, 60)!r} is not an environment variable's name")
    if client == "claude":
        return [_claude(config_files(client, env)[0], end, key_env)]
    if client == "codex":
        config, profile = config_files(client, env)
        return _codex(config, profile, end, key_env)
    return [_opencode(config_files(client, env)[0], end, key_env)]


def write(changes: list[Change]) -> list[str]:
    """Write each file (its backup first) and return what to say: the file, its backup, what was set, the undo."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    lines = []
    for change in changes:
        path = change.path
        try:
            backup = _write_one(change, stamp)
        except OSError as e:
            done = [str(c.path) for c in changes[: changes.index(change)]]
            raise CliError(
                f"{path} could not be written ({one_line(str(e), 120)}); "
                + (f"already written: {', '.join(done)}" if done else "nothing was written")
            ) from None
        if backup is not None:
            lines.append(f"wrote {path} (the previous one copied to {backup}):")
            undo = f"cp -p {shlex.quote(str(backup))} {shlex.quote(str(path))}"
        else:
            lines.append(f"wrote {path} (new):")
            undo = f"rm {shlex.quote(str(path))}"
        lines += [f"  {line}" for line in change.said]
        lines.append(f"  to undo: {undo}")
    return lines


def _write_one(change: Change, stamp: str) -> Path | None:
    """Back the file up (when it exists), then write it atomically, its mode kept; the backup."""
    path = change.path
    target = path.resolve() if path.is_symlink() else path
    backup = _backup(path, stamp) if change.existed else None
    mode = stat.S_IMODE(target.stat().st_mode) if change.existed else None
    write_private_parts(target, (change.text.encode("utf-8"),), durable=True)
    if mode is not None and mode != stat.S_IMODE(target.stat().st_mode):
        os.chmod(target, mode)
    return backup


def save(client: str, end: Endpoint, key_env: str, env: Mapping[str, str]) -> list[str]:
    """plan, then write: what was written where, and how to undo it."""
    return write(plan(client, end, key_env, env))


def how_to_run(client: str, model: str) -> str:
    """How the user runs the agent against the server from now on."""
    if client == "claude":
        return "`claude` now talks to llmtui serve (its user settings apply to every run)"
    if client == "codex":
        return f"`codex --profile {PROVIDER}` talks to llmtui serve; plain `codex` keeps your default"
    return (
        f"`opencode -m {PROVIDER}/{model}` (or /models in OpenCode) talks to llmtui serve; your default model is kept"
    )


# ----- each client's files ----------------------------------------------------------------------------------


def _claude(path: Path, end: Endpoint, key_env: str) -> Change:
    data, existed = _read_json(path)
    block = data.get("env", {})
    if not isinstance(block, dict):
        raise CliError(f'{path}: its "env" is not an object; {REFUSED}')
    setup = claude_setup(Endpoint(end.base, end.model, end.n_ctx))
    values = dict(setup.env)
    said = []
    if key_env:
        values.pop("ANTHROPIC_AUTH_TOKEN")  # before apiKeyHelper in Claude Code's order: it would be sent instead
        if block.pop("ANTHROPIC_AUTH_TOKEN", None) is not None:
            said.append("env.ANTHROPIC_AUTH_TOKEN removed (the key comes from apiKeyHelper)")
        data["apiKeyHelper"] = f"printenv {key_env}"
        said.append(f"apiKeyHelper = {json.dumps(data['apiKeyHelper'])} (the key from ${key_env}, not written)")
    values.update({k: v for k, v in setup.env_defaults.items() if k not in block})
    block.update(values)
    data["env"] = block
    said += [f"env.{k} = {json.dumps(v)}" for k, v in values.items()]
    return Change(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", existed, said)


def _codex(config: Path, profile: Path, end: Endpoint, key_env: str) -> list[Change]:
    doc, existed = _read_toml(config)
    providers = doc.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        doc["model_providers"] = providers
    elif not isinstance(providers, (Table, InlineTable)):
        raise CliError(f"{config}: its model_providers is not a table; {REFUSED}")
    values = codex_provider(end, key_env)
    table: Table | InlineTable = tomlkit.inline_table() if isinstance(providers, InlineTable) else tomlkit.table()
    table.update(values)
    if isinstance(table, Table):
        table.add(tomlkit.nl())
    providers[PROVIDER] = table
    said = [f"[model_providers.{PROVIDER}] {k} = {json.dumps(v)}" for k, v in values.items()]
    legacy = doc.get("profiles")
    if isinstance(legacy, (Table, InlineTable)) and PROVIDER in legacy:
        said.append(
            f"note: its [profiles.{PROVIDER}] table makes Codex 0.134+ refuse --profile {PROVIDER}: remove it "
            f"(the profile is {profile.name} now)"
        )
    pdoc, pexisted = _read_toml(profile)
    settings: dict[str, object] = {"model_provider": PROVIDER, "model": end.model}
    if end.n_ctx:
        settings["model_context_window"] = end.n_ctx
    elif "model_context_window" in pdoc:
        del pdoc["model_context_window"]  # the last save's model's
    pdoc.update(settings)
    psaid = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return [
        Change(config, tomlkit.dumps(doc), existed, said),
        Change(profile, tomlkit.dumps(pdoc), pexisted, psaid),
    ]


def _opencode(path: Path, end: Endpoint, key_env: str) -> Change:
    data, existed = _read_json(path)
    data.setdefault("$schema", "https://opencode.ai/config.json")
    providers = data.setdefault("provider", {})
    if not isinstance(providers, dict):
        raise CliError(f'{path}: its "provider" is not an object; {REFUSED}')
    entry = opencode_provider(end, f"{{env:{key_env}}}" if key_env else "")
    providers[PROVIDER] = entry
    said = [f"provider.{PROVIDER} = {json.dumps(entry)}"]
    return Change(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", existed, said)


# ----- reading, backups, places -----------------------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    """The file's text; None when it does not exist. One line when it cannot be read or is not UTF-8."""
    try:
        return read_text_file(path, MAX_AGENT_CONFIG_BYTES)  # bounded; a FIFO or a folder refused, not waited on
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CliError(f"{path} cannot be read ({one_line(str(e), 120)}); not changed") from None


def _read_json(path: Path) -> tuple[dict[str, Any], bool]:
    text = _read_text(path)
    if text is None or not text.strip():
        return {}, text is not None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
        raise CliError(f"{path} is not valid JSON ({one_line(str(e), 120)}); {REFUSED}") from None
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a JSON object; {REFUSED}")
    return data, True


def _read_toml(path: Path) -> tuple[tomlkit.TOMLDocument, bool]:
    text = _read_text(path)
    if text is None:
        return tomlkit.document(), False
    try:
        return tomlkit.parse(text), True
    except (TOMLKitError, RecursionError) as e:
        raise CliError(f"{path} is not valid TOML ({one_line(str(e), 120)}); {REFUSED}") from None


def _backup(path: Path, stamp: str) -> Path:
    """A copy of the file (a symlink's target) as NAME.STAMP.bak beside it, its mode kept; never over another."""
    backup = path.with_name(f"{path.name}.{stamp}.bak")
    n = 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.{stamp}-{n}.bak")
    shutil.copy2(path, backup)
    return backup


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _claude_dir(env: Mapping[str, str]) -> Path:
    value = env.get("CLAUDE_CONFIG_DIR")
    return Path(value).expanduser() if value else _home(env) / ".claude"


def _codex_home(env: Mapping[str, str]) -> Path:
    value = env.get("CODEX_HOME")
    return Path(value).expanduser() if value else _home(env) / ".codex"


def _xdg_config(env: Mapping[str, str]) -> Path:
    value = env.get("XDG_CONFIG_HOME")
    return Path(value) if value and Path(value).is_absolute() else _home(env) / ".config"
