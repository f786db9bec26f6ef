"""`run --doc` and `chat --doc` as a user runs them (a subprocess) on the tiny llama: the sources numbered into the
prompt, `run --json`'s citations, the tiny embedder searching with BM25, and the sources listed under a chat reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.engine.test_cli import ROOT
from tests.tiny_models import write_tiny_embedder

NOTES = Path(__file__).parents[1] / "fixtures" / "documents" / "notes"


def llmtui(*args: str, tmp: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp / "data"), LLMTUI_CONFIG_DIR=str(tmp / "config"))
    env["LLMTUI_CACHE_DIR"] = str(tmp / "cache")
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_doc_json_cites_file_lines_and_score_with_bm25_and_with_an_embedding_model(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    question = "How do I roll back a release of the billing service?"
    common = ["run", "-m", str(tiny_models["llama"]), "-n", "4", "--temp", "0", "--json", "-p", question]
    plain = llmtui(*common, "--doc", str(NOTES), tmp=tmp_path)
    assert plain.returncode == 0, plain.stderr
    citations = json.loads(plain.stdout)["citations"]
    assert citations[0]["file"].endswith("work/deploy.md") and citations[0]["lines"] == [1, 10]
    assert [c["n"] for c in citations] == list(range(1, len(citations) + 1))
    assert all(set(c) == {"n", "file", "lines", "score", "cited"} and c["score"] > 0 for c in citations)
    index_files = list((tmp_path / "cache" / "documents").glob("*.sqlite"))
    assert len(index_files) == 1 and index_files[0].stat().st_mode & 0o777 == 0o600

    embedder = write_tiny_embedder(tmp_path / "tiny-embedder.gguf")
    hybrid = llmtui(*common, "--doc", str(NOTES), "--embed-model", str(embedder), "--doc-budget", "300", tmp=tmp_path)
    assert hybrid.returncode == 0, hybrid.stderr
    fused, notes = json.loads(hybrid.stdout)["citations"], json.loads(hybrid.stdout)["documents"]
    assert any(c["file"].endswith("work/deploy.md") for c in fused) and len(fused) < len(citations)
    assert notes == [
        "tests/fixtures/documents/notes: read 11 files (2 KB); searched with BM25 and embeddings (tiny-embedder.gguf)"
    ]

    reranker = write_tiny_embedder(tmp_path / "tiny-reranker.gguf", rerank=True)
    ranked = llmtui(*common, "--doc", str(NOTES), "--rerank-model", str(reranker), tmp=tmp_path)
    assert ranked.returncode == 0, ranked.stderr
    scores = [c["score"] for c in json.loads(ranked.stdout)["citations"]]
    assert json.loads(ranked.stdout)["documents"][-1] == "reranked with tiny-reranker.gguf"
    assert scores == sorted(scores, reverse=True) and all(0 < x < 1 for x in scores)
    wrong = llmtui(*common, "--doc", str(NOTES), "--rerank-model", str(embedder), tmp=tmp_path)
    assert wrong.returncode == 1 and "not a reranker" in wrong.stderr and wrong.stderr.count("\n") == 1

    refused = llmtui(*common, "--doc", str(tmp_path / "missing"), tmp=tmp_path)
    assert refused.returncode == 2 and "no such file or folder" in refused.stderr

    listed = json.loads(llmtui("docs", "list", "--json", tmp=tmp_path).stdout)["indexes"]
    assert [(e["source"], e["files"]) for e in listed] == [(str(NOTES), 11)]
    removed = llmtui("docs", "rm", str(NOTES), tmp=tmp_path)
    assert removed.returncode == 0 and not list((tmp_path / "cache" / "documents").glob("*.sqlite"))
    again = llmtui("docs", "rm", str(NOTES), tmp=tmp_path)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "no index of" in again.stderr


def test_chat_doc_lists_the_sources_under_each_reply(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "parking.md").write_text("# Parking\n\nThe car park closes at 22:00.\n")
    args = ["chat", "-m", str(tiny_models["llama"]), "-n", "4", "--temp", "0", "--doc", str(notes)]
    done = llmtui(*args, tmp=tmp_path, stdin="When does the car park close?\nAnd on Sundays?\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("docs: ") == 2 and "read 1 file" in done.stderr
    assert done.stderr.count(f"[1] {notes / 'parking.md'}:1-3") == 2
