"""The prompt cache on disk: a conversation's engine state (KV cells, recurrent state and its checkpoints) saved after
each reply and restored for a prompt that starts with it, after a restart, a crash or a model switch.

One file per saved sequence, in the cache folder (0600 in 0700, written atomically: a temporary file, fsync, rename):

    magic "LLMTUIKV" | version (u32) | header length (u32) | header (JSON) | tokens (int32 each) | payload

The header holds the key (a hash of everything that decides the cells: the model file's identity and header, the
engine build, the KV types, the steering mix; `cache_key`), the token count, the payload's size and the SHA-256 of the
tokens and of the payload. The payload is llama.cpp's whole sequence state followed by the checkpoints (recurrent
state only) of hybrid models, each after a prefix of the tokens. Everything is checked before llama.cpp reads a byte:
a link, a file whose size is not the header's, another key, a count over the limits, a checksum that differs; such a
file is refused in one line and the prompt is evaluated instead. The folder is kept under a budget (by default the
smaller of 10 GiB and 10% of the free space), the least recently used file (by mtime, touched on each use) first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import struct
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_ext.params import EngineError
from engine_ext.private_files import private_dir, write_private_parts
from engine_ext.speculative.base import common_prefix_length
from engine_ext.untrusted_text import one_line_message

MAGIC = b"LLMTUIKV"
VERSION = 1
SUFFIX = ".kvstate"
_HEAD = struct.Struct("<8sII")  # magic, version, header length
MAX_HEADER = 64 * 1024  # bytes of JSON header: the key, counts, hashes and up to MAX_CHECKPOINTS entries
MAX_TOKENS = 1 << 24  # a state of more tokens than any context holds is not ours
MAX_CHECKPOINTS = 64
BUDGET_CAP = 10 * 1024**3  # the default budget: the smaller of 10 GiB ...
BUDGET_SHARE = 0.10  # ... and 10% of the free space (counting what the cache already holds)
MIN_GAIN_TOKENS = 32  # a saved prefix is read from disk only when it covers this many more tokens than the memory
WRITE_JOIN_S = 60.0  # how long closing waits for the saves in flight
MAX_QUEUED_BYTES = 1 << 30  # states copied out and waiting for the writer: a save past this is left out
HEADER_READ_BYTES = 1 << 20  # the model file's first MiB is hashed into its identity (its GGUF header, mostly)
_TOKEN = "i"  # int32, as llama_token
_HINT = "the prompt is evaluated instead"


class DiskCacheError(EngineError):
    """A state file refused before llama.cpp read it (one line: the file, what is wrong, what happens instead)."""


def model_identity(path: Path) -> dict[str, object]:
    """What identifies a model file for its saved states: its resolved path, size, mtime and its first MiB's hash."""
    resolved = Path(path).resolve()
    st = resolved.stat()
    digest = hashlib.sha256()
    with open(resolved, "rb") as file:
        digest.update(file.read(HEADER_READ_BYTES))
    return {"path": str(resolved), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_sha256": digest.hexdigest()}


def cache_key(parts: Mapping[str, object]) -> str:
    """The key of a set of states: a hash of `parts` (JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def default_budget(folder: Path) -> int:
    """The smaller of 10 GiB and 10% of the space the cache could use (free space plus what it holds)."""
    existing = next((f for f in (folder, *folder.parents) if f.is_dir()), folder)  # the folder may not be made yet
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return 0
    return int(min(BUDGET_CAP, BUDGET_SHARE * (free + folder_bytes(folder))))


def folder_bytes(folder: Path) -> int:
    """Bytes the state files in `folder` take."""
    return sum(size for _path, size, _mtime in _state_files(folder))


def _state_files(folder: Path) -> list[tuple[Path, int, float]]:
    """(path, size, mtime) of every state file in `folder` (links and other kinds left out)."""
    found = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.endswith(SUFFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((Path(entry.path), st.st_size, st.st_mtime))
    return found


@dataclass(frozen=True)
class StateFile:
    """A state file's verified header and tokens (its payload is read and checked by `DiskCache.load`)."""

    path: Path
    key: str
    tokens: tuple[int, ...]
    payload_size: int
    payload_sha256: str
    checkpoints: tuple[tuple[int, int], ...]  # (tokens, bytes) of each checkpoint after the full state
    model: str
    saved_at: float
    offset: int  # where the payload starts
    size: int  # the file's size
    mtime_ns: int

    def usable(self, n_common: int, truncatable: bool) -> int:
        """How many of the tokens a restore can give for a prompt sharing `n_common` of them: all of them, a
        truncation (attention-only memories), or the longest checkpoint within them (recurrent/hybrid)."""
        n_common = min(n_common, len(self.tokens))
        if n_common == len(self.tokens) or truncatable:
            return n_common
        return max((n for n, _size in self.checkpoints if n <= n_common), default=0)


def read_state_header(path: Path, max_bytes: int) -> StateFile:
    """The header and tokens of the state file `path`, checked: a regular file (not a link) of at most `max_bytes`,
    our magic and version, a bounded header, counts within limits, the exact size they add up to, and the tokens'
    checksum. DiskCacheError (one line) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise  # deleted meanwhile (evicted, replaced by a longer state): nothing to say
    except OSError as error:
        if os.path.islink(path):
            raise _refused(path, "is a symbolic link, not a file llmtui wrote") from None
        raise _refused(path, f"cannot be read ({error.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, "is not a regular file")
        if st.st_size > max_bytes:
            raise _refused(path, f"is {st.st_size} bytes, over the cache's limit of {max_bytes}")
        head = file.read(_HEAD.size)
        if len(head) < _HEAD.size:
            raise _refused(path, "is truncated (no header)")
        magic, version, header_len = _HEAD.unpack(head)
        if magic != MAGIC:
            raise _refused(path, "is not an llmtui state file (wrong magic)")
        if version != VERSION:
            raise _refused(path, f"has format version {version}, this llmtui reads {VERSION}")
        if header_len > MAX_HEADER:
            raise _refused(path, f"has a header of {header_len} bytes (at most {MAX_HEADER})")
        raw = file.read(header_len)
        if len(raw) < header_len:
            raise _refused(path, "is truncated (inside its header)")
        try:
            header = json.loads(raw)
        except ValueError:
            raise _refused(path, "has a header that is not JSON") from None
        fields = _header_fields(path, header)
        key, n_tokens, tokens_sha, payload_size, payload_sha, checkpoints, model, saved_at = fields
        offset = _HEAD.size + header_len + 4 * n_tokens
        expected = offset + payload_size
        if st.st_size != expected:
            what = "truncated" if st.st_size < expected else "longer than its header says"
            raise _refused(path, f"is {what}: {st.st_size} bytes, its header says {expected}")
        raw_tokens = file.read(4 * n_tokens)
    if hashlib.sha256(raw_tokens).hexdigest() != tokens_sha:
        raise _refused(path, "is corrupted (its tokens' checksum does not match)")
    tokens = array(_TOKEN)
    tokens.frombytes(raw_tokens)
    if sys.byteorder != "little":
        tokens.byteswap()
    return StateFile(
        path, key, tuple(tokens), payload_size, payload_sha, checkpoints, model, saved_at, offset, st.st_size,
        st.st_mtime_ns,
    )  # fmt: skip


def _header_fields(
    path: Path, header: object
) -> tuple[str, int, str, int, str, tuple[tuple[int, int], ...], str, float]:
    """The header's fields, each of its type and within its limits (DiskCacheError otherwise)."""
    if not isinstance(header, dict):
        raise _refused(path, "has a header that is not a JSON object")

    def field(name: str, kind: type) -> object:
        value = header.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _refused(path, f"has no valid {name!r} in its header")
        return value

    key = str(field("key", str))
    n_tokens = int(field("n_tokens", int))  # type: ignore[call-overload]
    payload_size = int(field("payload_size", int))  # type: ignore[call-overload]
    tokens_sha, payload_sha = str(field("tokens_sha256", str)), str(field("payload_sha256", str))
    if not 0 < n_tokens <= MAX_TOKENS:
        raise _refused(path, f"says it holds {n_tokens} tokens (1 to {MAX_TOKENS})")
    if payload_size <= 0:
        raise _refused(path, f"says its state is {payload_size} bytes")
    raw_checkpoints = field("checkpoints", list)
    assert isinstance(raw_checkpoints, list)
    if len(raw_checkpoints) > MAX_CHECKPOINTS:
        raise _refused(path, f"lists {len(raw_checkpoints)} checkpoints (at most {MAX_CHECKPOINTS})")
    checkpoints = []
    for item in raw_checkpoints:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            and 0 < item[0] <= n_tokens
            and 0 < item[1] < payload_size
        ):
            raise _refused(path, "lists a checkpoint that is not (tokens, bytes) within the state")
        checkpoints.append((int(item[0]), int(item[1])))
    if sum(size for _n, size in checkpoints) >= payload_size:
        raise _refused(path, "lists checkpoints larger than its state")
    model = header.get("model", "")
    saved_at = header.get("saved_at", 0.0)
    return (
        key,
        n_tokens,
        tokens_sha,
        payload_size,
        payload_sha,
        tuple(checkpoints),
        model if isinstance(model, str) else "",
        float(saved_at) if isinstance(saved_at, int | float) and not isinstance(saved_at, bool) else 0.0,
    )


