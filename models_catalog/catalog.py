"""The curated model catalog: loads catalog.toml, picks a quant per memory tier, refreshes facts from the Hub."""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine_ext.private_files import write_private_text
from engine_ext.spec_catalog import DRAFT_FILE_TYPES
from models_catalog.errors import CatalogError

MTP_KINDS = ("in-model", "sidecar", "none")
DRAFT_KINDS = DRAFT_FILE_TYPES  # dflash, dflash2, dspark, eagle3: from the catalogue of speculative types
USES = ("chat", "embed", "rerank")  # what an entry is for: a model to chat with, an embedding model, a reranker
USE_NAMES = {"chat": "chat model", "embed": "embedding model", "rerank": "reranker"}
GIB = 1 << 30


@dataclass(frozen=True)
class CatalogEntry:
    """One curated model."""

    id: str
    name: str
    family: str
    repos: tuple[str, ...]
    verified: bool
    total_params_b: float
    active_params_b: float
    architecture: str
    context_length: int
    license: str
    mtp: str
    reasoning: bool
    control_vectors: bool
    drafts: dict[str, str] = field(default_factory=dict)
    quants: tuple[tuple[int, str], ...] = ()  # (min GiB, quant tag), ascending
    starter: bool = False
    use: str = "chat"  # USES: an embedding model or a reranker is for the documents' search, not to chat with
    refreshed: bool = False  # facts confirmed from a GGUF header by refresh()

    @property
    def repo(self) -> str:
        return self.repos[0]

    @property
    def for_chat(self) -> bool:
        return self.use == "chat"

    @property
    def use_name(self) -> str:
        """ "chat model", "embedding model" or "reranker"."""
        return USE_NAMES[self.use]

    @property
    def is_moe(self) -> bool:
        return self.active_params_b < self.total_params_b

    def capabilities(self) -> list[str]:
        caps = []
        if self.mtp == "in-model":
            caps.append("MTP")
        elif self.mtp == "sidecar":
            caps.append("mtp- sidecar")
        caps += sorted(k.upper() if k != "dflash2" else "DFlash2" for k in self.drafts)
        if self.control_vectors:
            caps.append("control vectors")
        if self.reasoning:
            caps.append("reasoning")
        return caps

    def recommended_quant(self, memory_bytes: int) -> str:
        """The quant for a machine with this much memory (VRAM, or RAM without a GPU)."""
        gib = memory_bytes / GIB
        best = self.quants[0][1] if self.quants else ""
        for tier, tag in self.quants:
            if gib >= tier:
                best = tag
        return best

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["repos"] = list(self.repos)
        out["quants"] = {str(t): q for t, q in self.quants}
        out["capabilities"] = self.capabilities()
        return out


def _entry(raw: dict[str, Any], where: str) -> CatalogEntry:
    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        if key not in raw:
            raise CatalogError(f"{where}: missing `{key}`; every [[model]] needs it (see the file's header)")
        value = raw[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise CatalogError(f"{where}: `{key}` has the wrong type ({type(value).__name__})")
        return value

    model_id = need("id", str)
    where = f"{where} ({model_id})"
    repos = need("repos", list)
    if not repos or not all(isinstance(r, str) and r.count("/") == 1 for r in repos):
        raise CatalogError(f'{where}: `repos` must list repositories as "org/name"')
    params = need("params_b", list)
    if len(params) != 2 or not all(isinstance(p, int | float) and p > 0 for p in params):
        raise CatalogError(f"{where}: `params_b` must be [total, active] in billions")
    mtp = need("mtp", str)
    if mtp not in MTP_KINDS:
        raise CatalogError(f"{where}: `mtp` must be one of {', '.join(MTP_KINDS)}")
    drafts = raw.get("drafts", {})
    if not isinstance(drafts, dict) or any(k not in DRAFT_KINDS or not isinstance(v, str) for k, v in drafts.items()):
        raise CatalogError(f"{where}: `drafts` keys must be among {', '.join(DRAFT_KINDS)}, values repo names")
    use = raw.get("use", "chat")
    if use not in USES:
        raise CatalogError(f"{where}: `use` must be one of {', '.join(USES)}")
    if use != "chat" and raw.get("starter", False):
        raise CatalogError(f"{where}: `starter` is for a chat model, and this entry's `use` is {use}")
    quants = raw.get("quants", {})
    try:
        tiers = tuple(sorted((int(k), str(v)) for k, v in quants.items()))
    except (AttributeError, ValueError):
        raise CatalogError(f'{where}: `quants` keys must be memory sizes in GiB, e.g. "16" = "Q4_K_M"') from None
    return CatalogEntry(
        id=model_id,
        name=need("name", str),
        family=need("family", str),
        repos=tuple(repos),
        verified=bool(raw.get("verified", False)),
        total_params_b=float(params[0]),
        active_params_b=float(params[1]),
        architecture=need("architecture", str),
        context_length=int(need("context_length", int)),
        license=need("license", str),
        mtp=mtp,
        reasoning=bool(raw.get("reasoning", False)),
        control_vectors=bool(raw.get("control_vectors", False)),
        drafts=dict(drafts),
        quants=tiers,
        starter=bool(raw.get("starter", False)),
        use=use,
    )


class Catalog:
    """The entries of a catalog file, with refreshed facts from an overlay file layered on top."""

    def __init__(self, entries: Sequence[CatalogEntry], overlay_path: Path | None = None) -> None:
        ids = [e.id for e in entries]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise CatalogError(f"catalog ids must be unique; repeated: {', '.join(dupes)}")
        self.entries = list(entries)
        self.overlay_path = overlay_path

    def __iter__(self) -> Any:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, model_id: str) -> CatalogEntry | None:
        for e in self.entries:
            if e.id == model_id:
                return e
        return None

    def for_repo(self, repo_id: str) -> CatalogEntry | None:
        """The entry that lists this repository (case-insensitive)."""
        for e in self.entries:
            if repo_id.lower() in (r.lower() for r in e.repos):
                return e
        return None

    def search(self, text: str = "") -> list[CatalogEntry]:
        words = text.lower().split()
        return [
            e
            for e in self.entries
            if all(
                w in f"{e.id} {e.name} {e.family} {' '.join(e.repos)} {e.architecture} {e.use_name}".lower()
                for w in words
            )
        ]

    def chat_models(self) -> list[CatalogEntry]:
        """The entries to chat with (what recommends a model to chat with picks among these)."""
        return [e for e in self.entries if e.for_chat]

    def first_of_use(self, use: str) -> CatalogEntry | None:
        """The first entry for `use` ("embed", "rerank"): the documents' default embedding model or reranker."""
        return next((e for e in self.entries if e.use == use), None)

    def replace_entry(self, entry: CatalogEntry) -> None:
        self.entries = [entry if e.id == entry.id else e for e in self.entries]

    def save_overlay(self) -> None:
        """Write refreshed facts to the overlay file (the bundled catalog stays read-only)."""
        if self.overlay_path is None:
            return
        data = {
            e.id: {"architecture": e.architecture, "context_length": e.context_length, "mtp": e.mtp, "verified": True}
            for e in self.entries
            if e.refreshed
        }
        write_private_text(self.overlay_path, json.dumps(data, indent=1, sort_keys=True))


