"""The `llmtui` command line: the chat app with no subcommand; run, chat, info, bench."""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from app import paths
from app.cli_models import add_models_parser, cmd_models
from app.cli_remote import RemoteCliError, add_remote_args
from app.cli_steer import add_control_vector_args, add_steer_parser, cmd_steer, steering_entries
from app.cli_types import (
    INT32_MAX,
    MAX_CONTEXT,
    MAX_THREADS,
    finite_float,
    int_range,
    n_predict,
    seed,
    shares,
    text_file,
    utf8_error,
    utf8_text,
)
from app.models import ModelNotFound, resolve_model
from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.params import (
    DEFAULT_FIT_TARGET_MIB,
    DEFAULT_SEED,
    GPU_LAYERS_AUTO,
    KV_CACHE_TYPES,
    SPEC_TYPES,
    SPLIT_MODES,
    ContextParams,
    EngineError,
    ModelParams,
    SamplingParams,
    SpeculativeParams,
)
from engine_ext.protocol import (
    ChatMessage,
    Crashed,
    Failed,
    Finished,
    Generate,
    GenerationStats,
    ModelInfo,
    SpeculativeStats,
    TokenChunk,
)
from engine_ext.speculative.catalog import LoadPlan, load_plan


class CliError(Exception):
    """A problem reported as one line on stderr with a non-zero exit."""


# ----- arguments ----------------------------------------------------------------------------------------

CONTEXT = int_range(0, MAX_CONTEXT, meaning="0: the model's")
THREADS = int_range(0, MAX_THREADS, meaning="0: automatic")
BATCH = int_range(1, MAX_CONTEXT)
COUNT = int_range(0, INT32_MAX)  # top-k, --fit-target: 0 or more
PROBABILITY = finite_float(0.0, 1.0)
NON_NEGATIVE = finite_float(0.0)
POSITIVE = finite_float(0.0, above=True)
ANY_FINITE = finite_float()
DEVICE = int_range(0, 1023)  # -mg: a device index
LAYERS = int_range(0, 4096)  # --n-cpu-moe: more than the model has means every layer
DRAFT_MAX = int_range(1, 1024)
DRAFT_MIN = int_range(0, 1024)


def _add_engine_args(p: argparse.ArgumentParser, *, default_ctx: int = 4096) -> None:
    p.add_argument("-m", "--model", default="starter", help="model: a .gguf path or 'starter' (default)")
    p.add_argument("-c", "--ctx-size", type=CONTEXT, default=default_ctx,
                   help="context size in tokens (0: model's; llama.cpp rounds it up to a multiple of 256)")
    p.add_argument("-t", "--threads", type=THREADS, default=0, help="threads (default: one per physical core)")
    p.add_argument("-ngl", "--n-gpu-layers", type=_gpu_layers, default=-1, metavar="N|auto|all",
                   help="layers on the GPU (-1 or all: every layer; auto: as many as free device memory holds)")
    p.add_argument("--fit-target", type=COUNT, default=DEFAULT_FIT_TARGET_MIB, metavar="MiB",
                   help="with -ngl auto: memory to leave free on each device (default %(default)s MiB)")
    p.add_argument("-b", "--batch-size", type=BATCH, default=2048, help="logical batch size")
    p.add_argument("-ub", "--ubatch-size", type=BATCH, default=512, help="physical batch size")
    p.add_argument("-fa", "--flash-attn", choices=("auto", "on", "off"), default="auto")
    p.add_argument("-ctk", "--cache-type-k", choices=sorted(KV_CACHE_TYPES), default="f16")
    p.add_argument("-ctv", "--cache-type-v", choices=sorted(KV_CACHE_TYPES), default="f16")
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory instead of mapping it")
    p.add_argument("--mlock", action="store_true", help="lock the model in RAM")
    p.add_argument("--no-repack", action="store_true", help="keep CPU weights as stored: no repacking for this "
                   "CPU's matrix instructions (AMX, CPU_REPACK); avoids a repack path that crashes")
    p.add_argument("--rpc", default="", metavar="HOST:PORT,...", help="llama.cpp RPC servers to use as devices")
    p.add_argument("-sm", "--split-mode", choices=SPLIT_MODES, default="layer",
                   help="how to split the model across devices (tensor: llama.cpp's tensor parallelism)")
    p.add_argument("-ts", "--tensor-split", type=shares, default="", metavar="N0,N1,...",
                   help="share of the model per device")
    p.add_argument("-mg", "--main-gpu", type=DEVICE, default=0, help="the device for the whole model with -sm none")
    p.add_argument("--n-cpu-moe", type=LAYERS, default=0, metavar="N", help="keep the experts of the first N layers "
                   "on the CPU (MoE models)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=NON_NEGATIVE, default=0.8, help="temperature (0: greedy)")
    p.add_argument("--top-k", type=COUNT, default=40)
    p.add_argument("--top-p", type=PROBABILITY, default=0.95)
    p.add_argument("--min-p", type=PROBABILITY, default=0.05)
    p.add_argument("--repeat-penalty", type=POSITIVE, default=1.0)
    p.add_argument("--repeat-last-n", type=int_range(-1, MAX_CONTEXT, meaning="-1: the context"), default=64)
    p.add_argument("--presence-penalty", type=ANY_FINITE, default=0.0)
    p.add_argument("--frequency-penalty", type=ANY_FINITE, default=0.0)
    p.add_argument("-s", "--seed", type=seed, default=DEFAULT_SEED, help="RNG seed (default, -1: random)")
    p.add_argument("--stop", action="append", type=utf8_text, default=[], help="stop string (repeatable)")
    p.add_argument("--system", type=utf8_text, default=None, help="system prompt")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec-type", default="", metavar="T[,T...]",
                   help=f"speculative decoding: {', '.join(SPEC_TYPES)} (comma-separated; off by default)")
    p.add_argument("--spec-draft-model", default=None, metavar="PATH", help="draft model for draft-simple")
    p.add_argument("--spec-draft-n-max", type=DRAFT_MAX, default=16, help="most tokens drafted per step")
    p.add_argument("--spec-draft-n-min", type=DRAFT_MIN, default=0, help="drafts shorter than this are skipped")
    p.add_argument("--spec-draft-p-min", type=PROBABILITY, default=0.0, help="min draft token probability")


