"""Will it fit: memory estimates from GGUF headers read remotely with HTTP Range requests, against RAM and VRAM."""

from __future__ import annotations

import enum
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_ext.gguf import (
    MAX_READ_HEADER_BYTES,
    GGUFInfo,
    MemoryEstimate,
    estimate_memory,
    inspect_gguf,
    inspect_gguf_reader,
)
from engine_ext.untrusted_text import one_line
from models_catalog import hfcache, pairing, transport
from models_catalog.download import RemoteFile, installed_path
from models_catalog.errors import HubError
from models_catalog.hub import QuantGroup, RepoListing
from models_catalog.transport import TransientHTTPError, hub_headers, open_url, raise_for_status

DEFAULT_CTX = 8192
GIB = 1 << 30


# ----- the machine -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineMemory:
    """Memory llmtui can use: system RAM and the GPUs' VRAM (0 without a GPU)."""

    ram_total: int
    ram_available: int
    vram_total: int = 0
    vram_free: int = 0
    gpus: tuple[str, ...] = ()
    unified: bool = False  # Apple silicon: the GPU uses system RAM

    def to_dict(self) -> dict[str, Any]:
        return {
            "ram_total": self.ram_total,
            "ram_available": self.ram_available,
            "vram_total": self.vram_total,
            "vram_free": self.vram_free,
            "gpus": list(self.gpus),
            "unified": self.unified,
        }


def _ram() -> tuple[int, int]:
    try:
        with open("/proc/meminfo") as fh:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh if line.split()[1:]}
        return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total // 2
    except (ValueError, OSError, AttributeError):
        return 8 * GIB, 4 * GIB


def _nvidia() -> tuple[int, int, tuple[str, ...]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0, 0, ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, 0, ()
    total = free = 0
    names: list[str] = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            total += int(float(parts[1])) << 20
            free += int(float(parts[2])) << 20
        except ValueError:
            continue
        names.append(parts[0])
    return total, free, tuple(names)


def detect_memory() -> MachineMemory:
    """RAM from the OS, VRAM from nvidia-smi; LLMTUI_RAM_BYTES / LLMTUI_VRAM_BYTES override (tests, odd setups)."""
    ram_total, ram_available = _ram()
    if os.environ.get("LLMTUI_RAM_BYTES"):
        ram_total = ram_available = int(os.environ["LLMTUI_RAM_BYTES"])
    if os.environ.get("LLMTUI_VRAM_BYTES") is not None:
        vram = int(os.environ["LLMTUI_VRAM_BYTES"] or 0)
        return MachineMemory(ram_total, ram_available, vram, vram, ("override",) if vram else ())
    vram_total, vram_free, gpus = _nvidia()
    unified = platform.system() == "Darwin" and platform.machine() == "arm64"
    return MachineMemory(ram_total, ram_available, vram_total, vram_free, gpus, unified)


# ----- verdicts ----------------------------------------------------------------------------------------


class Verdict(enum.StrEnum):
    FITS = "fits"
    TIGHT = "tight"
    TOO_BIG = "too big"


def judge(need: int, mem: MachineMemory) -> tuple[Verdict, str]:
    """fits / tight / too big, and where it would run.

    With a GPU: fits when it all goes on the GPU with 10% to spare; tight when it needs the GPU plus up to 70% of
    RAM (layers split between them, slower). Without one (or unified memory): fits within 70% of RAM, tight
    within 90%.
    """
    if mem.vram_total and not mem.unified:
        if need <= 0.9 * mem.vram_total:
            return Verdict.FITS, "GPU"
        if need <= mem.vram_total + 0.7 * mem.ram_total:
            return Verdict.TIGHT, "GPU + CPU"
        return Verdict.TOO_BIG, "-"
    where = "GPU (unified memory)" if mem.unified else "CPU"
    if need <= 0.7 * mem.ram_total:
        return Verdict.FITS, where
    if need <= 0.9 * mem.ram_total:
        return Verdict.TIGHT, where
    return Verdict.TOO_BIG, "-"


@dataclass(frozen=True)
class QuantFit:
    """One quant's download size, memory need at the context, and verdict."""

    tag: str
    primary: str
    download_bytes: int
    need_bytes: int
    verdict: Verdict
    where: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "primary": self.primary,
            "download_bytes": self.download_bytes,
            "need_bytes": self.need_bytes,
            "verdict": str(self.verdict),
            "where": self.where,
        }


