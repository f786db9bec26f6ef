"""The engine, sampling and speculative arguments of `run`, `chat` and `bench`, and the parameters they make (the
same rules as the chat app: app.speculation, engine_ext.spec_catalog)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.session import CliError
from app.cli.types import (
    INT32_MAX,
    MAX_CONTEXT,
    MAX_THREADS,
    finite_float,
    int_range,
    seed,
    shares,
    utf8_text,
)
from app.models import resolve_model
from engine_ext.params import (
    DEFAULT_FIT_TARGET_MIB,
    DEFAULT_SEED,
    GPU_LAYERS_AUTO,
    KV_CACHE_TYPES,
    SPEC_TYPES,
    SPLIT_MODES,
    ContextParams,
    ModelParams,
    SamplingParams,
    SpeculativeParams,
)
from engine_ext.spec_catalog import LoadPlan, load_plan

CONTEXT = int_range(0, MAX_CONTEXT, meaning="0: the model's")


THREADS = int_range(0, MAX_THREADS, meaning="0: automatic")


BATCH = int_range(1, MAX_CONTEXT)


COUNT = int_range(0, INT32_MAX)  # top-k, --fit-target: 0 or more


PROBABILITY = finite_float(0.0, 1.0)


NON_NEGATIVE = finite_float(0.0)


POSITIVE = finite_float(0.0, above=True)


ANY_FINITE = finite_float()


DEVICE = int_range(0, 1023)  # -mg: a device index


LAYERS = int_range(0, 4096)  # --n-cpu-moe: more than the model has means every layer


DRAFT_MAX = int_range(1, 1024)


DRAFT_MIN = int_range(0, 1024)


def add_engine_args(p: argparse.ArgumentParser, *, default_ctx: int = 4096) -> None:
    p.add_argument("-m", "--model", default="starter", help="model: a .gguf path or 'starter' (default)")
    p.add_argument(
        "-c",
        "--ctx-size",
        type=CONTEXT,
        default=default_ctx,
        help="context size in tokens (0: model's; llama.cpp rounds it up to a multiple of 256)",
    )
    p.add_argument("-t", "--threads", type=THREADS, default=0, help="threads (default: one per physical core)")
    p.add_argument(
        "-ngl",
        "--n-gpu-layers",
        type=_gpu_layers,
        default=-1,
        metavar="N|auto|all",
        help="layers on the GPU (-1 or all: every layer; auto: as many as free device memory holds)",
    )
    p.add_argument(
        "--fit-target",
        type=COUNT,
        default=DEFAULT_FIT_TARGET_MIB,
        metavar="MiB",
        help="with -ngl auto: memory to leave free on each device (default %(default)s MiB)",
    )
    p.add_argument("-b", "--batch-size", type=BATCH, default=2048, help="logical batch size")
    p.add_argument("-ub", "--ubatch-size", type=BATCH, default=512, help="physical batch size")
    p.add_argument("-fa", "--flash-attn", choices=("auto", "on", "off"), default="auto")
    p.add_argument("-ctk", "--cache-type-k", choices=sorted(KV_CACHE_TYPES), default="f16")
    p.add_argument("-ctv", "--cache-type-v", choices=sorted(KV_CACHE_TYPES), default="f16")
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory instead of mapping it")
    p.add_argument("--mlock", action="store_true", help="lock the model in RAM")
    p.add_argument(
        "--no-repack",
        action="store_true",
        help="keep CPU weights as stored: no repacking for this "
        "CPU's matrix instructions (AMX, CPU_REPACK); avoids a repack path that crashes",
    )
    p.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="llama.cpp RPC servers to use as devices")
    p.add_argument(
        "-sm",
        "--split-mode",
        choices=SPLIT_MODES,
        default="layer",
        help="how to split the model across devices (tensor: llama.cpp's tensor parallelism)",
    )
    p.add_argument(
        "-ts", "--tensor-split", type=shares, default="", metavar="N0,N1,...", help="share of the model per device"
    )
    p.add_argument("-mg", "--main-gpu", type=DEVICE, default=0, help="the device for the whole model with -sm none")
    p.add_argument(
        "--n-cpu-moe",
        type=LAYERS,
        default=0,
        metavar="N",
        help="keep the experts of the first N layers on the CPU (MoE models)",
    )


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=NON_NEGATIVE, default=0.8, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=COUNT, default=40)
    p.add_argument("--top-p", type=PROBABILITY, default=0.95)
    p.add_argument("--min-p", type=PROBABILITY, default=0.05)
    p.add_argument("--repeat-penalty", type=POSITIVE, default=1.0)
    p.add_argument("--repeat-last-n", type=int_range(-1, MAX_CONTEXT, meaning="-1: the context"), default=64)
    p.add_argument("--presence-penalty", type=ANY_FINITE, default=0.0)
    p.add_argument("--frequency-penalty", type=ANY_FINITE, default=0.0)
    p.add_argument("-s", "--seed", type=seed, default=DEFAULT_SEED, help="RNG seed (default, -1: random)")
    p.add_argument("--stop", action="append", type=utf8_text, default=[], help="stop string (repeatable)")
    p.add_argument("--system", type=utf8_text, default=None, help="system prompt")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spec-type",
        default="",
        metavar="T[,T...]",
        help=f"speculative decoding: {', '.join(SPEC_TYPES)} (comma-separated; off by default)",
    )
    p.add_argument("--spec-draft-model", default=None, metavar="PATH", help="draft model for draft-simple")
    p.add_argument("--spec-draft-n-max", type=DRAFT_MAX, default=16, help="most tokens drafted per step")
    p.add_argument("--spec-draft-n-min", type=DRAFT_MIN, default=0, help="drafts shorter than this are skipped")
    p.add_argument("--spec-draft-p-min", type=PROBABILITY, default=0.0, help="min draft token probability")
    p.add_argument(
        "--spec-draft-fixed",
        action="store_true",
        help="draft lengths as llama.cpp (n-max, or the n-gram type's own) instead of starting short and "
        "growing with acceptance",
    )


def spec_params(args: argparse.Namespace, model: Path, types: str | None = None) -> SpeculativeParams:
    names = args.spec_type if types is None else types
    spec_types = tuple(t.strip() for t in names.split(",") if t.strip())
    draft = str(resolve_model(args.spec_draft_model)) if args.spec_draft_model else _sidecar_draft(model, spec_types)
    return SpeculativeParams(
        types=spec_types,
        draft_model=draft,
        n_max=args.spec_draft_n_max,
        n_min=args.spec_draft_n_min,
        p_min=args.spec_draft_p_min,
        fixed_length=args.spec_draft_fixed,
    )


def _sidecar_draft(model: Path, spec_types: tuple[str, ...]) -> str | None:
    """With no --spec-draft-model, the draft the model brings along for a single type (auto or a model drafter):
    a sidecar beside it or a draft from its paired repository, as the chat app uses it (said on stderr)."""
    from app.config import SpeculativeSettings, load_config
    from app.speculation import effective_settings, find_sidecars

    if len(spec_types) != 1:
        return None
    sidecars = find_sidecars(str(model), load_config().model_folders)
    chosen = effective_settings(str(model), SpeculativeSettings(enabled=True, spec_type=spec_types[0]), sidecars)
    if not chosen.draft_model:
        return None
    where = next(c.where for c in sidecars if str(c.path) == chosen.draft_model)
    print(
        f"note: {spec_types[0]} drafts with {Path(chosen.draft_model).name} ({where}); "
        "--spec-draft-model names another",
        file=sys.stderr,
    )
    return chosen.draft_model


def target_load_plan(spec: SpeculativeParams | None, model: Path) -> LoadPlan:
    """How the target loads for `spec` (its MTP heads, its recurrent-state rollback depth): the catalogue's one rule,
    the TUI's too (app.speculation.load_options)."""
    from app.speculation import model_facts

    facts = model_facts(str(model))
    if spec is None or facts is None:
        return LoadPlan(False, 0)
    return load_plan(
        spec.types,
        architecture=facts.architecture,
        n_layer_nextn=facts.n_layer_nextn,
        draft_model=spec.draft_model,
        n_max=spec.n_max,
    )


