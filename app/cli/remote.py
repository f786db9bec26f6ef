"""`llmtui run|chat --remote URL`: an OpenAI-compatible server (llama-server, vLLM, SGLang…) as the engine from the
command line, through the same RemoteBridge the chat app uses (its limits, timeouts and one-line errors)."""

from __future__ import annotations

import argparse
import queue
import sys
import time
from typing import Any

from app.core.config import REMOTE_STALL_TIMEOUT_S, ConfigError, RemoteSettings, SamplingSettings
from engine_ext.settings_schema import DEFAULT_SEED

WAIT_S = 3600.0  # a reply may take long on a slow server; Ctrl-C stops sooner


class RemoteCliError(Exception):
    """What the server or the settings did wrong, in one line."""


class _Inbox:
    """The bridge's message target: a queue read by the command's thread."""

    def __init__(self) -> None:
        self.messages: queue.Queue[object] = queue.Queue()  # the bridge's messages (app.tui.messages), told by type

    def post_message(self, message: object) -> bool:
        self.messages.put(message)
        return True

    def next(self, what: str, timeout_s: float) -> object:
        try:
            return self.messages.get(timeout=timeout_s)
        except queue.Empty:
            raise RemoteCliError(f"no answer from the server within {timeout_s:.0f} s while {what}") from None


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


class RemoteSession:
    """One connected server: `ask` streams a reply to stdout (reasoning to stderr) and returns its text and stats."""

    def __init__(self, remote: RemoteSettings, model: str) -> None:
        from app.tui.messages import ModelLoaded, ModelLoadFailed
        from app.tui.remote_bridge import RemoteBridge

        self.inbox = _Inbox()
        self.bridge = RemoteBridge(self.inbox, remote, model)
        self.bridge.connect()
        deadline = time.monotonic() + 60.0
        while True:  # the load's start and progress come first
            answer = self.inbox.next("connecting", max(0.1, deadline - time.monotonic()))
            if isinstance(answer, ModelLoadFailed):
                self.bridge.close()
                raise RemoteCliError(answer.error)
            if isinstance(answer, ModelLoaded):
                self.model = answer.model
                return

    def close(self) -> None:
        self.bridge.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(
        self, messages: list[tuple[str, str]], sampling: SamplingSettings, *, echo: bool
    ) -> tuple[str, dict[str, Any]]:
        from app.tui.messages import GenerationFailed, GenerationFinished, TokensArrived

        request_id = self.bridge.generate(messages, sampling)
        text: list[str] = []
        deadline = time.monotonic() + WAIT_S
        try:
            while True:
                message = self.inbox.next("writing the reply", max(1.0, deadline - time.monotonic()))
                if isinstance(message, TokensArrived) and message.request_id == request_id:
                    text.append(message.text)
                    if echo:
                        if message.reasoning:
                            sys.stderr.write(message.reasoning)
                            sys.stderr.flush()
                        sys.stdout.write(message.text)
                        sys.stdout.flush()
                elif isinstance(message, GenerationFinished) and message.request_id == request_id:
                    return "".join(text), dict(message.stats, stop_reason=message.stop_reason)
                elif isinstance(message, GenerationFailed) and message.request_id in (request_id, None):
                    raise RemoteCliError(message.error)
        except KeyboardInterrupt:
            self.bridge.cancel(request_id)
            raise


def format_remote_stats(stats: dict[str, Any]) -> str:
    def number(key: str) -> float:
        value = stats.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

    return (
        f"prompt {number('prompt_tokens'):.0f} tok | generated {number('generated_tokens'):.0f} tok, "
        f"{number('decode_tps'):.1f} tok/s | ttft {number('ttft_ms'):.0f} ms | {stats.get('stop_reason', '')}"
    )
