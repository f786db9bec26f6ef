"""What `llmtui serve` does for each model it serves, one (`-m`) or every local model (the router): the model loaded
in a worker of its own with the dispatcher that runs its requests, and the server listening until Ctrl+C."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from app.cli.engine_args import context_params, model_params, spec_params, target_load_plan
from app.cli.session import loaded, start_engine
from app.core.server_access import Access
from app.server.requests import Limits
from engine_ext.params import ContextParams, DiskCacheParams, ModelParams, SpeculativeParams
from engine_ext.spec_catalog import NGRAM_TYPES

if TYPE_CHECKING:
    import uvicorn

    from app.server.backend import EngineBackend, ServerSettings
    from app.server.metrics import Metrics
    from app.server.model_router import ModelRouter
    from app.server.parallel_backend import ParallelBackend
    from engine_ext.client import EngineClient


@dataclass(frozen=True)
class ModelLoad:
    """How a model loads, as the flags say: read before its worker starts (a missing or refused file is a
    CliError or an EngineError here, before anything else is done for it)."""

    spec: SpeculativeParams
    model: ModelParams
    context: ContextParams


def plan_model_load(args: argparse.Namespace, path: Path) -> ModelLoad:
    """`path`'s load as the flags say (its projector, its draft, its context); CliError or EngineError when the
    flags cannot load it."""
    spec = spec_params(args, path)
    spec.validate()
    model = model_params(args, spec, path)
    context = context_params(args, n_rs_seq=target_load_plan(spec, path).n_rs_seq)
    if args.parallel > 1:
        # llama-server's -np: n_ctx is shared by them, a KV stream each (a sequence's cells laid out as on the
        # single-sequence path: in one shared buffer, where they lie changes the sums; engine_ext.parallel)
        context = replace(context, n_seq_max=args.parallel, kv_unified=False)
    return ModelLoad(spec, model, context)


def start_model_backend(
    args: argparse.Namespace,
    path: Path,
    settings: ServerSettings,
    metrics: Metrics,
    *,
    disk: DiskCacheParams = DiskCacheParams(),
    log_name: str = "engine.log",
    on_progress: Callable[[float], None] | None = None,
    plan: ModelLoad | None = None,
) -> tuple[EngineBackend | ParallelBackend, EngineClient]:
    """`path` loaded in a worker of its own as the flags (and `settings`: its sampling, steering) say, and the
    dispatcher that runs its requests (`--parallel`: ParallelBackend); its client closed when this fails. `plan`:
    `plan_model_load`'s, when the caller read it already."""
    from app.server.backend import EngineBackend
    from app.server.parallel_backend import ParallelBackend

    load = plan or plan_model_load(args, path)
    spec, model, context = load.spec, load.model, load.context
    client = start_engine(log_name)
    client.step_limit_s = args.step_limit
    try:
        info = loaded(client.load(path, model, context, on_progress=on_progress, disk_cache=disk))
        if spec.enabled:
            client.set_speculative(spec)  # checked now: a draft that does not fit the target fails the start
            if args.parallel > 1 and any(t not in NGRAM_TYPES for t in spec.types):
                # The sequences draft in a draft context of their own (engine_ext.speculative.draft_seqs): the single
                # path's draft model and context go, so the draft's weights are held once.
                client.set_speculative(SpeculativeParams(types=()))
        if settings.steering:
            for notice in client.set_steering(settings.steering).notices:
                print(f"note: {notice}", file=sys.stderr)
    except BaseException:
        client.close()
        raise

    def restart() -> None:
        client.start()
        client.load(path, model, context, disk_cache=disk)

    limits = Limits(max_tokens=min(args.max_tokens, info.n_ctx) if args.max_tokens else 0)
    settings = replace(settings, speculative=spec, limits=limits, n_ctx=info.n_ctx)
    if args.parallel > 1:
        return ParallelBackend(client, settings, metrics, restart), client
    return EngineBackend(client, settings, metrics, restart), client


def pooled_routes(path: Path, embeddings_flag: bool) -> str:
    """What POST /v1/embeddings and /v1/rerank serve with `path`: `rank` for a reranker (rank pooling), `embed` for
    `--embeddings` or a model whose pooling says it embeds, "" otherwise (a file whose header cannot be read: "", its
    load says why). For `serve -m` and for each model of the router alike."""
    from engine_ext.gguf import GGUFError, read_pooling_type

    try:
        pooling = read_pooling_type(path)
    except (GGUFError, OSError, ValueError):
        pooling = 0
    return "rank" if pooling == 4 else "embed" if pooling or embeddings_flag else ""


def listen_until_stopped(
    args: argparse.Namespace,
    backend: EngineBackend | ParallelBackend | ModelRouter,
    metrics: Metrics,
    api_key: str | None,
) -> None:
    """Serve `backend` on --host and --port until Ctrl+C (which cancels every request first), then close it."""
    from app.server import listen
    from app.server.asgi import build_app

    access = Access(listen_host=args.host, allowed_hosts=tuple(args.allowed_host), cors=tuple(args.cors))
    log = None if args.no_request_log else _log_request
    app = build_app(backend, metrics, api_key=api_key, access=access, request_log=log)
    server = listen.server(app, args.host, args.port, log_level="warning")
    _cancel_on_exit(server, backend.stop)
    server.run()
    backend.close()


def _log_request(line: str) -> None:
    """A request's line on stderr, as llama-server logs each request."""
    print(f"llmtui serve: {line}", file=sys.stderr, flush=True)


def _cancel_on_exit(server: uvicorn.Server, stop: Callable[[], None]) -> None:
    """Ctrl+C (or SIGTERM) on `server` first cancels every request (`stop`): a streaming response ends (the engine
    client's watchdog ends a worker stuck in a native call within about a second) instead of holding the shutdown."""
    handle_exit = server.handle_exit

    def cancel_then_exit(sig: int, frame: FrameType | None) -> None:
        stop()
        handle_exit(sig, frame)

    server.handle_exit = cancel_then_exit  # type: ignore[method-assign]
