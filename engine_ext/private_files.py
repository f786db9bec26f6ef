"""Owner-only files and folders: the one place llmtui creates its settings, history, logs, exports, control
vectors, usage and catalog files, n-gram caches and download locks (every floor writes through it, so it lives here).

Folders llmtui creates for these are made 0700 (missing parents too, as the XDG spec asks) and files 0600, whatever
the umask. A folder that already exists with group or world access is tightened to 0700 once (after that its mode is
right, so nothing is said again); `take_notice()` gives the one line that says so. Never used on the user's model
folders or the Hugging Face cache's own files (blobs, snapshots, refs keep huggingface_hub's modes).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600

_lock = threading.Lock()
_tightened: list[Path] = []


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents (0700) if missing, else tighten it to 0700 when group/world can reach
    it; `path`."""
    path = Path(path)
    existed = path.is_dir()
    if not existed:
        missing = [path, *(parent for parent in path.parents if not parent.exists())]
        for folder in reversed(missing):  # the outermost first
            folder.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    if os.name != "posix":
        return path
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        try:
            os.chmod(path, PRIVATE_DIR_MODE)
        except PermissionError:  # another user's folder (a shared LLMTUI_DATA_DIR): left as it is
            return path
        if existed:
            _record(path)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty (0600) if missing, else tighten an existing one to 0600; `path`."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), PRIVATE_FILE_MODE)
    try:
        if _tighten_fd(fd):
            _record(path)
    finally:
        os.close(fd)
    return path


def tighten_if_exists(path: Path) -> None:
    """Tighten an existing file to 0600 when group/world can read it (recorded for the notice)."""
    if os.name != "posix":
        return
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if stat.S_ISREG(path.stat().st_mode) and mode & 0o077:
        try:
            os.chmod(path, PRIVATE_FILE_MODE)
        except PermissionError:  # another user's file: left as it is
            return
        _record(path)


def write_private_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically: a 0600 temporary file beside it, renamed over it."""
    write_private_bytes(path, text.encode("utf-8"))


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: a 0600 temporary file beside it (its name unique to this process and
    thread, so writers never share one), renamed over it. The folder is made with private_dir when missing."""
    write_private_parts(path, (data,))


def write_private_parts(path: Path, parts: Iterable[bytes | bytearray | memoryview], *, durable: bool = False) -> None:
    """Write `parts` one after the other to `path` atomically, as write_private_bytes does (no part is joined into a
    copy); with `durable`, the file is flushed to the disk (fsync) before the rename and the folder after it, so a
    crash or power loss leaves the old file or the whole new one, never a part. The temporary file's name ends in
    `.tmp`; one left by a process killed while writing is never read (a reader opens only the final name)."""
    path = Path(path)
    if not path.parent.is_dir():
        private_dir(path.parent)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), PRIVATE_FILE_MODE)
    try:
        _tighten_fd(fd)  # a stale temporary file keeps its mode otherwise
        with os.fdopen(fd, "wb") as file:
            fd = -1
            for part in parts:
                file.write(part)
            if durable:
                file.flush()
                os.fsync(file.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        if fd != -1:
            os.close(fd)
    os.replace(temporary, path)
    if durable and os.name == "posix":
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def take_notice() -> str | None:
    """One line naming the folders tightened since the last call (None when there were none)."""
    with _lock:
        tightened, _tightened[:] = list(_tightened), []
    if not tightened:
        return None
    names = ", ".join(str(p) for p in tightened)
    return f"Made owner-only (other users on this machine could read them): {names}"


def _record(path: Path) -> None:
    with _lock:
        if path not in _tightened:
            _tightened.append(path)


def _tighten_fd(fd: int) -> bool:
    """Make an open file 0600 if group/world can reach it; whether it was changed."""
    if os.name == "posix" and stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        except PermissionError:  # another user's file: left as it is
            return False
        return True
    return False