def _spec_params(args: argparse.Namespace, model: Path, types: str | None = None) -> SpeculativeParams:
    names = args.spec_type if types is None else types
    spec_types = tuple(t.strip() for t in names.split(",") if t.strip())
    draft = str(resolve_model(args.spec_draft_model)) if args.spec_draft_model else _sidecar_draft(model, spec_types)
    return SpeculativeParams(
        types=spec_types,
        draft_model=draft,
        n_max=args.spec_draft_n_max,
        n_min=args.spec_draft_n_min,
        p_min=args.spec_draft_p_min,
    )


def _sidecar_draft(model: Path, spec_types: tuple[str, ...]) -> str | None:
    """With no --spec-draft-model, the draft the model brings along for a single type (auto or a model drafter):
    a sidecar beside it or a draft from its paired repository, as the chat app uses it (said on stderr)."""
    from app.config import SpeculativeSettings, load_config
    from app.speculation import effective_settings, find_sidecars

    if len(spec_types) != 1:
        return None
    sidecars = find_sidecars(str(model), load_config().model_folders)
    chosen = effective_settings(str(model), SpeculativeSettings(enabled=True, spec_type=spec_types[0]), sidecars)
    if not chosen.draft_model:
        return None
    where = next(c.where for c in sidecars if str(c.path) == chosen.draft_model)
    print(f"note: {spec_types[0]} drafts with {Path(chosen.draft_model).name} ({where}); "
          "--spec-draft-model names another", file=sys.stderr)
    return chosen.draft_model


