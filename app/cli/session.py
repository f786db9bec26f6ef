"""What `run`, `chat` and `bench` share: starting the engine, streaming a reply to the terminal, one-line errors and
statistics lines."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import NoReturn, TypeVar

from app.core import paths
from app.core.model_paths import record_use
from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.params import (
    ContextParams,
    DiskCacheParams,
    ModelParams,
)
from engine_ext.protocol import (
    UNKNOWN_TOKEN,
    Crashed,
    Event,
    Failed,
    Finished,
    GenerationStats,
    ModelInfo,
    SpeculativeStats,
    TokenChunk,
)
from engine_ext.untrusted_text import one_line


class CliError(Exception):
    """A problem reported as one line on stderr with a non-zero exit."""


class CliParser(argparse.ArgumentParser):
    """llmtui's argument parser (its sub-commands' parsers are of this class too): a refusal is one line of at
    most 300 characters that points at --help, not argparse's usage block before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, error_line(message, self.prog, f" (see {self.prog} --help)"))


def error_line(message: str, prog: str = "llmtui", tail: str = "") -> str:
    """``prog: error: message`` + ``tail`` as one line of at most 300 characters and a newline (every CLI refusal
    goes through here); a long message is cut, the tail kept."""
    head = f"{prog}: error: "
    return head + one_line(message, max(300 - len(head) - len(tail), 40)) + tail + "\n"


def loaded(info: ModelInfo, used: Path | None = None) -> ModelInfo:
    """Say where -ngl auto put the model (stderr, so --json output stays clean); `used`: the model file of a chat or
    a run, recorded as used (`llmtui models list` and F4 say when)."""
    if info.placement:
        print(f"note: {info.placement}", file=sys.stderr)
    if used is not None and (failed := record_use(used)) is not None:
        print(f"note: {failed}", file=sys.stderr)
    return info


KEEP_REPACK_OFF = "Add --no-repack to turn repacking off altogether."
T = TypeVar("T")


def start_engine(log_name: str = "engine.log") -> EngineClient:
    """A started engine worker that leaves out the CPU extra buffer types that crashed this CPU with this engine
    build before (engine_ext.recovery); its log is `log_name` in the log dir (`serve`'s router: one per model)."""
    from app.core.owner_only_dirs import private_dir, take_notice

    client = EngineClient(private_dir(paths.log_dir()) / log_name, memory=paths.repack_memory())
    notice = take_notice()
    if notice:
        print(f"llmtui: {notice}", file=sys.stderr)
    client.start()
    return client


def saved_disk_cache() -> DiskCacheParams:
    """The prompt cache on disk as config.toml's [cache] sets it (`chat` and `serve --parallel 1` use it; on by
    default); off when the settings cannot be read (their error is the app's to show)."""
    from app.core.config import ConfigError, load_config

    try:
        return load_config().cache.disk_cache_params()
    except ConfigError:
        return DiskCacheParams()


def recovering(
    client: EngineClient,
    model: ModelParams,
    context: ContextParams,
    attempt: Callable[[ModelParams], T],
    *,
    early: Callable[[], bool] = lambda: True,
) -> T:
    """`attempt(model)` on a started engine; after a native crash in it while `early()` (nothing of a reply printed
    yet, no reply finished that a retry would repeat) with weights repacked: say so in one line, start the engine
    again without the extra buffer type that crashed (remembered for this CPU and engine build) and try again, down
    to no repacking. A crash that persists is one line with the settings that could avoid it."""
    from engine_ext.recovery import native_crash

    while True:
        try:
            return attempt(model)
        except EngineCrashedError as error:
            notice = None
            if native_crash(error.crashed.exit_code) and early():
                notice = client.drop_crashed_repack(model, KEEP_REPACK_OFF)
            if notice is None:
                if client.hello is not None and not client.hello.cpu_extra_bufts:  # none left: --no-repack is moot
                    model = replace(model, use_extra_bufts=False)
                raise with_advice(error, model, context) from None
            print(f"llmtui: {notice}", file=sys.stderr)
            client.start()


