"""`llmtui cache list|clear`: the conversations' engine state saved on disk (engine_ext.disk_cache)."""

from __future__ import annotations

import argparse
import time

from app.cli.session import CliError


def cmd_cache(args: argparse.Namespace) -> int:
    from app.core.config import ConfigError, load_config
    from app.core.paths import prompt_cache_dir
    from engine_ext.disk_cache import budget_bytes, clear_state_files, list_state_files
    from engine_ext.untrusted_text import json_text, shown

    folder = prompt_cache_dir()
    try:
        settings = load_config().cache
    except ConfigError as error:
        raise CliError(str(error)) from None
    if args.action == "clear":
        count, size = clear_state_files(folder)
        print(f"deleted {count} saved state file(s), {size / 2**20:.1f} MiB, from {shown(str(folder))}")
        return 0
    rows = list_state_files(folder)
    budget = budget_bytes(folder, settings.budget_mib)
    total = sum(row[1] for row in rows)
    if args.json:
        files = [
            {
                "file": str(path),
                "bytes": size,
                "last_used": mtime,
                "model": header.model if header is not None else None,
                "tokens": len(header.tokens) if header is not None else None,
                "refused": why or None,
            }
            for path, size, mtime, header, why in rows
        ]
        out = {"folder": str(folder), "on": settings.disk, "bytes": total, "budget": budget, "files": files}
        print(json_text(out))
        return 0
    state = "on" if settings.disk else "off ([cache] disk = false in config.toml)"
    print(f"prompt cache {state}: {shown(str(folder))}")
    print(f"{len(rows)} file(s), {total / 2**20:.1f} MiB of a {budget / 2**20:.0f} MiB budget")
    for path, size, mtime, header, why in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime))
        if header is None:
            print(f"  {used}  {size / 2**20:8.1f} MiB  refused: {why.removeprefix('prompt cache: ')}")
        else:
            model = shown(header.model or "?")
            print(f"  {used}  {size / 2**20:8.1f} MiB  {len(header.tokens):7d} tokens  {model}  {path.name}")
    return 0


def add_cache_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cache = sub.add_parser(
        "cache",
        help="the conversations' engine state saved on disk (list, clear)",
        description="The prompt cache on disk: each conversation's engine state (the same text as the history, as "
        "model state), restored when the conversation goes on after a restart. [cache] in config.toml turns it off "
        "(disk = false) or sets its budget (budget_mib).",
    )
    cache.add_argument("action", choices=("list", "clear"), help="list the saved states, or delete them all")
    cache.add_argument("--json", action="store_true", help="list as one JSON object")