def _refused(path: Path, problem: str) -> DiskCacheError:
    return DiskCacheError("prompt cache: " + one_line_message(path, problem, _HINT))


def list_state_files(folder: Path) -> list[tuple[Path, int, float, StateFile | None, str]]:
    """Every state file in `folder`, the most recently used first: (path, bytes, mtime, header or None, the reason
    it was refused or "")."""
    rows: list[tuple[Path, int, float, StateFile | None, str]] = []
    for path, size, mtime in _state_files(folder):
        try:
            rows.append((path, size, mtime, read_state_header(path, 1 << 62), ""))
        except FileNotFoundError:
            continue
        except DiskCacheError as error:
            rows.append((path, size, mtime, None, str(error)))
    rows.sort(key=lambda row: row[2], reverse=True)
    return rows


def clear_state_files(folder: Path) -> tuple[int, int]:
    """Delete every state file (and temporary file a killed save left) in `folder`: (files, bytes) deleted."""
    count = total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0, 0
    for entry in entries:
        if entry.name.endswith(SUFFIX) or (SUFFIX + "." in entry.name and entry.name.endswith(".tmp")):
            try:
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
            except OSError:
                continue
            count, total = count + 1, total + size
    return count, total


def budget_bytes(folder: Path, budget_mib: int) -> int:
    """The budget in bytes: `budget_mib` MiB, or the default for `folder` (0 MiB)."""
    return budget_mib << 20 if budget_mib > 0 else default_budget(folder)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size < 10 * 2**30 else f"{size / 2**30:.1f} GiB"


