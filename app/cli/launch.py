"""`llmtui launch claude|codex|opencode [-m MODEL] [-- CLIENT ARGS]`: a coding agent run in the foreground against
llmtui's API server. The server on the port is used when one answers there; otherwise `llmtui serve` is started
(its own process session, its log in a per-launch temp folder) and stopped when the client exits. The client is
pointed at it for this run only (app/cli/launch_clients.py): nothing is written outside that temp folder, unless
`--save` (or `--save-only`, which runs no agent and starts no server) writes the pointing into the agent's own config
(app/cli/launch_save.py)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from app.cli import launch_save
from app.cli.launch_clients import CLIENTS, Client, Endpoint
from app.cli.serve import DEFAULT_PORT, api_key_from_env
from app.cli.session import CliError
from app.cli.types import int_range
from app.core.config import RemoteSettings
from app.core.model_paths import resolve_model
from app.core.remote_http import RemoteError, RemoteModel, list_models
from engine_ext.untrusted_text import one_line

HOST = "127.0.0.1"
LOAD_LIMIT_S = 900.0  # the most a started server may take to answer (a large model read from a slow disk)
STOP_WAIT_S = 20.0  # a started server's clean stop (it cancels its requests first), then it is killed
PROBE_TIMEOUT_S = 2.0
SERVER_LOG = "serve.log"  # in the per-launch temp folder
CONTEXT_CAP = 65536  # a started server's context when -c is not given: the model's trained context, at most this


@dataclass
class Started:
    """A `llmtui serve` this launch started, with its log."""

    process: subprocess.Popen[bytes]
    log: Path


def cmd_launch(args: argparse.Namespace) -> int:
    options, client_args = _split(args)
    client = CLIENTS[args.client]
    if options.save_only:
        return save_only(client, options)
    executable = find_client(client, os.environ)
    if options.save:
        launch_save.check(client.name, os.environ)  # a config file that does not parse: said before any server
    key = api_key_from_env(options.api_key_env) or ""
    remote = _remote(options)
    folder = Path(tempfile.mkdtemp(prefix="llmtui-launch-"))  # 0700
    started: Started | None = None
    try:
        served = _served(remote)
        if served is None:
            path, n_ctx = _context_for(client, options)
            started = _start_server(path, n_ctx, options, folder)
            served = _wait_ready(remote, started)
            model = served[0]
        else:
            model, n_ctx = _pick_for(client, served, options)
            _say(f"using the server already on port {options.port} ({model.id}); it keeps running after {client.title}")
        end = Endpoint(f"http://{HOST}:{options.port}", model.id, n_ctx or model.n_ctx, key)
        _say(
            f"{client.title} → {end.base}{client.route} serving {model.id}"
            + (f", context {end.n_ctx}" if end.n_ctx else "")
        )
        if options.save:
            _save(client, end, options)
        return run_client(executable, client, end, client_args)
    finally:
        status = _stop(started) if started is not None else 0
        if status not in (0, 130):  # 130: the Ctrl+C it was stopped with
            _say(f"the server ended with status {status}; its log is kept: {folder / SERVER_LOG}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def save_only(client: Client, options: argparse.Namespace) -> int:
    """`--save-only`: the agent's config pointed at the server on the port (its model), or at the one to start there
    (-m's, with the context the agent needs); no server started, no agent run (nor needed on PATH yet)."""
    launch_save.check(client.name, os.environ)
    served = _served(_remote(options))
    start = ""
    if served is None:
        path, n_ctx = _context_for(client, options)
        model_id = path.name  # the id `llmtui serve` gives it
        start = f"llmtui serve -m {shlex.quote(str(path))} -c {n_ctx} --port {options.port}"
        if options.api_key_env:
            start += f" --api-key-env {shlex.quote(options.api_key_env)}"
    else:
        model, n_ctx = _pick_for(client, served, options)
        model_id, n_ctx = model.id, n_ctx or model.n_ctx
    _save(client, Endpoint(f"http://{HOST}:{options.port}", model_id, n_ctx), options)
    if start:
        _say(f"nothing answers on port {options.port} now: start the server first with `{start}`")
    try:
        find_client(client, os.environ)
    except CliError as e:
        _say(f"note: {str(e).removeprefix('llmtui: error: ')}")
    return 0


def _save(client: Client, end: Endpoint, options: argparse.Namespace) -> None:
    for line in launch_save.save(client.name, end, getattr(options, "api_key_env", None) or "", os.environ):
        _say(line)
    _say(launch_save.how_to_run(client.name, end.model))


def _remote(options: argparse.Namespace) -> RemoteSettings:
    return RemoteSettings(
        name="llmtui", base_url=f"http://{HOST}:{options.port}/v1", api_key_env=options.api_key_env or ""
    )


def _pick_for(client: Client, served: list[RemoteModel], options: argparse.Namespace) -> tuple[RemoteModel, int]:
    model, n_ctx = _pick(served, options.model, options.port)
    if n_ctx and n_ctx < client.min_ctx:
        raise CliError(
            _too_small(client, model.id, n_ctx, "the server on the port serves it with", "")
            + f": start that server with -c {client.min_ctx} or more, or choose a model with a longer context"
        )
    return model, n_ctx


def find_client(client: Client, env: Mapping[str, str]) -> str:
    """The client's executable on PATH (Claude Code's own installer's place too); a missing one is one line with how
    to install it."""
    found = shutil.which(client.command, path=env.get("PATH", os.defpath))
    if found is None and client.name == "claude":
        local = Path.home() / ".claude" / "local" / "claude"
        found = str(local) if os.access(local, os.X_OK) else None
    if found is None:
        raise CliError(
            f"{client.title} is not installed ({client.command} is not on PATH): install it with `{client.install}`"
        )
    return found


def client_environment(client: Client, end: Endpoint, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The client's environment (the user's, with the client's settings over it) and the arguments put first."""
    setup = client.setup(end)
    merged = {**setup.env_defaults, **env, **setup.env}
    return merged, list(setup.args)


def run_client(executable: str, client: Client, end: Endpoint, client_args: list[str]) -> int:
    """Run the client in the foreground and return its exit status. Ctrl+C is the client's (it shares the terminal's
    process group): llmtui ignores it meanwhile; a SIGTERM or SIGHUP to llmtui is passed on to the client."""
    env, first = client_environment(client, end, os.environ)
    process = subprocess.Popen([executable, *first, *client_args], env=env)

    def pass_on(sig: int, frame: FrameType | None) -> None:
        process.send_signal(sig)

    with _signals({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: pass_on, signal.SIGHUP: pass_on}):
        status = process.wait()
    return status if status >= 0 else 128 - status


@contextmanager
def _signals(handlers: Mapping[signal.Signals, object]) -> Iterator[None]:
    before = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}  # type: ignore[arg-type]
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _split(args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """launch's own options (before the client's name or after it, up to `--`) and the client's arguments."""
    rest: list[str] = list(args.rest)
    client_args: list[str] = []
    if "--" in rest:
        at = rest.index("--")
        rest, client_args = rest[:at], rest[at + 1 :]
    options, unknown = _options_parser().parse_known_args(rest, namespace=argparse.Namespace(**vars(args)))
    if unknown:
        raise CliError(
            f"launch does not take {one_line(unknown[0], 60)}: its options are -m, -c, --port, --api-key-env, "
            "--save and --save-only; "
            f"{args.client}'s own arguments go after -- (llmtui launch {args.client} -- {one_line(unknown[0], 40)})"
        )
    return options, client_args


def _options_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    _add_options(parser, defaults=False)
    return parser


def _add_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """-m, -c, --port, --api-key-env (`defaults`: argparse's, else left as parsed before the client's name)."""
    keep = argparse.SUPPRESS if not defaults else None
    parser.add_argument(
        "-m",
        "--model",
        default=keep,
        help="model to serve: a .gguf path or 'starter' (default: the server's, or starter)",
    )
    parser.add_argument(
        "-c",
        "--ctx-size",
        type=int_range(256, 1 << 24),
        default=keep,
        metavar="N",
        help=f"context of the server started (default: the model's trained context, at most {CONTEXT_CAP})",
    )
    parser.add_argument(
        "--port",
        type=int_range(1, 65535),
        default=keep if not defaults else DEFAULT_PORT,
        help=f"port on {HOST}: the server answering there, else one started there (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=keep,
        help="the API key in environment variable NAME: the server started requires it, the client sends it",
    )
    parser.add_argument(
        "--save",
        action="store_true",
        default=keep if not defaults else False,
        help="also write the pointing into the agent's own config (a backup beside each file), to run it "
        "directly later against llmtui serve",
    )
    parser.add_argument(
        "--save-only",
        action="store_true",
        default=keep if not defaults else False,
        help="write the agent's config as --save does, and neither start a server nor run the agent",
    )


def _served(remote: RemoteSettings) -> list[RemoteModel] | None:
    """The models of the server on the port; None when nothing answers there."""
    try:
        return list_models(remote, timeout=PROBE_TIMEOUT_S)
    except RemoteError as e:
        if "connection refused" in str(e):
            return None
        raise CliError(f"port {urlport(remote)} is taken by something that is not an API server: {e}") from None


def urlport(remote: RemoteSettings) -> str:
    return remote.base_url.rsplit(":", 1)[1].split("/", 1)[0]


def _pick(served: list[RemoteModel], asked: str | None, port: int) -> tuple[RemoteModel, int]:
    """The model to use on a running server: the one -m names (by its id or file name), else its first."""
    if not served:
        raise CliError(f"the server on port {port} lists no model")
    if asked is None:
        return served[0], served[0].n_ctx
    names = {asked, Path(asked).name}
    try:
        names.add(resolve_model(asked).name)
    except Exception:  # a name the server knows need not be a file here
        pass
    for model in served:
        if model.id in names:
            return model, model.n_ctx
    listed = ", ".join(one_line(m.id, 60) for m in served[:5])
    raise CliError(
        f"the server on port {port} serves {listed}, not {one_line(asked, 80)}: stop it, or use another --port"
    )


def _context_for(client: Client, options: argparse.Namespace) -> tuple[Path, int]:
    """The model file to serve and the context to start it with; one line when that context is too small."""
    from engine_ext.gguf import GGUFError, inspect_gguf

    path = resolve_model(options.model or "starter")
    try:
        trained = inspect_gguf(path).context_length or 0
    except GGUFError as e:
        raise CliError(str(e)) from None
    asked = getattr(options, "ctx_size", None)
    if asked is None:
        n_ctx = min(trained, CONTEXT_CAP) if trained else client.min_ctx
        if n_ctx < client.min_ctx:
            raise CliError(_too_small(client, path.name, n_ctx, "it was trained with") + ", or give -c N to go past it")
        return path, n_ctx
    if asked < client.min_ctx:
        raise CliError(_too_small(client, path.name, asked, "-c gives it"))
    if trained and asked > trained:
        _say(f"note: -c {asked} is past the {trained} tokens {path.name} was trained with; its replies may degrade")
    return path, asked


def _too_small(
    client: Client, model: str, n_ctx: int, how: str, advice: str = ": choose a model with a longer context"
) -> str:
    return (
        f"{client.title} needs a context of at least {client.min_ctx} tokens (its system prompt and tools take most "
        f"of it); {one_line(model, 80)} has {n_ctx} ({how}){advice}"
    )


def _start_server(path: Path, n_ctx: int, options: argparse.Namespace, folder: Path) -> Started:
    log = folder / SERVER_LOG
    command = [sys.executable, "-m", "app", "serve", "-m", str(path), "-c", str(n_ctx), "--port", str(options.port)]
    if getattr(options, "api_key_env", None):
        command += ["--api-key-env", options.api_key_env]
    _say(f"starting llmtui serve with {path.name} on port {options.port} (context {n_ctx}; its log: {log})")
    with open(log, "wb") as out:  # noqa: PTH123 - the child keeps its own descriptor
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Started(process, log)


def _wait_ready(remote: RemoteSettings, started: Started) -> list[RemoteModel]:
    """The started server's models once it answers; one line (its log's last) when it ends first or takes too long."""
    deadline = time.monotonic() + LOAD_LIMIT_S
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            raise CliError(f"llmtui serve did not start: {_last_line(started.log)}")
        try:
            models = list_models(remote, timeout=PROBE_TIMEOUT_S)
        except RemoteError:
            time.sleep(0.2)
            continue
        if models:
            return models
    raise CliError(f"llmtui serve did not answer within {LOAD_LIMIT_S:.0f} s (its log: {started.log})")


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as f:  # noqa: PTH123
            f.seek(max(0, log.stat().st_size - 4096))
            lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "its log cannot be read"
    text = lines[-1] if lines else "it ended without a word"
    return one_line(text.removeprefix("llmtui: error: "), 200)


def _stop(started: Started) -> int:
    """Stop a server this launch started (Ctrl+C's clean stop, then a kill if it does not end in time); its status."""
    process = started.process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_WAIT_S)
    return process.returncode


def _say(text: str) -> None:
    print(f"llmtui launch: {text}", file=sys.stderr, flush=True)


def add_launch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    launch = sub.add_parser(
        "launch",
        help="run Claude Code, Codex or OpenCode against a local model (the server on --port, or one started for it)",
        description="Run a coding agent against llmtui's API server: the one answering on --port, or `llmtui serve` "
        "started for this run and stopped when the agent exits. The agent is pointed at it through its environment "
        "and command line only; its own config files are changed only with --save or --save-only. For other engine "
        "settings (-ngl, --parallel…) start `llmtui serve` with them first: launch uses it.",
    )
    launch.add_argument("client", choices=sorted(CLIENTS), help="the agent to run")
    _add_options(launch)
    launch.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the agent's own arguments")
