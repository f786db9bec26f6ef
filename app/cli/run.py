"""`llmtui run`: one generation, streamed to stdout (or one JSON object), locally or on a remote engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from app.cli.doc_args import Documents, add_doc_args, print_sources
from app.cli.engine_args import (
    add_engine_args,
    add_max_tokens_arg,
    add_mmproj_arg,
    add_reasoning_args,
    add_sampling_args,
    add_spec_args,
    context_params,
    model_params,
    reasoning_fields,
    sampling_params,
    spec_params,
    target_load_plan,
)
from app.cli.remote import add_remote_args
from app.cli.session import CliError, format_spec_stats, format_stats, loaded, recovering, start_engine, stream_reply
from app.cli.steer import add_control_vector_args, steering_entries
from app.cli.tools_args import add_tool_args, wants_tools
from app.cli.types import text_file, text_or_file, utf8_text
from app.core.documents.retrieval import Retrieval, citations_record
from app.core.documents.retrieval_models import not_for_chat
from app.core.model_paths import resolve_model
from engine_ext.client import EngineClient
from engine_ext.image_input import ImageRefused, read_image_file
from engine_ext.params import (
    ContextParams,
    DiskCacheParams,
    ModelParams,
    SpeculativeParams,
)
from engine_ext.protocol import (
    ChatMessage,
    Event,
    Finished,
    Generate,
    ImageRef,
)
from engine_ext.settings_schema import SPEC_TYPE
from engine_ext.untrusted_text import json_text, shown


def cmd_run(args: argparse.Namespace) -> int:
    if args.remote:
        return _run_remote(args)
    if args.doc and (args.raw or wants_tools(args)):
        raise CliError("--doc asks a chat question: drop --raw and the tools")
    path = resolve_model(args.model)
    refusal = not_for_chat(path)  # an embedding model or a reranker: it would answer nonsense
    if refusal is not None:
        raise CliError(refusal)
    spec = spec_params(args, path)
    spec.validate()
    model = model_params(args, spec, path)
    images = _images(args, path, model)
    context = context_params(args, n_rs_seq=target_load_plan(spec, path).n_rs_seq)
    with start_engine() as client:
        echoed: list[bool] = []  # a reply partly printed is not written again by a retry
        return recovering(
            client,
            model,
            context,
            lambda model: _run_generation(args, client, path, spec, model, context, echoed, images),
            early=lambda: not echoed,
        )


def _run_generation(
    args: argparse.Namespace,
    client: EngineClient,
    path: Path,
    spec: SpeculativeParams,
    model: ModelParams,
    context: ContextParams,
    echoed: list[bool],
    images: tuple[ImageRef, ...] = (),
) -> int:
    """Load, configure and generate once on a started engine; `echoed` gets an item once reply text is printed."""
    info = loaded(client.load(path, model, context, disk_cache=prompt_cache_file(args)), used=path)
    if spec.enabled:
        client.set_speculative(spec)
    steering = steering_entries(args)
    if steering:
        applied = client.set_steering(steering)
        for notice in applied.notices:
            print(f"note: {notice}", file=sys.stderr)
    with Documents(args, info.n_ctx) as documents:  # the embedding engine, if any, stops before the reply
        retrieval = documents.ask(args.prompt, quiet=args.json)
    messages: tuple[ChatMessage, ...] = ()
    if not args.raw:
        if args.system:
            messages += (ChatMessage("system", args.system),)
        messages += (ChatMessage("user", retrieval.message if retrieval else args.prompt, images=images),)
    request = Generate(
        request_id=client.new_request_id(),
        messages=messages,
        prompt=args.prompt if args.raw else None,
        sampling=sampling_params(args),
        max_tokens=args.n_predict,
        stop=tuple(args.stop),
        enable_thinking=None if args.think is None else args.think == "on",
        grammar=args.grammar,
        json_schema=args.json_schema,
        **reasoning_fields(args),
    )
    if wants_tools(args) and not args.raw:
        return _run_with_tools(args, client, request, echoed)
    return _print_reply(args, Path(info.path).stem, client.generate(request), echoed, retrieval)


def _print_reply(
    args: argparse.Namespace,
    model: str,
    events: Iterator[Event],
    echoed: list[bool],
    retrieval: Retrieval | None = None,
) -> int:
    """Stream one reply of `model` (local or remote, its engine's events) to the terminal, or print it as one JSON
    object with --json (`retrieval`: the --doc sources the question was given, cited after the reply)."""
    provenance: list[str] = []
    text, ids, finished = stream_reply(events, echo=not args.json, provenance=provenance, echoed=echoed)
    if args.json:
        out: dict[str, object] = {
            "text": text,
            "model": model,
            "tokens": ids,  # the ids the engine says (a server does not)
            "provenance": provenance,  # per token: "target", or the drafter whose accepted draft it was
            "stop_reason": finished.stop_reason,
            "stats": finished.stats.to_dict(),
            "notices": list(finished.notices),
            "speculative": finished.speculative.to_dict() if finished.speculative else None,
        }
        if retrieval is not None:
            out["citations"] = citations_record(retrieval.citations, text)
            out["documents"] = list(retrieval.notes)  # per source: what was read and skipped, how it was searched
        print(json_text(out))
    else:
        sys.stdout.write("\n")
        if retrieval is not None:
            print_sources(retrieval, text)
        for notice in finished.notices:
            print(f"note: {notice}", file=sys.stderr)
        print(format_stats(finished.stats), file=sys.stderr)
        if finished.speculative is not None:
            print(format_spec_stats(finished.speculative), file=sys.stderr)
    return 0


def _run_with_tools(args: argparse.Namespace, client: EngineClient, first: Generate, echoed: list[bool]) -> int:
    """The tool loop (app/core/tools/loop.py) on the local engine: each reply streamed without its calls."""
    from contextlib import ExitStack

    from app.cli.tools_args import pending_json, say_pending, say_record, tool_box
    from app.core.tools.loop import ToolLoop
    from engine_ext.tool_calls import CallTextFilter

    with ExitStack() as stack:
        box, consent = tool_box(args, stack)

        def generate(messages: tuple[ChatMessage, ...]) -> tuple[str, Finished]:
            request = replace(
                first,
                request_id=client.new_request_id(),
                messages=messages,
                tools=box.definitions_json(),
                tool_choice=args.tool_choice if messages == first.messages else "auto",
            )
            calls_hidden = CallTextFilter()
            text: list[str] = []

            def shown(part: str) -> str:
                visible = calls_hidden.feed(part)
                text.append(visible)
                return visible

            _, _, finished = stream_reply(client.generate(request), echo=not args.json, echoed=echoed, shown=shown)
            rest = calls_hidden.finish(bool(finished.tool_calls))
            if rest and not args.json:
                sys.stdout.write(rest)
            return "".join(text) + rest, finished

        loop = ToolLoop(box, consent, max_calls=args.max_tool_calls, timeout_s=args.tool_timeout, on_record=say_record)
        result = loop.run(first.messages, generate)
    finished = result.finished
    if args.json:
        out = {
            "text": result.text,
            "stop_reason": finished.stop_reason,
            "tool_calls": pending_json(result.pending),
            "calls_made": [
                {
                    "name": r.call.name,
                    "arguments": r.call.arguments,
                    "source": r.source,
                    "allowed": r.allowed,
                    "failed": r.failed,
                    "result": r.result,
                }
                for r in result.records
            ],
            "stats": finished.stats.to_dict(),
            "notices": list(finished.notices) + result.notices,
        }
        print(json_text(out))
        return 0
    sys.stdout.write("\n")
    say_pending(result.pending)
    for notice in list(finished.notices) + result.notices:
        print(f"note: {notice}", file=sys.stderr)
    print(format_stats(finished.stats), file=sys.stderr)
    return 0


def _images(args: argparse.Namespace, path: Path, model: ModelParams) -> tuple[ImageRef, ...]:
    """The --image files, read and checked here (one line for a refused one), sent with the message."""
    if not args.image:
        return ()
    if args.raw:
        raise CliError("--image goes with a chat message: drop --raw")
    if model.mmproj is None:
        raise CliError(
            f"{path.name} has no projector (mmproj) beside it, so it cannot see images; give one with --mmproj FILE"
        )
    refs = []
    for file in args.image:
        try:
            image = read_image_file(file)
        except ImageRefused as exc:
            raise CliError(str(exc)) from None
        refs.append(ImageRef(image.sha256, data=image.data, name=Path(file).name))
    return tuple(refs)


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's output constraints: a GBNF grammar or a JSON schema (text, or a file that holds it)."""
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--grammar", type=text_or_file, default=None, metavar="GBNF|FILE", help="the reply follows this GBNF grammar"
    )
    shape.add_argument("--grammar-file", dest="grammar", type=text_file, metavar="FILE", help="GBNF grammar file")
    shape.add_argument(
        "-j",
        "--json-schema",
        type=text_or_file,
        default=None,
        metavar="JSON|FILE",
        help="the reply is JSON following this schema ('{}': any JSON)",
    )
    shape.add_argument(
        "-jf", "--json-schema-file", dest="json_schema", type=text_file, metavar="FILE", help="JSON schema file"
    )


