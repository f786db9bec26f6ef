"""Built-in tools that need no server, off by default: the current date and time, and reading a text file under a
folder the user chose (no escaping it: symlinks resolved, devices and FIFOs refused, the size bounded)."""

from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from app.tools.box import ToolEntry, ToolError

BUILTIN_NAMES = ("datetime", "read_file")
MAX_READ_BYTES = 256 * 1024


def datetime_tool() -> ToolEntry:
    def run(arguments: dict[str, Any], timeout_s: float) -> str:
        now = datetime.now().astimezone()
        return f"{now.isoformat(timespec='seconds')} ({now.strftime('%A')}, time zone {now.tzname()})"

    definition = {
        "name": "current_datetime",
        "description": "The current local date, time, weekday and time zone.",
        "parameters": {"type": "object", "properties": {}},
    }
    return ToolEntry(definition, "built-in", run)


def read_file_tool(folder: Path) -> ToolEntry:
    """read_file(path): a UTF-8 text file under `folder` (a path relative to it), at most MAX_READ_BYTES."""
    root = folder.expanduser().resolve(strict=True)
    if not root.is_dir():
        raise ToolError(f"{root} is not a folder; read_file reads under a folder")

    def run(arguments: dict[str, Any], timeout_s: float) -> str:
        return read_under(root, str(arguments.get("path", "")))

    definition = {
        "name": "read_file",
        "description": f"Read a UTF-8 text file (at most {MAX_READ_BYTES // 1024} KiB) under the folder {root.name}/.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "the file's path, relative to the folder"}},
            "required": ["path"],
        },
    }
    return ToolEntry(definition, "built-in", run)


def read_under(root: Path, relative: str) -> str:
    """The text of `relative` under `root`; ToolError when it leaves the folder or is not a small text file."""
    if not relative or "\x00" in relative:
        raise ToolError("give the file's path relative to the folder")
    try:
        path = (root / relative).resolve(strict=True)  # symlinks resolved: a link out of the folder leaves it
    except (OSError, RuntimeError):
        raise ToolError(f"{relative}: no such file under the folder") from None
    if not path.is_relative_to(root):
        raise ToolError(f"{relative} is outside the folder the user chose")
    try:
        # O_NOFOLLOW: a link put in its place since resolving is refused; O_NONBLOCK: a FIFO cannot block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise ToolError(f"{relative}: {error.strerror or error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{relative} is not a regular file (folders, devices and FIFOs are not read)")
        if info.st_size > MAX_READ_BYTES:
            raise ToolError(f"{relative} has {info.st_size} bytes; read_file reads at most {MAX_READ_BYTES}")
        data = os.read(fd, MAX_READ_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_READ_BYTES or b"\x00" in data:
        raise ToolError(f"{relative} is not a small text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{relative} is not UTF-8 text") from None
