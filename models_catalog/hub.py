"""The Hugging Face Hub, read with limits (transport): search, a repo's GGUF files grouped by quant, sidecars, card."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode, urljoin

from huggingface_hub import hf_hub_url

from engine_ext.untrusted_text import shown
from models_catalog import hfcache, pairing, transport
from models_catalog.download import RemoteFile
from models_catalog.errors import HubError, OfflineError, RepoNotFound
from models_catalog.transport import gated_message as gated_message  # the screens and the CLI use hub.gated_message
from models_catalog.transport import hub_headers, open_url, raise_for_status

SortKey = Literal["downloads", "likes", "updated"]
_SORT: dict[str, str] = {"downloads": "downloads", "likes": "likes", "updated": "lastModified"}
MAX_CARD_BYTES = 1 << 20
MAX_LISTED_FILES = 100_000  # a listing longer than this is not read on (the largest GGUF repos hold hundreds)


@dataclass(frozen=True)
class RepoSummary:
    """One search hit."""

    repo_id: str
    author: str | None
    downloads: int
    likes: int
    last_modified: str | None
    gated: bool
    tags: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "author": self.author,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified,
            "gated": self.gated,
            "tags": list(self.tags),
        }


@dataclass(frozen=True)
class QuantGroup:
    """One downloadable model variant: a quant tag and its file(s) (split shards grouped as one)."""

    tag: str
    primary: str  # the file (first shard) llama.cpp loads
    files: tuple[RemoteFile, ...]
    sidecars: dict[str, str] = field(default_factory=dict)  # kind -> path, by find_best_sibling

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bits(self) -> int:
        return pairing.tag_bits(self.tag)

    @property
    def n_shards(self) -> int:
        return len(self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "primary": self.primary,
            "files": [f.path for f in self.files],
            "size": self.size,
            "sidecars": dict(self.sidecars),
        }


@dataclass(frozen=True)
class RepoListing:
    """A repository at a commit: its files and facts shown before a download."""

    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]
    gated: bool = False
    tags: tuple[str, ...] = ()
    downloads: int = 0
    likes: int = 0
    last_modified: str | None = None
    from_cache: bool = False

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def file(self, path: str) -> RemoteFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    @property
    def gguf_files(self) -> list[RemoteFile]:
        return [f for f in self.files if f.path.endswith(".gguf")]

    def quant_groups(self) -> list[QuantGroup]:
        """Model files grouped by split prefix, smallest first, each with its best sidecar per kind."""
        groups: dict[str, list[RemoteFile]] = {}
        for f in self.files:
            if not pairing.is_model_file(f.path):
                continue
            groups.setdefault(pairing.split_info(f.path).prefix, []).append(f)
        out: list[QuantGroup] = []
        paths = self.paths
        for members in groups.values():
            members.sort(key=lambda f: pairing.split_info(f.path).index)
            primary = members[0].path
            tag = pairing.split_info(primary).tag
            sidecars: dict[str, str] = {}
            for kind, keyword in pairing.SIDECAR_KEYWORDS.items():
                found = pairing.find_best_sibling(paths, primary, keyword, "" if kind == "mmproj" else tag)
                if found is not None:
                    sidecars[kind] = found
            out.append(QuantGroup(tag, primary, tuple(members), sidecars))
        out.sort(key=lambda g: (g.size, g.primary))
        return out

    def sidecar_files(self) -> dict[str, list[RemoteFile]]:
        """Sidecar .gguf files present in the repository, by kind."""
        out: dict[str, list[RemoteFile]] = {}
        for f in self.files:
            kind = pairing.sidecar_kind(f.path)
            if kind is not None:
                out.setdefault(kind, []).append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "commit": self.commit,
            "gated": self.gated,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified,
            "from_cache": self.from_cache,
            "quants": [g.to_dict() for g in self.quant_groups()],
            "sidecars": {k: [f.path for f in v] for k, v in self.sidecar_files().items()},
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }


# ----- the Hub's API, read with limits ----------------------------------------------------------------------
#
# huggingface_hub's HfApi is not used for these reads: its client has no timeout (httpx built with timeout=None),
# reads every body whole into memory, retries 429 and 5xx sleeping whatever Retry-After says, and turns a body
# that is not the JSON it expects into KeyError/TypeError. None of that can be bounded from outside its calls,
# so the three GETs llmtui needs (search, a repository's info, its file tree page by page) go through
# transport.open_url: every answer within LIMITS (size, time), every failure one line naming the server's fault.

_LINK_NEXT = re.compile(r'<([^<>]{1,2000})>\s{0,10};[^,]{0,200}rel="?next"?')  # bounded: no backtracking blow-up


def _get_json(url: str, what: str, repo_id: str = "", time_limit: float | None = None) -> tuple[Any, str | None]:
    """The JSON answer to GET `url` and the URL of its next page (a Link header), read within the limits."""
    resp = open_url(url, headers=hub_headers({"Accept": "application/json"}), time_limit=time_limit, what=what)
    try:
        if resp.status == 404 and repo_id:
            code = resp.header("X-Error-Code") or ""
            if code == "RevisionNotFound":
                raise RepoNotFound(f"{repo_id}: the revision asked for does not exist")
            if code in ("RepoNotFound", ""):
                raise RepoNotFound(
                    f"{repo_id}: no such model on {hfcache.endpoint()}; check the name (private repos need HF_TOKEN)"
                )
        raise_for_status(resp, repo_id, what)
        if resp.status != 200:
            raise HubError(
                f"{resp.server} returned {resp.status} {resp.reason} for {what}, not an answer; is "
                f"{hfcache.endpoint()} a Hugging Face hub?"
            )
        body = resp.read_body(transport.LIMITS.max_json_bytes, what)
        link = resp.header("Link")
        server = resp.server
    finally:
        resp.close()
    if transport.json_items(body) > transport.LIMITS.max_json_items:
        raise HubError(
            f"{server} sent more than {transport.LIMITS.max_json_items:,} JSON values for {what}; "
            "stopped before reading them"
        )
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise HubError(
            f"{server} sent invalid JSON for {what} ({reason}); is {hfcache.endpoint()} a Hugging Face hub?"
        ) from None
    found = _LINK_NEXT.search((link or "")[:8192])
    return value, urljoin(url, found.group(1)) if found else None


def _shape_error(what: str, detail: str) -> HubError:
    return HubError(
        f"the Hub at {hfcache.endpoint()} sent {what} that is not what the Hub sends ({detail}); "
        "llmtui stopped reading it"
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _tags(value: Any) -> tuple[str, ...]:
    return tuple(t for t in value[:1000] if isinstance(t, str)) if isinstance(value, list) else ()


def _summary(item: Any, what: str) -> RepoSummary | None:
    """One search hit; None for one whose id is no repository id (control characters, spaces: nothing llmtui could
    list or download), so it is never shown. The author is the id's owner when the Hub's is no such name."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise _shape_error(what, "an entry without an id")
    repo_id = item["id"][:200]
    if not hfcache.is_valid_repo_id(repo_id):
        return None
    owner = repo_id.split("/")[0]
    author = _str(item.get("author"))
    modified = _str(item.get("lastModified"))
    return RepoSummary(
        repo_id=repo_id,
        author=author if author and hfcache.is_valid_repo_id(f"{author}/x") else owner,
        downloads=_int(item.get("downloads")),
        likes=_int(item.get("likes")),
        last_modified=shown(modified) if modified is not None else None,
        gated=bool(item.get("gated")),
        tags=tuple(shown(tag) for tag in _tags(item.get("tags"))),
    )


