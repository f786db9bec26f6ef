"""Hugging Face Hub access through huggingface_hub: search, a repo's GGUF files grouped by quant, sidecars, card."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub import errors as hf_errors
from huggingface_hub.hf_api import RepoFile

from models_catalog import hfcache, pairing
from models_catalog.download import RemoteFile
from models_catalog.errors import GatedRepoError, HubError, ModelsError, OfflineError, RepoNotFound
from models_catalog.transport import TransientHTTPError, gated_message, hub_headers, open_url, raise_for_status

SortKey = Literal["downloads", "likes", "updated"]
_SORT: dict[str, Literal["downloads", "likes", "last_modified"]] = {
    "downloads": "downloads",
    "likes": "likes",
    "updated": "last_modified",
}
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


def api() -> HfApi:
    """An HfApi for the current HF_ENDPOINT and HF_TOKEN (read now, not at import)."""
    return HfApi(endpoint=hfcache.endpoint(), token=hfcache.token(), library_name="llmtui")


@contextlib.contextmanager
def _hub_errors(repo_id: str, what: str) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into our typed errors."""
    try:
        yield
    except ModelsError:
        raise
    except hf_errors.GatedRepoError:
        raise GatedRepoError(gated_message(repo_id)) from None
    except hf_errors.RepositoryNotFoundError:
        raise RepoNotFound(
            f"{repo_id}: no such model on {hfcache.endpoint()}; check the name (private repos need HF_TOKEN)"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise RepoNotFound(f"{repo_id}: the revision asked for does not exist") from None
    except hf_errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(f"{what}: the Hub answered HTTP {status}; try again later") from None
    except (OSError, ValueError) as exc:
        raise HubError(f"{what}: cannot reach {hfcache.endpoint()} ({exc}); check the network or HF_ENDPOINT") from None
    except Exception as exc:
        # httpx2 (huggingface_hub's client) transport errors
        if type(exc).__module__.startswith("httpx"):
            raise HubError(
                f"{what}: cannot reach {hfcache.endpoint()} ({type(exc).__name__}: {exc}); check the network"
            ) from None
        raise


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
    expand: Any = ["author", "downloads", "likes", "lastModified", "gated", "tags"]
    with _hub_errors(query or author or "", "searching the Hub"):
        models = api().list_models(
            search=query or None,
            author=author,
            filter="gguf" if gguf_only else None,
            sort=_SORT[sort],
            limit=limit,
            expand=expand,
        )
        return [
            RepoSummary(
                repo_id=m.id,
                author=m.author or m.id.split("/")[0],
                downloads=m.downloads or 0,
                likes=m.likes or 0,
                last_modified=m.last_modified.isoformat() if m.last_modified else None,
                gated=bool(m.gated),
                tags=tuple(m.tags or ()),
            )
            for m in models
        ]


def list_repo(repo_id: str, revision: str = "main") -> RepoListing:
    """The repository's files at `revision` with sizes and LFS sha256 (model_info + list_repo_tree)."""
    hfcache.require_online(f"listing {repo_id}")
    if not hfcache.is_valid_repo_id(repo_id):
        raise RepoNotFound(f"{repo_id!r} is not a valid repository id; expected <user>/<model>")
    hf = api()
    endpoint = hfcache.endpoint()
    with _hub_errors(repo_id, f"listing {repo_id}"):
        info = hf.model_info(repo_id, revision=None if revision == "main" else revision)
        commit = info.sha or revision
        if not hfcache.is_commit(commit):
            raise HubError(f"{repo_id}: the server named its commit {commit[:80]!r}, not a commit id; is "
                           f"{endpoint} a Hugging Face hub?")
        files: list[RemoteFile] = []
        for entry in hf.list_repo_tree(repo_id, recursive=True, revision=commit):
            if not isinstance(entry, RepoFile):
                continue  # a folder
            if len(files) >= MAX_LISTED_FILES:
                raise HubError(f"{repo_id}: lists more than {MAX_LISTED_FILES} files; llmtui stopped reading it")
            lfs = getattr(entry, "lfs", None)
            sha256 = lfs.sha256 if lfs is not None else None
            if not hfcache.safe_repo_path(entry.path) or not hfcache.is_oid(sha256 or entry.blob_id or ""):
                # A file named "../../x" (or a blob id that is not one) would be written outside the cache.
                raise HubError(f"{repo_id}: lists a file with an unsafe name or id ({entry.path[:80]!r}); llmtui "
                               "does not download from it")
            files.append(
                RemoteFile(
                    repo_id=repo_id,
                    path=entry.path,
                    size=int(lfs.size if lfs is not None else entry.size),
                    oid=sha256 or entry.blob_id,
                    commit=commit,
                    url=hf_hub_url(repo_id, entry.path, revision=commit, endpoint=endpoint),
                    sha256=sha256,
                )
            )
    return RepoListing(
        repo_id=repo_id,
        commit=commit,
        files=tuple(files),
        gated=bool(info.gated),
        tags=tuple(info.tags or ()),
        downloads=info.downloads or 0,
        likes=info.likes or 0,
        last_modified=info.last_modified.isoformat() if info.last_modified else None,
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
    """The repository's README.md (the model card) as text; '' when it has none."""
    hfcache.require_online(f"fetching the model card of {repo_id}")
    url = hf_hub_url(repo_id, "README.md", revision=revision, endpoint=hfcache.endpoint())
    try:
        resp = open_url(url, headers=hub_headers(), timeout=30)
    except TransientHTTPError as exc:
        raise HubError(str(exc)) from None
    try:
        if resp.status == 404:
            return ""
        try:
            raise_for_status(resp, repo_id, "README.md")
        except TransientHTTPError as exc:
            raise HubError(str(exc)) from None
        return resp.read_all(MAX_CARD_BYTES).decode("utf-8", "replace")
    finally:
        resp.close()


def pick_files(listing: RepoListing, tag: str, sidecars: Sequence[str] = ()) -> pairing.DownloadPlan | None:
    """llama.cpp's plan for `repo:TAG` (+ sidecars) over this listing, in the Hub's listing order."""
    return pairing.plan_download(listing.repo_id, tag, listing.paths, sidecars)

