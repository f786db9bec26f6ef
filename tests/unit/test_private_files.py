"""llmtui's private files are owner-only: 0600 files in 0700 folders, existing ones tightened once, with a notice."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core import owner_only_dirs as private_files
from app.core import paths
from app.core.config import Config, config_path, save_config
from app.core.store import Store, open_default_store
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from tests.hub_server import HubServer

pytestmark = [
    pytest.mark.usefixtures("app_dirs"),
    pytest.mark.skipif(os.name != "posix", reason="unix permission bits"),
]

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask (022), under which plain creation would give 0644 files and 0755 folders."""
    old = os.umask(0o022)
    private_files.take_notice()  # nothing left over from another test
    try:
        yield
    finally:
        os.umask(old)


def test_saved_settings_are_0600_in_a_0700_folder(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "config.toml"
    save_config(Config(), path)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert not path.with_name("config.toml.tmp").exists()
    path.chmod(0o644)  # an older llmtui's file: the next save writes a 0600 one over it
    save_config(Config(), path)
    assert mode(path) == 0o600


def test_history_database_and_its_wal_and_shm_are_0600(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    store = Store(folder / "history.sqlite3")
    try:
        conversation = store.conversations.create_conversation("private")
        store.tree.add_user_message(conversation.id, "a secret question")
        files = [folder / name for name in ("history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm")]
        assert all(f.exists() for f in files)
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert mode(folder) == 0o700
    finally:
        store.close()


def test_an_older_world_readable_database_is_tightened(tmp_path: Path) -> None:
    Store(tmp_path / "history.sqlite3").close()
    (tmp_path / "history.sqlite3").chmod(0o644)
    Store(tmp_path / "history.sqlite3").close()
    assert mode(tmp_path / "history.sqlite3") == 0o600


def test_control_vectors_are_0600() -> None:
    import numpy as np

    folder = paths.data_dir() / "steering"
    path = write_control_vector(ControlVector({1: np.ones(8, dtype=np.float32)}, "llama"), folder / "v.gguf")
    assert mode(path) == 0o600 and mode(folder) == 0o700


def test_existing_open_folders_and_settings_are_tightened_once_with_a_notice() -> None:
    data, config = paths.data_dir(), paths.config_dir()
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o755)
    config.mkdir(parents=True, exist_ok=True)
    config_path().write_text('theme = "dark"\n')
    config_path().chmod(0o644)
    private_files.secure_app_dirs()
    notice = private_files.take_notice()
    assert notice is not None and str(data) in notice and str(config_path()) in notice
    assert mode(data) == 0o700 and mode(config_path()) == 0o600 and mode(paths.log_dir()) == 0o700
    private_files.secure_app_dirs()  # said once: the modes are right now
    assert private_files.take_notice() is None


@pytest.mark.anyio
async def test_the_app_says_once_that_it_tightened_and_exports_are_0600(tiny_models: dict[str, Path]) -> None:
    from app.tui.app import LlmtuiApp

    data = paths.data_dir()
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o755)
    store = open_default_store()
    conversation = store.conversations.create_conversation("exported")
    store.tree.add_user_message(conversation.id, "a question")
    store.close()
    private_files.take_notice()  # the test's own setup above does not count
    data.chmod(0o755)
    notices: list[str] = []
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    original = app.notify

    def notify(message: str, *args: object, **kwargs: object) -> None:
        notices.append(str(message))
        original(message, *args, **kwargs)  # type: ignore[arg-type]

    app.notify = notify  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert [n for n in notices if "owner-only" in n and str(data) in n], notices
        markdown, json_path = app.conversations.export(conversation.id)
        assert mode(markdown) == 0o600 and mode(json_path) == 0o600 and mode(markdown.parent) == 0o700
    assert mode(data) == 0o700 and mode(data / "history.sqlite3") == 0o600


