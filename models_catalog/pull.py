"""`pull REPO[:QUANT] --with KIND`: llama.cpp's file plan, paired draft repos, a disk check, then the downloads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models_catalog import download, hfcache, hub, pairing
from models_catalog.download import Control, ProgressCallback, RemoteFile, TransferOptions
from models_catalog.errors import NoMatchingFile, NotEnoughDiskSpace


@dataclass(frozen=True)
class PullPlan:
    """What a pull fetches: the model's shards and its sidecars (from the repo or a paired draft repo)."""

    repo_id: str
    tag: str
    commit: str
    primary: RemoteFile | None
    model_files: tuple[RemoteFile, ...]
    sidecars: dict[str, RemoteFile] = field(default_factory=dict)
    sidecar_sources: dict[str, str] = field(default_factory=dict)  # kind -> repo the sidecar comes from
    gated: bool = False

    @property
    def files(self) -> tuple[RemoteFile, ...]:
        return self.model_files + tuple(self.sidecars[k] for k in sorted(self.sidecars))

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def remaining_bytes(self, cache_root: Path | None = None) -> int:
        """Bytes still to fetch: files not installed, less what their partial files hold."""
        root = cache_root or hfcache.cache_dir()
        left = 0
        for f in self.files:
            if download.installed_path(f, root) is not None:
                continue
            partial = hfcache.RepoCache(root, f.repo_id).partial(f.oid)
            have = partial.stat().st_size if partial.exists() else 0
            left += max(0, f.size - have)
        return left

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "tag": self.tag,
            "commit": self.commit,
            "primary": self.primary.path if self.primary else None,
            "files": [{"repo_id": f.repo_id, "path": f.path, "size": f.size} for f in self.files],
            "sidecars": {k: {"repo_id": f.repo_id, "path": f.path} for k, f in self.sidecars.items()},
            "total_size": self.total_size,
        }


@dataclass(frozen=True)
class PullResult:
    """Installed snapshot paths: the model (first shard) and each sidecar kind."""

    plan: PullPlan
    model_path: Path | None
    sidecar_paths: dict[str, Path]
    paths: tuple[Path, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.plan.repo_id,
            "tag": self.plan.tag,
            "model_path": str(self.model_path) if self.model_path else None,
            "sidecars": {k: str(v) for k, v in self.sidecar_paths.items()},
            "paths": [str(p) for p in self.paths],
        }


def _available(listing: hub.RepoListing) -> str:
    tags = sorted({g.tag or g.primary for g in listing.quant_groups()})
    return ", ".join(tags) if tags else "no GGUF model files"


def _draft_file(draft_repo: str, kind: str, tag: str) -> RemoteFile | None:
    """The file to take from a paired draft repo: a `kind-` sidecar by llama.cpp's rule, else its best model."""
    listing = hub.listing(draft_repo)
    paths = listing.paths
    path = pairing.find_best_sibling(paths, "", pairing.SIDECAR_KEYWORDS[kind], tag)
    if path is None:
        ggufs = [p for p in paths if p.endswith(".gguf")]
        path = pairing.find_best_model(ggufs, tag) or pairing.find_best_model(ggufs, "")
        if path is None and ggufs:
            path = ggufs[0]
    return listing.file(path) if path else None


def plan_pull(
    spec: str,
    sidecars: Sequence[str] = (),
    *,
    draft_repos: Mapping[str, str] | None = None,
    default_tag: str = "",
) -> PullPlan:
    """Resolve `org/repo[:QUANT]` and the sidecar kinds into files (online, or from the cache when offline).

    A sidecar missing from the repository is taken from `draft_repos[kind]` (the catalog's paired drafts).
    """
    repo_id, tag = hfcache.split_repo_tag(spec)
    tag = tag or default_tag
    for kind in sidecars:
        if kind not in pairing.SIDECAR_KEYWORDS:
            raise NoMatchingFile(f"unknown sidecar kind {kind!r}; use one of: {', '.join(pairing.SIDECAR_KEYWORDS)}")
    listing = hub.listing(repo_id)
    plan = pairing.plan_download(repo_id, tag, listing.paths, sidecars)
    if plan is None or (plan.primary is None and not sidecars):
        want = f"quant {tag}" if tag else "a GGUF model file"
        raise NoMatchingFile(
            f"{repo_id} has no {want}; available: {_available(listing)}. Pull one of them as {repo_id}:QUANT"
        )
    found = {kind: listing.file(path) for kind, path in plan.sidecars.items()}
    sources = {kind: repo_id for kind in found}
    for kind in plan.missing_sidecars:
        draft_repo = (draft_repos or {}).get(kind)
        draft = _draft_file(draft_repo, kind, tag) if draft_repo else None
        if draft is None:
            where = f" nor in its paired draft repo {draft_repo}" if draft_repo else ""
            raise NoMatchingFile(
                f"{repo_id} has no {pairing.SIDECAR_KEYWORDS[kind]}*.gguf sidecar next to "
                f"{plan.primary or 'the model'}{where}; pull without --with {kind}, or name a repo that has one"
            )
        found[kind] = draft
        sources[kind] = draft.repo_id
    model_files = tuple(listing.file(p) for p in plan.model_files)
    primary = listing.file(plan.primary) if plan.primary else None
    return PullPlan(repo_id, tag, listing.commit, primary, model_files, found, sources, listing.gated)


def check_disk_space(plan: PullPlan, cache_root: Path | None = None) -> None:
    """Raise NotEnoughDiskSpace before fetching anything when the cache's disk cannot hold what is left."""
    root = cache_root or hfcache.cache_dir()
    need = plan.remaining_bytes(root)
    if need == 0:
        return
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = download._free_bytes(probe)
    if free < need:
        raise NotEnoughDiskSpace(
            f"{plan.repo_id}: needs {download._fmt_size(need)} but only {download._fmt_size(free)} is free in "
            f"{probe}; free some space (llmtui models rm ...) or set HF_HUB_CACHE to a larger disk"
        )


def run_pull(
    plan: PullPlan,
    *,
    options: TransferOptions | None = None,
    on_progress: ProgressCallback | None = None,
    control: Control | None = None,
    cache_root: Path | None = None,
) -> PullResult:
    """Fetch every file of the plan in order (each resumable and verified) and return the installed paths."""
    check_disk_space(plan, cache_root)
    paths: list[Path] = []
    by_file: dict[tuple[str, str], Path] = {}
    for i, f in enumerate(plan.files, start=1):
        path = download.fetch(
            f, cache_root=cache_root, options=options, on_progress=on_progress, control=control, task_id=i
        )
        by_file[(f.repo_id, f.path)] = path
        paths.append(path)
    model_path = by_file[(plan.primary.repo_id, plan.primary.path)] if plan.primary else None
    sidecar_paths = {k: by_file[(f.repo_id, f.path)] for k, f in plan.sidecars.items()}
    return PullResult(plan, model_path, sidecar_paths, tuple(paths))


def pull(
    spec: str,
    sidecars: Sequence[str] = (),
    *,
    draft_repos: Mapping[str, str] | None = None,
    options: TransferOptions | None = None,
    on_progress: ProgressCallback | None = None,
    control: Control | None = None,
) -> PullResult:
    """plan_pull() then run_pull()."""
    return run_pull(
        plan_pull(spec, sidecars, draft_repos=draft_repos), options=options, on_progress=on_progress, control=control
    )
