"""Searching the history: titles and every message of every branch, ignoring case."""

from __future__ import annotations

from typing import Final

from app.core.store.connection import Database
from app.core.store.records import SearchHit
from app.core.store.schema import casefold

SNIPPET_RADIUS_CHARS: Final = 40


def _snippet(text: str, query: str) -> str:
    """A one-line excerpt of `text` around the first case-insensitive match of `query`."""
    flat = " ".join(text.split())
    position = flat.lower().find(query.lower())
    if position < 0:
        position = 0
    start = max(0, position - SNIPPET_RADIUS_CHARS)
    end = min(len(flat), position + len(query) + SNIPPET_RADIUS_CHARS)
    return ("…" if start > 0 else "") + flat[start:end] + ("…" if end < len(flat) else "")


class Search:
    """Finding conversations by their text (`Store.search`)."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def find(self, query: str) -> list[SearchHit]:
        """Conversations (not deleted) whose title or any message (any branch) contains `query`, ignoring
        case; most recently active first, one hit each, with a snippet around the first match."""
        needle = query.strip().casefold()
        if not needle:
            return []
        with self._database.lock:
            conversations = self._database.connection.execute(
                "SELECT id, title FROM conversations WHERE deleted_at IS NULL ORDER BY updated_at DESC, id DESC"
            ).fetchall()
            title_matches = {row["id"] for row in conversations if needle in (casefold(row["title"]) or "")}
            message_matches: dict[int, tuple[int, str]] = {}
            for row in self._database.connection.execute(
                "SELECT m.conversation_id, m.id, m.content FROM messages m"
                " JOIN conversations c ON c.id = m.conversation_id"
                " WHERE c.deleted_at IS NULL AND instr(llmtui_casefold(m.content), ?) > 0"
                " ORDER BY m.created_at, m.id",
                (needle,),
            ):
                message_matches.setdefault(row["conversation_id"], (row["id"], row["content"]))
        hits: list[SearchHit] = []
        for row in conversations:
            conversation_id, title = row["id"], row["title"]
            if conversation_id in message_matches:
                message_id, content = message_matches[conversation_id]
                hits.append(SearchHit(conversation_id, title, _snippet(content, query.strip()), message_id))
            elif conversation_id in title_matches:
                hits.append(SearchHit(conversation_id, title, title, None))
        return hits
