"""`llmtui info`: a GGUF file's facts and memory estimate, without loading its weights."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.flags import add_setting
from app.core.model_paths import resolve_model
from engine_ext.settings_schema import N_CTX
from engine_ext.untrusted_text import json_text


def cmd_info(args: argparse.Namespace) -> int:
    # GGUF inspection reads metadata only: safe and fast in this process, no engine needed.
    from engine_ext.gguf import describe, estimate_memory, inspect_gguf

    path = resolve_model(args.model)
    info = inspect_gguf(path)
    n_ctx = args.ctx_size or info.context_length or 4096
    estimate = estimate_memory(info, n_ctx)
    if args.json:
        out: dict[str, Any] = info.to_dict()
        out["memory_estimate"] = estimate.to_dict()
        print(json_text(out, indent=2))
    else:
        print("\n".join(describe(info, estimate)))
    return 0


def add_info_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    info = sub.add_parser("info", help="inspect a GGUF file without loading its weights")
    info.add_argument("model", help="a .gguf path or 'starter'")
    add_setting(info, N_CTX, default=0, help="context for the memory estimate")
    info.add_argument("--json", action="store_true")
