"""`--doc PATH`, `--embed-model MODEL`, `--rerank-model MODEL` and `--doc-budget N` for `run` and `chat`: the files
and folders a question is asked of, searched and cited through app.core.documents; the embedding model and the
reranker each run in an engine of their own."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from app.cli.session import CliError
from app.cli.types import int_range
from app.core.documents.index import Embedding
from app.core.documents.retrieval import DEFAULT_BUDGET_TOKENS, Reranker, Retrieval, ask_documents, cited_numbers
from app.core.documents.retrieval_models import (
    OFF,
    DocumentEngines,
    DocumentModelError,
    find_document_model,
    rank_mismatch,
)
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
        help="an embedding GGUF searching the documents with BM25 (reciprocal-rank fusion); default: [documents] "
        "in config.toml, else the catalog's embedding model once downloaded; none: BM25 alone",
    )
    p.add_argument(
        "--rerank-model",
        default=None,
        metavar="MODEL",
        help="a reranker GGUF (rank pooling) ordering the best passages found, in an engine of its own; default: "
        "[documents] in config.toml, else the catalog's reranker once downloaded; none: no reranking",
    )
    p.add_argument(
        "--doc-budget",
        type=int_range(64, 1 << 20),
        default=DEFAULT_BUDGET_TOKENS,
        metavar="TOKENS",
        help=f"most tokens the sources take in the prompt (default {DEFAULT_BUDGET_TOKENS}, at most half the context)",
    )


class Documents:
    """The documents of one `run` or `chat`: their question's sources, and the embedding engine and reranker's
    (--embed-model, --rerank-model, else config.toml's [documents], else the catalog's once downloaded); `close()`
    stops them."""

    def __init__(self, args: argparse.Namespace, n_ctx: int) -> None:
        from app.cli.session import start_engine

        self.sources: list[Path] = list(args.doc)
        self.budget = min(args.doc_budget, max(64, n_ctx // 2))
        self.embedding: Embedding | None = None
        self.reranker: Reranker | None = None
        self._engines = DocumentEngines(start_engine)
        if not self.sources:
            return
        try:
            embedder = self._model("embed", "--embed-model", args.embed_model)
            if embedder is not None:
                self.embedding = self._engines.embedding(embedder)
            reranker = self._model("rerank", "--rerank-model", args.rerank_model)
            if reranker is not None:
                self.reranker = self._engines.reranker(reranker)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _model(use: str, flag: str, given: str | None) -> Path | None:
        """The model `flag` names ("none": none), else the one [documents] names or the catalog's downloaded one
        (said on stderr, with how to turn it off)."""
        from app.core.config import ConfigError, load_config
        from app.core.model_paths import resolve_model

        if given is not None:
            if given.strip().lower() == OFF:
                return None
            path = resolve_model(given)
            mismatch = rank_mismatch(path, use)
            if mismatch:
                raise CliError(f"{flag}: {mismatch}")
            return path
        try:
            setting = getattr(load_config().documents, f"{use}_model")
        except ConfigError:  # the settings' error is the app's to show; the catalog's default still applies
            setting = ""
        found = find_document_model(use, setting)
        where = f"the catalog's {found.default}" if found.default else f"[documents] {use}_model in config.toml"
        if found.path is not None:
            print(f"docs: {found.what}: {found.path.name} ({where}; {flag} none: without it)", file=sys.stderr)
        elif setting.strip() and found.why:
            print(f"docs: {found.what} not used: {where}: {found.why}", file=sys.stderr)
        return found.path

    def close(self) -> None:
        self._engines.close()

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
        except DocumentModelError as error:  # the embedding model's or the reranker's engine failed
            raise CliError(f"--doc: {error}") from None
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
