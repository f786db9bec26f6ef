"""The models the documents' search runs besides BM25: the embedding model and the reranker that config.toml's
[documents] names, else the catalog's first of each (`use = "embed"`, `"rerank"`) once it is downloaded; each runs
in an engine of its own (`DocumentEngines`), as `run --doc --embed-model` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from app.core.documents.index import Embedding
    from app.core.documents.retrieval import Reranker
    from engine_ext.client import EngineClient

OFF = "none"  # the setting's value (or --embed-model's) for no model: BM25 alone, no reranking
POOLING_RANK = 4  # llama.h's LLAMA_POOLING_TYPE_RANK: a reranker's


class DocumentModelError(RuntimeError):
    """An embedding model or reranker that failed while a question was searched (one line)."""


@dataclass(frozen=True)
class DocumentModel:
    """The embedding model ("embed") or reranker ("rerank") to use: its file, or why there is none."""

    use: str
    path: Path | None
    why: str = ""  # without a file: why not and how to get one ('' when the setting turns it off)
    default: str = ""  # the catalog id when the file is the catalog's default

    @property
    def what(self) -> str:
        return "embedding model" if self.use == "embed" else "reranker"


def rank_mismatch(path: Path, use: str) -> str:
    """Why `path` cannot be used for `use` ('' when it can): a reranker as the embedder, or the reverse."""
    from engine_ext.gguf import GGUFError, read_pooling_type

    try:
        rank = read_pooling_type(path) == POOLING_RANK
    except (GGUFError, OSError) as error:
        return f"{path.name} cannot be read ({one_line(str(error), 160)})"
    if rank == (use == "rerank"):
        return ""
    return f"{path.name} is " + ("a reranker (rank pooling), not an embedder" if rank else "not a reranker")


def not_for_chat(path: Path) -> str | None:
    """Why the model file at `path` is not opened to chat with (an embedding model or a reranker: its GGUF names a
    pooling), said as the draft-as-model refusal says it; None for a model to chat with (or an unreadable header:
    the load says why)."""
    from engine_ext.gguf import GGUFError, read_pooling_type

    try:
        pooling = read_pooling_type(path)
    except (GGUFError, OSError):
        return None
    if not pooling:
        return None
    what = "a reranker (rank pooling)" if pooling == POOLING_RANK else "an embedding model (its GGUF names a pooling)"
    return (
        f"{path.name} is {what}, not a model to chat with: the documents' search uses it (Settings, F3: Documents; "
        "--embed-model, --rerank-model), and `llmtui serve -m` serves it"
    )


def find_document_model(use: str, setting: str) -> DocumentModel:
    """The model for `use` ("embed", "rerank") that `setting` names (a path, catalog id, org/repo[:QUANT]; '' : the
    catalog's first for that use when it is downloaded; "none": none)."""
    from app.core.model_paths import ModelNotFound, resolve_model
    from models_catalog.catalog import load_catalog
    from models_catalog.errors import ModelsError

    wanted = setting.strip()
    if wanted.lower() == OFF:
        return DocumentModel(use, None)
    default = ""
    if not wanted:
        try:
            entry = load_catalog().first_of_use(use)
        except (ModelsError, ValueError, OSError):
            entry = None
        if entry is None:
            return DocumentModel(use, None, "the catalog has none")
        wanted = default = entry.id
    try:
        path = resolve_model(wanted)
    except ModelNotFound as error:
        if default:
            return DocumentModel(use, None, f"none on disk; `llmtui models pull {default}` fetches one", default)
        return DocumentModel(use, None, one_line(str(error), 240))
    mismatch = rank_mismatch(path, use)
    return DocumentModel(use, None, mismatch, default) if mismatch else DocumentModel(use, path, "", default)


def search_notice(embed: DocumentModel, rerank: DocumentModel) -> str:
    """How attached documents are searched, for the app's notice: hybrid with the embedding model, or BM25 alone
    and how to get one."""
    if embed.path is not None:
        line = f"hybrid search: BM25 and embeddings from {embed.path.name}"
    elif embed.why:
        line = f"BM25 search: embedding model {embed.why}"
    else:
        line = "BM25 search: the embedding model is off ([documents] embed_model = none)"
    return line + (f", reranked with {rerank.path.name}" if rerank.path is not None else "")


def start_worker(log_name: str) -> EngineClient:
    """A started engine worker logging to `log_name` in the log folder (the app's; the CLI's start_engine also says
    a recovery notice)."""
    from app.core import paths
    from app.core.owner_only_dirs import private_dir
    from engine_ext.client import EngineClient

    client = EngineClient(private_dir(paths.log_dir()) / log_name, memory=paths.repack_memory())
    client.start()
    return client


class DocumentEngines:
    """The embedding model and the reranker, each loaded in an engine worker of its own when first asked for (the
    worker's crash is not the chat's); close() stops them. `start`: a started EngineClient."""

    def __init__(self, start: Callable[[str], EngineClient]) -> None:
        self._start = start
        self._engines: dict[Path, EngineClient] = {}

    def _engine(self, path: Path, log_name: str) -> EngineClient:
        engine = self._engines.get(path)
        if engine is None:
            engine = self._start(log_name)
            try:
                engine.load(path)
            except BaseException:
                engine.close()
                raise
            self._engines[path] = engine
        return engine

    def embedding(self, path: Path) -> Embedding:
        from app.core.documents.index import Embedding
        from engine_ext.client import EngineCrashedError, EngineFailure

        engine = self._engine(path, "embedder.log")

        def embed(texts: Sequence[str]) -> list[tuple[float, ...]]:
            try:
                return list(engine.embed(texts).vectors)
            except (EngineFailure, EngineCrashedError) as error:
                raise DocumentModelError(f"{path.name}: {one_line(str(error), 200)}") from None

        return Embedding(path.name, embed)

    def reranker(self, path: Path) -> Reranker:
        from app.core.documents.retrieval import Reranker
        from engine_ext.client import EngineCrashedError, EngineFailure

        engine = self._engine(path, "reranker.log")

        def score(question: str, texts: Sequence[str]) -> list[float]:
            try:
                return [v[0] for v in engine.embed(texts, query=question).vectors]
            except (EngineFailure, EngineCrashedError) as error:
                raise DocumentModelError(f"{path.name}: {one_line(str(error), 200)}") from None

        return Reranker(path.name, score)

    def close(self) -> None:
        while self._engines:
            self._engines.popitem()[1].close()
