"""A whole TUI session in a test writes nothing outside the test's own directories (tests/conftest.py's
hermetic_dirs): not the user's config, history, logs or caches."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest

from app.core.config import SamplingSettings
from app.tui.app import LlmtuiApp
from tests.conftest import HermeticDirs
from tests.pilot import ready, reply_done, send
from tests.waits import wait_until

# The user's own directories, as the app and platformdirs find them in the environment this run started with:
# computed when the module is imported (collection), before any test's hermetic_dirs points HOME elsewhere.
REAL_HOME = Path(os.path.expanduser("~"))
REAL_APP_DIRS = sorted(
    {
        Path(platformdirs.user_config_dir("llmtui")),
        Path(platformdirs.user_data_dir("llmtui")),
        Path(platformdirs.user_cache_dir("llmtui")),
        Path(platformdirs.user_state_dir("llmtui")),
        Path(platformdirs.user_log_dir("llmtui")),
        REAL_HOME / ".config" / "llmtui",
        REAL_HOME / ".local" / "share" / "llmtui",
        REAL_HOME / ".cache" / "llmtui",
        REAL_HOME / ".local" / "state" / "llmtui",
        *(Path(os.environ[name]) for name in ("LLMTUI_CONFIG_DIR", "LLMTUI_DATA_DIR") if os.environ.get(name)),
    }
)

# Audit events that write to the file system, and which of their arguments are the paths written.
_WRITE_EVENTS = {
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.truncate": (0,),
    "os.symlink": (1,),
    "os.link": (1,),
    "os.utime": (0,),
    "os.chmod": (0,),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
    "shutil.move": (1,),
    "shutil.rmtree": (0,),
    "sqlite3.connect": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_writes: list[tuple[str, str]] | None = None  # (event, path) while a test records; None otherwise
_hook_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record the paths this process writes (an audit hook: must never raise)."""
    writes = _writes
    if writes is None:
        return
    try:
        if event == "open":
            path, mode, flags = args
            if not ((isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS):
                return
            paths = (path,)
        elif event in _WRITE_EVENTS:
            paths = tuple(args[i] for i in _WRITE_EVENTS[event])
            if event == "sqlite3.connect" and "mode=ro" in str(paths[0]):
                return
        else:
            return
        for path in paths:
            if isinstance(path, str | bytes | os.PathLike):
                writes.append((event, os.path.abspath(os.fsdecode(path))))
    except Exception:  # noqa: BLE001 (an audit hook that raised would break the call it audits)
        pass


@pytest.fixture
def writes_outside(hermetic_dirs: HermeticDirs) -> Iterator[list[tuple[str, str]]]:
    """While the test runs, every path this process writes outside the test's directories (and the system temp dir,
    where pytest keeps those); the list is filled in when the test ends."""
    global _writes, _hook_installed
    if not _hook_installed:  # once per process: audit hooks cannot be removed
        sys.addaudithook(_audit)
        _hook_installed = True
    outside: list[tuple[str, str]] = []
    _writes = []
    try:
        yield outside
    finally:
        recorded, _writes = _writes, None
    allowed = [str(root) for root in hermetic_dirs.roots] + [
        os.path.realpath(tempfile.gettempdir()),
        tempfile.gettempdir(),
        "/dev",
        "/proc",
    ]
    for event, path in recorded:
        if "__pycache__" in Path(path).parts or path == os.devnull or path.startswith(":memory:"):
            continue
        if not any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in allowed):
            outside.append((event, path))


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folder`: relative path -> (size, mtime in ns)."""
    if not folder.exists():
        return {}
    entries = {".": (0, folder.stat().st_mtime_ns)}
    for path in folder.rglob("*"):
        try:
            stat = path.lstat()
        except FileNotFoundError:
            continue
        entries[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return entries


@pytest.mark.anyio
async def test_a_tui_session_writes_only_the_tests_own_directories(
    lone_llama: Path, hermetic_dirs: HermeticDirs, writes_outside: list[tuple[str, str]]
) -> None:
    """Start the app on the tiny llama, send a message and get a reply, open the help, the settings and the model
    switcher, change the theme (saved) and back, quit: the history, log and settings are in the test's dirs, the
    user's llmtui dirs are as they were, and the UI process wrote no file anywhere else."""
    assert os.environ["HOME"] == str(hermetic_dirs.home) != str(REAL_HOME)
    before = {folder: _tree(folder) for folder in REAL_APP_DIRS}
    app = LlmtuiApp(str(lone_llama), default_sampling=SamplingSettings(temperature=0.0, max_tokens=8))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = await ready(pilot)
        await send(pilot, "hello there")
        await reply_done(pilot)
        assert app.store.tree.active_path(chat.conversation_id or 0)[-1].content
        for key, screen_name in (("f1", "HelpScreen"), ("f3", "SettingsScreen"), ("ctrl+l", "ModelSwitcher")):
            await pilot.press(key)
            await wait_until(pilot, lambda: app.screen is not chat, f"{key} to open a screen ({screen_name})")
            await wait_until(pilot, lambda: all(w.is_finished for w in app.workers), f"{screen_name}'s file reads")
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is chat, f"escape to close the screen {key} opened")
        theme = app.theme
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.theme != theme, "ctrl+t to change the theme")
        await pilot.press("ctrl+t")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: not app.is_running, "ctrl+q to quit the app", timeout_s=30)
    after = {folder: _tree(folder) for folder in REAL_APP_DIRS}
    changed = {
        str(folder): sorted(set(before[folder].items()) ^ set(after[folder].items()))
        for folder in REAL_APP_DIRS
        if before[folder] != after[folder]
    }
    assert not changed, f"the session changed the user's own llmtui dirs: {changed}"
    assert not writes_outside, f"the session wrote outside the test's dirs: {writes_outside}"
    # What it wrote went to the test's dirs.
    assert (hermetic_dirs.data / "history.sqlite3").is_file()
    assert (hermetic_dirs.logs / "engine.log").is_file()
    assert (hermetic_dirs.config / "config.toml").is_file()
