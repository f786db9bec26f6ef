"""What speculative decoding the loaded model allows, how to load it for that, and short readouts of the stats."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from app.core.config import SpeculativeSettings
from engine_ext.gguf import GGUFError, inspect_gguf
from engine_ext.protocol import SpeculativeStats
from engine_ext.spec_catalog import CATALOGUE, NGRAM_TYPES, TYPE_FOR_DRAFT, TYPE_FOR_KIND, load_plan
from models_catalog.drafts import DraftCandidate, draft_candidates, missing_drafts

# The catalogue's names for what the UI shows and picks (engine_ext.spec_catalog holds the types).
TYPE_HELP = {t.name: t.summary for t in CATALOGUE}
KIND_TYPES = TYPE_FOR_KIND  # a draft candidate's kind (models_catalog.drafts) → the type that drafts with it
DRAFT_KIND_TYPES = TYPE_FOR_DRAFT  # what a draft file's metadata says it is → the type that uses it
SPARK_BARS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class ModelFacts:
    """What the UI needs to know about a model file (read from its GGUF header, not its weights)."""

    architecture: str
    n_embd: int
    n_layer: int
    n_layer_nextn: int


@lru_cache(maxsize=16)
def model_facts(path: str) -> ModelFacts | None:
    """The file's facts, or None when it cannot be read."""
    try:
        info = inspect_gguf(Path(path))
    except (GGUFError, OSError):
        return None
    return ModelFacts(info.architecture or "", info.embedding_length or 0, info.block_count or 0, info.n_layer_nextn)


def draft_file_type(path: str) -> tuple[str | None, str]:
    """The speculative type a draft file is used with (None: not usable) and a note saying why."""
    from app.core.model_paths import user_path

    file = user_path(path)
    if file is None:
        return None, f"{path!r} cannot name a file"
    if not file.is_file():
        return None, f"{file} does not exist"
    try:
        info = inspect_gguf(file)
    except (GGUFError, OSError) as error:
        return None, str(error)
    if info.is_mtp_sidecar or file.name.startswith("mtp-"):
        return "draft-mtp", "an MTP sidecar"
    kind = info.draft.draft_type
    spec_type = DRAFT_KIND_TYPES.get(kind)
    if spec_type is None:
        return None, f"{file.name} is a {kind} draft, which llmtui cannot use"
    return spec_type, "a small model (draft-simple)" if kind is None else f"a {kind} draft"


def supported_types(
    model_path: str | None, draft_model: str, sidecars: Sequence[DraftCandidate] = ()
) -> list[tuple[str, str]]:
    """(type, description) the loaded model allows: auto and the n-gram types always, MTP with NextN heads,
    the model drafter the draft file is, and (with no draft file named) those of the model's own sidecars."""
    types = [("auto", TYPE_HELP["auto"])]
    types += [(t, TYPE_HELP[t]) for t in NGRAM_TYPES]
    facts = model_facts(model_path) if model_path else None
    if facts is not None and facts.n_layer_nextn > 0:
        types.append(("draft-mtp", TYPE_HELP["draft-mtp"]))
    if draft_model.strip():
        spec_type, note = draft_file_type(draft_model.strip())
        if spec_type is not None and all(t != spec_type for t, _ in types):
            types.append((spec_type, f"{TYPE_HELP[spec_type]} ({note})"))
    else:
        for candidate in sidecars:
            spec_type = KIND_TYPES[candidate.kind]
            if all(t != spec_type for t, _ in types):
                types.append((spec_type, f"{TYPE_HELP[spec_type]} ({candidate.path.name})"))
    return types


def find_drafts(
    model_path: str, config_folders: Iterable[str], *, same_vocabulary: bool = False
) -> tuple[list[DraftCandidate], list[tuple[str, str]]]:
    """The drafts the model brings along: sidecars beside it, and drafts from its catalog-paired repositories in the
    cache (what `llmtui models pull --with KIND` fetched); and (kind, repository) of those the catalog pairs with it
    that are not downloaded. With `same_vocabulary`, also the smaller models that could draft for it (what the user
    picks from, F9 then ctrl+d; it reads every model's header)."""
    from app.core.paths import data_dir, library
    from models_catalog.catalog import load_catalog
    from models_catalog.errors import ModelsError

    path = Path(model_path)
    try:
        models = library(config_folders).models(inspect=False)
        catalog = load_catalog(overlay_path=data_dir() / "catalog-refresh.json")
    except (OSError, ModelsError):  # an unreadable cache or catalog: the sidecars beside the model still count
        models, catalog = [], None
    found = draft_candidates(path, models, catalog, same_vocabulary=same_vocabulary)
    if not same_vocabulary:
        found = [c for c in found if c.kind != "model"]  # a paired repository's plain model is no default
    return found, missing_drafts(path, models, catalog, found)