def add_prompt_cache_args(p: argparse.ArgumentParser) -> None:
    """llama-cli's --prompt-cache FILE and --prompt-cache-ro (engine_ext.disk_cache checks the file before use)."""
    p.add_argument(
        "--prompt-cache",
        metavar="FILE",
        default=None,
        help="restore the prompt's state from FILE when it starts with the prompt saved there (checked first: "
        "the model, engine build and a checksum), and save the state there after the reply",
    )
    p.add_argument("--prompt-cache-ro", action="store_true", help="with --prompt-cache: read FILE but do not update it")


def prompt_cache_file(args: argparse.Namespace) -> DiskCacheParams:
    """The prompt cache `run` loads with: only the file --prompt-cache names (none without it)."""
    if args.prompt_cache is None:
        if args.prompt_cache_ro:
            raise CliError("--prompt-cache-ro needs --prompt-cache FILE")
        return DiskCacheParams()
    file = Path(args.prompt_cache).expanduser().absolute()
    if file.is_dir():
        raise CliError(f"--prompt-cache {file}: is a folder; name a file")
    return DiskCacheParams(file=str(file), read_only=args.prompt_cache_ro)


def refuse_local_only_flags(args: argparse.Namespace) -> None:
    """--remote takes the reply from a server: what only the local engine does is refused, not ignored."""
    local = [
        flag
        for flag, on in (
            (SPEC_TYPE.flag, bool(getattr(args, "spec_type", ""))),
            ("--control-vector", bool(getattr(args, "control_vector", None))),
            ("--control-vector-scaled", bool(getattr(args, "control_vector_scaled", None))),
            ("--raw", bool(getattr(args, "raw", False))),
            ("--grammar", getattr(args, "grammar", None) is not None),
            ("--json-schema", getattr(args, "json_schema", None) is not None),
            ("--tools/--mcp/--builtin-tool", wants_tools(args)),
            ("--image", bool(getattr(args, "image", None))),
            ("--prompt-cache", getattr(args, "prompt_cache", None) is not None),
            ("--doc", bool(getattr(args, "doc", None))),
        )
        if on
    ]
    if local:
        raise CliError(
            f"{', '.join(local)} need{'s' if len(local) == 1 else ''} the local engine; drop "
            f"{'it' if len(local) == 1 else 'them'} or --remote"
        )


