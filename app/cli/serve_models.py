"""`llmtui serve` without -m: every local model (the starter, the Hugging Face and llama.cpp caches, the model
folders and `--models-dir`) served by its name through `app.server.model_router`, each loaded when a request first
names it, in a worker of its own."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.cli.engine_args import sampling_params
from app.cli.serving import ModelLoad, listen_until_stopped, plan_model_load, pooled_routes, start_model_backend
from app.cli.session import CliError
from app.cli.types import int_range
from app.core import app_settings_schema as ui
from app.core.model_list import LocalModel
from app.core.model_paths import ModelNotFound
from app.core.model_presets import PRESET_SETTINGS, ModelPreset, PresetError, preset_for, serve_id, vector_entries
from app.server.api_errors import ApiError
from app.server.backend import ServerSettings
from app.server.metrics import Metrics
from app.server.model_router import RoutedModel, StartedModel
from app.server.requests import Job
from engine_ext import settings_schema as s
from engine_ext.client import EngineCrashedError, EngineFailure
from engine_ext.params import EngineError
from engine_ext.spec_catalog import DRAFT_MODEL
from engine_ext.untrusted_text import one_line

DEFAULT_MODELS_MAX = 4  # llama-server's --models-max
# Flags that name one model's files or name: with every model served, a model's preset says them instead.
_ONE_MODEL_FLAGS = (
    ("alias", "--alias"),
    ("slot_save_path", "--slot-save-path"),
    ("spec_draft_model", DRAFT_MODEL.flag),
    ("mmproj", "--mmproj"),
    ("control_vector", "--control-vector"),
    ("control_vector_scaled", "--control-vector-scaled"),
)


def add_router_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--models-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="without -m: serve the models in DIR too (three levels deep; repeatable), beside the Hugging Face cache "
        "and the model folders of the settings",
    )
    serve.add_argument(
        "--models-max",
        type=int_range(1, 64),
        default=DEFAULT_MODELS_MAX,
        metavar="N",
        help="without -m: most models loaded at once; the least recently used idle one is unloaded for another "
        f"(default {DEFAULT_MODELS_MAX})",
    )
    serve.add_argument(
        "--idle-unload",
        type=int_range(0, 7 * 86400),
        default=0,
        metavar="SECONDS",
        help="without -m: unload a model after SECONDS without requests (default 0: never)",
    )


def refuse_router_flags(args: argparse.Namespace) -> None:
    """`serve -m MODEL` serves that one model: the router's flags would do nothing, so they are refused."""
    given = [
        flag
        for flag, value, default in (
            ("--models-dir", args.models_dir, []),
            ("--models-max", args.models_max, DEFAULT_MODELS_MAX),
            ("--idle-unload", args.idle_unload, 0),
        )
        if value != default
    ]
    if given:
        raise CliError(f"{given[0]} is for serving every local model: leave out -m {args.model}")


def routed_models(found: Sequence[LocalModel], presets: Sequence[ModelPreset] = ()) -> list[RoutedModel]:
    """The router's models (their ids: app.core.model_presets.serve_id; the second of one id gets `-2`), each also
    known by its preset's alias and its file's name (`serve -m`'s id), pinned when its preset says so."""
    models: list[RoutedModel] = []
    taken: set[str] = set()
    for model in found:
        name = serve_id(model.source, model.name, model.path)
        model_id, n = name, 2
        while model_id in taken:
            model_id, n = f"{name}-{n}", n + 1
        preset = preset_for(presets, (model_id, model.path.name))
        alias = preset.get(ui.PRESET_ALIAS) if preset is not None else None
        names = (alias, model.path.name) if alias else (model.path.name,)
        aliases = tuple(dict.fromkeys(a for a in names if a not in taken and a != model_id))
        taken.update((model_id, *aliases))
        pinned = preset is not None and preset.pinned
        models.append(RoutedModel(model_id, model.path, aliases, model.need_bytes, pinned))
    return models


