"""Documents (app/core/documents): reading bounded, .gitignore, chunks along the structure, the index (BM25,
embeddings, reciprocal-rank fusion, freshness, 0600 files), the numbered prompt and its [n] markers; hostile folders
as reproducers. Embeddings here are a deterministic bag of hashed words, so recall measures the fusion, not a model."""

from __future__ import annotations

import json
import os
import stat
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from app.core.documents import index as index_module
from app.core.documents import reading
from app.core.documents.chunks import MAX_CHARS, chunk_text
from app.core.documents.gitignore import ignored, parse_rules
from app.core.documents.index import DocumentIndex, Embedding, list_indexes, remove_index
from app.core.documents.reading import ReadReport, html_text, read_source
from app.core.documents.retrieval import INSTRUCTION, Reranker, ask_documents, cited_numbers, numbered_sources

CORPUS = Path(__file__).parents[1] / "fixtures" / "documents"
QUESTIONS: list[tuple[str, str]] = [tuple(q) for q in json.loads((CORPUS / "questions.json").read_text())]


def hashed_words(texts: Sequence[str]) -> list[list[float]]:
    """A stand-in embedding model: each word hashed into 256 buckets (stems by their first five letters)."""
    out = []
    for text in texts:
        v = np.zeros(256, dtype=np.float32)
        for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
            if len(word) > 3:
                v[zlib.crc32(word[:5].encode()) % 256] += 1.0
        out.append(list(v))
    return out


EMBEDDING = Embedding("hashed-words", hashed_words)


def recall_at_5(index: DocumentIndex, embedding: Embedding | None, *, vectors_only: bool = False) -> float:
    found = 0
    for question, answer in QUESTIONS:
        if vectors_only:
            assert embedding is not None
            ids = index.nearest(embedding.embed([question])[0], 5)
            files = [
                index.db.execute(
                    "SELECT f.path FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id = ?", (i,)
                ).fetchone()[0]
                for i in ids
            ]
        else:
            files = [hit.file for hit in index.search(question, 5, embedding)]
        found += any(f.endswith(answer) for f in files)
    return found / len(QUESTIONS)


def test_recall_at_5_on_the_fixture_corpus_for_bm25_embeddings_and_both(tmp_path: Path) -> None:
    index = DocumentIndex(CORPUS / "notes", tmp_path)
    report = index.refresh(EMBEDDING)
    assert report.changed == 11 and report.embedded == index.counts()[1] > 11
    assert recall_at_5(index, None) == 1.0
    assert recall_at_5(index, EMBEDDING, vectors_only=True) >= 0.8
    assert recall_at_5(index, EMBEDDING) == 1.0
    hit = index.search("Which room is the quarterly planning meeting in?", 1)[0]
    assert hit.file.endswith("meeting.html") and "Atlas room" in hit.text and "tracking" not in hit.text
    index.close()


def test_an_index_is_owner_only_listed_and_removed(tmp_path: Path) -> None:
    folder = tmp_path / "indexes"
    index = DocumentIndex(CORPUS / "notes", folder)
    index.refresh()
    index.close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(index.path.stat().st_mode) == 0o600
    [entry] = list_indexes(folder)
    assert entry.source == str((CORPUS / "notes").absolute()) and entry.files == 11 and entry.chunks >= 11
    assert remove_index(CORPUS / "notes", folder) and not list_indexes(folder)


