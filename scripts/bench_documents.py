"""Documents' figures (issue 48): indexing speed (files/s, MB/s, from an empty index in a temporary folder), query
latency p50/p99 (BM25, and hybrid: BM25 + embeddings fused by reciprocal rank), the embedding engine's speed
(tokens/s), and recall@5 (the answer's file among the first five chunks) on two sets of questions whose answer
lives in one file: the fixture notes (tests/fixtures/documents/questions.json, 20 questions) and the project's own
code (project_questions.json, 50 questions about app/, engine_ext/, models_catalog/, answered by a module).

Embeddings come from --embed-model (an embedding GGUF, run by llmtui's engine in a worker process); without it, the
tiny random-weight embedder of tests/tiny_models.py: its timings are real, its recall is chance (no meaning).
`--llama-embedding BIN` times llama.cpp's `llama-embedding` (built from the engine's own llama.cpp source, e.g. its
examples/embedding/embedding.cpp compiled against the engine build's libraries) on the notes' chunks beside
llmtui's engine, in turns (three each), the same model, mean pooling, the engine's threads (one per core).

    python scripts/bench_documents.py                          # tiny embedder: latency and BM25 recall
    python scripts/bench_documents.py --embed-model bge-small-en-v1.5-q8_0.gguf --json
    python scripts/bench_documents.py --embed-model M.gguf --llama-embedding ./llama-embedding
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.documents.chunks import chunk_text  # noqa: E402
from app.core.documents.index import EMBED_CHARS, DocumentIndex, Embedding, Hit  # noqa: E402
from engine_ext.client import EngineClient  # noqa: E402
from engine_ext.cpu import default_threads  # noqa: E402

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


def side_by_side(engine: EngineClient, model: Path, binary: str, folder: Path) -> dict[str, Any]:
    """Tokens/s embedding the notes' chunks (one line each): llmtui's engine and `llama-embedding`, in turns; the
    latter timed from its first batch_decode (its own log's clock) to its exit, so without its load."""
    texts = [
        (f"{c.heading}\n{c.text}" if c.heading else c.text)[:EMBED_CHARS].replace("\n", " ")
        for path in sorted((FIXTURES / "notes").rglob("*"))
        if path.is_file()
        for c in chunk_text(path.read_text(encoding="utf-8"))
    ]
    prompt = folder / "texts.txt"
    prompt.write_text("<#sep#>".join(texts), encoding="utf-8")
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(3):
        t0 = time.perf_counter()
        n_tokens = engine.embed(texts).n_tokens
        ours.append(n_tokens / (time.perf_counter() - t0))
        argv = [binary, "-m", str(model), "-f", str(prompt), "--embd-separator", "<#sep#>", "--pooling", "mean"]
        argv += ["-t", str(default_threads()), "-c", "2048", "-b", "512", "-ub", "512", "--embd-output-format", "json"]
        t0 = time.perf_counter()
        done = subprocess.run([*argv, "--log-timestamps"], capture_output=True, text=True, timeout=900, check=True)
        wall = time.perf_counter() - t0
        found = re.search(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I batch_decode", done.stderr, re.M)
        assert found, "llama-embedding logged no batch_decode"
        minutes, seconds, ms, us = (int(x) for x in found.groups())
        theirs.append(n_tokens / (wall - (minutes * 60 + seconds + ms / 1e3 + us / 1e6)))
    return {
        "texts": len(texts),
        "tokens": n_tokens,
        "llmtui_tokens_per_s": round(statistics.median(ours), 1),
        "llama_embedding_tokens_per_s": round(statistics.median(theirs), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embed-model", default=None, help="an embedding GGUF (default: the tiny random embedder)")
    parser.add_argument(
        "--embed-code", action="store_true", help="embed the code corpus too (slow on a CPU: some 5,000 chunks)"
    )
    parser.add_argument("--llama-embedding", default=None, metavar="BIN", help="time llama.cpp's llama-embedding too")
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
            if args.llama_embedding:
                results["side_by_side"] = side_by_side(engine, model, args.llama_embedding, folder)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"embedding model: {results['embed_model']} · {results['embed_tokens_per_s']} tokens/s embedded")
    if "side_by_side" in results:
        both = results["side_by_side"]
        print(f"the notes' {both['texts']} chunks ({both['tokens']} tokens), median of 3 in turns:")
        print(
            f"  llmtui {both['llmtui_tokens_per_s']} tokens/s, llama-embedding {both['llama_embedding_tokens_per_s']}"
        )
    notes, code = results["notes"], results["code"]
    print(f"{'':22} {'notes':>10} {'code':>10}")
    for key in notes:
        print(f"{key:22} {notes[key]!s:>10} {code.get(key, '-')!s:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