def format_stats(stats: GenerationStats) -> str:
    return (
        f"prompt {stats.prompt_tokens} tok ({stats.prompt_tokens_cached} cached, "
        f"{stats.prompt_tokens_evaluated} evaluated, {stats.prompt_tps:.1f} tok/s) | "
        f"generated {stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s | "
        f"ttft {stats.ttft_ms:.0f} ms | context {stats.n_ctx_used}/{stats.n_ctx}"
    ) + (
        f" | images {stats.image_tokens} tok, {stats.images_encoded} encoded in {stats.image_encode_ms:.0f} ms"
        if stats.image_tokens
        else ""
    )


def stream_reply(
    events: Iterable[Event],
    *,
    echo: bool,
    provenance: list[str] | None = None,
    echoed: list[bool] | None = None,
    shown: Callable[[str], str] | None = None,
) -> tuple[str, list[int], Finished]:
    """One generation's events (the local engine's `client.generate(request)`, or a remote one's), echoing answer text
    to stdout and reasoning to stderr when `echo`; its text, token ids (those the engine says) and end. Each token's
    source ("target", or the drafter that proposed it) is added to `provenance` when given; `shown` filters the
    echoed answer text (tool calls held back)."""
    text: list[str] = []
    ids: list[int] = []
    in_reasoning = False
    for event in events:
        if isinstance(event, TokenChunk):
            text.append(event.text)
            pairs = zip(event.token_ids, event.provenance, strict=False)
            known = [(i, source) for i, source in pairs if i != UNKNOWN_TOKEN]
            ids.extend(i for i, _ in known)
            if provenance is not None:
                provenance.extend(source for _, source in known)
            if echo:
                if event.reasoning:
                    if not in_reasoning:
                        sys.stderr.write("[thinking] ")
                        in_reasoning = True
                    sys.stderr.write(event.reasoning)
                    sys.stderr.flush()
                if echoed is not None and not echoed and (event.text or event.reasoning):
                    echoed.append(True)
                visible = shown(event.text) if shown is not None else event.text
                if visible:
                    if in_reasoning:
                        sys.stderr.write("\n")
                        in_reasoning = False
                    sys.stdout.write(visible)
                    sys.stdout.flush()
        elif isinstance(event, Finished):
            return "".join(text), ids, event
        elif isinstance(event, Failed):
            raise EngineFailure(event)
        elif isinstance(event, Crashed):
            raise EngineCrashedError(event)
    raise CliError("the engine stopped without finishing the reply")


def with_advice(error: EngineCrashedError, model: ModelParams, context: ContextParams) -> EngineCrashedError:
    """`error` with the settings that could avoid the crash (llama.cpp flags), for the one-line report."""
    from engine_ext.cpu import default_threads
    from engine_ext.recovery import REQUEST_CRASH_ADVICE, fallbacks, request_crash

    if request_crash(error.crashed.exit_code, error.crashed.phase):  # a grammar, the tokenizer, a sampler
        error.advice = REQUEST_CRASH_ADVICE
        return error
    options = fallbacks(model, context, context.n_threads or default_threads(), error.crashed.gpu_devices)
    if options:
        error.advice = "to avoid it, try " + ", ".join(f"{f.flag} ({f.what})" for f in options)
    return error


def format_spec_stats(s: SpeculativeStats) -> str:
    per_pos = " ".join(f"{v:.2f}" for v in s.acceptance_per_position[:8])
    return (
        f"speculative: {s.counts()}, "
        f"mean accepted length {s.mean_accepted_length:.2f}, per position [{per_pos}], "
        f"drafting {s.draft_ms:.0f} ms, verifying {s.verify_ms:.0f} ms"
    )


def drain(client: EngineClient, request_id: int) -> tuple[str, list[int], Finished]:
    text: list[str] = []
    for event in client.events():
        if isinstance(event, TokenChunk) and event.request_id == request_id:
            text.append(event.text)
        elif isinstance(event, Finished) and event.request_id == request_id:
            return "".join(text), [], event
        elif isinstance(event, Failed):
            raise EngineFailure(event)
        elif isinstance(event, Crashed):
            raise EngineCrashedError(event)
    raise CliError("the engine stopped")
