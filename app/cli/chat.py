"""`llmtui chat`: a line-by-line chat in the terminal, locally or on a remote engine."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from contextlib import ExitStack

from app.cli.doc_args import Documents, add_doc_args, print_sources
from app.cli.engine_args import (
    add_engine_args,
    add_max_tokens_arg,
    add_reasoning_args,
    add_sampling_args,
    context_params,
    model_params,
    reasoning_fields,
    sampling_params,
)
from app.cli.remote import add_remote_args
from app.cli.session import (
    CliError,
    drain,
    error_line,
    format_stats,
    loaded,
    recovering,
    saved_disk_cache,
    start_engine,
    stream_reply,
)
from app.cli.types import utf8_error
from app.core.documents.retrieval_models import not_for_chat
from app.core.model_paths import resolve_model
from engine_ext.client import EngineCrashedError, EngineFailure
from engine_ext.params import EngineError, ModelParams
from engine_ext.protocol import (
    ChatMessage,
    Generate,
)
from engine_ext.recovery import EARLY_REPLIES
from engine_ext.untrusted_text import shown


def _chat_remote(args: argparse.Namespace) -> int:
    """--remote: the conversation with a server, each reply streamed and summed up as the local engine's is."""
    from app.cli.remote import connect_remote, sampling_settings

    client, info = connect_remote(args)
    try:
        print(f"{shown(info.description)} · {info.backend} · Ctrl-D to quit", file=sys.stderr)
        history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
        for line in _chat_lines():
            asked = [*history, ChatMessage("user", line)]
            try:
                events = client.generate(client.new_request_id(), asked, sampling_settings(args))
                text, _, finished = stream_reply(events, echo=True)
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            except EngineFailure as error:  # the server refused this one (too long, …): say so, go on
                sys.stderr.write(error_line(str(error)))
                continue
            history = [*asked, ChatMessage("assistant", text)]
            sys.stdout.write("\n")
            print(format_stats(finished.stats), file=sys.stderr)
    finally:
        client.close()
    return 0


def _chat_lines() -> Iterator[str]:
    """The lines typed at `llmtui chat`'s prompt, until Ctrl-D or Ctrl-C; blank ones skipped, and one that is not
    UTF-8 said so and skipped."""
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(errors="surrogateescape")  # a byte that is not UTF-8 is reported per line below
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        except UnicodeDecodeError as error:  # stdin in strict mode: say so and read the next line
            print(
                f"llmtui: that line is not valid UTF-8 (byte 0x{error.object[error.start]:02x} at offset "
                f"{error.start}); it was not sent",
                file=sys.stderr,
            )
            continue
        if not line.strip():
            continue
        where = utf8_error(line)
        if where is not None:
            print(f"llmtui: that line is not valid UTF-8 ({where}); it was not sent", file=sys.stderr)
            continue
        yield line


def cmd_chat(args: argparse.Namespace) -> int:
    if args.remote:
        if args.doc:
            raise CliError("--doc needs the local engine; drop it or --remote")
        return _chat_remote(args)
    path = resolve_model(args.model)
    refusal = not_for_chat(path)  # an embedding model or a reranker: it would answer nonsense
    if refusal is not None:
        raise CliError(refusal)
    model, context = model_params(args), context_params(args)
    history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
    replies = [0]  # replies finished: a crash after EARLY_REPLIES is not blamed on the repacking
    printed: list[bool] = []  # text of the reply in flight was printed: a retry would repeat it
    pending: list[ChatMessage] = []  # the message whose reply a crash interrupted, sent again after the restart
    lines = _chat_lines()
    opened: list[Documents] = []
    with start_engine() as client, ExitStack() as cleanup:

        def session(model: ModelParams) -> int:
            info = loaded(client.load(path, model, context, disk_cache=saved_disk_cache()), used=path)
            if not opened:  # once: a restart after a crash keeps the documents (and their embedding engine)
                opened.append(cleanup.enter_context(Documents(args, info.n_ctx)))
            documents = opened[0]
            if not replies[0] and not pending:
                asked = f" (-c {args.ctx_size} rounded up by llama.cpp)" if 0 < args.ctx_size != info.n_ctx else ""
                print(
                    f"{info.description} · {info.backend} · context {info.n_ctx}{asked} · Ctrl-D to quit",
                    file=sys.stderr,
                )
            while True:
                if pending:
                    history.append(pending.pop())
                else:
                    line = next(lines, None)
                    if line is None:
                        return 0
                    history.append(ChatMessage("user", line))
                printed.clear()
                asked_before = [m.content for m in history[:-1] if m.role == "user"][-1:]
                # this turn's sources (found with the question before it too); the history keeps the question alone
                retrieval = documents.ask(history[-1].content, earlier="".join(asked_before))
                turn = (ChatMessage("user", retrieval.message),) if retrieval else tuple(history[-1:])
                request = Generate(
                    request_id=client.new_request_id(),
                    messages=(*history[:-1], *turn),
                    sampling=sampling_params(args),
                    max_tokens=args.n_predict,
                    stop=tuple(args.stop),
                    **reasoning_fields(args),
                )
                try:
                    text, _, finished = stream_reply(client.generate(request), echo=True, echoed=printed)
                except KeyboardInterrupt:
                    client.cancel(request.request_id)
                    try:
                        text, _, finished = drain(client, request.request_id)
                    except EngineCrashedError as error:
                        if not error.crashed.stopped:
                            raise
                        # The worker was stuck in a native call (engine_ext.watchdog): the same engine again, the
                        # message that got no reply left out of the history.
                        print(f"\nllmtui: {error.crashed.stopped}; restarted", file=sys.stderr)
                        history.pop()
                        client.start()
                        client.load(path, model, context)
                        continue
                except (EngineFailure, EngineError) as error:  # e.g. a line longer than the context: say so, go on
                    history.pop()
                    sys.stderr.write(error_line(str(error)))
                    continue
                except EngineCrashedError:
                    pending.append(history.pop())  # asked again after a restart, or lost with the engine
                    raise
                history.append(ChatMessage("assistant", text))
                replies[0] += 1
                sys.stdout.write("\n")
                if retrieval is not None:
                    print_sources(retrieval, text)
                print(format_stats(finished.stats), file=sys.stderr)

        return recovering(client, model, context, session, early=lambda: replies[0] < EARLY_REPLIES and not printed)


def add_chat_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chat = sub.add_parser("chat", help="a line-by-line chat in the terminal")
    add_engine_args(chat)
    add_sampling_args(chat)
    add_reasoning_args(chat)
    add_max_tokens_arg(chat)
    add_doc_args(chat)
    add_remote_args(chat)
