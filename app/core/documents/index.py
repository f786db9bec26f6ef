"""One index per source (a file or a folder) in the cache folder (`documents/`, 0600 files in a 0700 folder): SQLite
with the chunks, an FTS5 table searched by BM25, and each chunk's embedding when an embedding model is given; a
search fuses both rankings by reciprocal rank. `refresh` runs before each question: a file whose size or time
changed is read and cut again, a file gone is dropped, and chunks without an embedding of the current model get
one."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.core import paths
from app.core.documents.chunks import chunk_text
from app.core.documents.reading import (
    MAX_FILES,
    MAX_TOTAL_BYTES,
    ReadReport,
    read_document,
    skip_the_rest,
    source_files,
)
from engine_ext.private_files import private_dir, private_file

RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al.)
CANDIDATES = 50  # of each ranking, fused
EMBED_BATCH = 32  # chunks per embedding request
EMBED_CHARS = 1500  # of a chunk, embedded (heading first): within a 512-token embedding model
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, mtime_ns INTEGER, size INTEGER);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL, start_line INTEGER, end_line INTEGER, heading TEXT, text TEXT,
    embedding BLOB);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, heading, tokenize='porter unicode61');
"""
_WORD = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_TERMS = 64


@dataclass(frozen=True)
class Embedding:
    """An embedding model as the index sees it: its name (a change re-embeds every chunk) and the call."""

    name: str
    embed: Callable[[Sequence[str]], Sequence[Sequence[float]]]


@dataclass(frozen=True)
class Hit:
    file: str
    start_line: int
    end_line: int
    heading: str
    text: str
    score: float  # the fused reciprocal-rank score (higher is better)
    bm25_rank: int | None = None  # 1-based place in each ranking (None: not among its candidates)
    vector_rank: int | None = None


@dataclass
class RefreshReport:
    read: ReadReport = field(default_factory=ReadReport)
    changed: int = 0  # files read again (new or changed)
    removed: int = 0
    embedded: int = 0  # chunks embedded now
    seconds: float = 0.0


def index_folder() -> Path:
    return paths.cache_dir() / "documents"


def index_path(source: Path, folder: Path | None = None) -> Path:
    key = hashlib.sha256(str(source.absolute()).encode()).hexdigest()[:24]
    return (folder or index_folder()) / f"{key}.sqlite"