def _load_plan(spec: SpeculativeParams | None, model: Path) -> LoadPlan:
    """How the target loads for `spec` (its MTP heads, its recurrent-state rollback depth): the catalogue's one rule,
    the TUI's too (app.speculation.load_options)."""
    from app.speculation import model_facts

    facts = model_facts(str(model))
    if spec is None or facts is None:
        return LoadPlan(False, 0)
    return load_plan(spec.types, architecture=facts.architecture, n_layer_nextn=facts.n_layer_nextn,
                     draft_model=spec.draft_model, n_max=spec.n_max)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtui", description="Run open language models from a terminal.")
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="one generation, streamed to stdout")
    _add_engine_args(run)
    _add_sampling_args(run)
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", type=utf8_text, help="the user message (or raw text with --raw)")
    source.add_argument("-f", "--file", dest="prompt", type=text_file, metavar="FILE",
                        help="read the prompt from a UTF-8 text file (at most 8 MiB)")
    run.add_argument("-n", "--n-predict", type=n_predict, default=-1, help="max tokens to generate (-1: no limit)")
    run.add_argument("--raw", action="store_true", help="complete the prompt text without the chat template")
    run.add_argument("--think", choices=("on", "off"), default=None, help="reasoning on/off (Qwen3.x)")
    run.add_argument("--json", action="store_true", help="print one JSON object with text, tokens, stats")
    _add_spec_args(run)
    add_control_vector_args(run)
    add_remote_args(run)

    chat = sub.add_parser("chat", help="a line-by-line chat in the terminal")
    _add_engine_args(chat)
    _add_sampling_args(chat)
    chat.add_argument("-n", "--n-predict", type=n_predict, default=-1)
    add_remote_args(chat)

    info = sub.add_parser("info", help="inspect a GGUF file without loading its weights")
    info.add_argument("model", help="a .gguf path or 'starter'")
    info.add_argument("-c", "--ctx-size", type=CONTEXT, default=0, help="context for the memory estimate")
    info.add_argument("--json", action="store_true")

    rpc = sub.add_parser("rpc-server", help="serve this machine's CPU to llama.cpp RPC clients (--rpc)")
    rpc.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    rpc.add_argument("--port", type=int_range(1, 65535), default=50052)
    rpc.add_argument("-t", "--threads", type=THREADS, default=0)

    doctor = sub.add_parser("doctor", help="backends, devices, memory, versions")
    doctor.add_argument("--json", action="store_true")

    bench = sub.add_parser("bench", help="prompt and decode speed (like llama-bench)")
    _add_engine_args(bench, default_ctx=0)
    bench.add_argument("-p", "--n-prompt", type=int_range(0, MAX_CONTEXT), default=512, help="prompt tokens (0: skip)")
    bench.add_argument("-n", "--n-gen", type=int_range(0, MAX_CONTEXT), default=128, help="generated tokens (0: skip)")
    bench.add_argument("-r", "--repetitions", type=int_range(1, 1000), default=5)
    bench.add_argument("--json", action="store_true")
    _add_spec_args(bench)
    bench.add_argument("--prompt", type=utf8_text, help="chat prompt for --spec-type runs (default: a copy-heavy one)")
    bench.add_argument("--raw", action="store_true", help="--spec-type runs complete the prompt without a template")
    bench.set_defaults(check_args=lambda args: _check_bench(bench, args))
    add_models_parser(sub)
    add_steer_parser(sub)
    return parser


def _check_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.n_prompt == 0 and args.n_gen == 0:
        parser.error("argument -p/--n-prompt: -p and -n are both 0: nothing to measure")


def _model_params(
    args: argparse.Namespace, spec: SpeculativeParams | None = None, model: Path | None = None
) -> ModelParams:
    # MTP heads inside the model are loaded only when draft-mtp (or auto) will use them (llama.cpp's load_mtp).
    load_mtp = model is not None and _load_plan(spec, model).load_mtp
    return ModelParams(
        n_gpu_layers=args.n_gpu_layers,
        use_mmap=not args.no_mmap,
        use_mlock=args.mlock,
        use_extra_bufts=not args.no_repack and _saved_repack(),
        load_mtp=load_mtp,
        rpc_servers=tuple(s.strip() for s in args.rpc.split(",") if s.strip()),
        split_mode=args.split_mode,
        tensor_split=_floats(args.tensor_split, "--tensor-split"),
        main_gpu=args.main_gpu,
        n_cpu_moe=args.n_cpu_moe,
        fit_target_mib=args.fit_target,
    )


def _saved_repack() -> bool:
    """Whether the saved settings repack CPU weights (F3; engine.use_extra_bufts): a crash fix made there holds for
    the commands too. A broken config.toml is the chat app's to report; here it means the default."""
    from app.config import ConfigError, load_config

    try:
        return load_config().engine.use_extra_bufts
    except (ConfigError, OSError):
        return True