@dataclass(frozen=True)
class FitReport:
    """The fit of every quant of a repository, from one header read remotely."""

    repo_id: str
    n_ctx: int
    memory: MachineMemory
    header_from: str  # the file whose header was read
    info: GGUFInfo
    estimate: MemoryEstimate
    quants: tuple[QuantFit, ...]
    recommended: str | None  # a tag (or primary path when it has no tag)
    bytes_read: int = 0
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "n_ctx": self.n_ctx,
            "memory": self.memory.to_dict(),
            "header_from": self.header_from,
            "architecture": self.info.architecture,
            "context_length": self.info.context_length,
            "overhead_bytes": overhead_bytes(self.estimate),
            "quants": [q.to_dict() for q in self.quants],
            "recommended": self.recommended,
            "bytes_read": self.bytes_read,
            "notes": list(self.notes),
        }


def overhead_bytes(estimate: MemoryEstimate) -> int:
    """What the model needs besides its weights: KV cache, recurrent state, compute buffers."""
    return estimate.kv_bytes + estimate.recurrent_bytes + estimate.compute_bytes


def need_bytes(file_bytes: int, estimate: MemoryEstimate) -> int:
    """The one memory figure for a model, wherever it is shown: its files' size (what a download is, and what a
    Hub listing knows for every quant) plus what it needs besides its weights."""
    return file_bytes + overhead_bytes(estimate)


def recommend(quants: Sequence[QuantFit]) -> str | None:
    """The largest quant that fits; else the smallest tight one; else None."""
    fitting = [q for q in quants if q.verdict == Verdict.FITS]
    if fitting:
        best = max(fitting, key=lambda q: q.download_bytes)
        return best.tag or best.primary
    tight = [q for q in quants if q.verdict == Verdict.TIGHT]
    if tight:
        best = min(tight, key=lambda q: q.download_bytes)
        return best.tag or best.primary
    return None


# ----- remote headers ----------------------------------------------------------------------------------


class RangeReader:
    """read_at(offset, n) over HTTP Range requests on a Hub file; counts requests and bytes. The whole header read is
    bounded as a local one is: the parser walks MAX_READ_HEADER_BYTES at most (refusing a header that claims more
    before reading it), this reader stops past that many bytes too, and all its requests share LIMITS.header_s."""

    def __init__(self, file: RemoteFile, timeout: float = 30.0) -> None:
        self.file = file
        self.timeout = timeout
        self.requests = 0
        self.bytes_read = 0
        self.deadline: float | None = None  # set by the first read

    def __call__(self, offset: int, n: int) -> bytes:
        what = f"the header of {self.file.repo_id}/{self.file.path}"
        hfcache.require_online(f"reading {what}")
        end = min(self.file.size, offset + n) - 1
        if end < offset:
            return b""
        limit_s = transport.LIMITS.header_s
        if self.deadline is None:
            self.deadline = time.monotonic() + limit_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HubError(
                one_line(f"the Hub took longer than the {limit_s:g} s limit to send {what}; stopped reading")
            )
        if self.bytes_read > MAX_READ_HEADER_BYTES + (4 << 20):  # the parser's limit and a window or so
            raise HubError(
                one_line(
                    f"{what} passes {MAX_READ_HEADER_BYTES >> 20} MiB, more than a real header holds; stopped reading"
                )
            )
        self.requests += 1
        try:
            resp = open_url(
                self.file.url,
                headers=hub_headers({"Range": f"bytes={offset}-{end}"}),
                timeout=self.timeout,
                time_limit=min(transport.LIMITS.exchange_s, left),
            )
        except TransientHTTPError as exc:
            raise HubError(str(exc)) from None
        try:
            try:
                raise_for_status(resp, self.file.repo_id, self.file.path)
            except TransientHTTPError as exc:
                raise HubError(str(exc)) from None
            if resp.status == 206:
                data = resp.read_all(end - offset + 1)
            else:  # the server ignored Range: read up to what we need and drop the connection
                data = resp.read_all(end + 1)[offset:]
            self.bytes_read += len(data)
            return data
        finally:
            resp.close()


