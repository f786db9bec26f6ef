"""The Hugging Face environment (endpoint, token, offline, cache dir) and cache layout shared with llama.cpp -hf."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine_ext.untrusted_text import shown
from models_catalog.errors import BadModelSpec, OfflineError

DEFAULT_ENDPOINT = "https://huggingface.co"
PARTIAL_SUFFIX = ".incomplete"
# Partial files other tools leave in blobs/: llama.cpp (`.downloadInProgress`), huggingface_hub (`.<uuid>.incomplete`).
FOREIGN_PARTIAL_SUFFIXES = (".downloadInProgress",)

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# hf-cache.cpp is_valid_repo_id: [A-Za-z0-9_] runs joined by single [/.-], exactly one '/'
_REPO_PART_RE = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*$")


# ----- environment (read at call time: tests and users change it after import) ----------------------------


def endpoint() -> str:
    """The Hub endpoint without a trailing slash: MODEL_ENDPOINT, else HF_ENDPOINT, else huggingface.co."""
    value = os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return value.rstrip("/")


def token() -> str | None:
    """HF_TOKEN (or the legacy HUGGING_FACE_HUB_TOKEN); None lets huggingface_hub use a saved login."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def is_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "on", "yes", "true"):
            return True
    return False


def require_online(what: str) -> None:
    """Raise OfflineError before any network call when offline mode is on."""
    if is_offline():
        raise OfflineError(
            f"{what} needs the network, but HF_HUB_OFFLINE=1 is set; unset it to go online "
            "(models already downloaded still work offline)"
        )


def cache_dir() -> Path:
    """The hub cache huggingface_hub writes to: HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > $HF_HOME/hub > XDG > ~."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def llama_cache_dir() -> Path | None:
    """LLAMA_CACHE when set: llama.cpp then uses it instead of the hub cache, so the library scans it too."""
    value = os.environ.get("LLAMA_CACHE")
    return Path(value).expanduser() if value else None


# ----- repo ids and specs ------------------------------------------------------------------------------


def is_valid_repo_id(repo_id: str) -> bool:
    """llama.cpp's rule: `org/name`, each part word characters joined by single `.`/`-`."""
    parts = repo_id.split("/")
    return len(parts) == 2 and all(_REPO_PART_RE.match(p) for p in parts)


def split_repo_tag(spec: str) -> tuple[str, str]:
    """`org/repo[:TAG]` -> (repo, tag), as common_download_split_repo_tag (the last `:` part is the tag)."""
    parts = spec.split(":")
    tag = parts[-1] if len(parts) > 1 else ""
    repo = parts[0]
    if len(repo.split("/")) != 2 or not is_valid_repo_id(repo):
        raise BadModelSpec(f"{spec!r} is not a Hugging Face model reference; expected <user>/<model>[:QUANT]")
    return repo, tag


def is_commit(value: str) -> bool:
    return bool(_COMMIT_RE.match(value))


# ----- layout ------------------------------------------------------------------------------------------


_OID = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
MAX_REPO_PATH = 1024


def is_oid(value: str) -> bool:
    """A git blob id (40 hex) or an LFS sha256 (64 hex): what a blob in the cache may be named."""
    return bool(_OID.match(value))


def safe_repo_path(path: str) -> bool:
    """A file path inside a repository that stays inside its snapshot folder: relative, "/"-separated, no empty,
    "." or ".." part, no backslash or control character, not too long. A hostile listing naming "../../x" (or a
    file whose name would write escape codes to a terminal) is refused by it."""
    if not path or len(path) > MAX_REPO_PATH or "\\" in path or path.startswith("/") or shown(path) != path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def repo_folder_name(repo_id: str) -> str:
    """`org/name` -> `models--org--name`."""
    return "models--" + repo_id.replace("/", "--")


def repo_id_from_folder(folder: str) -> str | None:
    """`models--org--name` -> `org/name` (None for other folders)."""
    if not folder.startswith("models--"):
        return None
    return folder[len("models--") :].replace("--", "/")


@dataclass(frozen=True)
class RepoCache:
    """Paths of one repository inside a hub cache."""

    root: Path  # the cache dir
    repo_id: str

    @property
    def folder(self) -> Path:
        return self.root / repo_folder_name(self.repo_id)

    def blob(self, oid: str) -> Path:
        _check(is_oid(oid), "blob id", oid)
        return self.folder / "blobs" / oid

    def partial(self, oid: str) -> Path:
        _check(is_oid(oid), "blob id", oid)
        return self.folder / "blobs" / (oid + PARTIAL_SUFFIX)

    def pointer(self, commit: str, path_in_repo: str) -> Path:
        _check(is_commit(commit), "commit", commit)
        _check(safe_repo_path(path_in_repo), "file path", path_in_repo)
        return self.folder / "snapshots" / commit / Path(*path_in_repo.split("/"))

    def lock(self, oid: str) -> Path:
        """The lock huggingface_hub also takes for this blob, so it and llmtui never fetch it at once."""
        return self.root / ".locks" / repo_folder_name(self.repo_id) / f"{oid}.lock"

    def ref(self, name: str = "main") -> Path:
        return self.folder / "refs" / name

    def read_ref(self, name: str = "main") -> str | None:
        """The commit a ref points to, else the first valid ref (llama.cpp's get_cached_ref)."""
        refs = self.folder / "refs"
        if not refs.is_dir():
            return None
        wanted = refs / name
        candidates = [wanted] + sorted(p for p in refs.rglob("*") if p.is_file() and p != wanted)
        for path in candidates:
            try:
                commit = path.read_text().strip()
            except OSError:
                continue
            if is_commit(commit):
                return commit
        return None

    def write_ref(self, commit: str, name: str = "main") -> None:
        path = self.ref(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if path.read_text().strip() == commit:
                return
        except OSError:
            pass
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, path)


def _check(ok: bool, what: str, value: str) -> None:
    """Every cache path llmtui writes is built from checked names: a repository cannot write outside the cache."""
    if not ok:
        from models_catalog.errors import HubError

        raise HubError(f"the repository gave an unsafe {what} ({value[:80]!r}); llmtui does not write it to disk")


def link_pointer(blob: Path, pointer: Path) -> None:
    """Make snapshots/<commit>/<path> point at the blob (a relative symlink, else a copy), as huggingface_hub."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        with contextlib.suppress(OSError):
            if pointer.resolve() == blob.resolve():
                return
        pointer.unlink()
    target = os.path.relpath(blob, pointer.parent)
    try:
        os.symlink(target, pointer)
    except OSError:
        shutil.copyfile(blob, pointer)
