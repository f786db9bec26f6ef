"""Documents' figures (issue 48): indexing speed (files/s, MB/s, from an empty index in a temporary folder), query
latency p50/p99 (BM25, and hybrid: BM25 + embeddings fused by reciprocal rank), the embedding engine's speed
(tokens/s), and recall@5 (the answer's file among the first five chunks) on two sets of questions whose answer
lives in one file: the fixture notes (tests/fixtures/documents/questions.json, 20 questions) and the project's own
code (project_questions.json, 50 questions about app/, engine_ext/, models_catalog/, answered by a module).

Embeddings come from --embed-model (an embedding GGUF, run by llmtui's engine in a worker process); without it, the
tiny random-weight embedder of tests/tiny_models.py: its timings are real, its recall is chance (no meaning).
llama.cpp's `llama-embedding` is not built here (the engine is llama-cpp-python's library), so no side-by-side.

    python scripts/bench_documents.py                          # tiny embedder: latency and BM25 recall
    python scripts/bench_documents.py --embed-model bge-small-en-v1.5-q8_0.gguf --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.documents.index import DocumentIndex, Embedding, Hit  # noqa: E402
from engine_ext.client import EngineClient  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "documents"
CODE = [ROOT / "app", ROOT / "engine_ext", ROOT / "models_catalog"]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def search(indexes: Sequence[DocumentIndex], question: str, embedding: Embedding | None, k: int = 5) -> list[Hit]:
    hits = [hit for index in indexes for hit in index.search(question, k, embedding)]
    return sorted(hits, key=lambda h: -h.score)[:k]


def recall(indexes: Sequence[DocumentIndex], questions: list[list[str]], embedding: Embedding | None) -> float:
    found = sum(
        any(hit.file.endswith(answer) for hit in search(indexes, question, embedding)) for question, answer in questions
    )
    return found / len(questions)


def vector_recall(indexes: Sequence[DocumentIndex], questions: list[list[str]], embedding: Embedding) -> float:
    """recall@5 of the embeddings alone (the nearest chunks, no BM25)."""
    found = 0
    for question, answer in questions:
        vector = embedding.embed([question])[0]
        files = []
        for index in indexes:
            for chunk_id in index.nearest(vector, 5):
                row = index.db.execute(
                    "SELECT f.path FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id = ?", (chunk_id,)
                ).fetchone()
                files.append(str(row[0]))
        found += any(f.endswith(answer) for f in files[: 5 * len(indexes)])
    return found / len(questions)


def latencies(indexes: Sequence[DocumentIndex], questions: list[list[str]], embedding: Embedding | None) -> list[float]:
    times = []
    for question, _ in questions:
        t0 = time.perf_counter()
        search(indexes, question, embedding)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(
    sources: Sequence[Path], questions: list[list[str]], embedding: Embedding | None, folder: Path
) -> dict[str, Any]:
    """Index `sources` from nothing, then search them: `embedding` None measures BM25 alone."""
    indexes = [DocumentIndex(source, folder) for source in sources]
    t0 = time.perf_counter()
    reports = [index.refresh() for index in indexes]
    seconds = time.perf_counter() - t0
    files = sum(r.read.files for r in reports)
    size = sum(r.read.bytes for r in reports)
    searches = questions * 3
    bm25 = latencies(indexes, searches, None)
    out: dict[str, Any] = {
        "files": files,
        "mb": round(size / 1e6, 2),
        "chunks": sum(index.counts()[1] for index in indexes),
        "files_per_s": round(files / seconds, 1),
        "mb_per_s": round(size / 1e6 / seconds, 2),
        "bm25_p50_ms": round(percentile(bm25, 0.5), 2),
        "bm25_p99_ms": round(percentile(bm25, 0.99), 2),
        "recall5_bm25": round(recall(indexes, questions, None), 3),
        "questions": len(questions),
    }
    if embedding is not None:
        t0 = time.perf_counter()
        embedded = sum(index.refresh(embedding).embedded for index in indexes)
        out["embed_chunks_per_s"] = round(embedded / (time.perf_counter() - t0), 1)
        hybrid = latencies(indexes, searches, embedding)
        out["hybrid_p50_ms"] = round(percentile(hybrid, 0.5), 2)
        out["hybrid_p99_ms"] = round(percentile(hybrid, 0.99), 2)
        out["recall5_hybrid"] = round(recall(indexes, questions, embedding), 3)
        out["recall5_embeddings"] = round(vector_recall(indexes, questions, embedding), 3)
    for index in indexes:
        index.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embed-model", default=None, help="an embedding GGUF (default: the tiny random embedder)")
    parser.add_argument(
        "--embed-code", action="store_true", help="embed the code corpus too (slow on a CPU: some 5,000 chunks)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.embed_model:
            model = Path(args.embed_model)
        else:
            from tests.tiny_models import write_tiny_embedder

            model = write_tiny_embedder(folder / "tiny-embedder.gguf")
        with EngineClient(folder / "engine.log") as engine:
            engine.start()
            engine.load(model)
            tokens = [0]
            busy = [0.0]

            def embed(texts: Sequence[str]) -> list[tuple[float, ...]]:
                t0 = time.perf_counter()
                done = engine.embed(texts)
                busy[0] += time.perf_counter() - t0
                tokens[0] += done.n_tokens
                return list(done.vectors)

            embedding = Embedding(model.name, embed)
            notes_questions = json.loads((FIXTURES / "questions.json").read_text())
            code_questions = json.loads((FIXTURES / "project_questions.json").read_text())
            results = {
                "embed_model": model.name,
                "notes": measure([FIXTURES / "notes"], notes_questions, embedding, folder / "ix-notes"),
                "code": measure(CODE, code_questions, embedding if args.embed_code else None, folder / "ix-code"),
                "embed_tokens_per_s": round(tokens[0] / busy[0], 1) if busy[0] else 0.0,
            }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"embedding model: {results['embed_model']} · {results['embed_tokens_per_s']} tokens/s embedded")
    notes, code = results["notes"], results["code"]
    print(f"{'':22} {'notes':>10} {'code':>10}")
    for key in notes:
        print(f"{key:22} {notes[key]!s:>10} {code.get(key, '-')!s:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
