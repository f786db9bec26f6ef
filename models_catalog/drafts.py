"""Draft models on disk for a target model: what speculative decoding can draft with.

Three places, as llama.cpp finds them or as a user would look:
- sidecars beside the model (`mtp-`, `dspark-`, `dflash-`, `eagle3-` .gguf files in its folder or cache snapshot);
  llama.cpp's preset.cpp attaches those to a model in the same folder on its own (preset.cpp:371-462);
- the catalog's paired draft repositories for the model's repository, where they are in the cache (a pull with
  `--with dflash` fetches a draft the model's own repository lacks from there);
- smaller models with the same vocabulary (draft-simple).

Each is read from its GGUF header and kept only when it fits the target: the same vocabulary size and tokenizer, and
for an MTP sidecar the same architecture and width, for a DFlash/DSpark/EAGLE3 draft the target's width. A mismatch
would be refused by the engine later; here it is simply not offered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from engine_ext.gguf import GGUFError, GGUFInfo, inspect_gguf
from engine_ext.spec_catalog import CATALOGUE, LAYER_INPUT_TYPES, TYPE_FOR_KIND
from models_catalog import pairing
from models_catalog.catalog import Catalog, CatalogEntry
from models_catalog.library import LocalModel

SIDECAR_ORDER: Final = pairing.DRAFT_KIND_ORDER
"""The order llama.cpp infers a draft repository's type in (arg.cpp:546-565): the first found is the default."""

DRAFT_TYPE_KINDS: Final = {
    draft_type: spec.candidate_kind for spec in CATALOGUE if spec.candidate_kind for draft_type in spec.draft_types
}
"""What a draft file's metadata says it is (engine_ext.gguf.DraftInfo.draft_type) → its kind here (from the catalogue of
speculative types: mtp, dflash, dspark, eagle3, or model for a plain model)."""


@dataclass(frozen=True)
class DraftCandidate:
    """A file that can draft for the target: `kind` is mtp, dspark, dflash, eagle3 or model (draft-simple)."""

    path: Path
    kind: str
    where: str  # "beside the model", "paired draft repo ORG/NAME", "same vocabulary"
    size: int


def _kind(info: GGUFInfo) -> str | None:
    if info.is_mtp_sidecar:
        return "mtp"
    return DRAFT_TYPE_KINDS.get(info.draft_type)


def _fits(target: GGUFInfo, draft: GGUFInfo, kind: str) -> bool:
    """Whether `draft` can draft for `target` by what both headers say."""
    if target.vocab_size and draft.vocab_size and target.vocab_size != draft.vocab_size:
        return False
    if target.tokenizer_model and draft.tokenizer_model and target.tokenizer_model != draft.tokenizer_model:
        return False
    if kind == "mtp":
        return draft.architecture == target.architecture and draft.embedding_length == target.embedding_length
    if TYPE_FOR_KIND[kind] in LAYER_INPUT_TYPES:  # dflash, dspark, eagle3: drafts from the target's hidden states
        hidden, layers = draft.draft.target_hidden_size, draft.draft.target_layers or ()
        n_layer = target.n_layer_trunk or target.block_count or 0
        return (hidden is None or hidden == target.embedding_length) and all(0 <= i <= n_layer for i in layers)
    # draft-simple: a smaller model that tokenizes the same way
    return draft.tokenizer_pre == target.tokenizer_pre and draft.total_size < target.total_size


def _read(path: Path) -> GGUFInfo | None:
    try:
        return inspect_gguf(path)
    except (GGUFError, OSError):
        return None


def sidecar_files(model: Path) -> list[Path]:
    """The draft sidecars in the model's folder, by file name (llama.cpp's rule; no header read)."""
    try:
        names = sorted(p.name for p in model.parent.iterdir() if p.suffix == ".gguf")
    except OSError:
        return []
    return [model.parent / n for n in names if pairing.sidecar_kind(n) in SIDECAR_ORDER]


def _catalog_entry(
    model: Path, models: Sequence[LocalModel], catalog: Catalog | None
) -> tuple[str, CatalogEntry] | None:
    """(repository, catalog entry) of `model` when it is a cache model of a repository the catalog lists."""
    me = model.resolve()
    local = next((m for m in models if m.path.resolve() == me), None)
    if catalog is None or local is None or not local.repo_id:
        return None
    entry = catalog.for_repo(local.repo_id)
    return (local.repo_id, entry) if entry is not None else None


def draft_candidates(
    model: Path,
    models: Sequence[LocalModel] = (),
    catalog: Catalog | None = None,
    *,
    same_vocabulary: bool = True,
) -> list[DraftCandidate]:
    """What can draft for `model`: its sidecars (in SIDECAR_ORDER), drafts from its paired repositories, then smaller
    models with the same vocabulary (smallest first). `models` is the local library (for paired repositories and
    draft-simple candidates); `same_vocabulary=False` skips the last group (it reads every model's header)."""
    target = _read(model)
    if target is None:
        return []
    me = model.resolve()
    seen: set[Path] = {me}
    found: list[DraftCandidate] = []

    def consider(paths: Iterable[Path], where: str, kinds: Sequence[str]) -> list[DraftCandidate]:
        out: list[DraftCandidate] = []
        for path in paths:
            resolved = path.resolve()
            if resolved in seen:
                continue
            info = _read(path)
            kind = _kind(info) if info is not None else None
            if info is None or kind is None or kind not in kinds or not _fits(target, info, kind):
                continue
            seen.add(resolved)
            out.append(DraftCandidate(path, kind, where, info.total_size))
        return out

    beside = consider(sidecar_files(model), "beside the model", SIDECAR_ORDER)
    found += sorted(beside, key=lambda c: SIDECAR_ORDER.index(c.kind))
    listed = _catalog_entry(model, models, catalog)
    if listed is not None:
        for draft_repo in dict.fromkeys(listed[1].drafts.values()):
            files = [
                p
                for m in models
                if (m.repo_id or "").lower() == draft_repo.lower()
                for p in (m.path, *m.sidecars.values())
            ]
            found += consider(files, f"paired draft repo {draft_repo}", SIDECAR_ORDER + ("model",))
    if same_vocabulary:
        smaller = consider((m.path for m in models if m.complete and m.problem is None), "same vocabulary", ("model",))
        found += sorted(smaller, key=lambda c: c.size)
    return found


def missing_drafts(
    model: Path, models: Sequence[LocalModel], catalog: Catalog | None, found: Sequence[DraftCandidate]
) -> list[tuple[str, str]]:
    """(kind, repository) of the drafts the catalog pairs with `model` that are not on disk (not in `found`): its
    repository's MTP sidecar, and its paired DFlash/DSpark/EAGLE3 repositories. Empty for a model the catalog does
    not list, or one not from the Hugging Face cache."""
    listed = _catalog_entry(model, models, catalog)
    if listed is None:
        return []
    repo_id, catalog_entry = listed
    have = {c.kind for c in found}
    wanted: dict[str, str] = {}
    if catalog_entry.mtp == "sidecar":
        wanted["mtp"] = repo_id
    for kind, repo in catalog_entry.drafts.items():
        wanted.setdefault(DRAFT_TYPE_KINDS.get(kind) or kind, repo)  # a DFlash2 draft is a dflash file
    return [(kind, repo) for kind, repo in wanted.items() if kind not in have]