def model_params(
    args: argparse.Namespace, spec: SpeculativeParams | None = None, model: Path | None = None
) -> ModelParams:
    # MTP heads inside the model are loaded only when draft-mtp (or auto) will use them (llama.cpp's load_mtp).
    load_mtp = model is not None and target_load_plan(spec, model).load_mtp
    return ModelParams(
        n_gpu_layers=args.n_gpu_layers,
        use_mmap=not args.no_mmap,
        use_mlock=args.mlock,
        use_extra_bufts=not args.no_repack and _saved_repack(),
        load_mtp=load_mtp,
        rpc_servers=tuple(s.strip() for s in args.rpc.split(",") if s.strip()),
        split_mode=args.split_mode,
        tensor_split=_floats(args.tensor_split, "--tensor-split"),
        main_gpu=args.main_gpu,
        n_cpu_moe=args.n_cpu_moe,
        fit_target_mib=args.fit_target,
        mmproj=str(projector) if (projector := projector_for(args, model)) else None,
    )


def add_mmproj_arg(p: argparse.ArgumentParser) -> None:
    """--mmproj, for the commands that send images (run, serve)."""
    p.add_argument(
        "--mmproj",
        type=Path,
        default=None,
        metavar="FILE",
        help="the model's multimodal projector (images); run's default: the mmproj*.gguf beside the model",
    )


def projector_for(args: argparse.Namespace, model: Path | None) -> Path | None:
    """The projector a model loads with: --mmproj, else the mmproj sidecar paired with it on disk (models_catalog's
    rule, llama.cpp's: in its folder, the closest quant) when images are to be sent; None: no images."""
    given: Path | None = getattr(args, "mmproj", None)
    if given is not None:
        if not given.is_file():
            raise CliError(f"--mmproj {given}: no such file")
        return given
    if not getattr(args, "image", None) or model is None:
        return None
    from models_catalog.pairing import local_mmproj

    return local_mmproj(model)


def _saved_repack() -> bool:
    """Whether the saved settings repack CPU weights (F3; engine.use_extra_bufts): a crash fix made there holds for
    the commands too. A broken config.toml is the chat app's to report; here it means the default."""
    from app.config import ConfigError, load_config

    try:
        return load_config().engine.use_extra_bufts
    except (ConfigError, OSError):
        return True


def _gpu_layers(text: str) -> int:
    """-ngl's value: a count, -1/all (every layer) or auto (planned from free device memory)."""
    if text.strip().lower() == "auto":
        return GPU_LAYERS_AUTO
    if text.strip().lower() == "all":
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, all or auto, not {text!r}") from None
    if not -1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"expected a number from -1 to {INT32_MAX}, all or auto, not {value}")
    return value


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace("/", ",").split(",") if v.strip())
    except ValueError:
        raise CliError(f"{flag} takes numbers separated by commas, not {text!r}") from None


def context_params(args: argparse.Namespace, n_ctx: int | None = None, n_rs_seq: int = 0) -> ContextParams:
    return ContextParams(
        n_rs_seq=n_rs_seq,
        n_ctx=args.ctx_size if n_ctx is None else n_ctx,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=args.threads,
        flash_attn=args.flash_attn,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )
