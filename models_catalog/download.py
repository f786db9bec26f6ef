"""Resumable, verified downloads into the Hugging Face cache, with pause, cancel and progress (the queue that runs
them: download_queue.py).

huggingface_hub's own transfer is not used for the bytes: it neither resumes a partial file left by another
process (it writes to a per-process temporary name) nor checks the sha256 of what it wrote. Here the partial
file has a stable name (`blobs/<oid>.incomplete`), so any later pull, after a restart or a `kill -9`, resumes
it with an HTTP Range request; the file is hashed as it is written and installed only when its sha256 (LFS) or
git blob id matches the Hub's. The cache layout and the blob lock are huggingface_hub's, so its
`hf_hub_download`, llama.cpp's `-hf` and llmtui share the files and never fetch the same blob at once.
"""

from __future__ import annotations

import collections
import enum
import errno
import hashlib
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from engine_ext.private_files import PRIVATE_FILE_MODE
from engine_ext.untrusted_text import one_line_message
from models_catalog import hfcache
from models_catalog.errors import (
    ChecksumMismatch,
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    ModelsError,
    NotEnoughDiskSpace,
    OfflineError,
)
from models_catalog.transport import Response, TransientHTTPError, hub_headers, open_url, raise_for_status


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository at a commit, as the Hub's tree lists it."""

    repo_id: str
    path: str
    size: int
    oid: str  # the blob's name in the cache: the LFS sha256, else the git blob id (sha1)
    commit: str
    url: str  # `{endpoint}/{repo}/resolve/{commit}/{path}`
    sha256: str | None = None  # LFS files only

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class TransferOptions:
    """Knobs of one transfer; tests shrink the timeouts."""

    chunk_size: int = 1 << 20
    stall_timeout: float = 30.0  # no byte for this long: drop the connection and reconnect
    # Fewer bytes than this per second, over a stall_timeout window, is a stall too: a server dripping a byte a
    # second never trips the socket's timeout. Its bytes are kept; the attempt counts as failed.
    min_rate: float = 1024.0
    max_retries: int = 8  # consecutive failed attempts without a byte of progress
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    max_checksum_failures: int = 2
    progress_interval: float = 0.25
    lock_poll: float = 0.5


class State(enum.StrEnum):
    """Where a download is."""

    QUEUED = "queued"
    WAITING = "waiting"  # another process holds the blob lock
    CHECKING = "checking"  # hashing the bytes already on disk before resuming
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({State.DONE, State.FAILED, State.CANCELLED})
PARTIAL_FILE_MODE = PRIVATE_FILE_MODE  # a partial download is owner-only until it is verified and installed


@dataclass(frozen=True)
class Progress:
    """A progress event: bytes on disk, rate (bytes/s over the last seconds), ETA, state and message."""

    task_id: int
    repo_id: str
    path: str
    state: State
    downloaded: int
    total: int
    rate: float = 0.0
    eta: float | None = None
    message: str = ""
    local_path: str | None = None

    @property
    def fraction(self) -> float:
        return self.downloaded / self.total if self.total else 1.0


ProgressCallback = Callable[[Progress], None]


class Control:
    """Stop requests for a transfer in progress; a stop also aborts the read that is blocking."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._response: Response | None = None
        self._wake = threading.Event()

    @property
    def reason(self) -> str | None:
        """None while running, else "pause" or "cancel"."""
        return self._reason

    def request_stop(self, reason: str) -> None:
        with self._lock:
            self._reason = reason
            response = self._response
        self._wake.set()
        if response is not None:
            response.abort()

    def reset(self) -> None:
        with self._lock:
            self._reason = None
        self._wake.clear()

    def check(self) -> None:
        if self._reason is not None:
            raise DownloadCancelled(f"download {'paused' if self._reason == 'pause' else 'cancelled'}")

    def sleep(self, seconds: float) -> None:
        """Sleep unless a stop arrives first."""
        self._wake.wait(seconds)
        self.check()

    def attach(self, response: Response | None) -> None:
        with self._lock:
            self._response = response
            stopped = self._reason is not None
        if stopped and response is not None:
            response.abort()


class _RateMeter:
    """Bytes per second over a sliding window."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, total: int) -> float:
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        return (total - b0) / (now - t0) if now > t0 else 0.0


# Seams for tests (a full disk, a small disk) without a real small filesystem.
def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])
    return written


