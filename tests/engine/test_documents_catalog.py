"""The catalog's embedding model and reranker, pulled by id from the local Hub like any entry, are what `run --doc`
then searches with (said on stderr), unless --embed-model none or config.toml's [documents] says otherwise; the
app's documents say the same in F12's notice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.documents.retrieval_models import find_document_model, search_notice
from tests.engine.test_cli import ROOT
from tests.hub_server import HubServer
from tests.tiny_models import write_tiny_embedder

NOTES = Path(__file__).parents[1] / "fixtures" / "documents" / "notes"
EMBED_REPO, EMBED_FILE = "ggml-org/embeddinggemma-300M-qat-q4_0-GGUF", "embeddinggemma-300M-qat-Q4_0.gguf"
RERANK_REPO, RERANK_FILE = "gpustack/bge-reranker-v2-m3-GGUF", "bge-reranker-v2-m3-FP16.gguf"


def llmtui(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMTUI_CACHE_DIR=str(tmp / "cache"), LLMTUI_RAM_BYTES=str(8 << 30), LLMTUI_VRAM_BYTES="0")
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def catalog_hub(hub_server: HubServer, tmp_path: Path) -> HubServer:
    hub_server.add_repo(EMBED_REPO, {EMBED_FILE: write_tiny_embedder(tmp_path / "e.gguf")})
    hub_server.add_repo(RERANK_REPO, {RERANK_FILE: write_tiny_embedder(tmp_path / "r.gguf", rerank=True)})
    return hub_server


def test_the_catalogs_embedding_model_and_reranker_are_pulled_by_id_and_then_used_by_run_doc(
    catalog_hub: HubServer, hf_env: Path, tmp_path: Path, tiny_models: dict[str, Path], app_dirs: tuple[Path, Path]
) -> None:
    question = ["-n", "2", "--temp", "0", "--json", "-p", "How do I roll back a release of the billing service?"]
    run = ["run", "-m", str(tiny_models["llama"]), *question, "--doc", str(NOTES)]
    before = llmtui(*run, tmp=tmp_path)
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["documents"][0].endswith("searched with BM25 only (no embedding model)")
    assert "docs: embedding model" not in before.stderr
    notice = search_notice(find_document_model("embed", ""), find_document_model("rerank", ""))
    assert notice == "BM25 search: embedding model none on disk; `llmtui models pull embeddinggemma-300m` fetches one"

    listed = llmtui("models", "search", "--catalog", "embeddinggemma", tmp=tmp_path)
    assert "embedding model, for --doc" in listed.stdout and EMBED_REPO in listed.stdout
    for catalog_id, name in (("embeddinggemma-300m", EMBED_FILE), ("bge-reranker-v2-m3", RERANK_FILE)):
        pulled = llmtui("models", "pull", catalog_id, "--json", tmp=tmp_path)
        assert pulled.returncode == 0, pulled.stderr
        assert Path(json.loads(pulled.stdout)["model_path"]).name == name

    after = llmtui(*run, tmp=tmp_path)
    assert after.returncode == 0, after.stderr
    notes = json.loads(after.stdout)["documents"]
    assert notes[0].endswith(f"searched with BM25 and embeddings ({EMBED_FILE})") and notes[-1] == (
        f"reranked with {RERANK_FILE}"
    )
    assert (
        f"docs: embedding model: {EMBED_FILE} (the catalog's embeddinggemma-300m; --embed-model none: without it)"
    ) in after.stderr
    notice = search_notice(find_document_model("embed", ""), find_document_model("rerank", ""))
    assert notice == f"hybrid search: BM25 and embeddings from {EMBED_FILE}, reranked with {RERANK_FILE}"

    off = llmtui(*run, "--embed-model", "none", "--rerank-model", "none", tmp=tmp_path)
    assert off.returncode == 0, off.stderr
    [bm25_only] = json.loads(off.stdout)["documents"]  # no "reranked with" line either
    assert bm25_only.endswith("; searched with BM25 only (no embedding model)")

    config_dir, _ = app_dirs
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.toml").write_text('[documents]\nembed_model = "none"\nrerank_model = "nope/Missing-GGUF"\n')
    configured = llmtui(*run, tmp=tmp_path)
    assert configured.returncode == 0, configured.stderr
    assert json.loads(configured.stdout)["documents"] == [bm25_only]
    assert "docs: reranker not used: [documents] rerank_model in config.toml: nope/Missing-GGUF" in configured.stderr


def test_run_and_chat_refuse_an_embedding_model_or_reranker_as_the_model_to_chat_with(tmp_path: Path) -> None:
    for name, what in (
        ("tiny-embedder.gguf", "an embedding model (its GGUF names a pooling)"),
        ("tiny-reranker.gguf", "a reranker (rank pooling)"),
    ):
        model = write_tiny_embedder(tmp_path / name, rerank="reranker" in name)
        for command in (["run", "-m", str(model), "-p", "hi", "-n", "2"], ["chat", "-m", str(model)]):
            refused = llmtui(*command, tmp=tmp_path)
            assert refused.returncode == 1, refused.stderr
            assert refused.stderr.startswith(f"llmtui: error: {name} is {what}, not a model to chat with")
            assert refused.stderr.count("\n") == 1 and "--embed-model" in refused.stderr
