"""llama.cpp's GGUF file rules (common/download.cpp): quant tags, split shards, best model and sidecar pairing."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine_ext.spec_catalog import DRAFT_FILE_KINDS

# Sidecar kinds `pull --with` accepts and the keyword llama.cpp's find_best_sibling looks for in a path.
# The draft kinds are the speculative catalogue's (engine_ext.spec_catalog), each file named `KIND-*.gguf`.
SIDECAR_KEYWORDS: dict[str, str] = {**{kind: f"{kind}-" for kind in DRAFT_FILE_KINDS}, "mmproj": "mmproj"}
# Basename markers that make a .gguf a companion file rather than a model (gguf_filename_is_model).
NON_MODEL_MARKERS = ("mmproj", "imatrix", *(f"{kind}-" for kind in DRAFT_FILE_KINDS))
# Basename prefixes of draft sidecars attached to a model in a local folder (preset.cpp draft_prefixes).
DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
# Speculative type inferred from the sidecars present, in llama.cpp's order (arg.cpp): mtp, dspark, dflash, eagle3.
DRAFT_KIND_ORDER = DRAFT_FILE_KINDS
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")

_SPLIT_RE = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_DIGITS_RE = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class SplitInfo:
    """get_gguf_split_info(): prefix (tag included, split suffix removed), upper-case tag, shard index/count."""

    prefix: str = ""
    tag: str = ""
    index: int = 0
    count: int = 0


def split_info(path: str) -> SplitInfo:
    """Parse `<prefix>[-0000i-of-0000N].gguf`; an empty SplitInfo for non-.gguf paths."""
    if not path.endswith(".gguf"):
        return SplitInfo()
    prefix = path[: -len(".gguf")]
    index = count = 1
    m = _SPLIT_RE.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG_RE.search(prefix)
    tag = t.group(1).upper() if t else ""
    return SplitInfo(prefix, tag, index, count)


def quant_tag(path: str) -> str:
    """The upper-case quant tag of a GGUF path (`Qwen3-8B-Q4_K_M.gguf` -> `Q4_K_M`), '' when none."""
    return split_info(path).tag


def tag_bits(tag: str) -> int:
    """The first number in a tag (Q4_K_M -> 4, F16 -> 16, NVFP4 -> 4), 0 when none."""
    m = _DIGITS_RE.search(tag.upper())
    return int(m.group(0)) if m else 0


def quant_bits(path: str) -> int:
    """extract_quant_bits(): the bits of a file's tag."""
    return tag_bits(split_info(path).tag)


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def is_model_file(path: str) -> bool:
    """gguf_filename_is_model(): a .gguf whose basename has none of the companion markers."""
    if not path.endswith(".gguf"):
        return False
    name = basename(path)
    return not any(marker in name for marker in NON_MODEL_MARKERS)


def is_draft_sidecar(name: str) -> bool:
    """preset.cpp is_draft_file(): a basename starting with `mtp-`, `dspark-` or `dflash-`."""
    return basename(name).startswith(DRAFT_PREFIXES)


def sidecar_kind(path: str) -> str | None:
    """Which sidecar keyword a .gguf path carries (mtp, dflash, dspark, eagle3, mmproj), None for models."""
    if not path.endswith(".gguf"):
        return None
    for kind in (*DRAFT_KIND_ORDER, "mmproj"):
        if SIDECAR_KEYWORDS[kind] in basename(path):
            return kind
    return None


def find_best_model(paths: Sequence[str], tag: str) -> str | None:
    """find_best_model(): the first model file matching `TAG[.-]` (first shard of a split), in listing order.

    With no tag the candidates are Q4_K_M then Q8_0, then the first model file.
    """
    tags = [tag] if tag else list(DEFAULT_TAGS)
    for t in tags:
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for path in paths:
            if is_model_file(path) and pattern.search(path):
                info = split_info(path)
                if info.count > 1 and info.index != 1:
                    continue
                return path
    if not tag:
        for path in paths:
            if is_model_file(path):
                info = split_info(path)
                if info.count > 1 and info.index != 1:
                    continue
                return path
    return None


def split_files(paths: Sequence[str], primary: str) -> list[str]:
    """get_split_files(): every shard with the primary's prefix and count (just the primary when not split)."""
    info = split_info(primary)
    if info.count <= 1:
        return [primary]
    return [p for p in paths if (s := split_info(p)).count == info.count and s.prefix == info.prefix]


