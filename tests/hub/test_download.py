"""The downloader against a local Hub: resume after SIGKILL, corruption, full disks, stalls, offline mode, queue."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from models_catalog import download, hfcache, hub, pull
from models_catalog.download import Progress, State, TransferOptions
from models_catalog.download_queue import DownloadQueue
from models_catalog.errors import ChecksumMismatch, DiskFullError, NotEnoughDiskSpace, OfflineError
from tests.hub_server import HubServer

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/Blob-GGUF"
NAME = "Blob-Q4_K_M.gguf"
FAST = TransferOptions(
    chunk_size=64 * 1024, stall_timeout=5, backoff_base=0.01, backoff_max=0.05, progress_interval=0.01, lock_poll=0.05
)


def payload(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
def blob_repo(hub_server: HubServer) -> bytes:
    data = payload(1 << 20)
    hub_server.add_repo(REPO, {NAME: data, "README.md": b"# Blob\n"})
    return data


def remote(name: str = NAME) -> download.RemoteFile:
    return hub.list_repo(REPO).file(name)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_path(cache: Path, data: bytes) -> Path:
    return hfcache.RepoCache(cache, REPO).blob(sha(data))


def test_fetch_installs_in_the_hf_cache_layout_that_huggingface_hub_reads(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer
) -> None:
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    events: list[Progress] = []
    path = download.fetch(remote(), options=FAST, on_progress=events.append)
    commit = hub.list_repo(REPO).commit
    assert path == hf_env / "models--org--Blob-GGUF" / "snapshots" / commit / NAME
    assert path.is_symlink() and path.resolve() == blob_path(hf_env, blob_repo)
    assert path.read_bytes() == blob_repo
    assert (hf_env / "models--org--Blob-GGUF" / "refs" / "main").read_text() == commit
    assert not hfcache.RepoCache(hf_env, REPO).partial(sha(blob_repo)).exists()
    assert try_to_load_from_cache(REPO, NAME, cache_dir=hf_env) == str(path)
    assert [r.repo_id for r in scan_cache_dir(hf_env).repos] == [REPO]
    assert events[-1].state == State.DONE and events[-1].downloaded == len(blob_repo)
    # a small non-LFS file is verified by its git blob id
    readme = download.fetch(remote("README.md"), options=FAST)
    assert readme.read_bytes() == b"# Blob\n"
    # fetching again is a no-op
    served = len(hub_server.data_requests(NAME))
    assert download.fetch(remote(), options=FAST) == path
    assert len(hub_server.data_requests(NAME)) == served


def test_huggingface_hub_download_and_ours_share_one_blob(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer
) -> None:
    from huggingface_hub import hf_hub_download

    theirs = hf_hub_download(REPO, NAME, cache_dir=hf_env, endpoint=hub_server.url)
    n = len(hub_server.data_requests(NAME))
    ours = download.fetch(remote(), options=FAST)
    assert str(ours) == theirs and len(hub_server.data_requests(NAME)) == n


def test_dropped_connections_resume_with_range(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, drop_at=300_000, drop_times=2)
    path = download.fetch(remote(), options=FAST)
    assert path.read_bytes() == blob_repo
    reqs = hub_server.data_requests(NAME, settled=True)
    assert len(reqs) == 3
    assert reqs[0].range is None and reqs[1].range is not None and reqs[1].start > 0
    assert reqs[1].start == 300_000 and reqs[2].start == 300_000  # nothing received is fetched twice
    assert sum(r.sent for r in reqs) == len(blob_repo)


def test_a_server_that_ignores_range_restarts_cleanly(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, drop_at=400_000, drop_times=1, ignore_range=True)
    events: list[Progress] = []
    path = download.fetch(remote(), options=FAST, on_progress=events.append)
    assert path.read_bytes() == blob_repo
    reqs = hub_server.data_requests(NAME)
    assert len(reqs) == 2 and reqs[1].range is not None and reqs[1].status == 200
    assert any("ignored the Range" in e.message for e in events)


def test_stall_is_detected_and_the_download_reconnects(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, stall_at=200_000, stall_seconds=20)
    events: list[Progress] = []
    start = time.monotonic()
    options = TransferOptions(chunk_size=16 * 1024, stall_timeout=0.5, backoff_base=0.01, progress_interval=0.01)
    path = download.fetch(remote(), options=options, on_progress=events.append)
    assert time.monotonic() - start < 10
    assert path.read_bytes() == blob_repo
    assert any("stalled" in e.message for e in events)
    reqs = hub_server.data_requests(NAME)
    assert len(reqs) == 2 and reqs[1].start == 200_000  # every byte received before the stall was kept


def test_5xx_answers_are_retried_with_backoff(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, errors_5xx=3)
    path = download.fetch(remote(), options=FAST)
    assert path.read_bytes() == blob_repo
    statuses = [r.status for r in hub_server.requests if r.path.startswith("/cdn/")]
    assert statuses == [503, 503, 503, 200]


def test_a_flipped_byte_is_caught_never_installed_and_fetched_again(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer
) -> None:
    hub_server.fault(REPO, NAME, corrupt_times=1, corrupt_offset=123_456)
    events: list[Progress] = []
    path = download.fetch(remote(), options=FAST, on_progress=events.append)
    assert sha(path.read_bytes()) == sha(blob_repo)
    assert any("checksum mismatch" in e.message for e in events)
    reqs = hub_server.data_requests(NAME)
    assert len(reqs) == 2 and reqs[0].range is None and reqs[1].range is None  # the bad copy is not resumed


def test_a_persistently_corrupt_file_is_never_installed(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, corrupt_times=100, corrupt_offset=5)
    with pytest.raises(ChecksumMismatch, match="not installed"):
        download.fetch(remote(), options=FAST)
    rc = hfcache.RepoCache(hf_env, REPO)
    assert not rc.blob(sha(blob_repo)).exists() and not rc.partial(sha(blob_repo)).exists()
    assert not rc.pointer(hub.list_repo(REPO).commit, NAME).exists()


def test_a_mismatch_on_a_deep_path_is_one_short_line(hf_env: Path, hub_server: HubServer) -> None:
    """Issue 32: a file 8 folders of 60 characters deep; the message keeps the path's end and the advice."""
    deep = "/".join(["d" * 60] * 8) + "/" + NAME
    hub_server.add_repo(REPO, {deep: payload(100_000)})
    hub_server.fault(REPO, deep, corrupt_times=100, corrupt_offset=5)
    with pytest.raises(ChecksumMismatch) as exc:
        download.fetch(remote(deep), options=FAST)
    text = str(exc.value)
    assert "\n" not in text and len(text) <= 300, text
    assert text.startswith("…") and NAME in text and "not installed" in text and "another network" in text


