"""Conversations: creating, listing, renaming, deleting and restoring them (the conversations table)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import cast

from app.core.store.connection import Database
from app.core.store.images import Images
from app.core.store.records import (
    Conversation,
    ConversationNotFound,
    JSONObject,
    conversation_from_row,
    damaged_placeholder,
    dump_settings,
)


class Conversations:
    """A conversation's own row: its title, system prompt, settings, model and deletion (`Store.conversations`)."""

    def __init__(self, database: Database, images: Images) -> None:
        self._database = database
        self._images = images

    def get_conversation(self, conversation_id: int) -> Conversation:
        """One conversation, deleted or not (ConversationNotFound when purged or never existed)."""
        with self._database.lock:
            row = self._database.connection.execute(
                "SELECT * FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            raise ConversationNotFound(f"conversation {conversation_id} no longer exists")
        return conversation_from_row(row)

    def create_conversation(
        self, title: str = "", *, system_prompt: str = "", settings: JSONObject | None = None, model: str = ""
    ) -> Conversation:
        """A new, empty conversation. An empty title is filled from the first user message."""
        settings_text = dump_settings(settings or {})
        with self._database.write() as connection:
            now = self._database.now()
            cursor = connection.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, settings, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, settings_text, model),
            )
            conversation_id = cast(int, cursor.lastrowid)
        return self.get_conversation(conversation_id)

    def list_conversations(self, *, deleted: bool = False) -> list[Conversation]:
        """Conversations, most recently active first; `deleted=True` lists the soft-deleted ones instead.

        Each is loaded on its own: one that cannot be read shows as a damaged placeholder, not an error.
        """
        condition = "deleted_at IS NOT NULL" if deleted else "deleted_at IS NULL"
        with self._database.lock:
            ids = [
                row[0]
                for row in self._database.connection.execute(
                    f"SELECT id FROM conversations WHERE {condition} ORDER BY updated_at DESC, id DESC"
                )
            ]
            conversations: list[Conversation] = []
            for conversation_id in ids:
                try:
                    conversations.append(self.get_conversation(conversation_id))
                except ConversationNotFound:  # purged by another process meanwhile
                    continue
                except sqlite3.OperationalError:
                    raise
                except (sqlite3.DatabaseError, ValueError, TypeError, KeyError):
                    conversations.append(damaged_placeholder(conversation_id))
        return conversations

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Set a conversation's title (does not change its place in the list)."""
        with self._database.write() as connection:
            self._database.require_conversation(connection, conversation_id)
            connection.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def update_settings(
        self,
        conversation_id: int,
        *,
        system_prompt: str | None = None,
        settings: JSONObject | None = None,
        model: str | None = None,
    ) -> None:
        """Change a conversation's system prompt, sampling settings or model; None leaves a field as is."""
        settings_text = None if settings is None else dump_settings(settings)
        with self._database.write() as connection:
            self._database.require_conversation(connection, conversation_id)
            connection.execute(
                "UPDATE conversations SET system_prompt = coalesce(?, system_prompt),"
                " settings = coalesce(?, settings), model = coalesce(?, model) WHERE id = ?",
                (system_prompt, settings_text, model, conversation_id),
            )

    def delete_conversation(self, conversation_id: int) -> None:
        """Soft-delete: hide the conversation from the list until `undo_delete` or `purge_deleted`."""
        with self._database.write() as connection:
            self._database.require_conversation(connection, conversation_id)
            connection.execute(
                "UPDATE conversations SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                (self._database.now(), conversation_id),
            )

    def undo_delete(self, conversation_id: int) -> None:
        """Bring a soft-deleted conversation back."""
        with self._database.write() as connection:
            self._database.require_conversation(connection, conversation_id)
            connection.execute("UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self, older_than: timedelta) -> int:
        """Remove for good the conversations deleted at least `older_than` ago, and the image files only they
        referred to; how many conversations were removed."""
        with self._database.write() as connection:
            cutoff = (datetime.fromisoformat(self._database.now()) - older_than).isoformat(timespec="microseconds")
            cursor = connection.execute(
                "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?", (cutoff,)
            )
            removed = cursor.rowcount
        if removed:
            self._images.free_unused_images()
        return removed
