"""Building the drafter chain for a loaded model from SpeculativeParams, refusing what would abort."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine_ext.model import Context, Model
from engine_ext.params import SPEC_TYPES, SpeculativeConfigError, SpeculativeParams
from engine_ext.spec_catalog import DRAFT_MODEL, LAYER_INPUT_TYPES, NGRAM_TYPES, TYPE_FOR_DRAFT, device_refusal
from engine_ext.speculative.base import Drafter
from engine_ext.speculative.driver import SpeculativeDriver

if TYPE_CHECKING:
    from engine_ext.speculative.dflash import DraftDFlash


def build_driver(
    params: SpeculativeParams,
    model: Model,
    ctx: Context,
    *,
    draft_simple: Callable[[], Drafter] | None = None,
    draft_mtp: Callable[[], Drafter] | None = None,
    layer_input: Callable[[str], Drafter] | None = None,
) -> SpeculativeDriver:
    """The drafters for `params.types` in upstream's priority order (whatever order the user gave). `draft_simple`,
    `draft_mtp`, `layer_input` (given the type: draft-eagle3, draft-dflash, draft-dspark): make that drafter instead
    of one with a draft context of its own (the parallel sequences share a draft context,
    engine_ext.speculative.draft_seqs, mtp_seqs and layer_seqs)."""
    params.validate()
    if params.types == ("auto",):
        return build_auto_driver(
            params, model, ctx, draft_simple=draft_simple, draft_mtp=draft_mtp, layer_input=layer_input
        )
    drafters: list[Drafter] = []
    try:
        for spec_type in SPEC_TYPES:
            if spec_type not in params.types:
                continue
            if spec_type == "draft-simple" and draft_simple is not None:
                drafters.append(draft_simple())
                continue
            if spec_type == "draft-mtp" and draft_mtp is not None:
                drafters.append(draft_mtp())
                continue
            if spec_type in LAYER_INPUT_TYPES and layer_input is not None:
                _check_device(spec_type, model)
                drafters.append(layer_input(spec_type))
                continue
            drafters.append(_build(spec_type, params, model, ctx))
    except Exception:
        for d in drafters:
            d.close()
        raise
    return SpeculativeDriver(params, drafters)


def _build(spec_type: str, params: SpeculativeParams, model: Model, ctx: Context) -> Drafter:
    if spec_type in NGRAM_TYPES:
        from engine_ext.speculative.ngram import make_ngram_drafter

        return make_ngram_drafter(spec_type, record_stats=False)  # the driver records statistics
    _check_device(spec_type, model)
    if spec_type == "draft-simple":
        from engine_ext.speculative.draft_model import DraftSimple

        assert params.draft_model is not None  # validate() checked it
        path = Path(params.draft_model)
        if not path.is_file():
            raise SpeculativeConfigError(f"draft model not found: {path}")
        return DraftSimple(path, model, ctx, p_min=params.p_min)
    if spec_type == "draft-mtp":
        return _build_mtp(params, model, ctx)
    if spec_type in ("draft-dflash", "draft-dspark"):
        return _build_dflash(spec_type, params, model, ctx)
    if spec_type == "draft-eagle3":
        from engine_ext.speculative.eagle3 import build_eagle3

        return build_eagle3(params, model, ctx)
    raise SpeculativeConfigError(f"{spec_type} is not supported by this version of llmtui yet")


def _check_device(spec_type: str, model: Model) -> None:
    refusal = device_refusal(spec_type, target_backends(model)) or lavapipe_refusal(spec_type, model)
    if refusal:  # a combination that crashed the engine on this kind of device (catalog.DEVICE_REFUSALS)
        raise SpeculativeConfigError(refusal)


def _build_mtp(params: SpeculativeParams, model: Model, ctx: Context) -> Drafter:
    """The MTP head inside the target (loaded with load_mtp), or an `mtp-*.gguf` sidecar given as draft model."""
    from engine_ext.params import ModelParams
    from engine_ext.speculative.mtp import DraftMTP

    if params.draft_model and Path(params.draft_model).name.startswith("mtp-"):
        path = Path(params.draft_model)
        if not path.is_file():
            raise SpeculativeConfigError(f"MTP sidecar not found: {path}")
        sidecar = Model(path, ModelParams(n_gpu_layers=model.params.n_gpu_layers, load_mtp=True))
        try:
            return DraftMTP(sidecar, model, ctx, p_min=params.p_min, owns_head=True)
        except Exception:
            sidecar.close()
            raise
    if model.n_layer_nextn < 1:
        raise SpeculativeConfigError(
            f"{model.path.name} has no MTP head; give its mtp-*.gguf sidecar with {DRAFT_MODEL.flag}"
        )
    return DraftMTP(model, model, ctx, p_min=params.p_min)


def target_backends(model: Model) -> tuple[str, ...]:
    """The GPU backends (e.g. Vulkan, CUDA) the target's layers are on: none with -ngl 0 or without a GPU device."""
    if model.params.n_gpu_layers == 0:
        return ()
    from engine_ext.doctor import list_devices

    _, devices = list_devices()
    names = [d.name for d in devices if d.type in ("GPU", "integrated GPU", "accelerator")]
    return tuple(dict.fromkeys(name.rstrip("0123456789") for name in names))