def bundled_catalog_path() -> Path:
    return Path(str(importlib.resources.files("models_catalog").joinpath("catalog.toml")))


def parse_catalog(text: str, source: str = "catalog.toml") -> list[CatalogEntry]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{source}: not valid TOML ({exc}); fix the file or reinstall llmtui") from None
    models = data.get("model", [])
    if not isinstance(models, list):
        raise CatalogError(f"{source}: `model` must be an array of tables ([[model]])")
    return [_entry(raw, f"{source}: model #{i + 1}") for i, raw in enumerate(models)]


def _overlay_int(value: object, default: int) -> int:
    """A count from the refresh overlay (a file llmtui wrote, but on the user's disk): the catalog's own value when
    it is not a positive whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 40 else default


def load_catalog(path: Path | None = None, *, overlay_path: Path | None = None) -> Catalog:
    """The catalog from `path` (default: the bundled catalog.toml) with the overlay's refreshed facts."""
    source = path or bundled_catalog_path()
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{source}: cannot be read ({exc.strerror}); reinstall llmtui") from None
    catalog = Catalog(parse_catalog(text, str(source)), overlay_path)
    if overlay_path is not None and overlay_path.is_file():
        try:
            overlay = json.loads(overlay_path.read_text())
        except (OSError, ValueError):
            overlay = {}
        for model_id, facts in overlay.items() if isinstance(overlay, dict) else ():
            entry = catalog.get(model_id)
            if entry is None or not isinstance(facts, dict):
                continue
            catalog.replace_entry(
                replace(
                    entry,
                    architecture=str(facts.get("architecture", entry.architecture)),
                    context_length=_overlay_int(facts.get("context_length"), entry.context_length),
                    mtp=str(facts.get("mtp", entry.mtp)),
                    verified=entry.verified or bool(facts.get("verified")),
                    refreshed=True,
                )
            )
    return catalog


def refresh_entry(entry: CatalogEntry) -> CatalogEntry:
    """Confirm an entry against the Hub: the repo exists, and architecture, context and MTP from its header."""
    from models_catalog import fit, hub, pairing

    listing = hub.list_repo(entry.repo)
    groups = listing.quant_groups()
    if not groups:
        return replace(entry, verified=True, refreshed=True)
    default = pairing.find_best_model([g.primary for g in groups], "") or groups[0].primary
    probe = next(g for g in groups if g.primary == default)
    info, _ = fit.remote_info(probe.files[:1])
    mtp = "in-model" if info.n_layer_nextn else "sidecar" if "mtp" in listing.sidecar_files() else "none"
    return replace(
        entry,
        verified=True,
        refreshed=True,
        architecture=info.architecture or entry.architecture,
        context_length=info.context_length or entry.context_length,
        mtp=mtp,
    )