def find_best_sibling(paths: Sequence[str], model: str, keyword: str, tag: str = "") -> str | None:
    """find_best_sibling(): a .gguf containing `keyword` in the model's folder or an ancestor.

    Prefers the deepest shared folder, then an exact `-TAG.` in the path, then the closest quant bits to the
    tag (or to the model's own tag when none is given); ties keep the first in listing order.
    """
    tag_upper = tag.upper()
    model_bits = tag_bits(tag_upper) if tag_upper else quant_bits(model)
    model_dirs = model.split("/")[:-1]
    best: str | None = None
    best_depth = best_diff = 0
    best_exact = False
    for path in paths:
        if not path.endswith(".gguf") or keyword not in path:
            continue
        sib_dirs = path.split("/")[:-1]
        if len(sib_dirs) > len(model_dirs) or model_dirs[: len(sib_dirs)] != sib_dirs:
            continue
        depth = len(sib_dirs)
        diff = abs(quant_bits(path) - model_bits)
        exact = bool(tag_upper) and f"-{tag_upper}." in path.upper()
        if (
            best is None
            or depth > best_depth
            or (depth == best_depth and exact and not best_exact)
            or (depth == best_depth and exact == best_exact and diff < best_diff)
        ):
            best, best_depth, best_diff, best_exact = path, depth, diff, exact
    return best


@dataclass(frozen=True)
class DownloadPlan:
    """The files of `repo[:TAG]` to fetch: the model's shards and the requested sidecars (kind -> path)."""

    repo_id: str
    tag: str
    primary: str | None
    model_files: tuple[str, ...]
    sidecars: dict[str, str] = field(default_factory=dict)
    missing_sidecars: tuple[str, ...] = ()

    @property
    def all_files(self) -> tuple[str, ...]:
        return self.model_files + tuple(self.sidecars[k] for k in sorted(self.sidecars))


def plan_download(repo_id: str, tag: str, paths: Sequence[str], sidecars: Sequence[str] = ()) -> DownloadPlan | None:
    """common_download_get_hf_plan() without preset.ini: the model for `tag` plus each requested sidecar kind.

    Returns None when neither a model nor any requested sidecar matches (llama.cpp: "no GGUF files found").
    """
    for kind in sidecars:
        if kind not in SIDECAR_KEYWORDS:
            raise ValueError(f"unknown sidecar kind {kind!r}; expected one of {', '.join(SIDECAR_KEYWORDS)}")
    primary = find_best_model(paths, tag)
    model_files = tuple(split_files(paths, primary)) if primary else ()
    found: dict[str, str] = {}
    missing: list[str] = []
    for kind in sidecars:
        if kind == "mmproj" and primary is None:
            continue
        # mmproj is matched against the model's own quant, drafts against the requested tag (download.cpp)
        sibling = find_best_sibling(paths, primary or "", SIDECAR_KEYWORDS[kind], "" if kind == "mmproj" else tag)
        if sibling is None:
            missing.append(kind)
        else:
            found[kind] = sibling
    if primary is None and not found:
        return None
    return DownloadPlan(repo_id, tag, primary, model_files, found, tuple(missing))


def draft_kind_for(sidecars: dict[str, str]) -> str | None:
    """The speculative type llama.cpp infers from the sidecars present: mtp > dspark > dflash > eagle3."""
    for kind in DRAFT_KIND_ORDER:
        if kind in sidecars:
            return kind
    return None


def local_draft_sidecar(names: Sequence[str]) -> str | None:
    """preset.cpp scan_subdir(): the first `.gguf` whose basename starts with a draft prefix."""
    for name in names:
        if name.endswith(".gguf") and is_draft_sidecar(name):
            return name
    return None


MAX_FOLDER_ENTRIES = 10_000  # a model's folder is read this far looking for its projector


def local_mmproj(model: Path) -> Path | None:
    """The projector paired with a model file on disk (llama.cpp's rule, as find_best_sibling): an `mmproj` .gguf
    in the model's folder, the closest in quant to the model; None when there is none."""
    names: list[str] = []
    try:
        with os.scandir(model.parent) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_FOLDER_ENTRIES:
                    break
                names.append(entry.name)
    except OSError:
        return None
    best = find_best_sibling(sorted(n for n in names if sidecar_kind(n) == "mmproj"), model.name, "mmproj")
    return model.parent / best if best is not None else None
