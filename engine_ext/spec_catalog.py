"""The one catalogue of speculative types: what each is, what model files it needs, how the target and the draft
load for it, and which flags apply. The engine (factory, params), the CLI, the TUI and the README's table all read
it, so a type is added here once.

It declares the speculative settings too (--spec-type, --spec-draft-*; engine_ext.settings_schema lists them with
the others). No imports beyond engine_ext.archs and engine_ext.setting: params.py builds SPEC_TYPES from this module
(which is why it sits beside params.py, not in speculative/, whose drafters import params: no package import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine_ext.archs import RS_ROLLBACK_ARCHS
from engine_ext.setting import Setting


def _draft_setting(name: str, kind: type[Any], default: Any, help: str, flag: str, **limits: Any) -> Setting[Any]:
    """A draft setting, named in messages by llama.cpp's flag ("--spec-draft-n-max must be at least 1")."""
    return Setting(name, kind, default, help, label=flag, flag=flag, saved_in="speculative", **limits)


# The speculative settings (SpeculativeParams, config.toml's [speculative], the F9 panel, the CLI): declared here, with
# the types they apply to, and listed with the other settings in engine_ext.settings_schema.
DRAFT_MODEL: Setting[str] = Setting(
    "draft_model",
    str,
    "",
    "draft model for draft-simple",
    label="draft model",
    flag="--spec-draft-model",
    saved_in="speculative",
)
DRAFT_N_MAX: Setting[int] = _draft_setting(
    "n_max", int, 16, "most tokens drafted per step", "--spec-draft-n-max", minimum=1, maximum=1024
)
DRAFT_N_MIN: Setting[int] = _draft_setting(
    "n_min", int, 0, "drafts shorter than this are skipped", "--spec-draft-n-min", minimum=0, maximum=1024
)
DRAFT_P_MIN: Setting[float] = _draft_setting(
    "p_min",
    float,
    0.0,
    "model drafts stop at a token less likely than this",
    "--spec-draft-p-min",
    minimum=0.0,
    maximum=1.0,
)
DRAFT_FIXED: Setting[bool] = Setting(
    "fixed_length",
    bool,
    False,
    "draft lengths as llama.cpp (n-max, or the n-gram type's own) instead of starting short and growing with "
    "acceptance",
    label="fixed draft lengths",
    flag="--spec-draft-fixed",
)
# The draft length and probability settings the F9 panel, config.toml and the CLI share with SpeculativeParams.
DRAFT_NUMBERS: tuple[Setting[Any], ...] = (DRAFT_N_MAX, DRAFT_N_MIN, DRAFT_P_MIN)

AUTO_SETTINGS = (DRAFT_MODEL, *DRAFT_NUMBERS)
NGRAM_SETTINGS = (DRAFT_N_MAX, DRAFT_N_MIN, DRAFT_FIXED)
MODEL_SETTINGS = (DRAFT_MODEL, *DRAFT_NUMBERS, DRAFT_FIXED)


@dataclass(frozen=True)
class SpecType:
    name: str
    family: str  # "auto", "ngram" (drafts from the text itself) or "model" (a draft model or head)
    summary: str  # a few words, for the F9 type list
    needs: str  # the model files it drafts with, for people
    # What a draft file's metadata says it is (engine_ext.gguf.DraftInfo.draft_type; None: a plain model) for the files
    # this type drafts with; an `mtp-*.gguf` sidecar is "draft-mtp".
    draft_types: tuple[str | None, ...] = ()
    # The kind models_catalog.drafts gives the files it drafts with (sidecars, paired repositories).
    candidate_kind: str | None = None
    # A kind of draft file that comes beside a model or from a paired repository (not a plain model): what the F9
    # panel calls it, and its place in the order llama.cpp infers the type from the files present (arg.cpp).
    file_label: str = ""
    file_rank: int = 0
    # Drafts with the target's own NextN (MTP) heads when no draft file is named: the target loads them (load_mtp).
    own_heads: bool = False
    # A model drafter verifies up to n_max tokens at once: on an architecture that can roll its recurrent state back
    # (RS_ROLLBACK_ARCHS) the target context keeps that many states (n_rs_seq; upstream's need_n_rs_seq for MTP,
    # EAGLE3, DFlash and DSpark). llmtui gives draft-simple the same: rolling back is one call where the other way
    # restores a checkpoint and replays the accepted tokens.
    rolls_back: bool = False
    settings: tuple[Setting[Any], ...] = ()  # the draft settings that apply (their flags in the table)