def search(
    query: str = "",
    *,
    author: str | None = None,
    sort: SortKey = "downloads",
    limit: int = 20,
    gguf_only: bool = True,
) -> list[RepoSummary]:
    """Search model repositories (GGUF ones by default), most downloaded / liked / recently updated first."""
    hfcache.require_online("searching the Hub")
    params: list[tuple[str, str]] = []
    if query:
        params.append(("search", query))
    if author:
        params.append(("author", author))
    if gguf_only:
        params.append(("filter", "gguf"))
    params += [("sort", _SORT[sort]), ("direction", "-1"), ("limit", str(max(1, min(limit, 1000))))]
    params += [("expand", e) for e in ("author", "downloads", "likes", "lastModified", "gated", "tags")]
    what = f"the search for {query or author or 'models'!r}"[:120]
    value, _ = _get_json(f"{hfcache.endpoint()}/api/models?{urlencode(params)}", what)
    if not isinstance(value, list):
        raise _shape_error(what, f"a {type(value).__name__}, not a list")
    hits = (_summary(item, what) for item in value[:limit])
    return [hit for hit in hits if hit is not None]


def _tree_entry(entry: Any, what: str) -> tuple[str, int, str, str | None] | None:
    """(path, size, blob id, LFS sha256) of a file entry; None for a folder."""
    if not isinstance(entry, dict):
        raise _shape_error(what, "an entry that is not an object")
    if entry.get("type") == "directory":
        return None
    path, oid, size = entry.get("path"), entry.get("oid"), entry.get("size")
    lfs = entry.get("lfs")
    if not isinstance(path, str) or not isinstance(oid, str):
        raise _shape_error(what, "a file entry without a path or id")
    sha256 = None
    if isinstance(lfs, dict):
        sha256, size = _str(lfs.get("oid")), lfs.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _shape_error(what, f"a size of {str(size)[:40]!r} for {path[:80]!r}")
    return path, size, oid, sha256


