"""Every model on this machine, as the quick switcher (ctrl+l) offers them: the bundled starter, the Hugging Face
cache (and llama.cpp's) and the user's model folders, each with its size, quant, paired drafts and memory need.

Two steps, both for a thread worker (they list folders and read GGUF headers): `local_models` lists the files by name
(fast: no header read), `describe_models` reads each model's header for its memory need (the one figure of
`models_catalog.fit.need_bytes`, as F4 shows it), finds its paired drafts and leaves out files whose header says they
are drafts themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from app.core import paths
from app.core.model_paths import starter_model_path, usable_folders, user_path
from engine_ext.gguf import GGUFError, inspect_gguf
from engine_ext.untrusted_text import shown
from models_catalog import drafts, fit, pairing
from models_catalog.catalog import Catalog
from models_catalog.library import Library
from models_catalog.library import LocalModel as LibraryModel

MAX_SCAN_DEPTH: Final = 3
RECENT_MODELS: Final = 20
"""How many of the model files used lately (`llmtui -m PATH` outside the model folders, say) ctrl+l offers."""
STARTER_NAME: Final = "starter (SmolLM2-135M-Instruct)"
"""How the bundled starter model is listed (ctrl+l, F4 → Local, `llmtui models list`)."""
IN_MODEL_MTP: Final = "draft-mtp"
"""The draft type of a model that carries its own MTP (NextN) heads: a chat model that drafts for itself."""
DRAFT_KINDS: Final = frozenset(pairing.DRAFT_KIND_ORDER)
"""Sidecar kinds that draft for a model (mmproj is a projector: shown, but not a draft)."""


@dataclass(frozen=True)
class LocalModel:
    """A model file that can be loaded."""

    name: str
    path: Path
    size_bytes: int
    source: str  # "starter", "hf-cache", "llama-cache" or the folder it was found in
    quant: str = ""
    sidecars: tuple[str, ...] = ()
    """Companion files beside it by name (mtp, dflash, dspark, eagle3, mmproj)."""
    drafts: tuple[str, ...] | None = None
    """Draft kinds that fit it by their headers (sidecars and the catalog's paired draft repos); None until read."""
    need_bytes: int | None = None
    """Memory to run it (`fit.need_bytes`, the figure F4 shows); None until its header is read."""
    problem: str | None = None
    """Why its header could not be read."""

    @property
    def has_projector(self) -> bool:
        """Whether a projector (mmproj) is beside it: the model sees images."""
        return "mmproj" in self.sidecars

    @property
    def draft_kinds(self) -> tuple[str, ...]:
        """The drafts to show: those read from headers when known, else the sidecars by name."""
        if self.drafts is not None:
            return self.drafts
        return tuple(kind for kind in self.sidecars if kind in DRAFT_KINDS)

    @property
    def where(self) -> str:
        return {"hf-cache": "Hugging Face cache", "llama-cache": "llama.cpp cache"}.get(self.source, self.source)


def local_models(folders: Iterable[str], also: Sequence[str] = (), recent: int = RECENT_MODELS) -> list[LocalModel]:
    """The starter model (when installed), then the Hugging Face and llama.cpp caches, then every model in `folders`
    (three levels deep), then the files in `also` (the model in use, opened by its path) and the `recent` model
    files used last (opened by a path outside the folders minutes before: issue 49, 9) not found there; no
    duplicates; draft sidecars, projectors and split parts after the first are not listed."""
    found: list[LocalModel] = []
    seen: set[Path] = set()
    starter = starter_model_path()
    if starter is not None:
        found.append(
            LocalModel(
                STARTER_NAME,
                starter,
                starter.stat().st_size,
                "starter",
                quant=pairing.quant_tag(starter.name),
            )
        )
        seen.add(starter.resolve())
    library = paths.library(usable_folders(folders))
    for model in library.models(inspect=False):
        try:
            resolved = model.path.resolve()
        except (OSError, RuntimeError):
            continue
        if resolved in seen or not model.path.is_file():
            continue
        seen.add(resolved)
        name = model.name if model.repo_id else shown(model.path.stem)  # a file's name, as it may be shown
        found.append(
            LocalModel(
                name,
                model.path,
                model.size,
                model.source,
                quant=model.tag or pairing.quant_tag(model.path.name),
                sidecars=tuple(sorted(model.sidecars)),
            )
        )
    for text in (*also, *(str(path) for path in library.recently_used(recent))):
        path = user_path(text)
        if path is None or path.suffix.lower() != ".gguf":
            continue
        try:
            resolved, size = path.resolve(), path.stat().st_size
        except (OSError, RuntimeError):
            continue
        if resolved not in seen and path.is_file():
            seen.add(resolved)
            projector = ("mmproj",) if pairing.local_mmproj(path) is not None else ()  # loaded with it (ctrl+l)
            found.append(
                LocalModel(
                    shown(path.stem), path, size, str(path.parent), pairing.quant_tag(path.name), sidecars=projector
                )
            )
    return found


def with_starter(on_disk: Library, models: Sequence[LibraryModel], *, inspect: bool = True) -> list[LibraryModel]:
    """`models` (the library's listing) and after them the bundled starter model, when it is installed and not
    listed already: F4's Local tab and `llmtui models list` show it beside the models downloaded (issue 49, 8)."""
    starter = starter_model_path()
    if starter is None or not starter.is_file():
        return list(models)
    try:
        resolved = starter.resolve()
        if any(model.path.resolve() == resolved for model in models):
            return list(models)
    except (OSError, RuntimeError):
        return list(models)
    return [*models, on_disk.file_model(starter, STARTER_NAME, "starter", inspect=inspect)]


def describe_models(
    models: Sequence[LocalModel],
    folders: Iterable[str],
    memory: fit.MachineMemory | None = None,
    *,
    chat_only: bool = False,
) -> list[LocalModel]:
    """`models` with their memory need and paired drafts from their headers; files whose header says they are a
    draft (an MTP sidecar, a DFlash/DSpark/EAGLE3 draft) are left out: they are not models to chat with. With
    `chat_only` (the chat's switcher), so are embedding models and rerankers (a pooling in the header); `serve`
    keeps them for /v1/embeddings and /v1/rerank."""
    memory = memory or fit.detect_memory()
    library = paths.library(usable_folders(folders))
    catalog = _catalog()
    try:
        everything = library.models(inspect=False)
    except (OSError, ValueError):
        everything = []
    out: list[LocalModel] = []
    for model in models:
        try:
            info = inspect_gguf(model.path)
        except (GGUFError, OSError, ValueError) as error:
            out.append(replace(model, problem=" ".join(str(error).split())[:200]))
            continue
        if info.is_mtp_sidecar or info.draft_type not in (None, IN_MODEL_MTP):
            continue  # an MTP sidecar, or a DFlash/DSpark/EAGLE3 draft (its own architecture): not a chat model
        if chat_only and _pools(model.path):
            continue  # an embedding model or a reranker: the documents' search runs it, not the chat
        try:
            need = fit.fit_local(model.path, memory=memory).need_bytes
        except (GGUFError, OSError, ValueError):
            need = None
        try:
            found = drafts.draft_candidates(model.path, everything, catalog, same_vocabulary=False)
        except (GGUFError, OSError, ValueError):
            found = []
        in_model = ("mtp",) if info.draft_type == IN_MODEL_MTP else ()  # its own NextN heads draft
        kinds = tuple(dict.fromkeys((*in_model, *(c.kind for c in found))))
        out.append(replace(model, need_bytes=need, drafts=kinds))
    return out


def _pools(path: Path) -> bool:
    """Whether the GGUF names a pooling (an embedding model or a reranker)."""
    from engine_ext.gguf import read_pooling_type

    try:
        return read_pooling_type(path) != 0
    except (GGUFError, OSError):
        return False


def _catalog() -> Catalog | None:
    from models_catalog.catalog import load_catalog
    from models_catalog.errors import ModelsError

    try:
        return load_catalog(overlay_path=paths.data_dir() / "catalog-refresh.json")
    except (ModelsError, ValueError, TypeError, OverflowError, RecursionError):
        return None


def human_size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
