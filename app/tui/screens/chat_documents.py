"""The chat screen's documents: a text, Markdown, code or HTML file, or a folder, attached with F12 (as images are)
is indexed at once in a thread (what was read and skipped said in one line), and each question of the conversation
is then asked of it: before a reply starts, the best passages are found (in a thread) and numbered into the
question the engine is sent (app.core.documents), and the reply keeps them as its sources. The conversation keeps
its files and folders in its settings (`documents`), so they stay attached after the app is closed. With an embedding
model (config.toml's [documents], else the catalog's once downloaded) the search is hybrid: the model runs in an
engine worker of its own, started at the first question (app.core.documents.retrieval_models)."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.documents.retrieval import Retrieval, ask_documents, shown_path
from app.core.documents.retrieval_models import (
    DocumentEngines,
    DocumentModel,
    find_document_model,
    search_notice,
    start_worker,
)
from app.core.store.records import StoreError
from app.tui.screens.chat_view import ChatView
from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell

MAX_SOURCES = 16  # files and folders attached to one conversation
SETTINGS_KEY = "documents"  # the conversation's settings keep its attached paths under it


class DocumentAttacher:
    """Attaching documents to the conversation, and finding each question's passages in them."""

    def __init__(self, view: ChatView) -> None:
        self._view = view
        self._sources: dict[int | None, list[Path]] = {}
        self._engines = DocumentEngines(start_worker)

    def close(self) -> None:
        """Stop the embedding model's and the reranker's engines (the chat screen's end: the app's)."""
        self._engines.close()

    def search_models(self) -> tuple[DocumentModel, DocumentModel]:
        """The embedding model and the reranker the settings name, else the catalog's on disk (file reads)."""
        settings = self.app.config.documents
        return find_document_model("embed", settings.embed_model), find_document_model("rerank", settings.rerank_model)

    @property
    def app(self) -> LlmtuiShell:
        return self._view.app

    def document_sources(self, conversation_id: int | None) -> list[Path]:
        """The files and folders attached to the conversation (None: the one not started yet), as its settings
        keep them when first asked for."""
        if conversation_id not in self._sources:
            self._sources[conversation_id] = self._kept(conversation_id)
        return self._sources[conversation_id]

    def _kept(self, conversation_id: int | None) -> list[Path]:
        if conversation_id is None:
            return []
        try:
            kept = self.app.store.conversations.get_conversation(conversation_id).settings.get(SETTINGS_KEY)
        except StoreError:
            return []
        if not isinstance(kept, list):
            return []
        return [Path(p) for p in kept[:MAX_SOURCES] if isinstance(p, str) and p and "\x00" not in p]

    def _keep(self, conversation_id: int | None) -> None:
        """The conversation's files and folders written into its settings (they outlive the app)."""
        if conversation_id is None:
            return
        conversations = self.app.store.conversations
        try:
            settings = dict(conversations.get_conversation(conversation_id).settings)
            settings[SETTINGS_KEY] = [str(p) for p in self.document_sources(conversation_id)]
            conversations.update_settings(conversation_id, settings=settings)
        except StoreError as error:
            self._view.notify(f"The attached documents were not saved: {one_line(str(error), 200)}", severity="error")

    def attach_document(self, path: Path) -> None:
        """Index the file or folder now (a thread) and attach it; what was read and skipped said in one line."""
        self._view.run_worker(partial(self._attach, path), thread=True, group="attach-document", exit_on_error=False)

    def _attach(self, path: Path) -> None:
        from app.core.documents.index import DocumentIndex

        path = path.absolute()
        if not path.exists():
            self.app.call_from_thread(self._view.notify, f"Not attached: {one_line(str(path), 200)} does not exist.")
            return
        try:
            index = DocumentIndex(path)
            try:
                report = index.refresh()
            finally:
                index.close()
        except Exception as error:  # a cache folder that cannot be written, a damaged index
            message = f"Not attached: {one_line(str(error), 200)}"
            self.app.call_from_thread(self._view.notify, message, severity="error", timeout=10)
            return
        if not report.read.files:  # a binary, a FIFO, an empty folder: nothing to answer from
            message = f"Not attached: {one_line(shown_path(str(path)), 80)}: {report.read.summary()}."
            self.app.call_from_thread(self._view.notify, message, severity="warning", timeout=10)
            return
        notice = search_notice(*self.search_models())
        self.app.call_from_thread(self._document_attached, path, report.read.summary(), notice)

    def _document_attached(self, path: Path, summary: str, notice: str) -> None:
        sources = self.document_sources(self._view.conversation_id)
        if path in sources:
            self._view.notify(f"{one_line(path.name, 60)} is attached already.")
            return
        if len(sources) >= MAX_SOURCES:
            self._view.notify(
                f"Not attached: a conversation takes at most {MAX_SOURCES} files and folders.", severity="error"
            )
            return
        sources.append(path)
        self._keep(self._view.conversation_id)
        self._view.notify(
            f"Attached {one_line(shown_path(str(path)), 80)}: {summary}. Questions are answered from it with "
            f"citations ({notice}).",
            timeout=10,
        )

    async def find_sources(self, parent_id: int) -> None:
        """Before a new reply to `parent_id`: its question's passages from the conversation's documents, handed to
        the generation controller (found in a thread; nothing when no document is attached)."""
        conversation_id = self._view.conversation_id
        pending = self.document_sources(None)
        sources = self.document_sources(conversation_id)
        if conversation_id is not None and pending:  # attached before the conversation's first message
            sources.extend(p for p in pending if p not in sources)
            pending.clear()
            self._keep(conversation_id)
        if not sources or conversation_id is None:
            return
        store = self.app.store
        questions = [m.content for m in store.tree.active_path(conversation_id) if m.role == "user"]
        question = store.tree.get_message(parent_id).content
        earlier = questions[-2] if len(questions) > 1 else ""
        try:
            retrieval = await asyncio.to_thread(self._ask, list(sources), question, earlier)
        except Exception as error:  # the cache folder, a damaged index: the reply goes without sources
            self._view.notify(f"The documents could not be searched: {one_line(str(error), 200)}", severity="error")
            return
        if not retrieval.citations:
            self._view.notify("No passage of the attached documents matched the question.", severity="warning")
        self.app.generation.retrieval = retrieval

    def _ask(self, sources: list[Path], question: str, earlier: str) -> Retrieval:
        """The question's passages (a thread): with the embedding model and reranker, whose engines start at the
        first question that needs them."""
        embed, rerank = self.search_models()
        return ask_documents(
            sources,
            question,
            earlier=earlier,
            embedding=self._engines.embedding(embed.path) if embed.path is not None else None,
            reranker=self._engines.reranker(rerank.path) if rerank.path is not None else None,
        )
