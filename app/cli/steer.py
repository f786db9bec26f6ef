"""`llmtui steer make|show|sets` and the `--control-vector*` options of `run`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.flags import add_setting
from app.cli.types import ControlVectorScaled, int_range, read_text_file
from app.core.model_paths import resolve_model
from app.core.owner_only_dirs import private_dir
from app.core.paths import prompt_set_folders, steering_dir
from app.core.vectors import vector_progress_text
from engine_ext.params import EngineError, SteeringEntry
from engine_ext.protocol import VectorMade, VectorProgress
from engine_ext.settings_schema import N_THREADS


def add_control_vector_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--control-vector", action="append", default=[], metavar="FILE", help="apply a control vector")
    p.add_argument(
        "--control-vector-scaled",
        action=ControlVectorScaled,
        nargs="+",
        default=[],
        metavar=("FILE[:S]", "S"),
        help="apply a control vector with strength S: FILE:S, or FILE S as llama.cpp writes it "
        "(any number, as llama.cpp; ±1000 at most)",
    )
    p.add_argument(
        "--control-vector-layer-range",
        nargs=2,
        type=int_range(0, 512),
        default=None,
        metavar=("START", "END"),
        help="layers to steer (inclusive; default: every layer the architecture steers)",
    )


def steering_entries(args: argparse.Namespace) -> tuple[SteeringEntry, ...]:
    start, end = args.control_vector_layer_range or (0, 0)
    entries = [SteeringEntry(str(Path(f).expanduser()), 1.0, start, end) for f in args.control_vector]
    for spec in args.control_vector_scaled:
        file, sep, strength = spec.rpartition(":")
        try:
            value = float(strength)
        except ValueError:
            value = float("nan")
        if not sep or value != value:
            raise EngineError(f"--control-vector-scaled takes FILE:STRENGTH, not {spec!r}")
        entries.append(SteeringEntry(str(Path(file).expanduser()), value, start, end))
    for entry in entries:
        entry.validate()
    return tuple(entries)


def add_steer_parser(sub: Any) -> None:
    steer = sub.add_parser("steer", help="control vectors: make one from a prompt set, inspect one")
    actions = steer.add_subparsers(dest="steer_command", required=True)
    make = actions.add_parser("make", help="make a control vector on a model from positive/negative prompts")
    make.add_argument("-m", "--model", default="starter")
    make.add_argument("--prompts", required=True, help="a bundled or user prompt set name, or a .json path")
    make.add_argument("--method", choices=("pca", "mean"), default="pca")
    make.add_argument("-o", "--output", default=None, help="output .gguf (default: the steering folder)")
    add_setting(make, N_THREADS)
    show = actions.add_parser("show", help="inspect a control-vector file")
    show.add_argument("file")
    show.add_argument("--json", action="store_true")
    actions.add_parser("sets", help="list the prompt sets (bundled and your own)")


def cmd_steer(args: argparse.Namespace) -> int:
    if args.steer_command == "show":
        return _show(args)
    if args.steer_command == "sets":
        from engine_ext.steering.prompt_sets import list_prompt_sets

        for path in list_prompt_sets(prompt_set_folders()):
            print(f"{path.stem:24} {path}")
        return 0
    return _make(args)


def _show(args: argparse.Namespace) -> int:
    from engine_ext.steering.cvec_file import norm_summary, read_control_vector

    vector = read_control_vector(Path(args.file).expanduser())
    norms = norm_summary(vector)
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(vector.path),
                    "model_hint": vector.model_hint,
                    "n_embd": vector.n_embd,
                    "layers": vector.layers,
                    "norms": [n for _, n in norms],
                    "metadata": vector.metadata,
                }
            )
        )
        return 0
    print(f"{vector.path}: control vector for {vector.model_hint or 'any'} model, n_embd {vector.n_embd}")
    print(f"layers {vector.layers[0]}..{vector.layers[-1]} ({len(vector.layers)} directions)")
    for key, value in sorted(vector.metadata.items()):
        print(f"  {key.removeprefix('llmtui.')}: {value}")
    peak = max(n for _, n in norms) or 1.0
    bars = " ▁▂▃▄▅▆▇█"
    print("norm per layer: " + "".join(bars[min(8, round(8 * n / peak))] for _, n in norms))
    return 0


def _make(args: argparse.Namespace) -> int:
    from app.cli.session import recovering, start_engine
    from engine_ext.params import ContextParams, ModelParams
    from engine_ext.steering.prompt_sets import find_prompt_set

    model = resolve_model(args.model)
    given = Path(args.prompts).expanduser()
    if given.suffix == ".json" and given.is_file():
        try:
            read_text_file(given)  # a user's file: too large or not UTF-8 is said in one line
        except ValueError as error:
            raise EngineError(str(error)) from None
    prompt_set, set_path = find_prompt_set(args.prompts, prompt_set_folders())
    default_output = f"{model.stem}-{prompt_set.name}.gguf"
    output = Path(args.output) if args.output else private_dir(steering_dir()) / default_output
    context = ContextParams(n_ctx=512, n_threads=args.threads)

    def progress(event: VectorProgress) -> None:
        text = vector_progress_text(event.phase, event.done, event.total, event.phase_seconds)
        line = f"making {prompt_set.name} vector ({event.fraction:.0%}): {text}"
        print(f"\r{line:<88}", end="", file=sys.stderr, flush=True)

    def make(params: ModelParams) -> VectorMade:
        client.load(model, params, context)
        return client.make_vector(set_path, output, args.method, progress)

    with start_engine() as client:
        made = recovering(client, ModelParams(), context, make)
    print(file=sys.stderr)
    print(f"wrote {made.path} ({made.layers} layers from {made.pairs} pairs in {made.seconds:.1f} s)")
    return 0
