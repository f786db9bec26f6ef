"""A local Hugging Face Hub on 127.0.0.1 for tests: the API subset huggingface_hub and llmtui use, with faults."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.quiet_http import QuietHTTPServer

GOOD_TOKEN = "hf_test_token_ok"
_PIECE = 16 * 1024


@dataclass
class HubFile:
    """A file in a test repository; .gguf files and large files are stored as LFS, like the Hub does."""

    path: str
    data: bytes
    lfs: bool

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        if self.lfs:  # the git blob is the LFS pointer
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
            return hashlib.sha1(f"blob {len(pointer)}\0{pointer}".encode()).hexdigest()
        return hashlib.sha1(f"blob {self.size}\0".encode() + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    gated: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-01-01T00:00:00.000Z"
    tags: tuple[str, ...] = ("gguf",)

    @property
    def commit(self) -> str:
        h = hashlib.sha1(self.repo_id.encode())
        for path in sorted(self.files):
            h.update(path.encode() + b"\0" + self.files[path].sha256.encode())
        return h.hexdigest()

    def summary(self) -> dict[str, Any]:
        return {
            "_id": hashlib.md5(self.repo_id.encode()).hexdigest()[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "downloads": self.downloads,
            "likes": self.likes,
            "lastModified": self.last_modified,
            "createdAt": self.last_modified,
            "gated": "manual" if self.gated else False,
            "private": False,
            "tags": list(self.tags),
            "library_name": "gguf",
        }


@dataclass
class Faults:
    """Misbehaviour of the data endpoint for one file; counters go down as faults fire."""

    drop_at: int | None = None  # close the connection once the response reaches this file offset
    drop_times: int = 1
    ignore_range: bool = False
    stall_at: int | None = None  # stop sending (connection open) at this file offset
    stall_seconds: float = 0.0
    stall_times: int = 1
    errors_5xx: int = 0  # answer this many data requests with 503
    retry_after: str | None = None  # the Retry-After header those 503s carry
    slow_times: int = 0  # send this many responses at slow_bps (a drip the client should give up on and resume)
    slow_bps: int = 100
    corrupt_times: int = 0  # flip the byte at corrupt_offset in this many responses
    corrupt_offset: int = 0
    throttle_bps: int | None = None  # bytes per second


@dataclass
class RequestLog:
    method: str
    path: str
    range: str | None
    status: int
    sent: int = 0  # body bytes written
    start: int = 0  # file offset of the first body byte
    done: threading.Event = field(default_factory=threading.Event)  # the handler is through with the body


@dataclass
class HubServer:
    """The server; start() binds 127.0.0.1 on a free port. Register repos with add_repo()."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    faults: dict[tuple[str, str], Faults] = field(default_factory=dict)
    requests: list[RequestLog] = field(default_factory=list)
    redirect_lfs: bool = True  # resolve LFS files with a 302 to /cdn/..., as the real Hub does
    _httpd: QuietHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    # -- setup ---------------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        *,
        gated: bool = False,
        downloads: int = 0,
        likes: int = 0,
        last_modified: str = "2026-01-01T00:00:00.000Z",
        tags: tuple[str, ...] = ("gguf",),
    ) -> HubRepo:
        hub_files = {}
        for path, content in files.items():
            data = content.read_bytes() if isinstance(content, Path) else content
            hub_files[path] = HubFile(path, data, lfs=path.endswith(".gguf") or len(data) > 10 * 1024 * 1024)
        repo = HubRepo(repo_id, hub_files, gated, downloads, likes, last_modified, tags)
        self.repos[repo_id] = repo
        return repo

    def fault(self, repo_id: str, path: str, **kwargs: Any) -> Faults:
        faults = Faults(**kwargs)
        self.faults[(repo_id, path)] = faults
        return faults

    def data_requests(self, path: str | None = None, *, settled: bool = False) -> list[RequestLog]:
        """GETs that served file bytes (optionally of one file path). `settled`: first wait (a few seconds at most)
        until their handlers are through: a client can have read the last bytes before the server counted them."""
        with self._lock:
            logs = list(self.requests)
        found = [
            r for r in logs if r.method == "GET" and "#" in r.path and (path is None or r.path.endswith("#" + path))
        ]
        if settled:
            deadline = time.monotonic() + 5.0
            for r in found:
                r.done.wait(max(0.0, deadline - time.monotonic()))
        return found

    @property
    def url(self) -> str:
        assert self._httpd is not None
        port = self._httpd.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, entry: RequestLog) -> RequestLog:
        with self._lock:
            self.requests.append(entry)
        return entry


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing ------------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.hub.log(RequestLog(self.command, self.path, self.headers.get("Range"), status, len(body)))

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self, repo: HubRepo) -> bool:
        return not repo.gated or self.headers.get("Authorization") == f"Bearer {GOOD_TOKEN}"

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        segs = [unquote(s) for s in parts.path.split("/") if s]
        if segs[:2] == ["api", "models"]:
            if len(segs) == 2:
                return self._search(query)
            if len(segs) < 4:
                return self._error(404, "RepoNotFound", "Repository not found")
            repo = self.hub.repos.get(f"{segs[2]}/{segs[3]}")
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            rest = segs[4:]
            if not rest or rest[0] == "revision":
                if rest and rest[1:] and rest[1] not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", "Invalid rev id")
                return self._info(repo)
            if rest[0] == "refs":
                return self._json(
                    {
                        "branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": repo.commit}],
                        "converts": [],
                        "tags": [],
                    }
                )
            if rest[0] == "tree" and len(rest) >= 2:
                if rest[1] not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", "Invalid rev id")
                return self._tree(repo, "/".join(rest[2:]), query.get("recursive", "").lower() in ("true", "1"))
            return self._error(404, "EntryNotFound", "not found")
        if segs and segs[0] == "cdn" and len(segs) == 2:
            for repo in self.hub.repos.values():
                for f in repo.files.values():
                    if f.sha256 == segs[1]:
                        return self._data(repo, f)
            return self._error(404, "EntryNotFound", "no such object")
        if len(segs) >= 5 and segs[2] == "resolve":
            repo = self.hub.repos.get(f"{segs[0]}/{segs[1]}")
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            if segs[3] not in ("main", repo.commit):
                return self._error(404, "RevisionNotFound", "Invalid rev id")
            if not self._authorized(repo):
                return self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo.repo_id} is restricted. You must have "
                    "access to it and be authenticated to access it. Please log in.",
                )
            found = repo.files.get("/".join(segs[4:]))
            if found is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            if found.lfs and self.hub.redirect_lfs:
                headers = self._file_headers(repo, found)
                headers["Location"] = f"/cdn/{found.sha256}"
                return self._send(302, b"", headers)
            return self._data(repo, found)
        return self._error(404, "EntryNotFound", "not found")

    # -- API -----------------------------------------------------------------------------------------

    def _search(self, q: dict[str, str]) -> None:
        repos = list(self.hub.repos.values())
        if q.get("search"):
            repos = [r for r in repos if q["search"].lower() in r.repo_id.lower()]
        if q.get("author"):
            repos = [r for r in repos if r.repo_id.split("/")[0] == q["author"]]
        if q.get("filter"):
            repos = [r for r in repos if q["filter"] in r.tags]
        key = {
            "downloads": "downloads",
            "likes": "likes",
            "lastModified": "last_modified",
            "createdAt": "last_modified",
        }.get(q.get("sort", ""), "downloads")
        repos.sort(key=lambda r: getattr(r, key), reverse=True)
        limit = int(q.get("limit", "1000"))
        self._json([r.summary() for r in repos[:limit]])

    def _info(self, repo: HubRepo) -> None:
        info = repo.summary()
        info["sha"] = repo.commit
        info["siblings"] = [{"rfilename": p} for p in repo.files]
        self._json(info)

    def _tree(self, repo: HubRepo, under: str, recursive: bool) -> None:
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        entries: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for path, f in repo.files.items():
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            parts = rel.split("/")
            for i in range(1, len(parts)):
                dirs.add(prefix + "/".join(parts[:i]))
            if not recursive and len(parts) > 1:
                continue
            entry: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            entries.append(entry)
        for d in sorted(dirs):
            if recursive or "/" not in d[len(prefix) :]:
                entries.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
        entries.sort(key=lambda e: e["path"])
        self._json(entries)

    # -- file bytes ----------------------------------------------------------------------------------

    def _file_headers(self, repo: HubRepo, f: HubFile) -> dict[str, str]:
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{f.etag}"', "Accept-Ranges": "bytes"}
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
        return headers

    def _data(self, repo: HubRepo, f: HubFile) -> None:
        if not self._authorized(repo):
            return self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
        faults = self.hub.faults.get((repo.repo_id, f.path)) or Faults()
        if self.command == "GET" and faults.errors_5xx > 0:
            faults.errors_5xx -= 1
            if faults.retry_after is not None:
                return self._send(503, b"try again", {"Retry-After": faults.retry_after})
            return self._error(503, "ServiceUnavailable", "try again")
        headers = self._file_headers(repo, f)
        size = f.size
        start, end, status = 0, size - 1, 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and not faults.ignore_range:
            a, _, b = wanted[6:].partition("-")
            start = int(a) if a else 0
            end = min(int(b), size - 1) if b else size - 1
            if start >= size:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, b"", headers)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        entry = self.hub.log(RequestLog(self.command, self.path + "#" + f.path, wanted, status, 0, start))
        try:
            self._send_body(f, entry, start, end, faults)
        finally:
            entry.done.set()

    def _send_body(self, f: HubFile, entry: RequestLog, start: int, end: int, faults: Faults) -> None:
        if self.command == "HEAD":
            return
        slow = faults.slow_times > 0
        if slow:
            faults.slow_times -= 1
        throttle = faults.slow_bps if slow else faults.throttle_bps
        if throttle:  # keep the bytes in flight few, so tests can count what a client lost
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        body = bytearray(f.data[start : end + 1])
        if faults.corrupt_times > 0 and start <= faults.corrupt_offset <= end:
            faults.corrupt_times -= 1
            body[faults.corrupt_offset - start] ^= 0xFF
        pos = 0
        while pos < len(body):
            offset = start + pos
            piece = max(1, throttle // 4) if slow else _PIECE  # a drip: a few bytes four times a second
            for at in (faults.drop_at, faults.stall_at):
                if at is not None and offset < at:
                    piece = min(piece, at - offset)
            if faults.drop_at is not None and faults.drop_times > 0 and offset >= faults.drop_at:
                faults.drop_times -= 1
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if faults.stall_at is not None and faults.stall_times > 0 and offset >= faults.stall_at:
                faults.stall_times -= 1
                self.wfile.flush()
                deadline = time.monotonic() + faults.stall_seconds
                while time.monotonic() < deadline and not self.hub.stopping.is_set():
                    time.sleep(0.02)
            chunk = bytes(body[pos : pos + piece])
            self.wfile.write(chunk)
            pos += len(chunk)
            entry.sent = pos
            if throttle:
                time.sleep(len(chunk) / throttle)
        self.wfile.flush()


def tiny_repo_files(models: dict[str, Path], layout: dict[str, str]) -> dict[str, bytes | Path]:
    """{path in repo: tiny model kind} -> {path in repo: file}, for add_repo."""
    return {path: models[kind] for path, kind in layout.items()}