def _gpu_layers(text: str) -> int:
    """-ngl's value: a count, -1/all (every layer) or auto (planned from free device memory)."""
    if text.strip().lower() == "auto":
        return GPU_LAYERS_AUTO
    if text.strip().lower() == "all":
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, all or auto, not {text!r}") from None
    if not -1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"expected a number from -1 to {INT32_MAX}, all or auto, not {value}")
    return value


def _loaded(info: ModelInfo) -> ModelInfo:
    """Say where -ngl auto put the model (stderr, so --json output stays clean)."""
    if info.placement:
        print(f"note: {info.placement}", file=sys.stderr)
    return info


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace("/", ",").split(",") if v.strip())
    except ValueError:
        raise CliError(f"{flag} takes numbers separated by commas, not {text!r}") from None


def _context_params(args: argparse.Namespace, n_ctx: int | None = None, n_rs_seq: int = 0) -> ContextParams:
    return ContextParams(
        n_rs_seq=n_rs_seq,
        n_ctx=args.ctx_size if n_ctx is None else n_ctx,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_threads=args.threads,
        flash_attn=args.flash_attn,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
    )


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )


def start_engine() -> EngineClient:
    from app.private_files import private_dir, take_notice

    client = EngineClient(private_dir(paths.log_dir()) / "engine.log")
    notice = take_notice()
    if notice:
        print(f"llmtui: {notice}", file=sys.stderr)
    client.start()
    return client


def format_stats(stats: GenerationStats) -> str:
    return (
        f"prompt {stats.prompt_tokens} tok ({stats.prompt_tokens_cached} cached, "
        f"{stats.prompt_tokens_evaluated} evaluated, {stats.prompt_tps:.1f} tok/s) | "
        f"generated {stats.generated_tokens} tok, {stats.decode_tps:.1f} tok/s | "
        f"ttft {stats.ttft_ms:.0f} ms | context {stats.n_ctx_used}/{stats.n_ctx}"
    )


# ----- commands -----------------------------------------------------------------------------------------


def _stream(client: EngineClient, request: Generate, *, echo: bool, provenance: list[str] | None = None,
            echoed: list[bool] | None = None) -> tuple[str, list[int], Finished]:
    """Run one generation, echoing answer text to stdout and reasoning to stderr when `echo`; each token's source
    ("target", or the drafter that proposed it) is added to `provenance` when given."""
    text: list[str] = []
    ids: list[int] = []
    in_reasoning = False
    for event in client.generate(request):
        if isinstance(event, TokenChunk):
            text.append(event.text)
            ids.extend(event.token_ids)
            if provenance is not None:
                provenance.extend(event.provenance)
            if echo:
                if event.reasoning:
                    if not in_reasoning:
                        sys.stderr.write("[thinking] ")
                        in_reasoning = True
                    sys.stderr.write(event.reasoning)
                    sys.stderr.flush()
                if echoed is not None and not echoed and (event.text or event.reasoning):
                    echoed.append(True)
                if event.text:
                    if in_reasoning:
                        sys.stderr.write("\n")
                        in_reasoning = False
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        elif isinstance(event, Finished):
            return "".join(text), ids, event
        elif isinstance(event, Failed):
            raise EngineFailure(event)
        elif isinstance(event, Crashed):
            raise EngineCrashedError(event)
    raise CliError("the engine stopped without finishing the reply")


def cmd_run(args: argparse.Namespace) -> int:
    if args.remote:
        return _run_remote(args)
    path = resolve_model(args.model)
    spec = _spec_params(args, path)
    spec.validate()
    model = _model_params(args, spec, path)
    context = _context_params(args, n_rs_seq=_load_plan(spec, path).n_rs_seq)
    with start_engine() as client:
        echoed: list[bool] = []
        try:
            return _run_generation(args, client, path, spec, model, context, echoed)
        except EngineCrashedError as error:
            # A native crash while loading or writing the reply, with weights repacked for this CPU (a Xeon's AMX
            # path crashed so): once more without repacking, unless the reply was already partly printed.
            from engine_ext.recovery import native_crash, repack_retry, retry_notice

            extra_bufts = client.hello.cpu_extra_bufts if client.hello is not None else ()
            retry = repack_retry(model, extra_bufts) if native_crash(error.crashed.exit_code) else None
            if retry is None or echoed:
                raise _with_advice(error, model, context) from None
            print(f"llmtui: {retry_notice(extra_bufts, 'Add --no-repack to keep it off.')}", file=sys.stderr)
            client.start()
            try:
                return _run_generation(args, client, path, spec, retry, context, echoed)
            except EngineCrashedError as again:
                raise _with_advice(again, retry, context) from None


