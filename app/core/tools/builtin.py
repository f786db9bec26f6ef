"""Built-in tools that need no server, off by default: the current date and time, and reading a text file under a
folder the user chose (no escaping it, even in a race: opened name by name from the folder's descriptor, no link
followed; devices and FIFOs refused, the size bounded)."""

from __future__ import annotations

import errno
import os
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from app.core.tools.box import ToolEntry, ToolError

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
    identity = _identity(os.stat(root))

    def run(arguments: dict[str, Any], timeout_s: float) -> str:
        return read_under(root, str(arguments.get("path", "")), identity)

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


# O_NONBLOCK: a FIFO cannot block the open; O_NOCTTY: a terminal is never made the controlling one.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_FOLDER_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0)
_WALKS_BY_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def read_under(root: Path, relative: str, identity: tuple[int, int] | None = None) -> str:
    """The text of `relative` under `root`; ToolError when it leaves the folder or is not a small text file.

    Linux (and every platform with `dir_fd`): the path is opened one name at a time from the folder's descriptor,
    none of them a link, `..` or absolute, so a folder swapped for a link while it is read cannot lead outside.
    Elsewhere: the resolved path is opened and the file opened must be the one found under the folder (device and
    inode). `identity`: the folder's (device, inode) when the tool was made; a folder replaced since is refused."""
    names = _names(relative)
    fd = _open_file(root, names, relative, identity) if _WALKS_BY_FD else _open_resolved(root, relative, identity)
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


def _names(relative: str) -> list[str]:
    """The names `relative` walks through, each one step down: no absolute path, no `..`."""
    if not relative or "\x00" in relative:
        raise ToolError("give the file's path relative to the folder")
    if relative.startswith("/") or Path(relative).is_absolute():
        raise ToolError(f"{relative} is outside the folder the user chose (give a path relative to it)")
    names = [name for name in relative.split("/") if name not in ("", ".")]
    if ".." in names:
        raise ToolError(f"{relative} is outside the folder the user chose (.. leaves it)")
    if not names:
        raise ToolError(f"{relative} is not a regular file (folders, devices and FIFOs are not read)")
    return names


def _open_file(root: Path, names: list[str], relative: str, identity: tuple[int, int] | None) -> int:
    """The descriptor of the file `names` leads to from the folder, opened name by name without following links."""
    folder = _open_at(str(root), _FOLDER_FLAGS, None, relative)
    try:
        if identity is not None and _identity(os.fstat(folder)) != identity:
            raise ToolError(f"the folder {root} was replaced since read_file was set up; set it up again")
        for name in names[:-1]:
            below = _open_at(name, _FOLDER_FLAGS, folder, relative)
            os.close(folder)
            folder = below
        return _open_at(names[-1], _FILE_FLAGS, folder, relative)
    finally:
        os.close(folder)


def _open_at(name: str, flags: int, folder: int | None, relative: str) -> int:
    """`name` opened with `flags` in the folder `folder` (None: `name` is a whole path); a link, a missing name or
    another failure as a one-line ToolError."""
    try:
        return os.open(name, flags, dir_fd=folder)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise ToolError(f"{relative}: no such file under the folder") from None
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and folder is not None and _is_link(folder, name):
            raise ToolError(
                f"{relative} goes through a link ({name}): read_file follows none, so it never reads outside the folder"
            ) from None
        if error.errno == errno.ENOTDIR:
            raise ToolError(f"{relative}: {name} is not a folder") from None
        raise ToolError(f"{relative}: {error.strerror or error}") from None


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_resolved(root: Path, relative: str, identity: tuple[int, int] | None) -> int:
    """Without `dir_fd`: open the resolved path and check that the file opened is the one found under the folder."""
    if identity is not None and _identity(os.stat(root)) != identity:
        raise ToolError(f"the folder {root} was replaced since read_file was set up; set it up again")
    try:
        path = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        raise ToolError(f"{relative}: no such file under the folder") from None
    if not path.is_relative_to(root):
        raise ToolError(f"{relative} is outside the folder the user chose")
    fd = _open_at(str(path), _FILE_FLAGS, None, relative)
    try:
        found = (root / relative).resolve(strict=True)
        same = found.is_relative_to(root) and _identity(os.stat(found)) == _identity(os.fstat(fd))
    except (OSError, RuntimeError):
        same = False
    if not same:
        os.close(fd)
        raise ToolError(f"{relative} changed while it was opened; it is not read")
    return fd
