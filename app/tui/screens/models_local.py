"""The models screen's (F4) Local tab beyond whole models: partial downloads (their rows, their progress against the
Hub's size, resume and delete), and what each status word on the screen means (tooltips and F1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from engine_ext.gguf import format_bytes
from models_catalog import hfcache, hub
from models_catalog.download import RemoteFile
from models_catalog.errors import ModelsError
from models_catalog.library import PartialDownload

STATUS_WORDS: dict[str, str] = {
    "unverified": "a catalog entry whose repository name was not confirmed from public documentation (it is the "
    "likely name); `llmtui models refresh` checks it against the Hub. It says nothing about files: every download "
    "is checked against the sha256 the Hub lists for it before it is installed.",
    "gated": "the repository asks you to accept its terms on huggingface.co; set HF_TOKEN to a token of an account "
    "that did.",
    "★": "the quant recommended for this machine: the largest that fits (else the smallest tight one).",
    "✓": "this quant is downloaded already.",
    "fits": "the memory it needs at its context (up to 8192 tokens) fits: on the GPU with 10% to spare, or without "
    "a GPU within 70% of RAM.",
    "tight": "it needs the GPU and RAM (layers split between them, slower), or without a GPU 70-90% of RAM.",
    "too big": "it needs more memory than that.",
    "needs, memory": "one figure per model, the same in F4 and ctrl+l: its files' size plus its KV cache, "
    "recurrent state and compute buffers at that context.",
    "+mtp, +dflash…": "companion files paired with the model by llama.cpp's naming rules: draft sidecars (mtp, "
    "dflash, dspark, eagle3) and mmproj.",
    "incomplete": "a split model with shards missing: download it again to finish.",
    "unusable": "its GGUF header could not be read (damaged, or not a GGUF file).",
    "partial": "a download that stopped before its end (paused, quit, or interrupted), bytes kept: r resumes it, "
    "x deletes it.",
    "queued": "the download waits for the one before it.",
    "waiting": "another process (huggingface_hub, llama.cpp, a second llmtui) is fetching the same file.",
    "checking": "the bytes already on disk are hashed before the download resumes.",
    "downloading": "bytes arriving: rate, ETA, bytes so far of the total.",
    "verifying": "the whole file's sha256 is checked against the Hub's before it is installed.",
    "paused": "stopped with p, bytes kept: p resumes it (so does the next pull of the same model).",
    "done": "installed in the Hugging Face cache.",
    "failed": "stopped with the error shown; the bytes are kept for the next pull.",
    "cancelled": "cancelled with x: its partial file is deleted.",
}
"""Every status word the models screen shows, and what it means (the lists' tooltips and F1's help)."""


def words_tooltip(*words: str) -> str:
    """The tooltip of a list: what the status words it can show mean."""
    return "\n".join(f"{word}: {STATUS_WORDS[word]}" for word in words)


@dataclass(frozen=True)
class PartialRow:
    """A partial download in the Local tab: the file on disk, and the Hub's file it is part of when known."""

    partial: PartialDownload
    file: RemoteFile | None = None
    """The Hub's file with this content (its name and total size); None until looked up, or when not found."""
    lookup_error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.partial.repo_id}/{self.file.path}" if self.file is not None else self.partial.repo_id

    @property
    def fraction(self) -> float | None:
        if self.file is None or self.file.size <= 0:
            return None
        return min(1.0, self.partial.size / self.file.size)

    def progress_text(self) -> str:
        """`3.34 MiB / 8.01 MiB  42%`, or `3.34 MiB so far` when the total is unknown."""
        fraction = self.fraction
        if self.file is None or fraction is None:
            return f"{format_bytes(self.partial.size)} so far"
        return f"{format_bytes(self.partial.size)} / {format_bytes(self.file.size)}  {100 * fraction:.0f}%"

    def label(self) -> Text:
        label = Text(self.file.name if self.file is not None else self.partial.oid[:12], style="bold")
        label.append("  partial" if not self.partial.active else "  downloading", style="yellow")
        label.append(f"  {self.progress_text()}", style="dim")
        label.append(f"  {self.partial.repo_id}", style="dim italic")
        return label

    def detail(self) -> Text:
        text = Text()
        text.append(f"Partial download: {self.name}\n", style="bold")
        text.append(f"{self.progress_text()} · from {self.partial.tool}\n")
        text.append(f"{self.partial.path}\n", style="dim")
        if self.partial.active:
            text.append("A process is writing it now (this one or another).\n", style="yellow")
        elif self.file is None and self.lookup_error:
            text.append(f"Its total is unknown: {self.lookup_error}\n", style="yellow")
        text.append(
            f"\nr or Enter: resume it · x: delete it (frees {format_bytes(self.partial.size)})", style="dim italic"
        )
        return text


def size_partials(partials: Sequence[PartialDownload]) -> list[PartialRow]:
    """Each partial with the Hub's file it belongs to (its name and total size), looked up by content id in its
    repository's listing (the cached snapshot when offline). Network: call from a thread worker."""
    listings: dict[str, hub.RepoListing | str] = {}
    rows: list[PartialRow] = []
    for partial in partials:
        if partial.repo_id not in listings:
            try:
                listing = hub.cached_listing(partial.repo_id) if hfcache.is_offline() else hub.listing(partial.repo_id)
                listings[partial.repo_id] = listing if listing is not None else "not in the cache (offline)"
            except (ModelsError, OSError, ValueError) as error:
                listings[partial.repo_id] = " ".join(str(error).split())[:200]
        found = listings[partial.repo_id]
        if isinstance(found, str):
            rows.append(PartialRow(partial, None, found))
            continue
        file = next((f for f in found.files if f.oid == partial.oid), None)
        why = None if file is not None else f"no file of {partial.repo_id} has this content at its current revision"
        rows.append(PartialRow(partial, file, why))
    return rows


NO_LOCAL_MODELS = "No models on disk yet (nor the bundled starter model): find one in Catalog or Search."
"""The Local tab's line when nothing is on disk; the bundled starter model, when installed, is a row of its own."""