def _with_advice(error: EngineCrashedError, model: ModelParams, context: ContextParams) -> EngineCrashedError:
    """`error` with the settings that could avoid the crash (llama.cpp flags), for the one-line report."""
    from engine_ext.cpu import default_threads
    from engine_ext.recovery import fallbacks

    options = fallbacks(model, context, context.n_threads or default_threads(), error.crashed.gpu_devices)
    if options:
        error.advice = "to avoid it, try " + ", ".join(f"{f.flag} ({f.what})" for f in options)
    return error


def _run_generation(
    args: argparse.Namespace,
    client: EngineClient,
    path: Path,
    spec: SpeculativeParams,
    model: ModelParams,
    context: ContextParams,
    echoed: list[bool],
) -> int:
    """Load, configure and generate once on a started engine; `echoed` gets an item once reply text is printed."""
    _loaded(client.load(path, model, context))
    if spec.enabled:
        client.set_speculative(spec)
    steering = steering_entries(args)
    if steering:
        applied = client.set_steering(steering)
        for notice in applied.notices:
            print(f"note: {notice}", file=sys.stderr)
    messages: tuple[ChatMessage, ...] = ()
    if not args.raw:
        if args.system:
            messages += (ChatMessage("system", args.system),)
        messages += (ChatMessage("user", args.prompt),)
    request = Generate(
        request_id=client.new_request_id(),
        messages=messages,
        prompt=args.prompt if args.raw else None,
        sampling=_sampling(args),
        max_tokens=args.n_predict,
        stop=tuple(args.stop),
        enable_thinking=None if args.think is None else args.think == "on",
    )
    provenance: list[str] = []
    text, ids, finished = _stream(client, request, echo=not args.json, provenance=provenance, echoed=echoed)
    if args.json:
        out = {
            "text": text,
            "tokens": ids,
            "provenance": provenance,  # per token: "target", or the drafter whose accepted draft it was
            "stop_reason": finished.stop_reason,
            "stats": finished.stats.to_dict(),
            "notices": list(finished.notices),
            "speculative": finished.speculative.to_dict() if finished.speculative else None,
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        for notice in finished.notices:
            print(f"note: {notice}", file=sys.stderr)
        print(format_stats(finished.stats), file=sys.stderr)
        if finished.speculative is not None:
            print(format_spec_stats(finished.speculative), file=sys.stderr)
    return 0


def format_spec_stats(s: SpeculativeStats) -> str:
    per_pos = " ".join(f"{v:.2f}" for v in s.acceptance_per_position[:8])
    return (
        f"speculative: {s.accepted}/{s.drafted} drafted tokens accepted ({s.acceptance_rate:.0%}), "
        f"mean accepted length {s.mean_accepted_length:.2f}, per position [{per_pos}], "
        f"drafting {s.draft_ms:.0f} ms, verifying {s.verify_ms:.0f} ms"
    )


def _remote_only(args: argparse.Namespace) -> None:
    """--remote takes the reply from a server: what only the local engine does is refused, not ignored."""
    local = [flag for flag, on in (("--spec-type", bool(getattr(args, "spec_type", ""))),
                                   ("--control-vector", bool(getattr(args, "control_vector", None))),
                                   ("--control-vector-scaled", bool(getattr(args, "control_vector_scaled", None))),
                                   ("--raw", bool(getattr(args, "raw", False)))) if on]
    if local:
        raise CliError(f"{', '.join(local)} need{'s' if len(local) == 1 else ''} the local engine; drop "
                       f"{'it' if len(local) == 1 else 'them'} or --remote")


def _run_remote(args: argparse.Namespace) -> int:
    from app.cli_remote import RemoteSession, format_remote_stats, remote_settings, sampling_settings

    _remote_only(args)
    remote, model = remote_settings(args)
    messages = ([("system", args.system)] if args.system else []) + [("user", args.prompt)]
    with RemoteSession(remote, model) as session:
        text, stats = session.ask(messages, sampling_settings(args), echo=not args.json)
    if args.json:
        print(json.dumps({"text": text, "model": session.model.name, "stats": stats}, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        print(format_remote_stats(stats), file=sys.stderr)
    return 0


def _chat_remote(args: argparse.Namespace) -> int:
    from app.cli_remote import RemoteCliError, RemoteSession, format_remote_stats, remote_settings, sampling_settings

    remote, model = remote_settings(args)
    with RemoteSession(remote, model) as session:
        print(f"{session.model.name} · {session.model.backend} · Ctrl-D to quit", file=sys.stderr)
        history: list[tuple[str, str]] = [("system", args.system)] if args.system else []
        for line in _chat_lines():
            try:
                text, stats = session.ask([*history, ("user", line)], sampling_settings(args), echo=True)
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            except RemoteCliError as error:  # the server refused this one (too long, …): say so, go on
                print(f"llmtui: error: {error}", file=sys.stderr)
                continue
            history += [("user", line), ("assistant", text)]
            sys.stdout.write("\n")
            print(format_remote_stats(stats), file=sys.stderr)
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
            print(f"llmtui: that line is not valid UTF-8 (byte 0x{error.object[error.start]:02x} at offset "
                  f"{error.start}); it was not sent", file=sys.stderr)
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
        return _chat_remote(args)
    path = resolve_model(args.model)
    with start_engine() as client:
        info = _loaded(client.load(path, _model_params(args), _context_params(args)))
        asked = f" (-c {args.ctx_size} rounded up by llama.cpp)" if 0 < args.ctx_size != info.n_ctx else ""
        print(f"{info.description} · {info.backend} · context {info.n_ctx}{asked} · Ctrl-D to quit", file=sys.stderr)
        history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
        for line in _chat_lines():
            history.append(ChatMessage("user", line))
            request = Generate(
                request_id=client.new_request_id(),
                messages=tuple(history),
                sampling=_sampling(args),
                max_tokens=args.n_predict,
                stop=tuple(args.stop),
            )
            try:
                text, _, finished = _stream(client, request, echo=True)
            except KeyboardInterrupt:
                client.cancel(request.request_id)
                text, _, finished = _drain(client, request.request_id)
            except (EngineFailure, EngineError) as error:  # e.g. a line longer than the context: say so, go on
                history.pop()
                print(f"llmtui: error: {error}", file=sys.stderr)
                continue
            history.append(ChatMessage("assistant", text))
            sys.stdout.write("\n")
            print(format_stats(finished.stats), file=sys.stderr)
    return 0


def _drain(client: EngineClient, request_id: int) -> tuple[str, list[int], Finished]:
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


def cmd_info(args: argparse.Namespace) -> int:
    # GGUF inspection reads metadata only: safe and fast in this process, no engine needed.
    from engine_ext.gguf_info import describe, estimate_memory, inspect_gguf

    path = resolve_model(args.model)
    info = inspect_gguf(path)
    n_ctx = args.ctx_size or info.context_length or 4096
    estimate = estimate_memory(info, n_ctx)
    if args.json:
        out: dict[str, Any] = info.to_dict()
        out["memory_estimate"] = estimate.to_dict()
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print("\n".join(describe(info, estimate)))
    return 0


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from engine_ext.cpu import default_threads
    from engine_ext.rpc import serve_rpc

    endpoint = f"{args.host}:{args.port}"
    print(f"serving this machine's CPU to llama.cpp RPC clients on {endpoint} (Ctrl-C stops)", file=sys.stderr)
    serve_rpc(endpoint, args.threads or default_threads())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from engine_ext.doctor import diagnose

    report = diagnose(repack=_saved_repack())
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    gib = 1024**3
    print(f"llmtui {report.llmtui_version}, llama-cpp-python {report.llama_cpp_python_version}, "
          f"Python {report.python}, {report.platform}")
    print(f"backends: {', '.join(report.backends)}  (RPC {'yes' if report.rpc else 'no'})")
    for d in report.devices:
        memory = f"{d.free_bytes / gib:.1f} / {d.total_bytes / gib:.1f} GiB free"
        print(f"  {d.name:10} {d.type:14} {d.description}  {memory}")
    print(f"CPU features: {' '.join(report.cpu_features)}")
    print(f"threads by default: {report.threads_reason}")
    if report.cpu_extra_bufts:
        use = ("in use: CPU weights are repacked for them when a model loads (--no-repack or F3 → Repack weights "
               "turns it off)" if report.repack else "not in use: repacking is off in the settings (F3)")
        print(f"CPU extra buffer types: {', '.join(report.cpu_extra_bufts)}, {use}")
    else:
        print("CPU extra buffer types: none in this build on this CPU (no weight repacking)")
    if report.hardware_gpus:
        print(f"GPUs on this machine: {', '.join(report.hardware_gpus)}")
    for line in report.advice:
        print(f"note: {line}")
    return 0


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "mean": round(statistics.fmean(values), 2),
        "stdev": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
    }


COPY_HEAVY_PROMPT = """Repeat these four Python functions exactly, then stop.

def add(a, b):
    return a + b

def subtract(a, b):
    return a - b

def multiply(a, b):
    return a * b

def divide(a, b):
    if b == 0:
        raise ValueError("division by zero")
    return a / b
"""


def cmd_bench_speculative(args: argparse.Namespace) -> int:
    """Plain decoding and each speculative mode on the same chat prompt: tok/s, speedup, acceptance."""
    path = resolve_model(args.model)
    modes = ["plain", *[t.strip() for t in args.spec_type.split(",") if t.strip()]]
    reps = max(1, args.repetitions)
    n_gen = args.n_gen
    greedy = SamplingParams(temperature=0.0)
    prompt = args.prompt or COPY_HEAVY_PROMPT
    specs = {mode: _spec_params(args, path, "" if mode == "plain" else mode) for mode in modes}
    for spec in specs.values():
        spec.validate()
    n_rs_seq = max(_load_plan(spec, path).n_rs_seq for spec in specs.values())
    rows: list[dict[str, Any]] = []
    with start_engine() as client:
        heads = (spec for spec in specs.values() if _load_plan(spec, path).load_mtp)
        context = _context_params(args, args.ctx_size or 4096, n_rs_seq)
        info = _loaded(client.load(path, _model_params(args, next(heads, None), path), context))
        for mode in modes:
            client.set_speculative(specs[mode])
            speeds: list[float] = []
            finished: Finished | None = None
            ids: list[int] = []
            for rep in range(reps + 1):  # the first run warms the prompt cache and is not counted
                request = Generate(
                    request_id=client.new_request_id(),
                    messages=() if args.raw else (ChatMessage("user", prompt),),
                    prompt=prompt if args.raw else None,
                    sampling=greedy,
                    max_tokens=n_gen,
                )
                _, ids, finished = _stream(client, request, echo=False)
                if rep > 0:
                    speeds.append(finished.stats.decode_tps)
            assert finished is not None
            s = finished.speculative
            rows.append(
                {
                    "mode": mode,
                    "tps": round(statistics.median(speeds), 2),
                    "generated": finished.stats.generated_tokens,
                    "drafted": s.drafted if s else 0,
                    "accepted": s.accepted if s else 0,
                    "mean_accepted_length": round(s.mean_accepted_length, 3) if s else 1.0,
                    "draft_ms": round(s.draft_ms, 2) if s else 0.0,
                    "tokens": ids,
                }
            )
    plain_tps, plain_ids = rows[0]["tps"], rows[0]["tokens"]
    for row in rows:
        row["speedup"] = round(row["tps"] / plain_tps, 3) if plain_tps else 0.0
        # Greedy speculation must reproduce plain decoding token for token (the trust check).
        row["identical"] = row.pop("tokens") == plain_ids
    if args.json:
        print(json.dumps({"model": str(path), "description": info.description, "n_gen": n_gen, "modes": rows}))
    else:
        print(f"model: {info.description} ({info.backend}, {info.n_threads} threads), {n_gen} tokens, median of {reps}")
        print(f"{'mode':>14} {'tok/s':>8} {'speedup':>8} {'accepted':>12} {'mean len':>9} {'same text':>10}")
        for row in rows:
            acc = f"{row['accepted']}/{row['drafted']}" if row["mode"] != "plain" else "-"
            mean_len = row["mean_accepted_length"]
            same = "yes" if row["identical"] else "DIVERGED"
            print(f"{row['mode']:>14} {row['tps']:8.2f} {row['speedup']:7.2f}x {acc:>12} {mean_len:9.2f} {same:>10}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Prompt processing (pp) and token generation (tg) speed through the app's own worker and client."""
    if args.spec_type:
        return cmd_bench_speculative(args)
    path = resolve_model(args.model)
    n_prompt, n_gen, reps = args.n_prompt, args.n_gen, max(1, args.repetitions)
    n_ctx = args.ctx_size or max(n_prompt, n_gen + 1) + 16
    greedy = SamplingParams(temperature=0.0)
    rng = random.Random(1234)
    with start_engine() as client:
        info = _loaded(client.load(path, _model_params(args), _context_params(args, n_ctx)))
        n_vocab = info.n_vocab

        def run(tokens: list[int], max_tokens: int) -> GenerationStats:
            request = Generate(
                request_id=client.new_request_id(),
                prompt_tokens=tuple(tokens),
                sampling=greedy,
                max_tokens=max_tokens,
                ignore_eos=True,
            )
            return _stream(client, request, echo=False)[2].stats

        def fresh(n: int, previous: list[int]) -> list[int]:
            # Random tokens whose first differs from the last run's, so nothing comes from the cache.
            tokens = [rng.randrange(n_vocab) for _ in range(n)]
            while previous and tokens[0] == previous[0]:
                tokens[0] = rng.randrange(n_vocab)
            return tokens

        results: dict[str, Any] = {
            "model": str(path),
            "description": info.description,
            "backend": info.backend,
            "n_threads": info.n_threads,
            "n_ctx": info.n_ctx,
        }
        last: list[int] = []
        if n_prompt > 0:
            last = fresh(min(n_prompt, 8), last)
            run(last, 1)  # warm-up
            pp: list[float] = []
            for _ in range(reps):
                last = fresh(n_prompt, last)
                stats = run(last, 1)
                pp.append(stats.prompt_tps)
            results["pp"] = {"n_prompt": n_prompt, "tps": [round(v, 2) for v in pp], **_summary(pp)}
        if n_gen > 0:
            last = fresh(1, last)
            run(last, 2)  # warm-up
            tg: list[float] = []
            for _ in range(reps):
                last = fresh(1, last)
                stats = run(last, n_gen + 1)  # n_gen decodes after the first sampled token
                tg.append(stats.decode_tps)
            results["tg"] = {"n_gen": n_gen, "tps": [round(v, 2) for v in tg], **_summary(tg)}
    if args.json:
        print(json.dumps(results))
    else:
        print(f"model: {results['description']} ({results['backend']}, {results['n_threads']} threads)")
        for key, label in (("pp", f"pp{n_prompt}"), ("tg", f"tg{n_gen}")):
            if key in results:
                r = results[key]
                print(f"{label:>8}: {r['median']:10.2f} tok/s (median of {reps}; mean {r['mean']} ± {r['stdev']})")
    return 0


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "info": cmd_info,
    "bench": cmd_bench,
    "models": cmd_models,
    "steer": cmd_steer,
    "doctor": cmd_doctor,
    "rpc-server": cmd_rpc_server,
}


def _open_tui(arguments: list[str]) -> int:
    """`llmtui [-m MODEL]`: the full-screen chat app."""
    parser = argparse.ArgumentParser(prog="llmtui", description="Open the chat app.")
    parser.add_argument("-m", "--model", default=None, help="model: a .gguf path or 'starter' (default: the last)")
    parser.add_argument("--no-repack", action="store_true", help="no CPU weight repacking this session (AMX, "
                        "CPU_REPACK; F3 settings keep it off for good)")
    args = parser.parse_args(arguments)
    from app.tui import run_tui

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
        print(f"llmtui: error: {exc}", file=sys.stderr)
        return 1
    except EngineCrashedError as exc:
        if not exc.advice and hasattr(args, "no_repack"):  # run, chat, bench: the engine settings that could help
            try:
                _with_advice(exc, _model_params(args), _context_params(args))
            except (CliError, ValueError):
                pass
        crashed = exc.crashed
        print(f"llmtui: error: {crashed.description}", file=sys.stderr)
        if crashed.log_tail:
            print("engine log (last lines):\n" + crashed.log_tail, file=sys.stderr)
        if crashed.log_path:
            print(f"the whole engine log: {crashed.log_path}", file=sys.stderr)
        if exc.advice:
            print(f"llmtui: {exc.advice}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a GGUF error from `info`, a broken pipe…: one line, no traceback
        from engine_ext.gguf_info import GGUFError

        if isinstance(exc, GGUFError | OSError):
            print(f"llmtui: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