def _run_remote(args: argparse.Namespace) -> int:
    """--remote: the reply from a server, printed as the local engine's is."""
    from app.cli.remote import connect_remote, sampling_settings

    refuse_local_only_flags(args)
    client, info = connect_remote(args)
    messages = ([("system", args.system)] if args.system else []) + [("user", args.prompt)]
    try:
        events = client.generate(client.new_request_id(), messages, sampling_settings(args))
        return _print_reply(args, shown(info.description), events, [])
    finally:
        client.close()


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="one generation, streamed to stdout")
    add_engine_args(run)
    add_mmproj_arg(run)
    add_sampling_args(run)
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", type=utf8_text, help="the user message (or raw text with --raw)")
    source.add_argument(
        "-f",
        "--file",
        dest="prompt",
        type=text_file,
        metavar="FILE",
        help="read the prompt from a UTF-8 text file (at most 8 MiB)",
    )
    add_max_tokens_arg(run)
    run.add_argument("--raw", action="store_true", help="complete the prompt text without the chat template")
    run.add_argument("--think", choices=("on", "off"), default=None, help="reasoning on/off (Qwen3.x)")
    add_reasoning_args(run)
    run.add_argument("--json", action="store_true", help="print one JSON object with text, tokens, stats")
    run.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image sent with the message (PNG, JPEG, GIF, BMP; repeatable); needs the model's projector",
    )
    add_grammar_args(run)
    add_prompt_cache_args(run)
    add_tool_args(run)
    add_doc_args(run)
    add_spec_args(run)
    add_control_vector_args(run)
    add_remote_args(run)