# In upstream's chain order (common/speculative.cpp: the first that drafts wins); auto first, llmtui's own.
CATALOGUE: tuple[SpecType, ...] = (
    SpecType(
        "auto",
        "auto",
        "best drafter for this model; pauses when slower",
        "nothing; uses the model's MTP heads or a draft when there is one",
        own_heads=True,
        settings=AUTO_SETTINGS,
    ),
    SpecType("ngram-simple", "ngram", "repeats what followed the last n-gram", "nothing", settings=NGRAM_SETTINGS),
    SpecType("ngram-map-k", "ngram", "n-gram map with key counts", "nothing", settings=NGRAM_SETTINGS),
    SpecType("ngram-map-k4v", "ngram", "n-gram map, 4 values per key", "nothing", settings=NGRAM_SETTINGS),
    SpecType("ngram-mod", "ngram", "rolling-hash n-grams (repeated text)", "nothing", settings=NGRAM_SETTINGS),
    SpecType("ngram-cache", "ngram", "n-gram cache of the conversation", "nothing", settings=NGRAM_SETTINGS),
    SpecType(
        "draft-simple",
        "model",
        "a small model, same vocabulary",
        "a smaller model with the same vocabulary",
        draft_types=(None,),
        candidate_kind="model",
        rolls_back=True,
        settings=MODEL_SETTINGS,
    ),
    SpecType(
        "draft-eagle3",
        "model",
        "an EAGLE3 draft head",
        "an EAGLE3 draft GGUF",
        draft_types=("eagle3",),
        candidate_kind="eagle3",
        file_label="EAGLE3 draft",
        file_rank=4,
        rolls_back=True,
        settings=MODEL_SETTINGS,
    ),
    SpecType(
        "draft-mtp",
        "model",
        "the model's own MTP heads",
        "the model's NextN heads, or its mtp-*.gguf sidecar",
        draft_types=("draft-mtp",),
        candidate_kind="mtp",
        file_label="MTP sidecar",
        file_rank=1,
        own_heads=True,
        rolls_back=True,
        settings=MODEL_SETTINGS,
    ),
    SpecType(
        "draft-dflash",
        "model",
        "a DFlash / DFlash2 block draft",
        "a DFlash or DFlash2 draft GGUF",
        draft_types=("dflash", "dflash2"),
        candidate_kind="dflash",
        file_label="DFlash draft",
        file_rank=3,
        rolls_back=True,
        settings=MODEL_SETTINGS,
    ),
    SpecType(
        "draft-dspark",
        "model",
        "a DSpark block draft",
        "a DSpark draft GGUF",
        draft_types=("dspark",),
        candidate_kind="dspark",
        file_label="DSpark draft",
        file_rank=2,
        rolls_back=True,
        settings=MODEL_SETTINGS,
    ),
)

BY_NAME = {t.name: t for t in CATALOGUE}
SPEC_TYPE_NAMES = tuple(t.name for t in CATALOGUE)
NGRAM_TYPES = tuple(t.name for t in CATALOGUE if t.family == "ngram")
MODEL_DRAFTER_TYPES = tuple(t.name for t in CATALOGUE if t.family == "model")
# A draft candidate's kind (models_catalog.drafts) → the type that drafts with it.
TYPE_FOR_KIND = {t.candidate_kind: t.name for t in CATALOGUE if t.candidate_kind}
# What a draft file's metadata says it is (DraftInfo.draft_type; None: a plain model) → the type that uses it.
TYPE_FOR_DRAFT = {draft_type: t.name for t in CATALOGUE for draft_type in t.draft_types}
# The kinds of draft files (models_catalog's sidecars and paired drafts: mtp, dspark, dflash, eagle3) in the order
# llama.cpp infers the type from the files present, and what the F9 panel calls each.
DRAFT_FILE_KINDS: tuple[str, ...] = tuple(
    t.candidate_kind for t in sorted(CATALOGUE, key=lambda t: t.file_rank) if t.file_rank and t.candidate_kind
)
DRAFT_FILE_LABELS: dict[str, str] = {
    t.candidate_kind: t.file_label for t in CATALOGUE if t.candidate_kind and t.file_label
}
# What a draft file's metadata may say it is (engine_ext.gguf.DraftInfo.draft_type) for the types that draft with a
# separate file of their own architecture: the keys of a catalog entry's `drafts` (models_catalog.catalog).
DRAFT_FILE_TYPES: tuple[str, ...] = tuple(
    sorted(d for t in CATALOGUE if t.file_rank and not t.own_heads for d in t.draft_types if d)
)

