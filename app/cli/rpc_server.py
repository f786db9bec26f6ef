"""`llmtui rpc-server`: serve this machine's CPU to llama.cpp RPC clients."""

from __future__ import annotations

import argparse
import sys

from app.cli.flags import add_setting
from app.cli.types import int_range
from engine_ext.settings_schema import N_THREADS


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from engine_ext.cpu import default_threads
    from engine_ext.rpc import serve_rpc

    endpoint = f"{args.host}:{args.port}"
    print(f"serving this machine's CPU to llama.cpp RPC clients on {endpoint} (Ctrl-C stops)", file=sys.stderr)
    serve_rpc(endpoint, args.threads or default_threads())
    return 0


def add_rpc_server_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rpc = sub.add_parser("rpc-server", help="serve this machine's CPU to llama.cpp RPC clients (--rpc)")
    rpc.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    rpc.add_argument("--port", type=int_range(1, 65535), default=50052)
    add_setting(rpc, N_THREADS)