def list_repo(repo_id: str, revision: str = "main") -> RepoListing:
    """The repository's files at `revision` with sizes and LFS sha256 (its info, then its tree page by page)."""
    hfcache.require_online(f"listing {repo_id}")
    if not hfcache.is_valid_repo_id(repo_id):
        raise RepoNotFound(f"{repo_id!r} is not a valid repository id; expected <user>/<model>")
    endpoint = hfcache.endpoint()
    limits = transport.LIMITS
    deadline = time.monotonic() + limits.listing_s
    info_url = f"{endpoint}/api/models/{repo_id}"
    if revision != "main":
        info_url += f"/revision/{quote(revision, safe='')}"
    info, _ = _get_json(info_url, f"the info of {repo_id}", repo_id)
    if not isinstance(info, dict):
        raise _shape_error(f"the info of {repo_id}", f"a {type(info).__name__}, not an object")
    commit = _str(info.get("sha")) or revision
    if not hfcache.is_commit(commit):
        raise HubError(
            f"{repo_id}: the server named its commit {commit[:80]!r}, not a commit id; is "
            f"{endpoint} a Hugging Face hub?"
        )
    what = f"the listing of {repo_id}"
    files: list[RemoteFile] = []
    url: str | None = f"{endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true&expand=false"
    pages = 0
    while url is not None:
        left = deadline - time.monotonic()
        too_slow = HubError(
            f"{transport.server_name(url)} took longer than the {limits.listing_s:g} s limit to "
            f"send {what} ({len(files)} files in {pages} pages); stopped reading"
        )
        if left <= 0:
            raise too_slow
        try:
            page, url = _get_json(url, what, repo_id, time_limit=min(limits.exchange_s, left))
        except transport.TransientHTTPError:
            if left < limits.exchange_s and time.monotonic() >= deadline:  # cut short by the listing's limit
                raise too_slow from None
            raise
        pages += 1
        if not isinstance(page, list):
            raise _shape_error(what, f"a {type(page).__name__}, not a list")
        for item in page:
            entry = _tree_entry(item, what)
            if entry is None:
                continue  # a folder
            if len(files) >= MAX_LISTED_FILES:
                raise HubError(f"{repo_id}: lists more than {MAX_LISTED_FILES} files; llmtui stopped reading it")
            path, size, blob_id, sha256 = entry
            if not hfcache.safe_repo_path(path) or not hfcache.is_oid(sha256 or blob_id):
                # A file named "../../x" (or a blob id that is not one) would be written outside the cache.
                raise HubError(
                    f"{repo_id}: lists a file with an unsafe name or id ({path[:80]!r}); llmtui "
                    "does not download from it"
                )
            files.append(
                RemoteFile(
                    repo_id=repo_id,
                    path=path,
                    size=size,
                    oid=sha256 or blob_id,
                    commit=commit,
                    url=hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint),
                    sha256=sha256,
                )
            )
    return RepoListing(
        repo_id=repo_id,
        commit=commit,
        files=tuple(files),
        gated=bool(info.get("gated")),
        tags=tuple(shown(tag) for tag in _tags(info.get("tags"))),
        downloads=_int(info.get("downloads")),
        likes=_int(info.get("likes")),
        last_modified=shown(info["lastModified"]) if isinstance(info.get("lastModified"), str) else None,
    )


def cached_listing(repo_id: str, cache_root: Path | None = None) -> RepoListing | None:
    """The repository as the cache has it (refs/main's snapshot), for offline use; None when not cached."""
    rc = hfcache.RepoCache(cache_root or hfcache.cache_dir(), repo_id)
    commit = rc.read_ref()
    if commit is None:
        return None
    snapshot = rc.folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files: list[RemoteFile] = []
    for path in sorted(snapshot.rglob("*")):
        if path.is_dir() or not path.exists():
            continue
        rel = path.relative_to(snapshot).as_posix()
        oid = path.resolve().name if path.is_symlink() else ""
        files.append(
            RemoteFile(
                repo_id=repo_id,
                path=rel,
                size=path.stat().st_size,
                oid=oid,
                commit=commit,
                url="",
                sha256=oid if len(oid) == 64 else None,
            )
        )
    return RepoListing(repo_id=repo_id, commit=commit, files=tuple(files), from_cache=True)


def listing(repo_id: str, revision: str = "main") -> RepoListing:
    """list_repo() online; the cached snapshot when offline (OfflineError when the repo is not cached)."""
    if hfcache.is_offline():
        cached = cached_listing(repo_id)
        if cached is None:
            raise OfflineError(
                f"{repo_id} is not in the cache ({hfcache.cache_dir()}) and HF_HUB_OFFLINE=1 is set; "
                "unset HF_HUB_OFFLINE to fetch it"
            )
        return cached
    return list_repo(repo_id, revision)


def model_card(repo_id: str, revision: str = "main") -> str:
    """The repository's README.md (the model card) as text, its control characters made visible (newlines and
    tabs kept); '' when it has none."""
    hfcache.require_online(f"fetching the model card of {repo_id}")
    url = hf_hub_url(repo_id, "README.md", revision=revision, endpoint=hfcache.endpoint())
    what = f"the model card of {repo_id}"
    resp = open_url(url, headers=hub_headers(), what=what)
    try:
        if resp.status == 404:
            return ""
        raise_for_status(resp, repo_id, what)
        return shown(resp.read_body(MAX_CARD_BYTES, what).decode("utf-8", "replace"), multiline=True)
    finally:
        resp.close()


def pick_files(listing: RepoListing, tag: str, sidecars: Sequence[str] = ()) -> pairing.DownloadPlan | None:
    """llama.cpp's plan for `repo:TAG` (+ sidecars) over this listing, in the Hub's listing order."""
    return pairing.plan_download(listing.repo_id, tag, listing.paths, sidecars)