def fts_query(question: str) -> str:
    """The question's words as an FTS5 query (any of them; quoted, so nothing in it is FTS5 syntax)."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(question)))[:MAX_QUERY_TERMS]
    return " OR ".join(f'"{w}"' for w in words)


class DocumentIndex:
    """The index of one source; `close()` closes its database (idempotent)."""

    def __init__(self, source: Path, folder: Path | None = None) -> None:
        self.source = source.absolute()
        self.path = index_path(self.source, folder)
        private_dir(self.path.parent)
        try:
            self.db = self._open()
        except sqlite3.DatabaseError:  # damaged (it is a cache): made again from the source
            self.path.unlink(missing_ok=True)
            self.db = self._open()
        self._vectors: tuple[np.ndarray, list[int]] | None = None

    def _open(self) -> sqlite3.Connection:
        private_file(self.path)
        db = sqlite3.connect(self.path, timeout=10)
        try:
            db.executescript(_SCHEMA)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('source', ?)", (str(self.source),))
            db.commit()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        self.db.close()

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    # ----- freshness ----------------------------------------------------------------------------------

    def refresh(self, embedding: Embedding | None = None) -> RefreshReport:
        """Bring the index up to the source: changed files read and cut again, gone ones dropped, embeddings made."""
        t0 = time.perf_counter()
        report = RefreshReport()
        known = {
            row[1]: (row[0], row[2], row[3]) for row in self.db.execute("SELECT id, path, mtime_ns, size FROM files")
        }
        seen: set[str] = set()
        total = 0
        files = source_files(self.source, report.read)
        for path in files:
            if len(seen) >= MAX_FILES:
                skip_the_rest(path, files, report.read, MAX_FILES)
                break
            key = str(path)
            try:
                st = path.stat()
            except OSError:
                st = None
            old = known.get(key)
            if st is not None and old is not None and (old[1], old[2]) == (st.st_mtime_ns, st.st_size):
                seen.add(key)
                total += st.st_size
                report.read.files += 1
                report.read.bytes += st.st_size
                continue
            document = read_document(path, report.read, MAX_TOTAL_BYTES - total)
            if document is None:
                continue
            seen.add(key)
            total += document.size
            self._store(key, old[0] if old else None, document.mtime_ns, document.size, document.text)
            report.changed += 1
        for key, (file_id, _, _) in known.items():
            if key not in seen:
                self._drop(file_id)
                report.removed += 1
        self.db.commit()
        if embedding is not None:
            report.embedded = self._embed_missing(embedding)
        if report.changed or report.removed or report.embedded:
            self._vectors = None
        report.seconds = time.perf_counter() - t0
        return report

    def _drop(self, file_id: int) -> None:
        ids = [row[0] for row in self.db.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
        self.db.executemany("DELETE FROM chunks_fts WHERE rowid = ?", ((i,) for i in ids))
        self.db.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
        self.db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    def _store(self, key: str, file_id: int | None, mtime_ns: int, size: int, text: str) -> None:
        if file_id is not None:
            self._drop(file_id)
        cursor = self.db.execute("INSERT INTO files(path, mtime_ns, size) VALUES (?, ?, ?)", (key, mtime_ns, size))
        new_id = cursor.lastrowid
        for chunk in chunk_text(text):
            row = self.db.execute(
                "INSERT INTO chunks(file_id, start_line, end_line, heading, text) VALUES (?, ?, ?, ?, ?)",
                (new_id, chunk.start_line, chunk.end_line, chunk.heading, chunk.text),
            ).lastrowid
            self.db.execute(
                "INSERT INTO chunks_fts(rowid, text, heading) VALUES (?, ?, ?)", (row, chunk.text, chunk.heading)
            )

    def _embed_missing(self, embedding: Embedding) -> int:
        if self._meta("embedding_model") != embedding.name:
            self.db.execute("UPDATE chunks SET embedding = NULL")
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('embedding_model', ?)", (embedding.name,))
            self.db.commit()
        rows = self.db.execute("SELECT id, heading, text FROM chunks WHERE embedding IS NULL ORDER BY id").fetchall()
        for start in range(0, len(rows), EMBED_BATCH):
            batch = rows[start : start + EMBED_BATCH]
            texts = [(f"{heading}\n{text}" if heading else text)[:EMBED_CHARS] for _, heading, text in batch]
            vectors = embedding.embed(texts)
            self.db.executemany(
                "UPDATE chunks SET embedding = ? WHERE id = ?",
                ((np.asarray(v, dtype=np.float32).tobytes(), row[0]) for v, row in zip(vectors, batch, strict=True)),
            )
            self.db.commit()
        return len(rows)

    # ----- search -------------------------------------------------------------------------------------

    def bm25(self, question: str, limit: int = CANDIDATES) -> list[int]:
        query = fts_query(question)
        if not query:
            return []
        rows = self.db.execute(
            "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts, 1.0, 2.0) LIMIT ?",
            (query, limit),
        )
        return [int(r[0]) for r in rows]

    def nearest(self, vector: Sequence[float], limit: int = CANDIDATES) -> list[int]:
        if self._vectors is None:
            rows = self.db.execute("SELECT id, embedding FROM chunks WHERE embedding IS NOT NULL").fetchall()
            matrix = np.array([np.frombuffer(blob, dtype=np.float32) for _, blob in rows], dtype=np.float32)
            self._vectors = (matrix.reshape(len(rows), -1), [int(r[0]) for r in rows])
        matrix, ids = self._vectors
        if not ids:
            return []
        query = np.asarray(vector, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(query) or 1.0)
        scores = matrix @ query / np.where(norms > 0, norms, 1.0)
        order = np.argsort(-scores)[:limit]
        return [ids[i] for i in order]

    def search(self, question: str, k: int = 5, embedding: Embedding | None = None) -> list[Hit]:
        """The k best chunks for `question`: BM25 and (with `embedding`) nearest embeddings, fused by reciprocal
        rank."""
        rankings = {"bm25": self.bm25(question)}
        if embedding is not None:
            rankings["vector"] = self.nearest(embedding.embed([question[:EMBED_CHARS]])[0])
        places: dict[int, dict[str, int]] = {}
        for name, ids in rankings.items():
            for place, chunk_id in enumerate(ids, 1):
                places.setdefault(chunk_id, {})[name] = place
        fused = sorted(places, key=lambda i: -sum(1.0 / (RRF_K + p) for p in places[i].values()))[:k]
        hits = []
        for chunk_id in fused:
            row = self.db.execute(
                "SELECT f.path, c.start_line, c.end_line, c.heading, c.text FROM chunks c JOIN files f "
                "ON f.id = c.file_id WHERE c.id = ?",
                (chunk_id,),
            ).fetchone()
            file, start, end, heading, text = row
            where = places[chunk_id]
            score = sum(1.0 / (RRF_K + p) for p in where.values())
            hits.append(Hit(file, start, end, heading, text, score, where.get("bm25"), where.get("vector")))
        return hits

    def counts(self) -> tuple[int, int]:
        files = self.db.execute("SELECT COUNT(*) FROM files").fetchone()[0]
        chunks = self.db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        return int(files), int(chunks)


@dataclass(frozen=True)
class IndexEntry:
    source: str  # "" for a damaged index (made again when its source is next asked about)
    path: Path
    files: int
    chunks: int
    size: int  # bytes on disk
    damaged: bool = False


def list_indexes(folder: Path | None = None) -> list[IndexEntry]:
    """Every document index in the cache folder, with its source and counts (one that cannot be read: damaged)."""
    entries = []
    for path in sorted((folder or index_folder()).glob("*.sqlite")):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
            try:
                source = db.execute("SELECT value FROM meta WHERE key = 'source'").fetchone()
                files = db.execute("SELECT COUNT(*) FROM files").fetchone()[0]
                chunks = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error:
            entries.append(IndexEntry("", path, 0, 0, size, damaged=True))
            continue
        entries.append(IndexEntry(source[0] if source else "", path, int(files), int(chunks), size, not source))
    return entries


def remove_index_file(path: Path) -> None:
    """An index's file (and its journal) removed."""
    for extra in (path, path.with_name(path.name + "-journal")):
        extra.unlink(missing_ok=True)


def remove_index(source: Path, folder: Path | None = None) -> bool:
    """Remove the index of `source`; whether there was one."""
    path = index_path(source, folder)
    existed = path.exists()
    remove_index_file(path)
    return existed
