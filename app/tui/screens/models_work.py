"""The models screen's (F4) blocking work: the Hub, the fit and the library, run in the screen's thread workers.

Each function does one worker's job and returns (or yields) the messages the screen posts to itself; none touches a
widget. An error a function does not expect escapes it, and the screen's `on_worker_state_changed` says it in one
line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from http.client import HTTPException
from pathlib import Path

from textual.message import Message

from app.tui.download_bridge import DownloadBridge
from app.tui.screens.models_local import PartialRow, size_partials
from app.tui.screens.models_messages import (
    HubSearched,
    LocalModelJudged,
    LocalModelsListed,
    MemoryDetected,
    ModelDeleted,
    ModelsWorkFailed,
    RepoInspected,
)
from engine_ext.gguf import GGUFError
from engine_ext.untrusted_text import one_line
from models_catalog import fit, hfcache, hub
from models_catalog.catalog import CatalogEntry
from models_catalog.errors import ModelsError
from models_catalog.library import Library, LocalModel, PartialDownload
from models_catalog.pull import plan_pull

SEARCH_LIMIT = 50
# Model files of one repository the screen groups into quants. Grouping pairs every file with its sidecars by
# llama.cpp's rules, which takes time growing with the square of the files (5,000 took 43 s, and a listing may hold
# 100,000); the largest real GGUF repositories hold a few hundred.
MAX_REPO_MODEL_FILES = 2000


def detect_memory() -> Message:
    return MemoryDetected(fit.detect_memory())


def search(query: str, author: str | None, sort: hub.SortKey) -> Message:
    try:
        results = hub.search(query, author=author, sort=sort, limit=SEARCH_LIMIT)
    except (ModelsError, OSError, ValueError) as error:
        return ModelsWorkFailed("Search", str(error))
    return HubSearched(results)


def inspect(repo_id: str, entry: CatalogEntry | None, memory: fit.MachineMemory | None) -> Message:
    try:
        listing = hub.listing(repo_id)
    except (ModelsError, OSError, ValueError) as error:
        return ModelsWorkFailed(f"Opening {repo_id}", str(error))
    report, fit_error = None, None
    n_files = len(listing.gguf_files)
    groups = listing.quant_groups() if n_files <= MAX_REPO_MODEL_FILES else []
    if n_files > MAX_REPO_MODEL_FILES:
        fit_error = (
            f"{repo_id} lists {n_files:,} .gguf files, more than the {MAX_REPO_MODEL_FILES:,} this "
            "screen groups into quants; download one by name with: llmtui models pull REPO:QUANT"
        )
    elif not groups:
        fit_error = "no GGUF model files in this repository"
    elif hfcache.is_offline():
        fit_error = "offline: the fit needs the model's header (unset HF_HUB_OFFLINE)"
    else:
        try:
            report = fit.fit_repo(listing, memory=memory)
        except (ModelsError, GGUFError, OSError, HTTPException, ValueError) as error:
            # OSError, HTTPException: the connection failed in the middle of the header's bytes
            fit_error = one_line(str(error) or type(error).__name__)
    return RepoInspected(listing, groups, report, fit_error, entry)


def list_local(library_of: Callable[[], Library]) -> Iterator[Message]:
    """The models on disk, then the bundled starter, and the partial downloads; then the partials' totals from the
    Hub's listing."""
    from app.core.model_list import with_starter

    try:
        library = library_of()
        models, partials = with_starter(library, library.models()), library.partials()
    except (ModelsError, OSError, ValueError) as error:  # ValueError: a folder name the OS refuses (NUL)
        yield ModelsWorkFailed("Listing local models", str(error))
        return
    yield LocalModelsListed(models, [PartialRow(p) for p in partials], sized=not partials)
    if partials:
        yield LocalModelsListed(models, size_partials(partials))


def resume_partial(row: PartialRow, downloads: DownloadBridge | None) -> Message | None:
    """Find the partial's file on the Hub (when not known yet) and queue it: the download resumes from the bytes on
    disk, in the downloads panel."""
    file = row.file or size_partials([row.partial])[0].file
    if file is None:
        return ModelsWorkFailed(
            f"Resuming {row.name}",
            f"no file of {row.partial.repo_id} has this content at its current revision; delete it with x",
        )
    try:
        assert downloads is not None
        downloads.resume_file(file)
    except ModelsError as error:
        return ModelsWorkFailed(f"Resuming {file.name}", str(error))
    return None


def delete_partial(library_of: Callable[[], Library], partial: PartialDownload, name: str) -> Message:
    try:
        freed = library_of().clean_partials([partial])
    except (ModelsError, OSError) as error:
        return ModelsWorkFailed(f"Deleting {name}", str(error))
    if not freed:
        return ModelsWorkFailed(f"Deleting {name}", "a process is writing it; pause it first (p)")
    return ModelDeleted(name, freed)


def judge_local(model: LocalModel, memory: fit.MachineMemory | None) -> Message:
    try:
        verdict, error = fit.fit_local(model.path, memory=memory), None
    except (GGUFError, OSError, ValueError) as exc:
        verdict, error = None, one_line(str(exc))
    return LocalModelJudged(model, verdict, error)


def pull(
    spec: str, sidecars: list[str], draft_repos: dict[str, str], downloads: DownloadBridge | None
) -> Message | None:
    try:
        plan = plan_pull(spec, sidecars, draft_repos=draft_repos)
        assert downloads is not None
        downloads.pull(plan)
    except ModelsError as error:
        return ModelsWorkFailed(f"Downloading {spec}", str(error))
    return None


def delete(library_of: Callable[[], Library], model: LocalModel) -> Message:
    try:
        freed = library_of().delete(model)
    except (ModelsError, OSError) as error:
        return ModelsWorkFailed(f"Deleting {model.name}", str(error))
    return ModelDeleted(model.name, freed)


def deletion_of(model: LocalModel) -> tuple[list[str], int]:
    """Which files deleting a model removes (its sidecars that are there too) and how many bytes that frees."""
    sidecar_files = [p for p in model.sidecars.values() if p.exists()]
    size = model.size + sum(file_size(p) for p in sidecar_files)
    names = [p.name for p in model.files] + [f"{p.name} (sidecar)" for p in sidecar_files]
    return names, size


def file_size(path: Path) -> int:
    """The size of a file that may have gone since it was listed (0 then)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