def remote_info(files: Sequence[RemoteFile], *, window: int = 1 << 20) -> tuple[GGUFInfo, int]:
    """Inspect a remote model (all shards' headers) without downloading it; returns (info, bytes read)."""
    readers = [RangeReader(f) for f in files]
    head, rest = readers[0], readers[1:]
    info = inspect_gguf_reader(
        f"{files[0].repo_id}/{files[0].path}",
        files[0].size,
        head,
        shards=[(f"{r.file.repo_id}/{r.file.path}", r.file.size, r) for r in rest],
        window=window,
    )
    return info, sum(r.bytes_read for r in readers)


def _header_info(group: QuantGroup, cache_root: Path | None, window: int) -> tuple[GGUFInfo, int]:
    """The first shard's header: from the cache when downloaded, else over the network (first shard only)."""
    local = installed_path(group.files[0], cache_root)
    if local is not None:
        return inspect_gguf(local), 0
    return remote_info(group.files[:1], window=window)


def fit_repo(
    listing: RepoListing,
    *,
    n_ctx: int | None = None,
    memory: MachineMemory | None = None,
    kv_type_bytes: float = 2.0,
    window: int = 1 << 20,
    cache_root: Path | None = None,
) -> FitReport:
    """Judge every quant of a repository from ONE header (KV, state and buffers do not depend on the quant).

    The weights of each quant are its files' total size; everything else comes from the estimate at `n_ctx`
    (default: the trained context, capped at 8192).
    """
    groups = listing.quant_groups()
    if not groups:
        raise HubError(f"{listing.repo_id} has no GGUF model files to check")
    memory = memory or detect_memory()
    # Read the header of the file llama.cpp would pick by default (any quant has the same architecture).
    default = pairing.find_best_model([g.primary for g in groups], "") or groups[0].primary
    probe = next(g for g in groups if g.primary == default)
    info, bytes_read = _header_info(probe, cache_root, window)
    ctx = n_ctx or min(info.context_length or DEFAULT_CTX, DEFAULT_CTX)
    estimate = estimate_memory(info, ctx, kv_type_bytes=kv_type_bytes)
    quants = []
    for g in groups:
        need = need_bytes(g.size, estimate)
        verdict, where = judge(need, memory)
        quants.append(QuantFit(g.tag, g.primary, g.size, need, verdict, where))
    return FitReport(
        repo_id=listing.repo_id,
        n_ctx=ctx,
        memory=memory,
        header_from=probe.primary,
        info=info,
        estimate=estimate,
        quants=tuple(quants),
        recommended=recommend(quants),
        bytes_read=bytes_read,
        notes=estimate.notes,
    )


def fit_local(path: Path, *, n_ctx: int | None = None, memory: MachineMemory | None = None) -> QuantFit:
    """The verdict for a model file on disk, counting the projector (mmproj) paired with it, which loads with it."""
    info = inspect_gguf(path)
    need = _local_need(path, info, n_ctx or min(info.context_length or DEFAULT_CTX, DEFAULT_CTX))
    verdict, where = judge(need, memory or detect_memory())
    tag = pairing.quant_tag(path.name)
    return QuantFit(tag, str(path), info.total_size, need, verdict, where)


def need_at_context(path: Path, n_ctx: int) -> int:
    """`fit_local`'s figure for the model loaded with `n_ctx` tokens of context (0: the model's own), as
    `llmtui serve` loads it: what F4 shows at its context."""
    info = inspect_gguf(path)
    return _local_need(path, info, n_ctx or info.context_length or DEFAULT_CTX)


def _local_need(path: Path, info: GGUFInfo, n_ctx: int) -> int:
    need = need_bytes(info.total_size, estimate_memory(info, n_ctx))  # as fit_repo: one figure in both tabs
    projector = pairing.local_mmproj(path)
    if projector is not None:
        try:
            need += projector.stat().st_size  # its weights, in memory beside the model's
        except OSError:
            pass
    return need
