"""`llmtui run|chat --remote URL`: an OpenAI-compatible server (llama-server, vLLM, SGLang…) as the engine from the
command line, through the same RemoteClient the chat app uses (its limits, timeouts, one-line errors and the engine
protocol's events, read by the local engine's code: `app/cli/session.py`'s `stream_reply`)."""

from __future__ import annotations

import argparse

from app.core.config import REMOTE_STALL_TIMEOUT_S, ConfigError, RemoteSettings, SamplingSettings
from app.core.remote_engine import RemoteClient
from app.core.remote_http import RemoteError
from engine_ext.protocol import ModelInfo
from engine_ext.settings_schema import DEFAULT_SEED


class RemoteCliError(Exception):
    """What the server or the settings did wrong, in one line."""


def add_remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="an OpenAI-compatible server's base URL (e.g. "
        "http://host:8080/v1) as the engine instead of the local one; -m names its model",
    )
    p.add_argument(
        "--api-key-env", default="", metavar="NAME", help="with --remote: the environment variable holding the API key"
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=REMOTE_STALL_TIMEOUT_S,
        metavar="SECONDS",
        help="with --remote: end the reply when the server sends no text for this long, keep-alives and empty "
        f"events aside (default {REMOTE_STALL_TIMEOUT_S:g})",
    )


def remote_settings(args: argparse.Namespace) -> tuple[RemoteSettings, str]:
    """The endpoint and the model asked for ('' : the server's first; 'starter', the local default, counts as none)."""
    remote = RemoteSettings("remote", args.remote, api_key_env=args.api_key_env, stall_timeout_s=args.stall_timeout)
    try:
        remote.validate()
    except ConfigError as error:
        raise RemoteCliError(str(error)) from None
    model = "" if args.model in (None, "starter") else args.model
    return remote, model


def sampling_settings(args: argparse.Namespace) -> SamplingSettings:
    """The sampling flags as the preset the remote bridge sends (-s's random seed is the preset's -1)."""
    from app.cli.flags import flag_values
    from app.core.app_settings_schema import PRESET_SAMPLING

    seed = -1 if args.seed in (-1, DEFAULT_SEED) else args.seed
    return SamplingSettings(**flag_values(args, PRESET_SAMPLING), max_tokens=args.n_predict, seed=seed)


def connect_remote(args: argparse.Namespace) -> tuple[RemoteClient, ModelInfo]:
    """The server --remote names, connected: the client and the model it serves (RemoteCliError: why not)."""
    remote, model = remote_settings(args)
    client = RemoteClient(remote, model)
    try:
        return client, client.connect()
    except RemoteError as error:
        raise RemoteCliError(str(error)) from None
