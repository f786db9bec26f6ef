"""A question asked of documents: each source's index brought up to date, the best chunks of all of them numbered
into the user's message within a token budget, and the reply's `[n]` markers mapped back to their file and lines.
The same for `run --doc`, `chat --doc` and the app's attached files."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the index (SQLite, numpy) is imported when a question is asked, not with the app
    from app.core.documents.index import Embedding, Hit

DEFAULT_BUDGET_TOKENS = 2048  # of the prompt, the sources may take this many (estimated: BYTES_PER_TOKEN)
BYTES_PER_TOKEN = 3  # a low estimate of UTF-8 bytes per token (English runs about 4): the budget is rarely passed
TOP_K = 8  # chunks looked at per question (fewer when the budget is spent)
RERANK_CANDIDATES = 16  # of the fused ranking, the chunks a reranker orders
INSTRUCTION = (
    "Answer the question from the numbered sources above when they hold the answer, and cite each source you use "
    "by its number in brackets, like [1]. If they do not hold it, say so."
)
MAX_KEPT_CHARS = 20_000  # of a chunk kept with a reply in the history
_MARKER = re.compile(r"\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]")


@dataclass(frozen=True)
class Citation:
    n: int
    file: str  # as shown: relative to the working folder when under it
    start_line: int
    end_line: int
    score: float
    heading: str
    text: str

    @property
    def where(self) -> str:
        lines = str(self.start_line) if self.start_line == self.end_line else f"{self.start_line}-{self.end_line}"
        return f"{self.file}:{lines}"

    def to_dict(self, cited: bool, *, with_text: bool = False) -> dict[str, object]:
        """`run --json`'s citation (file, lines, score, whether the reply cites it); with the chunk for the history."""
        out: dict[str, object] = {
            "n": self.n,
            "file": self.file,
            "lines": [self.start_line, self.end_line],
            "score": round(self.score, 6),
            "cited": cited,
        }
        if with_text:
            out.update(heading=self.heading, text=self.text)
        return out

    @staticmethod
    def from_dict(data: object) -> tuple[Citation, bool] | None:
        """A citation kept in the history (a reply's stats, an import: checked, not trusted), and whether it was
        cited; None when it is not one."""
        if not isinstance(data, dict):
            return None
        n, file, lines, score = data.get("n"), data.get("file"), data.get("lines"), data.get("score", 0.0)
        heading, text = data.get("heading", ""), data.get("text", "")
        if not (
            isinstance(n, int)
            and isinstance(file, str)
            and isinstance(lines, list)
            and len(lines) == 2
            and all(isinstance(x, int) for x in lines)
            and isinstance(score, int | float)
            and isinstance(heading, str)
            and isinstance(text, str)
        ):
            return None
        citation = Citation(n, file[:4096], lines[0], lines[1], float(score), heading[:1000], text[:MAX_KEPT_CHARS])
        return citation, bool(data.get("cited", False))


@dataclass(frozen=True)
class Retrieval:
    message: str  # the user's message with the sources numbered above it
    citations: tuple[Citation, ...]
    notes: tuple[str, ...]  # one line per source: what was read and skipped, and how it was searched


def shown_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def estimated_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8", errors="replace")) // BYTES_PER_TOKEN)


def numbered_sources(hits: Sequence[Hit], budget_tokens: int) -> tuple[str, tuple[Citation, ...]]:
    """The hits, best first, as numbered sources within the budget (a hit that does not fit is left out)."""
    parts: list[str] = []
    citations: list[Citation] = []
    spent = 0
    for hit in hits:
        citation = Citation(
            len(citations) + 1, shown_path(hit.file), hit.start_line, hit.end_line, hit.score, hit.heading, hit.text
        )
        part = f"[{citation.n}] {citation.where}\n{hit.text}"
        cost = estimated_tokens(part)
        if spent + cost > budget_tokens:
            continue
        spent += cost
        parts.append(part)
        citations.append(citation)
    return "\n\n".join(parts), tuple(citations)


def ask_documents(
    sources: Sequence[Path],
    question: str,
    *,
    embedding: Embedding | None = None,
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
    index_folder: Path | None = None,
    earlier: str = "",
    reranker: Reranker | None = None,
) -> Retrieval:
    """Refresh each source's index, search them all, and number the best chunks into the user's message. `earlier`
    (the conversation's previous question) is searched with it, so that a follow-up finds what it refers to; a
    `reranker` orders the best RERANK_CANDIDATES by its relevance scores (which the citations then carry)."""
    from app.core.documents.index import DocumentIndex

    query = f"{question}\n{earlier}" if earlier else question
    hits: list[Hit] = []
    notes: list[str] = []
    how = f"BM25 and embeddings ({embedding.name})" if embedding is not None else "BM25 only (no embedding model)"
    for source in sources:
        index = DocumentIndex(source, index_folder)
        try:
            report = index.refresh(embedding)
            hits += index.search(query, TOP_K, embedding)
        finally:
            index.close()
        fresh = [f"{report.changed} new or changed"] if report.changed else []
        fresh += [f"{report.removed} gone"] if report.removed else []
        since = "; " + ", ".join(fresh) if fresh else ""  # since the index was last brought up to date
        notes.append(f"{shown_path(str(source.absolute()))}: {report.read.summary()}{since}; searched with {how}")
    hits.sort(key=lambda h: -h.score)
    if reranker is not None and hits:
        hits = reranked(hits[:RERANK_CANDIDATES], question, reranker)
        notes.append(f"reranked with {reranker.name}")
    block, citations = numbered_sources(hits[:TOP_K], budget_tokens)
    if not citations:
        return Retrieval(question, (), (*notes, "no passage of the documents matched the question"))
    return Retrieval(f"Sources:\n\n{block}\n\n{INSTRUCTION}\n\nQuestion: {question}", citations, tuple(notes))


@dataclass(frozen=True)
class Reranker:
    """A reranker as retrieval sees it: its name and the call scoring documents against a question."""

    name: str
    score: Callable[[str, Sequence[str]], Sequence[float]]


def reranked(hits: Sequence[Hit], question: str, reranker: Reranker) -> list[Hit]:
    """`hits` ordered by the reranker's relevance of each passage to the question, best first, scored by it."""
    scores = reranker.score(question, [hit.text for hit in hits])
    rescored = [replace(hit, score=float(score)) for hit, score in zip(hits, scores, strict=True)]
    return sorted(rescored, key=lambda h: -h.score)


def cited_numbers(reply: str, count: int) -> list[int]:
    """The source numbers the reply's [n] (or [n, m]) markers name, in the order first named, within 1..count."""
    seen: dict[int, None] = {}
    for match in _MARKER.finditer(reply):
        for part in re.split(r"\s*[,;]\s*", match.group(1)):
            n = int(part)
            if 1 <= n <= count:
                seen.setdefault(n)
    return list(seen)


def citations_record(citations: Sequence[Citation], reply: str, *, with_text: bool = False) -> list[dict[str, object]]:
    """Every source given, numbered, with whether the reply's [n] markers cite it (`run --json`; with the chunks,
    a reply's stats in the history)."""
    cited = set(cited_numbers(reply, len(citations)))
    return [c.to_dict(c.n in cited, with_text=with_text) for c in citations]


def stored_citations(stats: Mapping[str, object]) -> list[tuple[Citation, bool]]:
    """The citations a reply's stats keep (none when absent or not citations)."""
    kept = stats.get("citations")
    if not isinstance(kept, list):
        return []
    return [c for c in (Citation.from_dict(item) for item in kept[: TOP_K * 4]) if c is not None]