SPEC_TYPE: Setting[str] = Setting(
    "spec_type",
    str,
    "auto",
    "speculative decoding type",
    label="speculative type",
    flag="--spec-type",
    saved_in="speculative",
    choices=SPEC_TYPE_NAMES,  # the catalogue's, in its order
)


# Drafters that read the target's layer inputs (llama_set_embeddings_layer_inp). Turning those outputs on in a target
# context that has already decoded on a Vulkan device crashed the engine (issue 24: heap corruption or SIGSEGV in
# lavapipe's queue thread, 4 of 4 runs; 0 of 4 with them on before the context's first decode): the engine worker
# gives them a fresh target context when the target has layers on a device (worker.set_speculative).
LAYER_INPUT_TYPES = ("draft-dflash", "draft-dspark", "draft-eagle3")

# Speculative types refused when the target is offloaded to a device of these backends: each crashed the engine there
# (issue 24, measured on Vulkan with Mesa's lavapipe), and the refusal says which and why in one line. None now: the
# layer-input drafters' crash is avoided by the fresh context above.
DEVICE_REFUSALS: dict[str, dict[str, str]] = {}


def needs_fresh_context(types: Sequence[str]) -> bool:
    """Whether turning `types` on may turn on the target's layer inputs (auto may pick a layer-input drafter)."""
    return any(t in LAYER_INPUT_TYPES or t == "auto" for t in types)


def device_refusal(spec_type: str, backends: Sequence[str]) -> str | None:
    """Why `spec_type` is refused with the target's layers on devices of `backends` (None: it is not)."""
    for backend in backends:
        why = DEVICE_REFUSALS.get(spec_type, {}).get(backend)
        if why:
            return (
                f"{spec_type} is off with the target on a {backend} device: {why}; load the target with -ngl 0 "
                "(the draft follows it to the CPU) or pick another drafter"
            )
    return None


@dataclass(frozen=True)
class LoadPlan:
    """How the target loads for a set of types: its MTP heads (load_mtp), and the recurrent states its context keeps
    for rolling a rejected draft back (n_rs_seq)."""

    load_mtp: bool
    n_rs_seq: int


def load_plan(
    types: Sequence[str], *, architecture: str, n_layer_nextn: int, draft_model: str | None, n_max: int
) -> LoadPlan:
    """The one rule the CLI and the TUI load a target by. `types` empty: speculation off. The model's own heads are
    loaded when a type that can use them is on, the model has some and no draft file is named; a model drafter
    (or auto with heads or a draft file) on a rollback architecture keeps n_max recurrent states."""
    specs = [BY_NAME[t] for t in types if t in BY_NAME]
    own_heads = n_layer_nextn > 0 and not draft_model and any(s.own_heads for s in specs)
    model_drafter = any(s.rolls_back for s in specs) or (
        any(s.family == "auto" for s in specs) and (own_heads or bool(draft_model))
    )
    n_rs_seq = n_max if model_drafter and architecture in RS_ROLLBACK_ARCHS else 0
    return LoadPlan(own_heads, n_rs_seq)


def markdown_table() -> str:
    """The README's table of types (tests check that the README carries this very table)."""
    rows = ["| type | drafts with | flags |", "|---|---|---|"]
    for t in CATALOGUE:
        flags = ", ".join(f"`{setting.flag}`" for setting in t.settings)
        rows.append(f"| `{t.name}` | {t.needs} | {flags} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
