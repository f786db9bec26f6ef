"""The local library: models in the Hugging Face cache and the user's folders, sidecars, deletion, partial files."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from engine_ext.gguf import GGUFError, inspect_gguf
from engine_ext.private_files import PRIVATE_FILE_MODE, write_private_text
from engine_ext.untrusted_text import shown
from models_catalog import hfcache, pairing
from models_catalog.download import Control, ProgressCallback, TransferOptions, fetch
from models_catalog.errors import ModelsError

MAX_FOLDER_DEPTH = 3


@dataclass(frozen=True)
class LocalModel:
    """A model on disk: its first shard, all shards, attached sidecars (kind -> path) and facts."""

    name: str  # `org/repo:TAG` for the hub cache, the path relative to its folder otherwise
    path: Path
    source: str  # "hf-cache", "llama-cache" or the user folder it was found in
    repo_id: str | None
    tag: str
    files: tuple[Path, ...]
    size: int
    sidecars: dict[str, Path] = field(default_factory=dict)
    architecture: str | None = None
    complete: bool = True
    last_used: float | None = None
    problem: str | None = None  # why the header could not be read

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "source": self.source,
            "repo_id": self.repo_id,
            "tag": self.tag,
            "files": [str(p) for p in self.files],
            "size": self.size,
            "sidecars": {k: str(v) for k, v in self.sidecars.items()},
            "architecture": self.architecture,
            "complete": self.complete,
            "last_used": self.last_used,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class PartialDownload:
    """A partial file in a cache's blobs/ folder, from llmtui, huggingface_hub or llama.cpp."""

    path: Path
    repo_id: str
    oid: str
    size: int
    modified: float
    tool: str  # "llmtui", "huggingface_hub" or "llama.cpp"
    active: bool  # a process holds its lock right now

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "repo_id": self.repo_id,
            "oid": self.oid,
            "size": self.size,
            "modified": self.modified,
            "tool": self.tool,
            "active": self.active,
        }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Library:
    """What is on disk. `folders` are the user's model folders; `usage_file` remembers when a model was used."""

    def __init__(
        self,
        folders: Iterable[Path | str] = (),
        *,
        cache_root: Path | None = None,
        usage_file: Path | None = None,
    ) -> None:
        self.folders = [p for p in (_folder_path(f) for f in folders) if p is not None]
        self.cache_root = cache_root or hfcache.cache_dir()
        self.usage_file = usage_file

    # -- usage ---------------------------------------------------------------------------------------

    def _usage(self) -> dict[str, float]:
        if self.usage_file is None:
            return {}
        try:
            data = json.loads(self.usage_file.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        usage: dict[str, float] = {}
        for key, value in data.items():  # a damaged entry (a null, a string) is dropped, not the whole file
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                usage[str(key)] = float(value)
        return usage

    def mark_used(self, path: Path, when: float | None = None) -> None:
        """Remember that the model at `path` was just opened."""
        if self.usage_file is None:
            return
        usage = self._usage()
        usage[str(Path(path).absolute())] = time.time() if when is None else when
        write_private_text(self.usage_file, json.dumps(usage, indent=1))

    def recently_used(self, limit: int) -> list[Path]:
        """The files of the models opened lately (as `mark_used` remembers them), most recent first, at most
        `limit`; a file since deleted or moved is among them (the caller checks)."""
        usage = sorted(self._usage().items(), key=lambda item: item[1], reverse=True)
        return [Path(path) for path, _ in usage[: max(0, limit)]]

    # -- listing -------------------------------------------------------------------------------------

    def cache_roots(self) -> list[tuple[Path, str]]:
        roots = [(self.cache_root, "hf-cache")]
        llama = hfcache.llama_cache_dir()
        if llama is not None and llama.resolve() != self.cache_root.resolve():
            roots.append((llama, "llama-cache"))
        return roots

    def models(self, *, inspect: bool = True) -> list[LocalModel]:
        """Every model: hub caches first (by repo and size), then the user's folders. A file the folders reach twice
        (a folder inside another, one folder named twice, a link to a file listed already) is listed once, where it
        was found first."""
        usage = self._usage()
        found: list[LocalModel] = []
        for root, source in self.cache_roots():
            found.extend(self._cached_models(root, source, usage, inspect))
        seen = {_file_key(model.path) for model in found}
        for folder in self.folders:
            for model in self._folder_models(folder, usage, inspect):
                key = _file_key(model.path)
                if key not in seen:
                    seen.add(key)
                    found.append(model)
        return found

    def file_model(self, path: Path, name: str, source: str, *, inspect: bool = True) -> LocalModel:
        """One model file outside the caches and folders (the bundled starter), described as the listing describes
        a model found there."""
        info = pairing.split_info(path.name)
        return self._model(name, path, source, None, info.tag, (path,), 1, {}, self._usage(), inspect)

    def _cached_models(self, root: Path, source: str, usage: dict[str, float], inspect: bool) -> list[LocalModel]:
        out: list[LocalModel] = []
        if not root.is_dir():
            return out
        for repo_dir in sorted(root.iterdir()):
            repo_id = hfcache.repo_id_from_folder(repo_dir.name)
            if repo_id is None or not (repo_dir / "snapshots").is_dir():
                continue
            rc = hfcache.RepoCache(root, repo_id)
            main = rc.read_ref()
            snapshots = sorted((repo_dir / "snapshots").iterdir(), key=lambda p: p.name != main)
            seen: set[str] = set()
            for snapshot in snapshots:
                if not snapshot.is_dir():
                    continue
                rel_paths = sorted(
                    p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file() or p.is_symlink()
                )
                for rel in rel_paths:
                    info = pairing.split_info(rel)
                    if not pairing.is_model_file(rel) or info.index != 1 or info.prefix in seen:
                        continue
                    seen.add(info.prefix)
                    shard_rels = pairing.split_files(rel_paths, rel)
                    files = tuple(snapshot / p for p in shard_rels)
                    name = f"{repo_id}:{info.tag}" if info.tag else f"{repo_id}/{rel}"
                    if snapshot.name != main:
                        name += f"@{snapshot.name[:8]}"
                    sidecars = {}
                    for kind, keyword in pairing.SIDECAR_KEYWORDS.items():
                        sib = pairing.find_best_sibling(rel_paths, rel, keyword, "" if kind == "mmproj" else info.tag)
                        if sib is not None:
                            sidecars[kind] = snapshot / sib
                    out.append(
                        self._model(
                            name, snapshot / rel, source, repo_id, info.tag, files, info.count, sidecars, usage, inspect
                        )
                    )
        return out

    def _folder_models(self, folder: Path, usage: dict[str, float], inspect: bool) -> list[LocalModel]:
        out: list[LocalModel] = []
        for directory, names in _walk(folder, MAX_FOLDER_DEPTH):
            ggufs = sorted(n for n in names if n.endswith(".gguf"))
            sidecars: dict[str, Path] = {}
            for n in ggufs:  # preset.cpp: sidecars in the model's own folder, the first of a kind wins
                kind = pairing.sidecar_kind(n)
                if kind is not None and (kind == "mmproj" or pairing.is_draft_sidecar(n) or kind == "eagle3"):
                    sidecars.setdefault(kind, directory / n)
            for n in ggufs:
                info = pairing.split_info(n)
                if not pairing.is_model_file(n) or info.index != 1:
                    continue
                files = tuple(directory / p for p in pairing.split_files(ggufs, n))
                rel = (directory / n).relative_to(folder).as_posix()
                out.append(
                    self._model(
                        rel,
                        directory / n,
                        str(folder),
                        None,
                        info.tag,
                        files,
                        info.count,
                        dict(sidecars),
                        usage,
                        inspect,
                    )
                )
        return out

    def _model(
        self,
        name: str,
        path: Path,
        source: str,
        repo_id: str | None,
        tag: str,
        files: tuple[Path, ...],
        expected_shards: int,
        sidecars: dict[str, Path],
        usage: dict[str, float],
        inspect: bool,
    ) -> LocalModel:
        arch: str | None = None
        problem: str | None = None
        if inspect:
            try:
                arch = inspect_gguf(path).architecture
            except GGUFError as exc:
                problem = str(exc)
        present = tuple(f for f in files if f.exists())
        return LocalModel(
            name=shown(name),  # from file and folder names on disk: as it may be shown
            path=path,
            source=source,
            repo_id=repo_id,
            tag=tag,
            files=files,
            size=sum(_size(f) for f in present),
            sidecars=sidecars,
            architecture=arch,
            complete=len(present) == max(1, expected_shards),
            last_used=usage.get(str(path.absolute())),
            problem=problem,
        )

    def find(self, spec: str) -> list[LocalModel]:
        """Models matching `org/repo:TAG`, `org/repo` (all its quants), a name, or a file path."""
        models = self.models(inspect=False)
        spec_path = _folder_path(spec)
        if spec_path is not None and spec_path.exists():
            target = spec_path.absolute()
            return [m for m in models if target in {m.path.absolute(), *(f.absolute() for f in m.files)}]
        if ":" in spec:
            repo, tag = spec.rsplit(":", 1)
            return [m for m in models if m.repo_id == repo and m.tag == tag.upper()]
        return [m for m in models if m.repo_id == spec or m.name == spec]

    # -- partial downloads ---------------------------------------------------------------------------

    def partials(self) -> list[PartialDownload]:
        out: list[PartialDownload] = []
        for root, _ in self.cache_roots():
            if not root.is_dir():
                continue
            for blobs in sorted(root.glob("models--*/blobs")):
                repo_id = hfcache.repo_id_from_folder(blobs.parent.name) or blobs.parent.name
                rc = hfcache.RepoCache(root, repo_id)
                for path in sorted(blobs.iterdir()):
                    name = path.name
                    if name.endswith(hfcache.PARTIAL_SUFFIX):
                        stem = name[: -len(hfcache.PARTIAL_SUFFIX)]
                        oid, tool = (stem, "llmtui") if "." not in stem else (stem.split(".")[0], "huggingface_hub")
                    elif name.endswith(hfcache.FOREIGN_PARTIAL_SUFFIXES):
                        oid, tool = name.split(".")[0], "llama.cpp"
                    else:
                        continue
                    try:
                        st = path.stat()
                    except OSError:
                        continue
                    out.append(
                        PartialDownload(path, repo_id, oid, st.st_size, st.st_mtime, tool, _locked(rc.lock(oid)))
                    )
        return out

    def clean_partials(self, partials: Sequence[PartialDownload] | None = None) -> int:
        """Delete partial files no process is writing (all, or the given ones); returns the bytes freed."""
        freed = 0
        for p in self.partials() if partials is None else partials:
            if p.active or _locked(hfcache.RepoCache(p.path.parent.parent.parent, p.repo_id).lock(p.oid)):
                continue
            with contextlib.suppress(FileNotFoundError):
                p.path.unlink()
                freed += p.size
        return freed

    def resume_partial(
        self,
        partial: PartialDownload,
        *,
        options: TransferOptions | None = None,
        on_progress: ProgressCallback | None = None,
        control: Control | None = None,
    ) -> Path:
        """Finish an llmtui partial download: find its file on the Hub by oid and fetch it (resuming)."""
        from models_catalog.hub import list_repo

        listing = list_repo(partial.repo_id)
        for f in listing.files:
            if f.oid == partial.oid:
                return fetch(f, cache_root=self.cache_root, options=options, on_progress=on_progress, control=control)
        raise ModelsError(
            f"{partial.path}: no file of {partial.repo_id} at its current revision has this content any more; "
            "clean it with `llmtui models rm --partials`"
        )

    # -- deletion ------------------------------------------------------------------------------------

    def delete(self, model: LocalModel, *, with_sidecars: bool = True) -> int:
        """Delete a model (its shards, and its sidecars unless another model uses them); returns bytes freed."""
        targets = list(model.files)
        if with_sidecars:
            others = [m for m in self.models(inspect=False) if m.path != model.path]
            used = {p for m in others for p in m.sidecars.values()}
            targets += [p for p in model.sidecars.values() if p not in used]
        if model.source in ("hf-cache", "llama-cache"):
            return self._delete_cached(targets)
        freed = 0
        for path in targets:
            size = _size(path)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                freed += size
        return freed

    def _delete_cached(self, pointers: Sequence[Path]) -> int:
        """Remove snapshot entries, then the blobs no snapshot points to any more (llama.cpp's rule)."""
        blobs: set[Path] = set()
        repo_dirs: set[Path] = set()
        for p in pointers:
            snapshot_dir = next((a for a in p.parents if a.parent.name == "snapshots"), None)
            if snapshot_dir is not None:
                repo_dirs.add(snapshot_dir.parent.parent)
            if p.is_symlink():
                blobs.add(p.resolve())
            elif p.exists() and not p.is_symlink():
                blobs.add(p)  # a copy made where symlinks are not supported
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        referenced: set[Path] = set()
        for repo_dir in repo_dirs:
            for entry in (repo_dir / "snapshots").rglob("*"):
                if entry.is_symlink():
                    referenced.add(entry.resolve())
        freed = 0
        for blob in blobs:
            if blob in referenced:
                continue
            size = _size(blob)
            with contextlib.suppress(FileNotFoundError):
                blob.unlink()
                freed += size
        for repo_dir in repo_dirs:
            _prune_empty(repo_dir / "snapshots")
            if not any((repo_dir / "snapshots").rglob("*")) and not _has_partials(repo_dir):
                shutil.rmtree(repo_dir, ignore_errors=True)
        return freed


def _folder_path(folder: Path | str) -> Path | None:
    """A model folder from the settings, `~` expanded; None for one that cannot name a folder (a NUL byte, or
    `~name` of a user this machine does not have): it is left out instead of stopping the scan."""
    if "\0" in str(folder):
        return None
    try:
        return Path(folder).expanduser()
    except RuntimeError:  # "Could not determine home directory."
        return None


def _file_key(path: Path) -> Path:
    """The file a path names, links followed (its absolute path when it cannot be resolved)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()


def _walk(folder: Path, depth: int) -> Iterable[tuple[Path, list[str]]]:
    try:
        entries = sorted(folder.iterdir())
    except (OSError, ValueError):  # ValueError: a name the OS cannot take (a NUL byte)
        return
    yield folder, [e.name for e in entries if e.is_file()]
    if depth > 0:
        for e in entries:
            if e.is_dir() and not e.name.startswith("."):
                yield from _walk(e, depth - 1)


def _locked(lock_path: Path) -> bool:
    """Whether another process holds a blob lock (without creating the lock file)."""
    if not lock_path.exists():
        return False
    lock = filelock.FileLock(str(lock_path), mode=PRIVATE_FILE_MODE)  # filelock chmods the file it opens to this
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    except OSError:
        return False
    lock.release()
    return False


def _prune_empty(root: Path) -> None:
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def _has_partials(repo_dir: Path) -> bool:
    blobs = repo_dir / "blobs"
    return blobs.is_dir() and any(
        p.name.endswith((hfcache.PARTIAL_SUFFIX, *hfcache.FOREIGN_PARTIAL_SUFFIXES)) for p in blobs.iterdir()
    )
