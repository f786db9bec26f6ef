"""`--doc PATH`, `--embed-model MODEL`, `--rerank-model MODEL` and `--doc-budget N` for `run` and `chat`: the files
and folders a question is asked of, searched and cited through app.core.documents; the embedding model and the
reranker each run in an engine of their own."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from app.cli.session import CliError
from app.cli.types import int_range
from app.core.documents.index import Embedding
from app.core.documents.retrieval import DEFAULT_BUDGET_TOKENS, Reranker, Retrieval, ask_documents, cited_numbers
from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.untrusted_text import one_line


def _doc_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{one_line(text, 200)}: no such file or folder")
    return path


def add_doc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--doc",
        action="append",
        default=[],
        type=_doc_path,
        metavar="PATH",
        help="a file or folder to answer from, citing file and lines (repeatable; folders recursively, .gitignore "
        "respected; indexed in the cache folder and read again when a file changes)",
    )
    p.add_argument(
        "--embed-model",
        default=None,
        metavar="MODEL",
        help="an embedding GGUF searching the documents with BM25 (reciprocal-rank fusion); without it, BM25 alone",
    )
    p.add_argument(
        "--rerank-model",
        default=None,
        metavar="MODEL",
        help="a reranker GGUF (rank pooling) ordering the best passages found, in an engine of its own",
    )
    p.add_argument(
        "--doc-budget",
        type=int_range(64, 1 << 20),
        default=DEFAULT_BUDGET_TOKENS,
        metavar="TOKENS",
        help=f"most tokens the sources take in the prompt (default {DEFAULT_BUDGET_TOKENS}, at most half the context)",
    )


class Documents:
    """The documents of one `run` or `chat`: their question's sources, and the embedding engine when one is asked
    for; `close()` stops it."""

    def __init__(self, args: argparse.Namespace, n_ctx: int) -> None:
        self.sources: list[Path] = list(args.doc)
        self.budget = min(args.doc_budget, max(64, n_ctx // 2))
        self.embedding: Embedding | None = None
        self.reranker: Reranker | None = None
        self._engines: list[EngineClient] = []
        if self.sources and args.embed_model:
            self._start_embedder(args.embed_model)
        if self.sources and args.rerank_model:
            self._start_reranker(args.rerank_model)

    def _engine_for(self, flag: str, name: str, *, rank: bool) -> tuple[Path, EngineClient]:
        """An engine of its own with the model `name` loaded: a reranker (`rank`) or an embedding model."""
        from app.cli.session import start_engine
        from app.core.model_paths import resolve_model
        from engine_ext.gguf import read_pooling_type

        path = resolve_model(name)
        if (read_pooling_type(path) == 4) != rank:
            what = "not a reranker (its pooling is not rank)" if rank else "a reranker (rank pooling), not an embedder"
            raise CliError(f"{flag} {path.name}: {what}")
        engine = start_engine()
        self._engines.append(engine)
        engine.load(path)
        return path, engine

    def _start_embedder(self, name: str) -> None:
        path, engine = self._engine_for("--embed-model", name, rank=False)

        def embed(texts: Sequence[str]) -> list[tuple[float, ...]]:
            try:
                return list(engine.embed(texts).vectors)
            except (EngineFailure, EngineCrashedError) as error:
                raise CliError(f"--embed-model {path.name}: {error}") from None

        self.embedding = Embedding(path.name, embed)

    def _start_reranker(self, name: str) -> None:
        path, engine = self._engine_for("--rerank-model", name, rank=True)

        def score(question: str, texts: Sequence[str]) -> list[float]:
            try:
                return [v[0] for v in engine.embed(texts, query=question).vectors]
            except (EngineFailure, EngineCrashedError) as error:
                raise CliError(f"--rerank-model {path.name}: {error}") from None

        self.reranker = Reranker(path.name, score)

    def close(self) -> None:
        while self._engines:
            self._engines.pop().close()

    def __enter__(self) -> Documents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, question: str, *, earlier: str = "", quiet: bool = False) -> Retrieval | None:
        """The question with its sources (None without --doc); what was read and skipped said on stderr. `earlier`:
        the previous question, searched with it."""
        if not self.sources:
            return None
        try:
            retrieval = self._ask(question, earlier)
        except (OSError, sqlite3.Error) as error:  # the cache folder cannot be written, the disk is full
            raise CliError(f"--doc: the documents' index could not be used: {one_line(str(error), 200)}") from None
        if not quiet:
            for note in retrieval.notes:
                print(f"docs: {note}", file=sys.stderr)
        return retrieval

    def _ask(self, question: str, earlier: str) -> Retrieval:
        return ask_documents(
            self.sources,
            question,
            embedding=self.embedding,
            budget_tokens=self.budget,
            earlier=earlier,
            reranker=self.reranker,
        )


def print_sources(retrieval: Retrieval, reply: str) -> None:
    """The sources under the reply (stderr): those it cites, else every one it was given."""
    cited = cited_numbers(reply, len(retrieval.citations))
    shown = [retrieval.citations[n - 1] for n in cited] or list(retrieval.citations)
    if not shown:
        return
    print("sources cited:" if cited else "sources given (the reply cites none):", file=sys.stderr)
    for c in shown:
        print(f"  [{c.n}] {one_line(c.where, 200)} (score {c.score:.4f})", file=sys.stderr)