def test_cli_run_leaves_an_owner_only_engine_log(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path / "data"), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    result = subprocess.run(
        [sys.executable, "-m", "app", "run", "-m", str(tiny_models["llama"]), "-p", "hi", "-n", "4", "-t", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    log = tmp_path / "data" / "logs" / "engine.log"
    assert mode(log) == 0o600 and mode(log.parent) == 0o700


def test_a_partial_download_is_0600_until_installed_then_shared_like_huggingface_hub(
    hf_env: Path, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from models_catalog import download, hfcache, hub
    from models_catalog.download import TransferOptions
    from models_catalog.errors import DiskFullError

    data = random.Random(7).randbytes(1 << 20)
    hub_server.add_repo("org/Blob-GGUF", {"Blob.gguf": data})
    file = hub.list_repo("org/Blob-GGUF").file("Blob.gguf")
    options = TransferOptions(
        chunk_size=64 * 1024,
        stall_timeout=5,
        backoff_base=0.01,
        backoff_max=0.05,
        progress_interval=0.01,
        lock_poll=0.05,
    )
    real_write = download._write_all

    def disk_full_after_the_first_chunk(fd: int, chunk: bytes) -> int:
        if os.fstat(fd).st_size:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, chunk)

    monkeypatch.setattr(download, "_write_all", disk_full_after_the_first_chunk)
    with pytest.raises(DiskFullError):
        download.fetch(file, options=options)
    partial = hfcache.RepoCache(hf_env, "org/Blob-GGUF").partial(hashlib.sha256(data).hexdigest())
    assert partial.stat().st_size > 0 and mode(partial) == 0o600
    monkeypatch.setattr(download, "_write_all", real_write)
    path = download.fetch(file, options=options)
    # installed: the mode huggingface_hub gives its blobs (0666 less the umask), as the cache is shared
    assert path.read_bytes() == data and mode(path.resolve()) == 0o644


# ----- every writer, every command (issue 32, class 9) ----------------------------------------------------------


def _modes_under(root: Path) -> dict[str, int]:
    """Every folder and file under `root` (itself included) with its mode, for a readable assertion."""
    found = {str(root): mode(root)}
    for path in root.rglob("*"):
        found[str(path)] = mode(path)
    return found


def assert_owner_only(root: Path) -> None:
    loose = {p: oct(m) for p, m in _modes_under(root).items() if m != (0o700 if Path(p).is_dir() else 0o600)}
    assert not loose, loose


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022])
def test_private_dir_makes_missing_parents_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    os.umask(umask)
    folder = private_files.private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", folder)] == [0o700] * 3
    private_files.write_private_bytes(tmp_path / "x" / "y" / "cache.bin", b"\0" * 8)
    assert mode(tmp_path / "x") == 0o700 and mode(tmp_path / "x" / "y" / "cache.bin") == 0o600
    assert [p.name for p in (tmp_path / "x" / "y").iterdir()] == ["cache.bin"]  # no temporary file left


def test_usage_and_catalog_files_are_0600_even_over_older_0644_ones(tmp_path: Path) -> None:
    from models_catalog.catalog import load_catalog
    from models_catalog.library import Library

    data = tmp_path / "fresh-data"
    library = Library([], usage_file=data / "model-usage.json")
    library.mark_used(tmp_path / "m.gguf")
    assert mode(data) == 0o700 and mode(data / "model-usage.json") == 0o600
    (data / "model-usage.json").chmod(0o644)  # an older llmtui's file: the next write replaces it with a 0600 one
    library.mark_used(tmp_path / "n.gguf")
    catalog = load_catalog(overlay_path=data / "catalog-refresh.json")
    catalog.save_overlay()
    assert_owner_only(data)


def test_secure_app_dirs_tightens_the_state_folder_that_holds_the_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMTUI_DATA_DIR")
    monkeypatch.delenv("LLMTUI_CONFIG_DIR")
    state = paths.log_dir().parent
    assert state.name == "llmtui"  # platformdirs' ~/.local/state/llmtui, logs in its log/
    state.mkdir(parents=True)
    state.chmod(0o755)  # as an older llmtui's CLI left it
    private_files.secure_app_dirs()
    assert mode(state) == 0o700 and mode(paths.log_dir()) == 0o700 and mode(paths.data_dir()) == 0o700
    assert str(state) in (private_files.take_notice() or "")


def test_every_command_leaves_owner_only_folders_and_files(
    hermetic_dirs: object, hub_server: HubServer, hf_env: Path, tiny_models: dict[str, Path]
) -> None:
    """The campaign's reproducer with the platform folders (no LLMTUI_* overrides), under umask 022: a catalog
    refresh, a pull (a download lock in the cache) and a run (the engine log) leave nothing group/world-readable."""
    from models_catalog.catalog import load_catalog

    hub_server.add_repo("org/Tiny-GGUF", {"Tiny-Q8_0.gguf": tiny_models["llama"]})
    env = {k: v for k, v in os.environ.items() if k not in ("LLMTUI_DATA_DIR", "LLMTUI_CONFIG_DIR")}
    catalog_id = load_catalog().entries[0].id
    for args in (
        ["models", "refresh", catalog_id],
        ["models", "pull", "org/Tiny-GGUF:Q8_0"],
        ["run", "-m", str(tiny_models["llama"]), "-p", "hi", "-n", "2", "-t", "1"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, (args, result.stderr)
    home = Path(os.environ["HOME"])
    data, state = home / ".local" / "share" / "llmtui", home / ".local" / "state" / "llmtui"
    assert (data / "catalog-refresh.json").is_file() and (state / "log" / "engine.log").is_file()
    for root in (data, state):
        assert_owner_only(root)
    assert mode(home / ".local") == 0o700 and mode(home / ".local" / "share") == 0o700  # made by llmtui: XDG's mode
    locks = list((hf_env / ".locks").rglob("*.lock"))
    assert locks and {mode(lock) for lock in locks} == {0o600}