def _fmt_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class _Hasher:
    """sha256 for LFS files, the git blob id (sha1 of `blob <size>\\0` + bytes) otherwise."""

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        self.reset()

    def reset(self) -> None:
        if self.file.sha256:
            self.h = hashlib.sha256()
        else:
            self.h = hashlib.sha1(f"blob {self.file.size}\0".encode(), usedforsecurity=False)

    def update(self, data: bytes | memoryview) -> None:
        self.h.update(data)

    @property
    def expected(self) -> str:
        return (self.file.sha256 or self.file.oid).lower()

    def matches(self) -> bool:
        return self.h.hexdigest() == self.expected


def installed_path(file: RemoteFile, cache_root: Path | None = None) -> Path | None:
    """The snapshot path of a file already in the cache (its blob present), else None."""
    rc = hfcache.RepoCache(cache_root or hfcache.cache_dir(), file.repo_id)
    pointer = rc.pointer(file.commit, file.path)
    if pointer.exists():
        return pointer
    blob = rc.blob(file.oid)
    if blob.is_file() and blob.stat().st_size == file.size:
        hfcache.link_pointer(blob, pointer)
        return pointer
    return None


def partial_size(file: RemoteFile, cache_root: Path | None = None) -> int | None:
    """The bytes of a file's partial download on disk; None when there is none."""
    try:
        return hfcache.RepoCache(cache_root or hfcache.cache_dir(), file.repo_id).partial(file.oid).stat().st_size
    except (OSError, ValueError):
        return None


def discard_partial(file: RemoteFile, cache_root: Path | None = None) -> bool:
    """Delete a file's partial download unless a process (this one included) is writing it."""
    rc = hfcache.RepoCache(cache_root or hfcache.cache_dir(), file.repo_id)
    lock_path = rc.lock(file.oid)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path), mode=PRIVATE_FILE_MODE)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    try:
        rc.partial(file.oid).unlink(missing_ok=True)
        return True
    finally:
        lock.release()


def fetch(
    file: RemoteFile,
    *,
    cache_root: Path | None = None,
    options: TransferOptions | None = None,
    on_progress: ProgressCallback | None = None,
    control: Control | None = None,
    task_id: int = 0,
    discard_on_cancel: bool = False,
) -> Path:
    """Download one file into the hub cache (resuming, verifying) and return its snapshot path."""
    return _Fetch(file, cache_root, options or TransferOptions(), on_progress, control or Control(), task_id).run(
        discard_on_cancel
    )


