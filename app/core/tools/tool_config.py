"""The tool settings in config.toml, read by a small reader of our own (on app.core.config's bounded TOML reading; the
settings model will take them over): ``[mcp.servers.NAME]`` with ``command``/``args``/``env`` (stdio) or
``url``/``headers`` (streamable HTTP),
``${VAR}`` in env and header values taken from the environment; ``[tools]`` with ``builtin``, ``read_folder`` and
``always_allow``. Every problem is one line naming the file and the key."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from app.core import paths
from app.core.config import ConfigError, read_config_text, toml_tables
from app.core.tools.box import ToolError
from engine_ext.private_files import private_dir, write_private_text
from engine_ext.untrusted_text import one_line_message

MAX_SERVERS = 64
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SERVER_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 20.0
    call_timeout_s: float = 60.0


@dataclass(frozen=True)
class ToolSettings:
    servers: dict[str, McpServerConfig] = field(default_factory=dict)
    builtin: tuple[str, ...] = ()
    read_folder: str = ""
    always_allow: tuple[str, ...] = ()


def _expand(value: str, where: str, config: Path) -> str:
    def var(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ToolError(one_line_message(config, f"{where} names ${{{name}}}, which is not set in the environment"))
        return os.environ[name]

    return _VAR.sub(var, value)


def _strings(value: Any, where: str, config: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolError(one_line_message(config, f"{where} is a list of strings"))
    return tuple(value)


def _table(value: Any, where: str, config: Path) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ToolError(one_line_message(config, f"{where} is a table of strings"))
    return {str(k): _expand(v, f"{where}.{k}", config) for k, v in value.items()}


def _seconds(value: Any, where: str, config: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ToolError(one_line_message(config, f"{where} is a number of seconds from 0 to 3600"))
    return float(value)


def _server(name: str, table: Any, config: Path) -> McpServerConfig:
    where = f"mcp.servers.{name}"
    if not _SERVER_NAME.fullmatch(name):
        raise ToolError(one_line_message(config, f"{where}: a server name is letters, digits, _ . - (at most 64)"))
    if not isinstance(table, dict):
        raise ToolError(one_line_message(config, f"{where} is a table"))
    command, url = table.get("command", ""), table.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str) or bool(command) == bool(url):
        raise ToolError(one_line_message(config, f"{where} needs command (stdio) or url (HTTP), one of them"))
    if url and not url.startswith(("http://", "https://")):
        raise ToolError(one_line_message(config, f"{where}.url is an http:// or https:// address"))
    return McpServerConfig(
        name=name,
        command=command,
        args=_strings(table.get("args", []), f"{where}.args", config),
        env=_table(table.get("env", {}), f"{where}.env", config),
        url=url,
        headers=_table(table.get("headers", {}), f"{where}.headers", config),
        start_timeout_s=_seconds(table.get("start_timeout_s", 20.0), f"{where}.start_timeout_s", config),
        call_timeout_s=_seconds(table.get("call_timeout_s", 60.0), f"{where}.call_timeout_s", config),
    )


def read_tool_settings(config: Path | None = None) -> ToolSettings:
    """The [mcp] and [tools] tables of config.toml (none there: no servers, no built-in tools)."""
    config = paths.config_path() if config is None else config
    try:
        document = toml_tables(read_config_text(config), str(config))
    except ConfigError as error:
        raise ToolError(str(error)) from None
    mcp, tools = document.get("mcp", {}), document.get("tools", {})
    servers_table = mcp.get("servers", {}) if isinstance(mcp, dict) else None
    if not isinstance(servers_table, dict) or not isinstance(tools, dict):
        raise ToolError(one_line_message(config, "[mcp.servers] and [tools] are tables"))
    if len(servers_table) > MAX_SERVERS:
        raise ToolError(one_line_message(config, f"{len(servers_table)} MCP servers; at most {MAX_SERVERS}"))
    servers = {name: _server(name, table, config) for name, table in servers_table.items()}
    folder = tools.get("read_folder", "")
    if not isinstance(folder, str):
        raise ToolError(one_line_message(config, "tools.read_folder is a folder's path"))
    builtin = _strings(tools.get("builtin", []), "tools.builtin", config)
    unknown = [name for name in builtin if name not in ("datetime", "read_file")]
    if unknown:
        raise ToolError(
            one_line_message(config, f"tools.builtin: no built-in tool {unknown[0]!r} (datetime, read_file)")
        )
    return ToolSettings(
        servers=servers,
        builtin=builtin,
        read_folder=folder,
        always_allow=_strings(tools.get("always_allow", []), "tools.always_allow", config),
    )


def remember_always_allow(tool: str, config: Path | None = None) -> None:
    """Add `tool` to [tools] always_allow in config.toml ("always" in the consent dialog), keeping the file's
    comments, order and other keys (tomlkit); written as the settings are (0600, in a 0700 folder)."""
    config = paths.config_path() if config is None else config
    try:
        document = tomlkit.parse(read_config_text(config))
    except ConfigError as error:
        raise ToolError(str(error)) from None
    except tomlkit.exceptions.ParseError as error:
        raise ToolError(one_line_message(config, f"cannot remember the tool: {error}")) from None
    tools = document.get("tools")
    if not isinstance(tools, dict):
        tools = tomlkit.table()
        document["tools"] = tools
    allowed = tools.get("always_allow")
    if not isinstance(allowed, list):
        allowed = tomlkit.array()
        tools["always_allow"] = allowed
    if tool not in allowed:
        allowed.append(tool)
    try:
        private_dir(config.parent)
        write_private_text(config, tomlkit.dumps(document))
    except OSError as error:
        raise ToolError(one_line_message(config, f"cannot save: {error.strerror or error}")) from None
