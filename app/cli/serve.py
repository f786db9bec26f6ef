"""`llmtui serve`: the model as a local OpenAI-compatible API (llama-server's routes), with speculation and steering
chosen per request."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from app.cli.engine_args import add_engine_args, add_mmproj_arg, add_sampling_args, add_spec_args, sampling_params
from app.cli.serve_models import add_router_args, refuse_router_flags
from app.cli.serving import listen_until_stopped, pooled_routes, start_model_backend
from app.cli.session import CliError, saved_disk_cache
from app.cli.steer import add_control_vector_args, steering_entries
from app.cli.types import int_range
from app.core.app_settings_schema import SERVER_HOST, SERVER_PORT
from app.core.model_paths import resolve_model
from app.core.server_access import api_key_refusal, host_refusal, loopback, origin_refusal

DEFAULT_PORT = SERVER_PORT.default
DEFAULT_STEP_LIMIT_S = 60  # one step of a request's reply (a decode, a sampling, a grammar's build) past it: restarted


def cmd_serve(args: argparse.Namespace) -> int:
    from app.core import paths
    from app.server.backend import ServerSettings
    from app.server.metrics import Metrics

    api_key = api_key_from_env(args.api_key_env)
    if not loopback(args.host) and not api_key:
        print(
            f"llmtui serve: warning: listening on {args.host} without an API key: anyone who can reach this machine "
            "can use the model (set one with --api-key-env NAME)",
            file=sys.stderr,
        )
    if args.model is None:
        from app.cli.serve_models import serve_every_model

        return serve_every_model(args, api_key)
    refuse_router_flags(args)
    path = resolve_model(args.model)
    slot_save_path = _slot_save_path(args)
    embeddings = _embeddings(args, path)
    steering = steering_entries(args)
    vectors = {p.stem: str(p) for p in sorted(paths.steering_dir().glob("*.gguf"))}
    vectors.update({Path(entry.path).stem: entry.path for entry in steering})  # `serve --control-vector F` wins
    # Each sequence's state is saved when it goes idle (after each reply), is evicted or the server stops, and
    # restored for a request that starts with it, also after a restart (engine_ext.disk_cache, engine_ext.seq_disk).
    disk = saved_disk_cache()
    settings = ServerSettings(
        model_id=args.alias or Path(path).name,
        model_path=str(path),
        sampling=sampling_params(args),
        steering=steering,
        vectors=vectors,
        queue=args.queue,
        slots=args.parallel,
        slot_save_path=slot_save_path,
        embeddings=embeddings,
    )
    metrics = Metrics()
    backend, client = start_model_backend(args, path, settings, metrics, disk=disk)
    try:
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"llmtui serve: http://{host}:{args.port}/v1 serving {settings.model_id}", file=sys.stderr, flush=True)
        listen_until_stopped(args, backend, metrics, api_key)
    finally:
        client.close()
    return 0


def _slot_save_path(args: argparse.Namespace) -> str:
    """--slot-save-path as a folder (made owner-only when missing); "" without it."""
    if args.slot_save_path is None:
        return ""
    from engine_ext.private_files import private_dir

    folder = Path(args.slot_save_path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise CliError(f"--slot-save-path {folder}: not a folder")
    if not folder.exists():
        private_dir(folder)
    return str(folder)


def _embeddings(args: argparse.Namespace, path: Path) -> str:
    """What /v1/embeddings and /v1/rerank serve (app.cli.serving.pooled_routes). One sequence only."""
    wanted = pooled_routes(path, args.embeddings)
    if wanted and args.parallel > 1:
        raise CliError("--embeddings and embedding or reranker models work with --parallel 1")
    return wanted


def api_key_from_env(name: str | None) -> str | None:
    """The API key in environment variable `name` (None without a name); one line when it is unset or unusable."""
    if not name:
        return None
    value = os.environ.get(name, "")
    if not value:
        raise CliError(f"--api-key-env {name}: that environment variable is not set or empty")
    why = api_key_refusal(value)
    if why is not None:
        raise CliError(f"--api-key-env {name}: {why}")
    return value


def _checked(refusal: Callable[[str], str | None]) -> Callable[[str], str]:
    """An argparse type: the text, or argparse's one line saying why it is refused."""

    def parse(text: str) -> str:
        why = refusal(text)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return text

    return parse


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="serve a model, or every local model, as an OpenAI-compatible API")
    add_engine_args(
        serve,
        model_help="serve this model only: a .gguf path, 'starter' or org/repo[:QUANT] (default: every local model, "
        "each loaded when a request names it)",
    )
    add_mmproj_arg(serve)
    add_sampling_args(serve)
    serve.add_argument(
        "--host",
        default=SERVER_HOST.default,
        help=f"address to listen on (default: {SERVER_HOST.default}, this machine)",
    )
    serve.add_argument("--port", type=int_range(1, 65535), default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    serve.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=None,
        help="require the API key held in environment variable NAME (Authorization: Bearer KEY)",
    )
    serve.add_argument("--alias", default=None, help="the model's name in /v1/models (default: the file name)")
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        type=_checked(host_refusal),
        metavar="NAME",
        help="answer requests that name this server NAME too (a DNS name behind a proxy; * for any); "
        "localhost, loopback addresses and --host always",
    )
    serve.add_argument(
        "--cors",
        action="append",
        default=[],
        type=_checked(origin_refusal),
        metavar="ORIGIN",
        help="allow browser requests from ORIGIN (such as http://localhost:3000; * for any); without it, a request "
        "a browser sends from a web page is refused",
    )
    serve.add_argument(
        "--queue", type=int_range(0, 4096), default=16, help="requests that may wait for the engine (default 16)"
    )
    serve.add_argument(
        "--max-tokens", type=int_range(0, 1 << 24), default=0, help="most tokens one reply may ask for (0: context)"
    )
    serve.add_argument(
        "-np",
        "--parallel",
        type=int_range(1, 64),
        default=1,
        help="requests decoded together in one batch (llama-server's -np; the context is shared by them; default 1)",
    )
    serve.add_argument(
        "--step-limit",
        type=int_range(0, 86400),
        default=DEFAULT_STEP_LIMIT_S,
        metavar="SECONDS",
        help="most seconds one step of a reply whose work the request's input sets (building its grammar, sampling, "
        f"tokenizing) may take before the engine is restarted and the request fails (0: no limit; default "
        f"{DEFAULT_STEP_LIMIT_S}); a decode always finishes its batch",
    )
    serve.add_argument(
        "--slot-save-path",
        metavar="DIR",
        default=None,
        help="allow POST /slots/{id}?action=save|restore|erase with files in DIR (llama-server's; id 0 to "
        "--parallel N - 1; a busy slot's action waits for its reply to end)",
    )
    serve.add_argument(
        "--embeddings",
        action="store_true",
        help="answer POST /v1/embeddings with the model (mean pooling unless its GGUF names one; on by itself for "
        "an embedding model, and /v1/rerank for a reranker; --parallel 1)",
    )
    serve.add_argument(
        "--no-request-log",
        action="store_true",
        help="do not write a line per request on stderr (method, path, status, tokens, seconds)",
    )
    add_spec_args(serve)
    add_control_vector_args(serve)
    add_router_args(serve)