def find_sidecars(model_path: str, config_folders: Iterable[str]) -> list[DraftCandidate]:
    """The drafts the model brings along (see find_drafts)."""
    return find_drafts(model_path, config_folders)[0]


def drafts_with_own_heads(model_path: str | None, spec_type: str, draft_model: str | None) -> bool:
    """Whether the model's own MTP heads draft (and must be loaded): it has some, the type is auto or draft-mtp, and no
    draft file is named."""
    facts = model_facts(model_path) if model_path else None
    return (
        facts is not None
        and load_plan(
            (spec_type,),
            architecture=facts.architecture,
            n_layer_nextn=facts.n_layer_nextn,
            draft_model=draft_model,
            n_max=1,
        ).load_mtp
    )


def effective_settings(
    model_path: str | None, settings: SpeculativeSettings, sidecars: Sequence[DraftCandidate]
) -> SpeculativeSettings:
    """`settings` with the draft the engine uses: the user's draft file, else the model's own sidecar for the type
    (for auto the first in llama.cpp's order mtp > dspark > dflash > eagle3, as llama.cpp attaches it). A model
    with its own MTP heads drafts with them, not with an MTP sidecar."""
    if settings.draft_model or not sidecars or drafts_with_own_heads(model_path, settings.spec_type, ""):
        return settings  # a model's own heads come first, as upstream infers mtp first
    for candidate in sidecars:
        if settings.spec_type in ("auto", KIND_TYPES[candidate.kind]):
            return replace(settings, draft_model=str(candidate.path))
    return settings


def load_options(model_path: str, settings: SpeculativeSettings) -> tuple[bool, int]:
    """(load_mtp, n_rs_seq) the model needs for `settings`, by the catalogue's one rule (the CLI's too)."""
    facts = model_facts(model_path)
    if facts is None or not settings.enabled:
        return False, 0
    plan = load_plan(
        (settings.spec_type,),
        architecture=facts.architecture,
        n_layer_nextn=facts.n_layer_nextn,
        draft_model=settings.draft_model,
        n_max=settings.n_max,
    )
    return plan.load_mtp, plan.n_rs_seq


def sparkline(values: tuple[float, ...] | list[float], width: int) -> str:
    """The last `width` values in 0..1 as block characters."""
    tail = list(values)[-width:]
    return "".join(SPARK_BARS[max(0, min(7, round(v * 7)))] for v in tail)


MIN_NOISE = 0.03
"""Speeds within 3% are no measurable difference, however steady the runs (the check and the readouts)."""
NOISE_RUNS = 5
"""The readouts measure the run-to-run spread over the last five replies."""


def spread(speeds: Sequence[float]) -> float | None:
    """How much measured speeds (or speed ratios) vary between runs, relative to their mean: (max - min) / mean;
    None with fewer than two runs (no spread measured)."""
    if len(speeds) < 2 or min(speeds) <= 0:
        return None
    return (max(speeds) - min(speeds)) / (sum(speeds) / len(speeds))


def measurable(ratio: float, noise: float | None) -> bool:
    """Whether a speed ratio says anything: outside the measured run-to-run spread (and at least `MIN_NOISE` away
    from 1). Not while the spread is unmeasured (one run)."""
    return noise is not None and abs(ratio - 1) > max(noise, MIN_NOISE)


def speedup_text(speedup: float, noise: float | None, digits: int = 1) -> str:
    """ "×1.4" when the ratio is a measurable difference; "~×1.4" when it is within the run-to-run spread of this
    session's replies, or when only one reply measured it (the speculation check says "no measurable
    difference" then)."""
    mark = "" if measurable(speedup, noise) else "~"
    return f"{mark}×{speedup:.{digits}f}"


def short_summary(stats: SpeculativeStats, noise: float | None = None) -> str:
    """A few characters for the stats bar: acceptance and speedup ("~" marks a speedup within the noise, or whose
    noise is not measured yet: `speedup_text`)."""
    parts = [f"{stats.acceptance_rate:.0%}"] if stats.drafted else []
    if stats.speedup > 0:
        parts.append(speedup_text(stats.speedup, noise))
    return " ".join(parts) or "on"