class _Fetch:
    def __init__(
        self,
        file: RemoteFile,
        cache_root: Path | None,
        options: TransferOptions,
        on_progress: ProgressCallback | None,
        control: Control,
        task_id: int,
    ) -> None:
        self.file = file
        self.rc = hfcache.RepoCache(cache_root or hfcache.cache_dir(), file.repo_id)
        self.opts = options
        self.on_progress = on_progress
        self.control = control
        self.task_id = task_id
        self.partial = self.rc.partial(file.oid)
        self.offset = 0
        self.hasher = _Hasher(file)
        self.meter = _RateMeter()
        self.last_report = 0.0

    @property
    def where(self) -> str:
        """The file as messages name it (one_line_message keeps the end of a long one)."""
        return f"{self.file.repo_id}/{self.file.path}"

    # -- events --------------------------------------------------------------------------------------

    def report(self, state: State, message: str = "", *, force: bool = True, local_path: str | None = None) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        rate = self.meter.add(now, self.offset) if state == State.DOWNLOADING else 0.0
        if not force and now - self.last_report < self.opts.progress_interval:
            return
        self.last_report = now
        remaining = self.file.size - self.offset
        eta = remaining / rate if rate > 0 else None
        self.on_progress(
            Progress(
                self.task_id,
                self.file.repo_id,
                self.file.path,
                state,
                self.offset,
                self.file.size,
                rate,
                eta,
                message,
                local_path,
            )
        )

    # -- steps ---------------------------------------------------------------------------------------

    def run(self, discard_on_cancel: bool) -> Path:
        existing = installed_path(self.file, self.rc.root)
        if existing is not None:
            self.offset = self.file.size
            self.report(State.DONE, "already downloaded", local_path=str(existing))
            return existing
        if hfcache.is_offline():
            raise OfflineError(
                one_line_message(
                    self.where, "not in the cache and HF_HUB_OFFLINE=1 is set", "unset HF_HUB_OFFLINE to download it"
                )
            )
        lock_path = self.rc.lock(self.file.oid)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(lock_path), mode=PRIVATE_FILE_MODE)
        waiting = False
        while True:
            self.control.check()
            try:
                lock.acquire(timeout=self.opts.lock_poll)
                break
            except filelock.Timeout:
                if not waiting:
                    self.report(State.WAITING, "another process is downloading this file; waiting for it")
                    waiting = True
        try:
            existing = installed_path(self.file, self.rc.root)  # the other process may have finished it
            if existing is not None:
                self.offset = self.file.size
                self.report(State.DONE, "downloaded by another process", local_path=str(existing))
                return existing
            try:
                self.download_verified()
            except DownloadCancelled:
                if discard_on_cancel and self.control.reason == "cancel":
                    self.partial.unlink(missing_ok=True)
                raise
            return self.install()
        finally:
            lock.release()

    def download_verified(self) -> None:
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        failures = 0
        while True:
            self.start_from_disk()
            self.transfer()
            self.report(State.VERIFYING, "checking sha256" if self.file.sha256 else "checking the git blob id")
            if self.hasher.matches():
                return
            got = self.hasher.h.hexdigest()
            self.partial.unlink(missing_ok=True)
            failures += 1
            if failures >= self.opts.max_checksum_failures:
                raise ChecksumMismatch(
                    one_line_message(
                        self.where,
                        f"the downloaded bytes hash to {got[:12]}…, the Hub says {self.hasher.expected[:12]}…, "
                        f"{failures} times; the file was not installed",
                        "the server or a proxy is corrupting data; try again later or from another network",
                    )
                )
            self.report(State.DOWNLOADING, "checksum mismatch: the file was discarded and is fetched again")

    def start_from_disk(self) -> None:
        """Resume from the partial file: hash what is there (truncating anything past the end)."""
        self.hasher.reset()
        size = self.partial.stat().st_size if self.partial.exists() else 0
        if size > self.file.size:
            os.truncate(self.partial, 0)
            size = 0
        remaining = self.file.size - size
        free = _free_bytes(self.partial.parent)
        if free < remaining:
            raise NotEnoughDiskSpace(
                one_line_message(
                    self.where,
                    f"needs {_fmt_size(remaining)} more but only {_fmt_size(free)} is free in the cache's disk",
                    "free some space (llmtui models rm ...) or point HF_HUB_CACHE at a larger disk, then pull again",
                )
            )
        self.offset = 0
        if size:
            self.report(State.CHECKING, f"resuming: checking the {_fmt_size(size)} already downloaded")
            with open(self.partial, "rb") as fh:
                while self.offset < size:
                    self.control.check()
                    data = fh.read(min(self.opts.chunk_size * 4, size - self.offset))
                    if not data:
                        break
                    self.hasher.update(data)
                    self.offset += len(data)
            if self.offset != size:  # shrank under us: start over
                os.truncate(self.partial, 0)
                self.hasher.reset()
                self.offset = 0

    def restart(self, fd: int, why: str) -> None:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        self.hasher.reset()
        self.offset = 0
        self.report(State.DOWNLOADING, why)

    def write(self, fd: int, data: bytes) -> None:
        try:
            _write_all(fd, data)
        except OSError as exc:
            # what reached the disk is still a correct prefix; make the file say exactly what we hashed
            try:
                os.ftruncate(fd, self.offset)
            except OSError:
                pass
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(
                    one_line_message(
                        self.partial,
                        f"the disk is full after {_fmt_size(self.offset)} of {_fmt_size(self.file.size)}",
                        "free some space and pull again: the partial file is kept and resumes where it stopped",
                    )
                ) from None
            raise DownloadError(
                one_line_message(
                    self.partial, f"cannot write ({exc.strerror or exc})", "check the disk and permissions"
                )
            ) from None
        self.hasher.update(data)
        self.offset += len(data)

    def transfer(self) -> None:
        failures = 0
        # The partial file is owner-only (0600) until it is verified and installed (see install).
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), PARTIAL_FILE_MODE)
        try:
            if os.name == "posix" and os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, PARTIAL_FILE_MODE)  # a partial file left by an older version
            os.lseek(fd, self.offset, os.SEEK_SET)
            while self.offset < self.file.size:
                self.control.check()
                before = self.offset
                try:
                    self.attempt(fd)
                except (TransientHTTPError, OSError) as exc:
                    self.control.check()
                    slow = isinstance(exc, _TooSlow)
                    failures = 0 if self.offset > before and not slow else failures + 1
                    reason = _describe_failure(exc, self.opts.stall_timeout)
                    if failures > self.opts.max_retries:
                        raise DownloadError(
                            one_line_message(
                                self.where,
                                f"{reason}; gave up after {failures} attempts at byte {self.offset} of "
                                f"{self.file.size}",
                                "the partial file is kept: pull again to resume",
                            )
                        ) from None
                    delay = (
                        0.0
                        if failures == 0
                        else min(self.opts.backoff_max, self.opts.backoff_base * 2 ** (failures - 1))
                        * random.uniform(0.5, 1.0)
                    )
                    asked = getattr(exc, "retry_after", None)
                    if asked is not None:  # the server's Retry-After, within our own backoff's ceiling
                        delay = max(delay, min(float(asked), self.opts.backoff_max))
                    self.report(State.DOWNLOADING, f"{reason}; reconnecting" + (f" in {delay:.0f} s" if delay else ""))
                    if delay:
                        self.control.sleep(delay)
            os.fsync(fd)
        finally:
            os.close(fd)

    def attempt(self, fd: int) -> None:
        """One request from the current offset to the end (or until the connection breaks)."""
        extra = {"Range": f"bytes={self.offset}-"} if self.offset else {}
        resp = open_url(
            self.file.url,
            headers=hub_headers(extra),
            timeout=self.opts.stall_timeout,
            time_limit=2 * self.opts.stall_timeout,
            stream=True,
            what=self.file.path,
        )
        self.control.attach(resp)
        try:
            if resp.status == 416:
                resp.close()
                self.restart(fd, "the server refused the resume point; starting over")
                raise TransientHTTPError("range not satisfiable")
            raise_for_status(resp, self.file.repo_id, self.file.path)
            if self.offset and resp.status == 200:
                self.restart(fd, "the server ignored the Range request; starting over")
            elif resp.status == 206:
                start = _content_range_start(resp.header("Content-Range"))
                if start != self.offset:
                    self.restart(fd, f"the server resumed at byte {start}, not {self.offset}; starting over")
                    raise TransientHTTPError(f"unexpected Content-Range {resp.header('Content-Range')!r}")
            self.report(State.DOWNLOADING, force=True)
            window_start, window_offset = time.monotonic(), self.offset
            while self.offset < self.file.size:
                data = resp.read(min(self.opts.chunk_size, self.file.size - self.offset))
                self.control.check()
                if not data:
                    raise TransientHTTPError(f"connection closed at byte {self.offset} of {self.file.size}")
                self.write(fd, data)
                self.report(State.DOWNLOADING, force=False)
                now = time.monotonic()
                if now - window_start >= self.opts.stall_timeout:
                    got = self.offset - window_offset
                    if got < self.opts.min_rate * (now - window_start):
                        raise _TooSlow(
                            f"{resp.server} sent only {_fmt_size(got)} in {now - window_start:.0f} s (under "
                            f"{_fmt_size(self.opts.min_rate)}/s)"
                        )
                    window_start, window_offset = now, self.offset
        finally:
            self.control.attach(None)
            resp.close()

    def install(self) -> Path:
        blob = self.rc.blob(self.file.oid)
        if os.name == "posix":
            # The Hugging Face cache is shared with huggingface_hub and llama.cpp's -hf: an installed blob gets
            # the mode huggingface_hub gives its blobs (0666 less the umask), not the partial file's 0600.
            os.chmod(self.partial, 0o666 & ~_umask())
        os.replace(self.partial, blob)
        pointer = self.rc.pointer(self.file.commit, self.file.path)
        hfcache.link_pointer(blob, pointer)
        self.rc.write_ref(self.file.commit)
        self.report(State.DONE, "installed", local_path=str(pointer))
        return pointer


class _TooSlow(TransientHTTPError):
    """The server sent bytes, but fewer than TransferOptions.min_rate per second."""


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask sets it; threads race on that)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def _describe_failure(exc: BaseException, stall_timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"stalled: no data for {stall_timeout:g} s"
    if isinstance(exc, TransientHTTPError):
        return str(exc)
    return f"network error ({type(exc).__name__}: {exc})"


# ----- a queued download (download_queue.DownloadQueue runs them) ------------------------------------------


@dataclass
class DownloadTask:
    """A queued file download and its latest progress."""

    task_id: int
    file: RemoteFile
    state: State = State.QUEUED
    progress: Progress | None = None
    path: Path | None = None
    error: ModelsError | None = None
    control: Control = field(default_factory=Control)
    done: threading.Event = field(default_factory=threading.Event)
