"""The engine, sampling and speculative arguments of `run`, `chat` and `bench`, and the parameters they make (the
same rules as the chat app: app.core.speculation_facts, engine_ext.spec_catalog)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app.cli.flags import add_setting, flag_values
from app.cli.session import CliError
from app.cli.types import INT32_MAX, seed, shares, utf8_text
from app.core.model_paths import resolve_model
from engine_ext import settings_schema as s
from engine_ext.params import (
    GPU_LAYERS_AUTO,
    ContextParams,
    ModelParams,
    SamplingParams,
    SpeculativeParams,
)
from engine_ext.settings_schema import Setting
from engine_ext.spec_catalog import LoadPlan, load_plan


def add_engine_args(
    p: argparse.ArgumentParser, *, default_ctx: int = s.N_CTX.default, model_help: str | None = None
) -> None:
    """The engine's flags; -m defaults to the starter model (with `model_help`: to None, that help saying why)."""
    if model_help is None:
        p.add_argument("-m", "--model", default="starter", help="model: a .gguf path or 'starter' (default)")
    else:
        p.add_argument("-m", "--model", default=None, help=model_help)
    special: dict[Setting[Any], dict[str, Any]] = {
        s.N_CTX: {"default": default_ctx},
        s.N_GPU_LAYERS: {"type": _gpu_layers, "metavar": "N|auto|all"},
        s.FIT_TARGET_MIB: {"metavar": "MiB", "help": f"{s.FIT_TARGET_MIB.help} (default %(default)s MiB)"},
        s.TENSOR_SPLIT: {"type": shares, "metavar": "N0,N1,..."},
        s.RPC_SERVERS: {"metavar": "HOST:PORT,..."},
        s.N_CPU_MOE: {"metavar": "N"},
    }
    for setting in s.ENGINE:
        add_setting(p, setting, **special.get(setting, {}))


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    for setting in s.SAMPLING:
        add_setting(p, setting, **({"type": seed} if setting is s.SEED else {}))
    p.add_argument("--stop", action="append", type=utf8_text, default=[], help="stop string (repeatable)")
    p.add_argument("--system", type=utf8_text, default=None, help="system prompt")


def add_max_tokens_arg(p: argparse.ArgumentParser) -> None:
    """-n: the most tokens a reply of `run` and `chat` may have (serve takes it per request)."""
    add_setting(p, s.N_PREDICT)


def add_reasoning_args(p: argparse.ArgumentParser) -> None:
    """--reasoning-budget, --reasoning-budget-message, --reasoning-effort (run and chat; llama.cpp's flags)."""
    for setting in s.REASONING:
        if setting is s.REASONING_BUDGET_MESSAGE:
            add_setting(p, setting, type=utf8_text, metavar="TEXT")
        else:
            add_setting(p, setting, **({"metavar": "N"} if setting is s.REASONING_BUDGET else {}))


def reasoning_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Generate's reasoning fields from the parsed flags."""
    fields = flag_values(args, s.REASONING)
    fields["reasoning_effort"] = s.effort_or_none(fields["reasoning_effort"])
    return fields


def add_spec_args(p: argparse.ArgumentParser) -> None:
    add_setting(
        p,
        s.SPEC_TYPE,
        default="",
        choices=None,  # a comma-separated chain, checked by SpeculativeParams
        metavar="T[,T...]",
        help=f"speculative decoding: {', '.join(s.SPEC_TYPE.choices)} (comma-separated; off by default)",
    )
    add_setting(p, s.DRAFT_MODEL, default=None, metavar="PATH")
    for setting in (*s.DRAFT_NUMBERS, s.DRAFT_FIXED):
        add_setting(p, setting)


def spec_params(args: argparse.Namespace, model: Path, types: str | None = None) -> SpeculativeParams:
    names = args.spec_type if types is None else types
    spec_types = tuple(t.strip() for t in names.split(",") if t.strip())
    draft = str(resolve_model(args.spec_draft_model)) if args.spec_draft_model else _sidecar_draft(model, spec_types)
    numbers = flag_values(args, (*s.DRAFT_NUMBERS, s.DRAFT_FIXED))
    return SpeculativeParams(types=spec_types, draft_model=draft, **numbers)


def _sidecar_draft(model: Path, spec_types: tuple[str, ...]) -> str | None:
    """With no --spec-draft-model, the draft the model brings along for a single type (auto or a model drafter):
    a sidecar beside it or a draft from its paired repository, as the chat app uses it (said on stderr)."""
    from app.core.config import SpeculativeSettings, load_config
    from app.core.speculation_facts import effective_settings, find_sidecars

    if len(spec_types) != 1:
        return None
    sidecars = find_sidecars(str(model), load_config().model_folders)
    chosen = effective_settings(str(model), SpeculativeSettings(enabled=True, spec_type=spec_types[0]), sidecars)
    if not chosen.draft_model:
        return None
    where = next(c.where for c in sidecars if str(c.path) == chosen.draft_model)
    print(
        f"note: {spec_types[0]} drafts with {Path(chosen.draft_model).name} ({where}); "
        f"{s.DRAFT_MODEL.flag} names another",
        file=sys.stderr,
    )
    return chosen.draft_model


def target_load_plan(spec: SpeculativeParams | None, model: Path) -> LoadPlan:
    """How the target loads for `spec` (its MTP heads, its recurrent-state rollback depth): the catalogue's one rule,
    the TUI's too (app.core.speculation_facts.load_options)."""
    from app.core.speculation_facts import model_facts

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
    values = flag_values(args, s.MODEL)
    values["use_extra_bufts"] = values["use_extra_bufts"] and _saved_repack()
    return ModelParams(
        **values,
        load_mtp=load_mtp,
        rpc_servers=tuple(server.strip() for server in args.rpc.split(",") if server.strip()),
        tensor_split=_floats(args.tensor_split, "--tensor-split"),
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
    from app.core.config import ConfigError, load_config

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
    values = flag_values(args, s.CONTEXT)
    if n_ctx is not None:
        values["n_ctx"] = n_ctx
    return ContextParams(**values, n_rs_seq=n_rs_seq)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**flag_values(args, s.SAMPLING))
