"""The local library: the hub cache and user folders, sidecars, last used, deletion with freed space, partials."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from models_catalog import hfcache, hub, pull
from models_catalog.download import TransferOptions
from models_catalog.library import Library
from tests.hub_server import HubServer

REPO = "org/Tiny-GGUF"
FAST = TransferOptions(chunk_size=64 * 1024, backoff_base=0.01, progress_interval=0.01)


@pytest.fixture
def tiny_hub(hub_server: HubServer, tiny_models: dict[str, Path]) -> HubServer:
    hub_server.add_repo(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": tiny_models["qwen35_mtp"],
            "Tiny-Q8_0.gguf": tiny_models["qwen35"],
            "mtp-Tiny-Q8_0.gguf": tiny_models["qwen35_mtp_sidecar"],
            "README.md": b"# tiny\n",
        },
    )
    return hub_server


def test_cached_models_with_sidecars_sizes_and_architecture(
    tiny_hub: HubServer, hf_env: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    pull.pull(f"{REPO}:Q8_0", ["mtp"], options=FAST)
    pull.pull(f"{REPO}:Q4_K_M", options=FAST)
    library = Library(usage_file=tmp_path / "usage.json")
    models = {m.name: m for m in library.models()}
    assert sorted(models) == [f"{REPO}:Q4_K_M", f"{REPO}:Q8_0"]
    q8 = models[f"{REPO}:Q8_0"]
    assert q8.source == "hf-cache" and q8.repo_id == REPO and q8.tag == "Q8_0" and q8.complete
    assert q8.size == tiny_models["qwen35"].stat().st_size
    assert q8.architecture == "qwen35"
    assert set(q8.sidecars) == {"mtp"} and q8.sidecars["mtp"].name == "mtp-Tiny-Q8_0.gguf"
    assert models[f"{REPO}:Q4_K_M"].sidecars["mtp"].name == "mtp-Tiny-Q8_0.gguf"  # llama.cpp's closest-bits rule
    library.mark_used(q8.path, when=1234.0)
    assert {m.name: m.last_used for m in library.models(inspect=False)}[f"{REPO}:Q8_0"] == 1234.0
    assert [m.name for m in library.find(f"{REPO}:q8_0")] == [f"{REPO}:Q8_0"]
    assert len(library.find(REPO)) == 2
    assert [m.name for m in library.find(str(q8.path))] == [f"{REPO}:Q8_0"]


def test_user_folders_follow_llama_cpp_local_rules(tmp_path: Path, hf_env: Path, tiny_models: dict[str, Path]) -> None:
    folder = tmp_path / "models"
    (folder / "qwen").mkdir(parents=True)
    (folder / "split").mkdir()
    (folder / "qwen" / "Qwen-Q4_K_M.gguf").write_bytes(tiny_models["qwen35_mtp"].read_bytes())
    (folder / "qwen" / "mtp-Qwen-Q8_0.gguf").write_bytes(tiny_models["qwen35_mtp_sidecar"].read_bytes())
    (folder / "qwen" / "mmproj-Qwen-F16.gguf").write_bytes(b"GGUF")
    (folder / "loose-Q8_0.gguf").write_bytes(tiny_models["llama"].read_bytes())
    (folder / "split" / "Big-Q4_0-00001-of-00002.gguf").write_bytes(tiny_models["llama"].read_bytes())
    models = {m.name: m for m in Library([folder]).models()}
    assert sorted(models) == ["loose-Q8_0.gguf", "qwen/Qwen-Q4_K_M.gguf", "split/Big-Q4_0-00001-of-00002.gguf"]
    qwen = models["qwen/Qwen-Q4_K_M.gguf"]
    assert qwen.source == str(folder) and qwen.tag == "Q4_K_M" and qwen.architecture == "qwen35"
    assert {k: v.name for k, v in qwen.sidecars.items()} == {
        "mtp": "mtp-Qwen-Q8_0.gguf",
        "mmproj": "mmproj-Qwen-F16.gguf",
    }
    assert models["loose-Q8_0.gguf"].sidecars == {}  # sidecars attach within their own folder only
    assert not models["split/Big-Q4_0-00001-of-00002.gguf"].complete


def test_delete_frees_space_and_keeps_shared_blobs(tiny_hub: HubServer, hf_env: Path, tmp_path: Path) -> None:
    pull.pull(f"{REPO}:Q8_0", ["mtp"], options=FAST)
    pull.pull(f"{REPO}:Q4_K_M", options=FAST)
    library = Library()
    q8 = library.find(f"{REPO}:Q8_0")[0]
    blob = q8.path.resolve()
    size = blob.stat().st_size
    freed = library.delete(q8)
    # the mtp sidecar is still used by the Q4_K_M model, so only the Q8_0 blob goes
    assert freed == size
    assert not blob.exists() and not q8.path.exists()
    assert q8.sidecars["mtp"].exists()
    q4 = library.find(f"{REPO}:Q4_K_M")[0]
    both = q4.path.resolve().stat().st_size + q4.sidecars["mtp"].resolve().stat().st_size
    assert library.delete(q4) == both
    assert not (hf_env / "models--org--Tiny-GGUF").exists()  # nothing left: the repo folder goes too
    assert library.models() == []


def test_partials_are_listed_cleaned_and_resumed(
    tiny_hub: HubServer, hf_env: Path, tiny_models: dict[str, Path]
) -> None:
    listing = hub.list_repo(REPO)
    file = listing.file("Tiny-Q8_0.gguf")
    rc = hfcache.RepoCache(hf_env, REPO)
    rc.partial(file.oid).parent.mkdir(parents=True)
    data = tiny_models["qwen35"].read_bytes()
    rc.partial(file.oid).write_bytes(data[:100_000])
    (rc.folder / "blobs" / "abc.downloadInProgress").write_bytes(b"x" * 10)
    (rc.folder / "blobs" / f"{'d' * 64}.1234abcd.incomplete").write_bytes(b"y" * 20)
    library = Library()
    partials = {p.tool: p for p in library.partials()}
    assert set(partials) == {"llmtui", "llama.cpp", "huggingface_hub"}
    ours = partials["llmtui"]
    assert ours.repo_id == REPO and ours.oid == file.oid and ours.size == 100_000 and not ours.active
    path = library.resume_partial(ours, options=FAST)
    assert path.read_bytes() == data
    assert tiny_hub.data_requests("Tiny-Q8_0.gguf")[-1].start == 100_000
    assert library.clean_partials() == 30
    assert library.partials() == []


def test_a_partial_being_written_is_active_and_never_cleaned(tiny_hub: HubServer, hf_env: Path) -> None:
    file = hub.list_repo(REPO).file("Tiny-Q8_0.gguf")
    rc = hfcache.RepoCache(hf_env, REPO)
    rc.partial(file.oid).parent.mkdir(parents=True)
    rc.partial(file.oid).write_bytes(b"z" * 10)
    rc.lock(file.oid).parent.mkdir(parents=True)
    # a lock taken the way huggingface_hub takes it, from another process
    code = f"import filelock, time; lock = filelock.FileLock({str(rc.lock(file.oid))!r}); lock.acquire(); time.sleep(5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 5
        while not Library().partials()[0].active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Library().partials()[0].active
        assert Library().clean_partials() == 0 and rc.partial(file.oid).exists()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_damaged_usage_entries_and_folders_that_cannot_be_paths_are_left_out(tmp_path: Path, hf_env: Path) -> None:
    """One bad line (a null where a time goes, a folder with a NUL byte or ~nosuchuser) loses only itself."""
    import json

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "good.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    usage = tmp_path / "model-usage.json"
    usage.write_text(
        json.dumps(
            {str(folder / "good.gguf"): 1700000000.0, "/x.gguf": None, "/y.gguf": "soon", "/z.gguf": float("inf")}
        )
    )
    library = Library([folder, "bad\0folder", "~nosuchuser-llmtui/models"], usage_file=usage)
    assert library.folders == [folder]
    models = library.models(inspect=False)
    assert [m.path.name for m in models if m.path.parent == folder] == ["good.gguf"]
    assert library._usage() == {str(folder / "good.gguf"): 1700000000.0}
    library.mark_used(folder / "good.gguf", when=1.0)  # rewrites the file without raising
    assert library.find("bad\0name") == []