def test_docs_lists_a_damaged_index_and_clear_removes_it(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import build_parser
    from app.cli.docs import cmd_docs

    index = DocumentIndex(CORPUS / "notes")
    index.refresh()
    index.close()
    damaged = index_module.index_folder() / "0123456789abcdef01234567.sqlite"
    damaged.write_bytes(b"not a database" * 100)
    assert cmd_docs(build_parser().parse_args(["docs", "list", "--json"])) == 0
    rows = json.loads(capsys.readouterr().out)["indexes"]
    assert [(r["source"], r["damaged"]) for r in rows] == [(None, True), (str((CORPUS / "notes").absolute()), False)]
    assert cmd_docs(build_parser().parse_args(["docs", "list"])) == 0
    assert "0123456789abcdef01234567.sqlite: damaged (llmtui docs clear removes it)" in capsys.readouterr().out
    assert cmd_docs(build_parser().parse_args(["docs", "clear"])) == 0
    assert capsys.readouterr().out.startswith("removed 2 index(es)") and not damaged.exists()
    assert not list(index_module.index_folder().glob("*.sqlite"))


def test_a_file_changed_since_indexing_is_read_again_and_a_removed_one_dropped(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# Parking\n\nThe car park closes at 22:00.\n")
    (notes / "b.md").write_text("# Lunch\n\nThe canteen serves soup on Fridays.\n")
    first = ask_documents([notes], "When does the car park close?", index_folder=tmp_path / "ix")
    assert first.citations[0].file.endswith("a.md") and "22:00" in first.message
    (notes / "a.md").write_text("# Parking\n\nThe car park now closes at 23:30, and opens at six.\n")
    os.utime(notes / "a.md", ns=(time.time_ns(), time.time_ns() + 10**9))
    (notes / "b.md").unlink()
    index = DocumentIndex(notes, tmp_path / "ix")
    report = index.refresh()
    assert (report.changed, report.removed) == (1, 1) and index.counts()[0] == 1
    index.close()
    second = ask_documents([notes], "When does the car park close?", index_folder=tmp_path / "ix")
    assert "23:30" in second.message and "22:00" not in second.message
    assert first.notes[0].endswith(
        "read 2 files (0 KB); 2 new or changed; searched with BM25 only (no embedding model)"
    )
    (notes / "c.md").write_text("# Bikes\n\nThe bike shed is behind the canteen.\n")
    (notes / "a.md").unlink()
    third = ask_documents([notes], "Where is the bike shed?", index_folder=tmp_path / "ix")
    assert "; 1 new or changed, 1 gone; searched with" in third.notes[0]


def test_the_prompt_numbers_the_sources_within_the_budget_and_markers_map_back(tmp_path: Path) -> None:
    retrieval = ask_documents([CORPUS / "notes"], "How do I roll back a release?", index_folder=tmp_path)
    assert retrieval.message.startswith("Sources:\n\n[1] ") and INSTRUCTION in retrieval.message
    assert retrieval.message.endswith("Question: How do I roll back a release?")
    first = retrieval.citations[0]
    assert first.n == 1 and first.file.endswith("work/deploy.md") and (first.start_line, first.end_line) == (1, 10)
    assert first.to_dict(cited=True) == {
        "n": 1,
        "file": first.file,
        "lines": [1, 10],
        "score": round(first.score, 6),
        "cited": True,
    }
    assert "BM25 only (no embedding model)" in retrieval.notes[0] and "read 11 files" in retrieval.notes[0]
    assert [c.n for c in retrieval.citations] == list(range(1, len(retrieval.citations) + 1))
    hits = DocumentIndex(CORPUS / "notes", tmp_path).search("release rollback migrations", 8)
    block, cited = numbered_sources(hits, budget_tokens=60)
    assert len(cited) < len(hits) and len(block.encode()) <= 60 * 3
    assert cited_numbers("It runs [2], then [1, 3]; see [2] and [9] and [x].", 3) == [2, 1, 3]
    nothing = ask_documents([CORPUS / "notes"], "?!", index_folder=tmp_path)
    assert nothing.citations == () and nothing.message == "?!" and "no passage" in nothing.notes[-1]


def test_chunks_follow_headings_code_blocks_and_paragraphs_with_their_lines() -> None:
    text = "# Title\n\nIntro line.\n\n## Setup\n\n```sh\nmake\n\nmake install\n```\n\nAfter.\n\n## Use\n\nRun it.\n"
    chunks = chunk_text(text)
    assert [(c.heading, c.start_line, c.end_line) for c in chunks] == [
        ("Title", 1, 3),
        ("Title > Setup", 5, 13),
        ("Title > Use", 15, 17),
    ]
    assert "```sh\nmake\n\nmake install\n```" in chunks[1].text
    long = chunk_text("x" * (MAX_CHARS * 2 + 5))
    assert [len(c.text) for c in long] == [MAX_CHARS, MAX_CHARS, 5] and all(c.start_line == 1 for c in long)


def test_gitignore_rules_as_git_reads_them() -> None:
    rules = parse_rules("*.log\n!keep.log\nbuild/\n/only-root.md\ndocs/**/secret.md\n# c\n\n", "")
    rules += parse_rules("local.txt\n", "sub")
    assert ignored(rules, "a.log", False) and ignored(rules, "sub/b.log", False)
    assert not ignored(rules, "keep.log", False)
    assert ignored(rules, "build", True) and not ignored(rules, "build", False)
    assert ignored(rules, "only-root.md", False) and not ignored(rules, "sub/only-root.md", False)
    assert ignored(rules, "docs/a/b/secret.md", False) and ignored(rules, "docs/secret.md", False)
    assert ignored(rules, "sub/local.txt", False) and not ignored(rules, "local.txt", False)


def test_html_is_read_as_its_text() -> None:
    text = html_text("<h2>T</h2><p>One &amp; two</p><style>x{}</style><script>evil()</script><p>three</p>")
    assert text == "## T\n\nOne & two\n\nthree"


# ----- hostile folders: reproducers -----------------------------------------------------------------------------


def test_a_hostile_folder_is_read_bounded_and_every_skip_said_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "hostile"
    (root / "deep").mkdir(parents=True)
    (root / "ok.md").write_text("# Fine\n\nThe answer is 42.\n")
    with (root / "huge.txt").open("wb") as f:
        f.truncate(5 << 30)  # 5 GiB, sparse: never read
    (root / "binary.txt").write_bytes(b"PK\x03\x04\x00\x00" + os.urandom(2000))
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "paper.pdf").write_bytes(b"%PDF-1.7\n")
    os.mkfifo(root / "fifo.txt")
    (root / "loop.md").symlink_to("loop.md")
    (root / "deep" / "up").symlink_to("..")
    outside = tmp_path / "outside"
    (outside / "keys").mkdir(parents=True)
    (outside / "id_rsa").write_text("PRIVATE KEY")
    (outside / "keys" / "more").write_text("PRIVATE KEY")
    (root / "id_rsa.txt").symlink_to(outside / "id_rsa")  # a repository's link out: not read
    (root / "ssh").symlink_to(outside / "keys")
    (root / "inside.md").symlink_to("ok.md")  # a link within the folder: read
    (root / ".gitignore").write_text("ignored/\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "secret.md").write_text("not to be read")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main")
    t0 = time.monotonic()
    documents, report = read_source(root)
    assert time.monotonic() - t0 < 10
    assert [d.path.name for d in documents] == ["inside.md", "ok.md"]
    assert all("PRIVATE" not in d.text for d in documents)
    assert report.skipped == {
        "link out of the folder": 2,
        "over 2 MiB": 1,
        "binary": 2,
        "PDF (no PDF reader is installed)": 1,
        "FIFO": 1,
        "symlink loop": 2,
    }
    line = report.summary()
    assert "\n" not in line and line.startswith("read 2 files (0 KB); skipped ")


def test_many_files_stop_at_the_limit_and_the_total_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(300):
        (root / f"n{i:04}.txt").write_text(f"note {i}\n")
    monkeypatch.setattr(reading, "MAX_FILES", 250)
    documents, report = read_source(root)
    assert len(documents) == 250 and report.skipped == {"files past the first 250": 50}
    assert report.summary().endswith("; skipped 50 files past the first 250")
    monkeypatch.setattr(index_module, "MAX_FILES", 100)
    index = DocumentIndex(root, tmp_path / "ix")
    refresh = index.refresh()
    assert refresh.changed == 100 and refresh.read.skipped == {"files past the first 100": 200}
    index.close()
    report = ReadReport()
    assert reading.read_document(root / "n0000.txt", report, budget=5) is None
    assert report.skipped == {"past the 64 MiB total": 1}


def test_a_reranker_orders_the_fused_passages_and_its_scores_are_cited(tmp_path: Path) -> None:
    def prefers_packing(question: str, texts: Sequence[str]) -> list[float]:
        return [0.9 if "Passport" in text else 0.1 / (i + 1) for i, text in enumerate(texts)]

    plain = ask_documents([CORPUS / "notes"], "How do I roll back a release?", index_folder=tmp_path)
    ranked = ask_documents(
        [CORPUS / "notes"],
        "How do I roll back a release?",
        index_folder=tmp_path,
        reranker=Reranker("prefers-packing", prefers_packing),
    )
    assert not plain.citations[0].file.endswith("packing.md") and any(
        c.file.endswith("packing.md") for c in plain.citations
    )
    assert ranked.citations[0].file.endswith("travel/packing.md") and ranked.citations[0].score == 0.9
    assert [c.score for c in ranked.citations] == sorted((c.score for c in ranked.citations), reverse=True)
    assert ranked.notes[-1] == "reranked with prefers-packing"


def test_a_damaged_index_is_made_again_from_the_source(tmp_path: Path) -> None:
    index = DocumentIndex(CORPUS / "notes", tmp_path)
    index.refresh()
    index.close()
    index.path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    again = DocumentIndex(CORPUS / "notes", tmp_path)
    assert again.refresh().changed == 11 and again.search("rail pass", 1)[0].file.endswith("budget.csv")
    again.close()
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o600


@pytest.mark.slow
def test_a_folder_of_100000_files_is_cut_at_the_limits_in_bounded_time(tmp_path: Path) -> None:
    root = tmp_path / "hundred-thousand"
    for folder in range(100):
        sub = root / f"d{folder:03}"
        sub.mkdir(parents=True)
        for i in range(1000):
            (sub / f"n{i:04}.txt").write_bytes(b"x\n")
    t0 = time.monotonic()
    documents, report = read_source(root)
    assert time.monotonic() - t0 < 120
    assert len(documents) == reading.MAX_FILES and report.skipped == {
        f"files past the first {reading.MAX_FILES}": 80_000
    }
    assert report.summary() == f"read {reading.MAX_FILES} files (39 KB); skipped 80000 files past the first 20000"