def target_on_lavapipe(model: Model) -> bool:
    """Whether the target has layers on Mesa's lavapipe (a Vulkan driver that runs on the CPU)."""
    if model.params.n_gpu_layers == 0:
        return False
    from engine_ext.doctor import is_lavapipe, list_devices

    _, devices = list_devices()
    return any(is_lavapipe(d.description) for d in devices if d.type in ("GPU", "integrated GPU", "accelerator"))


def lavapipe_refusal(spec_type: str, model: Model) -> str | None:
    """Why `spec_type` is refused for this target on lavapipe (None: it is not). A drafter that reads the target's
    layer inputs with a mixture-of-experts target crashed Mesa 22.3's lavapipe (issue 24: draft-dflash on the tiny
    qwen3next, SIGSEGV while decoding speculatively, in 5 of 5 runs through the worker, with the fresh target
    context); Mesa 25.0's lavapipe ran it, identical to plain decoding, in 3 of 3."""
    if spec_type not in LAYER_INPUT_TYPES or not target_on_lavapipe(model):
        return None
    from engine_ext.gguf import inspect_gguf

    if not inspect_gguf(model.path).expert_count:
        return None
    return (
        f"{spec_type} is off with a mixture-of-experts target on Mesa's lavapipe: it crashed the engine there (a "
        "Mesa 22.3 driver bug); load the target with -ngl 0 (the draft follows it to the CPU) or pick another drafter"
    )


def _build_dflash(spec_type: str, params: SpeculativeParams, model: Model, ctx: Context) -> Drafter:
    return build_dflash(spec_type, params, model, ctx)


def build_dflash(
    spec_type: str, params: SpeculativeParams, model: Model, ctx: Context, *, n_seq: int = 1
) -> DraftDFlash:
    """A DFlash/DFlash2/DSpark draft GGUF, checked against the target before llama.cpp sees it together (n_seq: draft
    sequences, one per target sequence of the parallel loop)."""
    from engine_ext.gguf import inspect_gguf
    from engine_ext.params import ModelParams
    from engine_ext.speculative.dflash import DraftDFlash

    if not params.draft_model:
        raise SpeculativeConfigError(f"{spec_type} needs its draft GGUF ({DRAFT_MODEL.flag} PATH)")
    path = Path(params.draft_model)
    if not path.is_file():
        raise SpeculativeConfigError(f"draft model not found: {path}")
    info = inspect_gguf(path)
    kind = info.draft.draft_type
    wanted = {"draft-dflash": ("dflash", "dflash2"), "draft-dspark": ("dspark",)}[spec_type]
    if kind not in wanted:
        hint = f"it is a {kind} draft" if kind else "it is not a DFlash or DSpark draft"
        raise SpeculativeConfigError(f"{path.name} cannot be used with {spec_type}: {hint}")
    draft = Model(path, ModelParams(n_gpu_layers=model.params.n_gpu_layers))
    try:
        return DraftDFlash(
            draft, model, ctx, dspark=spec_type == "draft-dspark", n_max=params.n_max, p_min=params.p_min, n_seq=n_seq
        )
    except Exception:
        draft.close()
        raise


def auto_types(params: SpeculativeParams, model: Model) -> tuple[str, ...]:
    """What auto mode chains: ngram-mod (free, strong on repeated text), then the best model drafter available."""
    from engine_ext.gguf import inspect_gguf

    chain = ["ngram-mod"]
    if model.n_layer_nextn > 0 and model.params.load_mtp:
        chain.append("draft-mtp")
    elif params.draft_model:
        draft_type = inspect_gguf(Path(params.draft_model)).draft.draft_type
        drafter = TYPE_FOR_DRAFT.get(draft_type, "draft-simple")
        if not lavapipe_refusal(drafter, model):  # refused there: auto keeps to ngram-mod
            chain.append(drafter)
    return tuple(chain)


def build_auto_driver(
    params: SpeculativeParams,
    model: Model,
    ctx: Context,
    *,
    draft_simple: Callable[[], Drafter] | None = None,
    draft_mtp: Callable[[], Drafter] | None = None,
    layer_input: Callable[[str], Drafter] | None = None,
) -> SpeculativeDriver:
    """Auto mode's chain (auto_types); without a model drafter, a short-key copier (ngram-prompt) after ngram-mod,
    so text repeated from the prompt is drafted from the first reply on. The hooks: as build_driver's (a parallel
    sequence's model drafter drafts in the shared draft context)."""
    from dataclasses import replace

    from engine_ext.speculative.ngram import prompt_lookup_drafter

    chosen = replace(params, types=auto_types(params, model))
    drafters = build_driver(
        chosen, model, ctx, draft_simple=draft_simple, draft_mtp=draft_mtp, layer_input=layer_input
    ).drafters
    if not any(d.follows_draft_n_max for d in drafters):  # n-gram drafters only
        drafters.append(prompt_lookup_drafter())
    return SpeculativeDriver(chosen, drafters, auto=True)
