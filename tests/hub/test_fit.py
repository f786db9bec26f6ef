"""Fit checks from GGUF headers read remotely with HTTP Range requests, against given RAM and VRAM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_ext.gguf import estimate_memory, inspect_gguf, inspect_gguf_reader
from models_catalog import fit, hub
from models_catalog.fit import MachineMemory, QuantFit, Verdict
from tests.hub_server import HubServer

GIB = 1 << 30
REPO = "org/Tiny-Qwen35-GGUF"


def _strip(d: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in d.items() if k not in ("path", "split_paths")}


@pytest.mark.parametrize("kind", ["llama", "qwen35_mtp", "qwen35_mtp_sidecar", "nemotron_h_moe", "dflash"])
def test_reader_inspection_equals_file_inspection(tiny_models: dict[str, Path], kind: str) -> None:
    data = tiny_models[kind].read_bytes()
    calls: list[tuple[int, int]] = []

    def read_at(offset: int, n: int) -> bytes:
        calls.append((offset, n))
        return data[offset : offset + n]

    remote = inspect_gguf_reader(f"remote/{kind}.gguf", len(data), read_at, window=16 * 1024)
    local = inspect_gguf(tiny_models[kind])
    assert _strip(remote.to_dict()) == _strip(local.to_dict())
    assert remote.path == f"remote/{kind}.gguf"
    assert sum(n for _, n in calls) < len(data)  # the header only, never the weights


@pytest.fixture
def tiny_repo(hub_server: HubServer, tiny_models: dict[str, Path]) -> HubServer:
    model = tiny_models["qwen35_mtp"].read_bytes()
    # three "quants" of one model: the header is the same, the sizes differ (padding past the tensor data is
    # harmless for the header reader)
    hub_server.add_repo(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": model,
            "Tiny-Q8_0.gguf": model + b"\0" * 400_000,
            "F16/Tiny-F16-00001-of-00002.gguf": model,
            "F16/Tiny-F16-00002-of-00002.gguf": model + b"\0" * 900_000,
            "mtp-Tiny-Q8_0.gguf": tiny_models["qwen35_mtp_sidecar"].read_bytes(),
        },
    )
    return hub_server


def test_remote_header_is_read_with_a_few_range_requests(tiny_repo: HubServer, tiny_models: dict[str, Path]) -> None:
    listing = hub.list_repo(REPO)
    file = listing.file("Tiny-Q8_0.gguf")
    info, bytes_read = fit.remote_info([file], window=64 * 1024)
    assert info.architecture == "qwen35" and info.n_layer_nextn == 1
    assert _strip(info.to_dict()) | {"file_size": 0, "total_size": 0} == _strip(
        inspect_gguf(tiny_models["qwen35_mtp"]).to_dict()
    ) | {"file_size": 0, "total_size": 0}
    reqs = tiny_repo.data_requests("Tiny-Q8_0.gguf", settled=True)
    assert 1 <= len(reqs) <= 4 and all(r.status == 206 for r in reqs)
    assert bytes_read == sum(r.sent for r in reqs) < file.size / 4


def test_a_server_ignoring_range_still_reads_only_what_it_needs(tiny_repo: HubServer) -> None:
    tiny_repo.fault(REPO, "Tiny-Q8_0.gguf", ignore_range=True)
    info, _ = fit.remote_info([hub.list_repo(REPO).file("Tiny-Q8_0.gguf")], window=64 * 1024)
    assert info.architecture == "qwen35"


def test_fit_repo_judges_every_quant_from_one_header(tiny_repo: HubServer) -> None:
    listing = hub.list_repo(REPO)
    sizes = {g.tag: g.size for g in listing.quant_groups()}
    info = inspect_gguf_reader(
        "x", listing.file("Tiny-Q4_K_M.gguf").size, fit.RangeReader(listing.file("Tiny-Q4_K_M.gguf"))
    )
    overhead = fit.overhead_bytes(estimate_memory(info, 4096))
    # a machine where Q4_K_M and Q8_0 fit on the GPU and F16 only spills into RAM
    vram = int((sizes["Q8_0"] + overhead) / 0.9) + 1
    ram = int((sizes["F16"] + overhead - vram) / 0.7) + 1
    memory = MachineMemory(ram_total=ram, ram_available=ram, vram_total=vram, vram_free=vram, gpus=("test",))
    report = fit.fit_repo(listing, n_ctx=4096, memory=memory)
    verdicts = {q.tag: q.verdict for q in report.quants}
    assert verdicts == {"Q4_K_M": Verdict.FITS, "Q8_0": Verdict.FITS, "F16": Verdict.TIGHT}
    assert report.recommended == "Q8_0"  # the largest that fits
    assert report.header_from == "Tiny-Q4_K_M.gguf"  # llama.cpp's default pick, one header read
    assert len(tiny_repo.data_requests()) <= 4
    assert {q.tag: q.need_bytes - q.download_bytes for q in report.quants} == dict.fromkeys(verdicts, overhead)
    tiny = MachineMemory(ram_total=1000, ram_available=1000)
    assert fit.fit_repo(listing, n_ctx=4096, memory=tiny).recommended is None


def test_judge_rules() -> None:
    gpu = MachineMemory(ram_total=64 * GIB, ram_available=60 * GIB, vram_total=24 * GIB, vram_free=23 * GIB)
    assert fit.judge(20 * GIB, gpu) == (Verdict.FITS, "GPU")
    assert fit.judge(40 * GIB, gpu) == (Verdict.TIGHT, "GPU + CPU")
    assert fit.judge(80 * GIB, gpu)[0] == Verdict.TOO_BIG
    cpu = MachineMemory(ram_total=32 * GIB, ram_available=20 * GIB)
    assert fit.judge(20 * GIB, cpu) == (Verdict.FITS, "CPU")
    assert fit.judge(26 * GIB, cpu) == (Verdict.TIGHT, "CPU")
    assert fit.judge(30 * GIB, cpu)[0] == Verdict.TOO_BIG
    mac = MachineMemory(ram_total=64 * GIB, ram_available=50 * GIB, vram_total=64 * GIB, unified=True)
    assert fit.judge(40 * GIB, mac) == (Verdict.FITS, "GPU (unified memory)")
    quants = [
        QuantFit("Q2_K", "a", 1, 1, Verdict.FITS, "GPU"),
        QuantFit("Q4_K_M", "b", 2, 2, Verdict.FITS, "GPU"),
        QuantFit("Q8_0", "c", 4, 4, Verdict.TIGHT, "GPU + CPU"),
    ]
    assert fit.recommend(quants) == "Q4_K_M"
    assert fit.recommend(quants[2:]) == "Q8_0"


def test_memory_detection_and_overrides(monkeypatch: pytest.MonkeyPatch, tiny_models: dict[str, Path]) -> None:
    detected = fit.detect_memory()
    assert detected.ram_total > 0
    monkeypatch.setenv("LLMTUI_RAM_BYTES", str(16 * GIB))
    monkeypatch.setenv("LLMTUI_VRAM_BYTES", str(8 * GIB))
    mem = fit.detect_memory()
    assert (mem.ram_total, mem.vram_total) == (16 * GIB, 8 * GIB)
    verdict = fit.fit_local(tiny_models["llama"], n_ctx=512)
    assert verdict.verdict == Verdict.FITS and verdict.where == "GPU"


def test_vram_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 140000'\necho 'NVIDIA L4, 23034, 22000'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("LLMTUI_VRAM_BYTES", raising=False)
    mem = fit.detect_memory()
    assert mem.gpus == ("NVIDIA H200", "NVIDIA L4")
    assert mem.vram_total == (143771 + 23034) << 20 and mem.vram_free == (140000 + 22000) << 20
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert fit.detect_memory().vram_total == 0  # a broken driver means no GPU, not a crash


def test_a_model_shows_one_memory_figure_in_the_hub_and_on_disk(tiny_repo: HubServer, tmp_path: Path) -> None:
    """The Hub tab (fit_repo) and the Local tab (fit_local) judged the same file by two figures (439.23 and
    440.93 MiB in a user's session): both are now its file size plus what it needs besides its weights."""
    listing = hub.list_repo(REPO)
    memory = MachineMemory(ram_total=64 * GIB, ram_available=60 * GIB)
    remote = {q.tag: q for q in fit.fit_repo(listing, n_ctx=4096, memory=memory).quants}["Q8_0"]
    local_path = tmp_path / "Tiny-Q8_0.gguf"
    local_path.write_bytes(tiny_repo.repos[REPO].files["Tiny-Q8_0.gguf"].data)
    local = fit.fit_local(local_path, n_ctx=4096, memory=memory)
    assert local.need_bytes == remote.need_bytes
    assert local.download_bytes == remote.download_bytes == local_path.stat().st_size


def test_a_local_model_needs_its_projector_too(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The mmproj paired with a model loads with it (images): the fit check counts its file."""
    model = tmp_path / tiny_models["llama"].name
    model.write_bytes(tiny_models["llama"].read_bytes())
    memory = MachineMemory(ram_total=64 * GIB, ram_available=60 * GIB)
    alone = fit.fit_local(model, n_ctx=512, memory=memory).need_bytes
    (tmp_path / "mmproj-tiny-f16.gguf").write_bytes(b"\0" * 123_456)
    assert fit.fit_local(model, n_ctx=512, memory=memory).need_bytes == alone + 123_456