@dataclass
class CliStarter:
    """A model's settings and its load, as `serve`'s flags and the model's preset say (the preset wins over the flags,
    a request's own fields over both): app.server.model_router.ModelStarter."""

    args: argparse.Namespace
    base: ServerSettings
    presets: Sequence[ModelPreset] = ()
    _plans: dict[str, ModelLoad] = field(default_factory=dict, repr=False)  # check's reading, for start
    _pooled: dict[Path, str] = field(default_factory=dict)  # a model's pooled routes, read once from its header

    def preset(self, model: RoutedModel) -> ModelPreset | None:
        return preset_for(self.presets, (model.id, model.path.name))

    def args_for(self, model: RoutedModel) -> argparse.Namespace:
        """`serve`'s flags with the model's preset in place of those it sets."""
        args = argparse.Namespace(**vars(self.args))
        preset = self.preset(model)
        for name, value in preset.values if preset is not None else ():
            setting = PRESET_SETTINGS[name]
            if setting is ui.PRESET_PROJECTOR:
                args.mmproj = Path(value).expanduser() if value else None
            elif setting.flag and hasattr(args, dest := setting.flag.lstrip("-").replace("-", "_")):
                setattr(args, dest, value or None if setting is DRAFT_MODEL else value)
        return args

    def settings(self, model: RoutedModel) -> ServerSettings:
        preset = self.preset(model)
        vectors = preset.get(ui.PRESET_VECTORS) if preset is not None else None
        try:
            steering = vector_entries(vectors, dict(self.base.vectors)) if vectors else ()
        except PresetError as error:
            raise ApiError(500, f"{model.id}'s preset: {error}") from None
        sampling = sampling_params(self.args_for(model))
        if model.path not in self._pooled:  # --embeddings, or an embedding or reranker model: with --parallel 1
            pooled = pooled_routes(model.path, self.args.embeddings)
            self._pooled[model.path] = pooled if self.args.parallel == 1 else ""
        return replace(
            self.base,
            model_id=model.id,
            model_path=str(model.path),
            sampling=sampling,
            steering=steering,
            embeddings=self._pooled[model.path],
        )

    def job(self, model: RoutedModel, job: Job) -> Job:
        preset = self.preset(model)
        if preset is None:
            return job
        budget, effort = preset.get(s.REASONING_BUDGET), preset.get(s.REASONING_EFFORT)
        if budget is not None and job.reasoning_budget == s.REASONING_BUDGET.default:
            job = replace(job, reasoning_budget=budget)
        if effort is not None and job.reasoning_effort is None:
            job = replace(job, reasoning_effort=s.effort_or_none(effort))
        return job

    def check(self, model: RoutedModel) -> int:
        """Its files as the flags and its preset name them (the model, its projector, its draft) read, and its
        settings made, before any other model is unloaded for it: a file that cannot load unloads nothing. Its
        memory need at the context it loads with (its preset's or -c; F4 shows it at the model's, up to 8192)."""
        from engine_ext.gguf import GGUFError, inspect_gguf
        from models_catalog import fit

        try:
            inspect_gguf(model.path)
            self.settings(model)
            plan = plan_model_load(self.args_for(model), model.path)
            for companion in (plan.model.mmproj, plan.spec.draft_model):
                if companion:
                    inspect_gguf(Path(companion))
            need = fit.need_at_context(model.path, plan.context.n_ctx)
        except (CliError, EngineError, GGUFError, ModelNotFound, OSError, ValueError) as error:
            raise ApiError(500, f"{model.id} could not be loaded: {one_line(str(error), 240)}") from None
        self._plans[model.id] = plan
        return need

    def start(self, model: RoutedModel, metrics: Metrics, progress: Callable[[float], None]) -> StartedModel:
        log_name = "engine-" + re.sub(r"[^A-Za-z0-9._-]+", "_", model.id)[:80] + ".log"
        try:
            backend, client = start_model_backend(
                self.args_for(model),
                model.path,
                self.settings(model),
                metrics,
                log_name=log_name,
                on_progress=progress,
                plan=self._plans.pop(model.id, None),
            )
        except EngineFailure as error:
            why = error.failed.message or error.failed.error
            raise ApiError(500, f"{model.id} could not be loaded: {one_line(why, 240)}") from None
        except EngineCrashedError as error:
            why = f"the engine crashed ({error.crashed.description})"
            raise ApiError(500, f"{model.id} could not be loaded: {one_line(why, 240)}") from None

        def close() -> None:
            backend.stop()
            backend.close()
            client.close()

        return StartedModel(backend, close)


def serve_every_model(args: argparse.Namespace, api_key: str | None) -> int:
    """Serve every local model until Ctrl+C."""
    from app.core import paths
    from app.core.config import ConfigError, load_config
    from app.core.model_list import describe_models, local_models
    from app.server.model_router import ModelRouter, RouterLimits
    from models_catalog import fit

    for name, flag in _ONE_MODEL_FLAGS:
        if getattr(args, name, None):
            raise CliError(f"{flag} is for one model: add -m MODEL, or set it in the model's preset")
    if args.embeddings and args.parallel > 1:
        raise CliError("--embeddings works with --parallel 1")
    for folder in args.models_dir:
        if not Path(folder).expanduser().is_dir():
            raise CliError(f"--models-dir {folder}: not a folder")
    try:
        config = load_config()
    except ConfigError as error:
        raise CliError(str(error)) from None
    folders = [*config.model_folders, *args.models_dir]
    # The caches and model folders: not the model files opened by their path lately (ctrl+l offers those)
    models = routed_models(describe_models(local_models(folders, recent=0), folders), config.model_presets)
    if not models:
        raise CliError("no local models to serve: download one (llmtui models pull) or add a folder: --models-dir DIR")
    vectors = {p.stem: str(p) for p in sorted(paths.steering_dir().glob("*.gguf"))}
    base = ServerSettings(
        model_id="", sampling=sampling_params(args), vectors=vectors, queue=args.queue, slots=args.parallel
    )
    limits = RouterLimits(args.models_max, float(args.idle_unload), memory=fit.detect_memory())
    metrics = Metrics()

    def log(line: str) -> None:
        print(f"llmtui serve: {one_line(line)}", file=sys.stderr, flush=True)

    router = ModelRouter(models, base, metrics, CliStarter(args, base, config.model_presets), limits, log)
    host = f"[{args.host}]" if ":" in args.host else args.host
    names = ", ".join(m.id for m in models[:8]) + (f" and {len(models) - 8} more" if len(models) > 8 else "")
    log(f"http://{host}:{args.port}/v1 serving {len(models)} models, each loaded when asked for: {names}")
    try:
        listen_until_stopped(args, router, metrics, api_key)
    finally:
        router.close()
    return 0