def usage_line(folder: Path, budget_mib: int, model: str = "") -> str:
    """One line on what the cache holds: files, size against the budget, and the bytes a token of `model` (a model
    file's name) takes, from its newest state file."""
    rows = list_state_files(folder)
    total = sum(row[1] for row in rows)
    line = f"{len(rows)} saved conversation state(s), {_mib(total)} of {_mib(budget_bytes(folder, budget_mib))}"
    for _path, size, _mtime, header, _why in rows:
        if header is not None and model and header.model == model:
            line += f"; {size / len(header.tokens) / 1024:.0f} KiB per token for {model}"
            break
    return line


class DiskCache:
    """The state files of one key (a model, engine build, KV types and steering mix) in one folder, or one file
    (`run --prompt-cache FILE`); saves run in a thread of their own, one at a time."""

    def __init__(
        self,
        folder: Path,
        parts: Mapping[str, object],
        *,
        budget: int = 0,
        single_file: Path | None = None,
        read_only: bool = False,
        model: str = "",
    ) -> None:
        # The cache folder is llmtui's (0700); the folder of a file the user named (`--prompt-cache`) is left as it is.
        self.folder = private_dir(Path(folder)) if not read_only and single_file is None else Path(folder)
        self.parts = dict(parts)
        self.key = cache_key(self.parts)
        self.budget = budget if budget > 0 else default_budget(self.folder)
        self.single_file = single_file
        self.read_only = read_only
        self.model = model
        self._notices: list[str] = []
        self._refused: set[tuple[Path, int]] = set()  # (file, mtime_ns) refused already: said once
        self._headers: dict[Path, StateFile] = {}
        self._written: dict[Path, tuple[str, tuple[int, ...]]] = {}  # files saved here: key, tokens (writer)
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._jobs: deque[tuple[str, tuple[int, ...], memoryview, tuple[tuple[int, bytes], ...]]] = deque()
        self._queued = 0  # bytes of the queued states
        self.last_save: tuple[float, int] = (0.0, 0)  # the last save's (ms in its thread, bytes)
        self._remove_stale_temporaries()

    def set_part(self, name: str, value: object) -> None:
        """Change one part of the key (the steering mix): states saved under another mix are not restored."""
        self.parts[name] = value
        self.key = cache_key(self.parts)

    def key_of(self, steering: object = None, images: Sequence[object] = (), projector: object = None) -> str:
        """The key of states computed under another steering mix (None: this cache's), after `images` (each image
        chunk's identity, in the order the tokens meet them; none: the text-only key) through `projector`."""
        parts = dict(self.parts)
        if steering is not None:
            parts["steering"] = steering
        if images:
            parts["images"], parts["projector"] = list(images), projector
        return cache_key(parts)

    def take_notices(self) -> tuple[str, ...]:
        notices, self._notices = tuple(self._notices), []
        return notices

    # ----- finding and reading ----------------------------------------------------------------------

    def _candidates(self, key: str) -> list[Path]:
        if self.single_file is not None:
            return [self.single_file] if os.path.lexists(self.single_file) else []
        prefix = key[:16] + "-"
        return [path for path, _size, _mtime in _state_files(self.folder) if path.name.startswith(prefix)] + [
            Path(entry)
            for entry in self._links()
            if Path(entry).name.startswith(prefix)  # a link named like ours is refused, not passed over
        ]

    def _links(self) -> list[str]:
        try:
            return [e.path for e in os.scandir(self.folder) if e.name.endswith(SUFFIX) and e.is_symlink()]
        except OSError:
            return []

    def header_of(self, path: Path, key: str | None = None) -> StateFile:
        """The checked header of `path`, of `key` (this cache's by default; DiskCacheError, one line, otherwise)."""
        try:
            header = read_state_header(path, self.budget or 1 << 62)
        except FileNotFoundError:
            raise _refused(path, "does not exist") from None
        if header.key != (self.key if key is None else key):
            raise _refused(path, "was saved for another model file, engine build or settings")
        return header

    def _header(self, path: Path, key: str) -> StateFile | None:
        """The file's checked header (kept while its mtime and size stay), or None (refused: said once)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        known = self._headers.get(path)
        if known is not None and known.mtime_ns == st.st_mtime_ns and known.size == st.st_size:
            return known if known.key == key else None
        if (path, st.st_mtime_ns) in self._refused:
            return None
        if not os.path.lexists(path):
            return None
        try:
            header = self.header_of(path, key)
        except DiskCacheError as error:
            self._refused.add((path, st.st_mtime_ns))
            self._notices.append(str(error))
            return None
        self._headers[path] = header
        return header

    def best(
        self, tokens: Sequence[int], have: int, *, truncatable: bool, key: str | None = None
    ) -> tuple[StateFile, int] | None:
        """The saved state of `key` (this cache's by default) that gives the most of `tokens` (more than `have` +
        MIN_GAIN_TOKENS), and how many."""
        best: tuple[StateFile, int] | None = None
        wanted = tuple(tokens)
        key = self.key if key is None else key
        for path in self._candidates(key):
            header = self._header(path, key)
            if header is None:
                continue
            usable = header.usable(common_prefix_length(header.tokens, wanted), truncatable)
            if usable >= have + MIN_GAIN_TOKENS and (best is None or usable > best[1]):
                best = (header, usable)
        return best

    def load(self, header: StateFile) -> tuple[memoryview, list[tuple[int, memoryview]]]:
        """The state and checkpoints of a file `best` found, read whole and checked against the header's checksum
        (DiskCacheError otherwise; FileNotFoundError when it was deleted meanwhile); the file is marked used (its
        mtime) for the budget's order."""
        path = header.path
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            raise  # evicted meanwhile: the prompt is evaluated, nothing to say
        except OSError as error:
            raise _refused(path, f"cannot be read ({error.strerror})") from None
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(file.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size != header.size or st.st_mtime_ns != header.mtime_ns:
                raise _refused(path, "changed since its header was read")
            file.seek(header.offset)
            payload = bytearray(header.payload_size)
            if file.readinto(payload) != header.payload_size:
                raise _refused(path, "is truncated")
        if hashlib.sha256(payload).hexdigest() != header.payload_sha256:
            self._refused.add((path, header.mtime_ns))
            self._headers.pop(path, None)
            raise _refused(path, "is corrupted (its state's checksum does not match)")
        with contextlib.suppress(OSError):
            os.utime(path)
            self._headers.pop(path, None)  # its mtime changed: read again next time (cheap, the tokens only)
        view = memoryview(payload)
        end = header.payload_size - sum(size for _n, size in header.checkpoints)
        state, checkpoints, at = view[:end], [], end
        for n, size in header.checkpoints:
            checkpoints.append((n, view[at : at + size]))
            at += size
        return state, checkpoints

    # ----- saving -----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a save is still being written (the next one waits for a later reply: saving never blocks)."""
        with self._lock:
            return bool(self._jobs)

    def save(
        self,
        tokens: Sequence[int],
        state: memoryview,
        checkpoints: Sequence[tuple[int, bytes]],
        *,
        key: str | None = None,
    ) -> None:
        """Write the state after `tokens` (and checkpoints within them) under `key` (this cache's by default) in the
        writer's thread, after the saves queued before it (never waiting for them: a save past MAX_QUEUED_BYTES
        queued is left out); the buffers are this call's to keep (the caller made them for it)."""
        if self.read_only or not tokens:
            return
        size = len(state) + sum(len(data) for _n, data in checkpoints) + 4 * len(tokens)
        if self.budget and size > self.budget:
            self._notices.append(
                f"prompt cache: this conversation's state ({size >> 20} MiB) is over the cache's budget "
                f"({self.budget >> 20} MiB), so it is not saved"
            )
            return
        if self.single_file is not None and not _ours_or_missing(self.single_file):
            self._notices.append(
                "prompt cache: " + one_line_message(self.single_file, "is not an llmtui state file", "left as it is")
            )
            return
        job = (self.key if key is None else key, tuple(tokens), state, tuple(checkpoints[-MAX_CHECKPOINTS:]))
        with self._lock:
            if self._jobs and self._queued + size > MAX_QUEUED_BYTES:
                self._notices.append(f"prompt cache: {self._queued >> 20} MiB wait to be written; this state is not")
                return
            self._jobs.append(job)
            self._queued += size
            if self._writer is None:
                self._writer = threading.Thread(target=self._drain, name="llmtui-state-save", daemon=True)
                self._writer.start()

    def _drain(self) -> None:
        """The writer's thread: the queued saves in order, each left in the queue (`busy`) until it is written."""
        while True:
            with self._lock:
                if not self._jobs:
                    self._writer = None
                    return
                job = self._jobs[0]
            try:
                self._write(*job)
            except Exception as error:  # a bug must not leave the queue stuck: said, and the next save goes on
                self._notices.append(f"prompt cache: a save failed ({type(error).__name__}: {error})")
            with self._lock:
                self._jobs.popleft()
                self._queued -= len(job[2]) + sum(len(d) for _n, d in job[3]) + 4 * len(job[1])

    def wait(self, timeout: float = WRITE_JOIN_S) -> None:
        """Wait for the saves queued so far (at most `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while (writer := self._writer) is not None and time.monotonic() < deadline:
            writer.join(max(0.0, deadline - time.monotonic()))

    def _path_for(self, tokens: tuple[int, ...], key: str | None = None) -> Path:
        if self.single_file is not None:
            return self.single_file
        key = self.key if key is None else key
        return self.folder / f"{key[:16]}-{hashlib.sha256(_token_bytes(tokens)).hexdigest()[:24]}{SUFFIX}"

    def _write(
        self, key: str, tokens: tuple[int, ...], state: memoryview, checkpoints: tuple[tuple[int, bytes], ...]
    ) -> None:
        t0 = time.perf_counter()
        raw_tokens = _token_bytes(tokens)
        payload_sha = hashlib.sha256(state)
        for _n, data in checkpoints:
            payload_sha.update(data)
        payload_size = len(state) + sum(len(data) for _n, data in checkpoints)
        header = json.dumps(
            {
                "key": key,
                "n_tokens": len(tokens),
                "tokens_sha256": hashlib.sha256(raw_tokens).hexdigest(),
                "payload_size": payload_size,
                "payload_sha256": payload_sha.hexdigest(),
                "checkpoints": [[n, len(data)] for n, data in checkpoints],
                "model": self.model,
                "saved_at": time.time(),
            }
        ).encode()
        path = self._path_for(tokens, key)
        parts: list[bytes | bytearray | memoryview] = [_HEAD.pack(MAGIC, VERSION, len(header)), header, raw_tokens]
        parts += [state, *(d for _n, d in checkpoints)]
        try:
            write_private_parts(path, parts, durable=True)
        except OSError as error:
            self._notices.append(f"prompt cache: cannot save to {path}: {error.strerror}")
            return
        if self.single_file is None:
            self._drop_superseded(path, key, tokens)
            self._evict(keep=path)
        self.last_save = ((time.perf_counter() - t0) * 1000.0, len(header) + len(raw_tokens) + payload_size)

    def _drop_superseded(self, path: Path, key: str, tokens: tuple[int, ...]) -> None:
        """Delete the files of `key` whose tokens the new file starts with (it restores all they did, and more)."""
        known = {other: (header.key, header.tokens) for other, header in list(self._headers.items())}
        known.update(self._written)
        for other, (other_key, saved) in known.items():
            if other != path and other_key == key and len(saved) < len(tokens) and tokens[: len(saved)] == saved:
                with contextlib.suppress(OSError):
                    os.unlink(other)
                self._written.pop(other, None)
        self._written[path] = (key, tokens)

    def _evict(self, keep: Path) -> None:
        """Delete the least recently used files until the folder is within the budget."""
        files = sorted(_state_files(self.folder), key=lambda f: f[2])
        total = sum(size for _p, size, _m in files)
        for path, size, _mtime in files:
            if total <= self.budget:
                break
            if path == keep:
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size

    def _remove_stale_temporaries(self) -> None:
        """Delete the temporary files of saves whose process is gone (killed while writing)."""
        if self.read_only or self.single_file is not None:
            return
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        for entry in entries:
            name = entry.name
            if not (name.endswith(".tmp") and SUFFIX + "." in name):
                continue
            pid = name.split(SUFFIX + ".", 1)[1].split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)

    def close(self) -> None:
        self.wait()


def _ours_or_missing(path: Path) -> bool:
    """Whether `path` may be written: missing, or a regular file that starts with our magic (a file the user named by
    mistake, a model say, is never overwritten)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    with os.fdopen(fd, "rb") as file:
        return stat.S_ISREG(os.fstat(file.fileno()).st_mode) and file.read(len(MAGIC)) == MAGIC


def _token_bytes(tokens: Sequence[int]) -> bytes:
    values = array(_TOKEN, tokens)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