def test_a_full_disk_gives_a_clear_error_keeps_the_partial_and_resumes(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = download._write_all
    budget = {"left": 300_000}

    def write_until_full(fd: int, data: bytes) -> int:
        if budget["left"] < len(data):
            os.write(fd, data[: budget["left"]])  # a short write, then the disk is full
            budget["left"] = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        budget["left"] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr(download, "_write_all", write_until_full)
    with pytest.raises(DiskFullError) as info:
        download.fetch(remote(), options=FAST)
    partial = hfcache.RepoCache(hf_env, REPO).partial(sha(blob_repo))
    assert "disk is full" in str(info.value) and "partial file is kept" in str(info.value)
    kept = partial.stat().st_size
    assert 0 < kept <= 300_000 and partial.read_bytes() == blob_repo[:kept]
    monkeypatch.setattr(download, "_write_all", real_write)
    path = download.fetch(remote(), options=FAST)
    assert path.read_bytes() == blob_repo
    assert hub_server.data_requests(NAME)[-1].start == kept


def test_the_disk_space_check_runs_before_any_byte(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "_free_bytes", lambda path: 1000)
    with pytest.raises(NotEnoughDiskSpace, match="free some space"):
        pull.pull(f"{REPO}:Q4_K_M", options=FAST)
    with pytest.raises(NotEnoughDiskSpace):
        download.fetch(remote(), options=FAST)
    assert hub_server.data_requests() == []


class SocketGuard:
    """Fails any attempt to open a network connection, and counts them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("connect", "connect_ex"):
            monkeypatch.setattr(socket.socket, name, self._deny(name))
        monkeypatch.setattr(socket, "create_connection", self._deny("create_connection"))
        monkeypatch.setattr(socket, "getaddrinfo", self._deny("getaddrinfo"))

    def _deny(self, name: str) -> Any:
        def deny(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise OSError(f"network disabled by the test ({name})")

        return deny


def test_offline_mode_opens_no_socket(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    online = pull.pull(f"{REPO}:Q4_K_M", options=FAST)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    guard = SocketGuard(monkeypatch)
    offline = pull.pull(f"{REPO}:Q4_K_M", options=FAST)
    assert offline.model_path == online.model_path
    assert offline.model_path is not None and offline.model_path.read_bytes() == blob_repo
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE"):
        hub.search("blob")
    with pytest.raises(OfflineError):
        pull.pull("org/Not-Cached-GGUF", options=FAST)
    with pytest.raises(OfflineError):
        hub.model_card(REPO)
    assert guard.calls == []


CHILD = """
import sys
from models_catalog.download import TransferOptions
from models_catalog.pull import pull
options = TransferOptions(chunk_size=int(sys.argv[2]), stall_timeout=5, backoff_base=0.02, backoff_max=0.1)
print(pull(sys.argv[1], options=options).model_path)
"""


def test_sigkill_at_random_points_then_pull_again_ten_times(hf_env: Path, hub_server: HubServer) -> None:
    size, chunk = 3 << 20, 64 * 1024
    data = payload(size, seed=11)
    hub_server.add_repo(REPO, {NAME: data})
    hub_server.fault(REPO, NAME, throttle_bps=8 << 20)
    partial = hfcache.RepoCache(hf_env, REPO).partial(sha(data))
    rng = random.Random(1234)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", CHILD, f"{REPO}:Q4_K_M", str(chunk)]
    kept: list[int] = []
    refetched: list[int] = []
    deadline = time.monotonic() + 60
    for round_no in range(10):
        n_before = len(hub_server.data_requests(NAME))
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        have = partial.stat().st_size if partial.exists() else 0
        # a byte target that leaves room for the rounds to come; every 4th round dies by time instead
        # (often before the first byte, or in the middle of a chunk)
        target = have + rng.randrange(1, max(2, (size - have) // (11 - round_no)))
        kill_at = time.monotonic() + (rng.uniform(0.05, 1.0) if round_no % 4 == 3 else 60)
        while proc.poll() is None and time.monotonic() < min(deadline, kill_at):
            if partial.exists() and partial.stat().st_size >= target:
                break
            time.sleep(0.002)
        assert proc.poll() is None, "the pull finished before it could be killed; slow the server down"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kept.append(partial.stat().st_size if partial.exists() else 0)
        assert partial.read_bytes() == data[: kept[-1]] if partial.exists() else True
        time.sleep(0.05)  # let the server notice the dead client
        served = [r.start + r.sent for r in hub_server.data_requests(NAME)[n_before:]]
        refetched.append(max(served) - kept[-1] if served else 0)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = Path(done.stdout.strip())
    assert sha(installed.read_bytes()) == sha(data)
    assert not partial.exists()
    reqs = hub_server.data_requests(NAME)
    # each pull resumed exactly from the bytes on disk ...
    starts = [r.start for r in reqs]
    assert all(s in (0, *kept) for s in starts)
    assert starts[-1] == kept[-1]
    # ... and lost at most one chunk per kill: bytes the server had sent that were not on disk when the
    # process died (read but not yet written, or still in the socket buffers)
    # The client writes every read (at most one chunk) at once, so what it loses is what it had read but not
    # yet written plus what the kernel still buffered for it: the server's 16 KiB send buffer and the
    # client's receive window (128 KiB by default on Linux); typically 16-64 KiB here.
    in_flight = chunk + 128 * 1024
    assert max(refetched) <= in_flight, refetched
    assert sum(r.sent for r in reqs) <= size + 10 * in_flight


def test_two_fetchers_of_one_blob_take_turns_on_the_lock(hf_env: Path, blob_repo: bytes, hub_server: HubServer) -> None:
    hub_server.fault(REPO, NAME, throttle_bps=2 << 20)
    file = remote()
    events: list[Progress] = []
    results: list[Path] = []

    def run() -> None:
        results.append(download.fetch(file, options=FAST, on_progress=events.append))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2 and results[0] == results[1]
    assert any(e.state == State.WAITING for e in events)
    assert any("another process" in e.message for e in events if e.state == State.DONE)
    assert sum(r.sent for r in hub_server.data_requests(NAME, settled=True)) == len(blob_repo)


def test_queue_pause_resume_cancel_and_progress_events(hf_env: Path, hub_server: HubServer) -> None:
    a, b = payload(1 << 20, seed=1), payload(1 << 20, seed=2)
    hub_server.add_repo(REPO, {"A-Q4_K_M.gguf": a, "B-Q8_0.gguf": b})
    hub_server.fault(REPO, "A-Q4_K_M.gguf", throttle_bps=1 << 20)
    hub_server.fault(REPO, "B-Q8_0.gguf", throttle_bps=1 << 20)
    listing = hub.list_repo(REPO)
    events: list[Progress] = []
    with DownloadQueue(options=FAST) as queue:
        queue.subscribe(events.append)
        task_a = queue.add(listing.file("A-Q4_K_M.gguf"))
        task_b = queue.add(listing.file("B-Q8_0.gguf"))
        queue.cancel(task_b.task_id)  # still queued: never starts
        assert task_b.state == State.CANCELLED
        deadline = time.monotonic() + 20
        while (task_a.progress is None or task_a.progress.downloaded < 200_000) and time.monotonic() < deadline:
            time.sleep(0.01)
        queue.pause(task_a.task_id)
        assert task_a.done.wait(10) and task_a.state == State.PAUSED
        partial = hfcache.RepoCache(hf_env, REPO).partial(sha(a))
        paused_at = partial.stat().st_size
        assert 200_000 <= paused_at < len(a)
        queue.resume(task_a.task_id)
        assert queue.wait([task_a], timeout=30) and task_a.state == State.DONE
        assert task_a.path is not None and task_a.path.read_bytes() == a
    reqs = hub_server.data_requests("A-Q4_K_M.gguf")
    assert reqs[-1].start == paused_at
    assert hub_server.data_requests("B-Q8_0.gguf") == []
    downloading = [e for e in events if e.task_id == task_a.task_id and e.state == State.DOWNLOADING]
    assert any(e.rate > 0 and e.eta is not None for e in downloading)
    states = [e.state for e in events if e.task_id == task_a.task_id]
    assert State.PAUSED in states and states[-1] == State.DONE


def test_queue_cancel_of_a_running_download_deletes_its_partial(
    hf_env: Path, blob_repo: bytes, hub_server: HubServer
) -> None:
    hub_server.fault(REPO, NAME, throttle_bps=1 << 20)
    with DownloadQueue(options=FAST) as queue:
        task = queue.add(remote())
        deadline = time.monotonic() + 20
        while (task.progress is None or task.progress.downloaded < 100_000) and time.monotonic() < deadline:
            time.sleep(0.01)
        queue.cancel(task.task_id)
        assert task.done.wait(10) and task.state == State.CANCELLED
    assert not hfcache.RepoCache(hf_env, REPO).partial(sha(blob_repo)).exists()
