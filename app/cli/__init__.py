"""The `llmtui` command line: the chat app with no sub-command, or one of the sub-commands, each in its own module
(run, chat, bench, info, models, steer, doctor, rpc_server, cache, serve, launch, docs). Their engine arguments are
in engine_args (shared with the chat app's rules), what they share in session, argument types in types."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from app.cli.bench import add_bench_parser, cmd_bench
from app.cli.cache import add_cache_parser, cmd_cache
from app.cli.chat import add_chat_parser, cmd_chat
from app.cli.docs import add_docs_parser, cmd_docs
from app.cli.doctor import add_doctor_parser, cmd_doctor
from app.cli.engine_args import context_params, model_params
from app.cli.info import add_info_parser, cmd_info
from app.cli.launch import add_launch_parser, cmd_launch
from app.cli.models import add_models_parser, cmd_models
from app.cli.remote import RemoteCliError
from app.cli.rpc_server import add_rpc_server_parser, cmd_rpc_server
from app.cli.run import add_run_parser, cmd_run
from app.cli.serve import add_serve_parser, cmd_serve
from app.cli.session import CliError, CliParser, error_line, with_advice
from app.cli.steer import add_steer_parser, cmd_steer
from app.core.model_paths import ModelNotFound
from engine_ext.client import EngineCrashedError, EngineFailure
from engine_ext.params import EngineError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "chat": cmd_chat,
    "info": cmd_info,
    "bench": cmd_bench,
    "models": cmd_models,
    "steer": cmd_steer,
    "serve": cmd_serve,
    "launch": cmd_launch,
    "doctor": cmd_doctor,
    "rpc-server": cmd_rpc_server,
    "cache": cmd_cache,
    "docs": cmd_docs,
}


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="llmtui", description="Run open language models from a terminal.")
    # CliParser is an ArgumentParser; _SubParsersAction is invariant in its parser type, so say what each
    # sub-command registrar takes (an action that makes ArgumentParsers).
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(dest="command")  # type: ignore[assignment]
    for add in (
        add_run_parser,
        add_chat_parser,
        add_info_parser,
        add_rpc_server_parser,
        add_doctor_parser,
        add_bench_parser,
        add_models_parser,
        add_steer_parser,
        add_serve_parser,
        add_launch_parser,
        add_cache_parser,
        add_docs_parser,
    ):
        add(sub)
    return parser


def _open_tui(arguments: list[str]) -> int:
    """`llmtui [-m MODEL]`: the full-screen chat app."""
    parser = CliParser(prog="llmtui", description="Open the chat app.")
    parser.add_argument("-m", "--model", default=None, help="model: a .gguf path or 'starter' (default: the last)")
    parser.add_argument(
        "--no-repack",
        action="store_true",
        help="no CPU weight repacking this session (AMX, CPU_REPACK; F3 settings keep it off for good)",
    )
    args = parser.parse_args(arguments)
    from app.tui.app import run_tui

    return run_tui(args.model, no_repack=args.no_repack)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or arguments[0] not in COMMANDS and arguments[0] not in ("-h", "--help"):
        return _open_tui(arguments)
    args = parser.parse_args(arguments)
    check_args = getattr(args, "check_args", None)
    if check_args is not None:
        check_args(args)
    try:
        return COMMANDS[args.command](args)
    except (CliError, ModelNotFound, EngineError, EngineFailure, RemoteCliError) as exc:
        sys.stderr.write(error_line(str(exc)))
        return 1
    except EngineCrashedError as exc:
        if not exc.advice and hasattr(args, "no_repack"):  # run, chat, bench: the engine settings that could help
            try:
                with_advice(exc, model_params(args), context_params(args))
            except (CliError, ValueError):
                pass
        crashed = exc.crashed
        sys.stderr.write(error_line(crashed.description))
        if crashed.log_tail:
            print("engine log (last lines):\n" + crashed.log_tail, file=sys.stderr)
        if crashed.log_path:
            print(f"the whole engine log: {crashed.log_path}", file=sys.stderr)
        if exc.advice:
            print(f"llmtui: {exc.advice}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a GGUF error from `info`, a broken config.toml, a broken pipe…: one line, no traceback
        from app.core.config import ConfigError
        from engine_ext.gguf import GGUFError

        if isinstance(exc, GGUFError | OSError | ConfigError):
            sys.stderr.write(error_line(str(exc)))
            return 1
        raise
