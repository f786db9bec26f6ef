"""`llmtui docs list|rm PATH|clear`: the documents' indexes `run --doc`, `chat --doc` and the app's F12 keep in the
cache folder (app.core.documents.index), one per file or folder asked about."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli.session import CliError


def cmd_docs(args: argparse.Namespace) -> int:
    from app.core.documents.index import index_folder, list_indexes, remove_index, remove_index_file
    from engine_ext.untrusted_text import json_text, shown

    folder = index_folder()
    if args.action == "rm":
        if not args.path:
            raise CliError("llmtui docs rm PATH: name the file or folder whose index goes")
        path = Path(args.path).expanduser()
        if not remove_index(path):
            raise CliError(f"no index of {shown(str(path.absolute()))} (llmtui docs list shows them)")
        print(f"removed the index of {shown(str(path.absolute()))}")
        return 0
    entries = list_indexes(folder)
    if args.action == "clear":
        for entry in entries:
            remove_index_file(entry.path)
        print(f"removed {len(entries)} index(es) from {shown(str(folder))}")
        return 0
    if args.json:
        rows = [
            {"source": e.source or None, "files": e.files, "chunks": e.chunks, "bytes": e.size, "damaged": e.damaged}
            for e in entries
        ]
        print(json_text({"folder": str(folder), "indexes": rows}))
        return 0
    print(f"{len(entries)} index(es) in {shown(str(folder))}")
    for e in entries:
        where = shown(e.source) if not e.damaged else f"{e.path.name}: damaged (llmtui docs clear removes it)"
        print(f"  {e.files:6d} files {e.chunks:7d} chunks {e.size / 2**20:8.1f} MiB  {where}")
    return 0


def add_docs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    docs = sub.add_parser("docs", help="the documents' indexes in the cache folder (list, rm PATH, clear)")
    docs.add_argument("action", choices=("list", "rm", "clear"), nargs="?", default="list")
    docs.add_argument("path", nargs="?", default=None, help="rm: the file or folder given to --doc or F12")
    docs.add_argument("--json", action="store_true", help="list as one JSON object")
