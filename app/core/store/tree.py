"""The message tree: each conversation is a tree of messages, one branch of it on screen (the active path)."""

from __future__ import annotations

import heapq
import sqlite3
from typing import cast

from app.core.store.connection import Database
from app.core.store.images import Images
from app.core.store.records import (
    FINISHED_STATES,
    JSONObject,
    Message,
    MessageNotFound,
    MessageNotStreaming,
    MessageState,
    Role,
    Siblings,
    StoredImage,
    dump_images,
    dump_stats,
    message_from_row,
    title_from_message,
)


def parents_first(messages: list[Message]) -> list[Message]:
    """Messages in id order, except that a parent always comes before its children."""
    by_id = {message.id: message for message in messages}
    children: dict[int, list[Message]] = {}
    ready: list[tuple[int, Message]] = []
    for message in messages:
        if message.parent_id is not None and message.parent_id in by_id:
            children.setdefault(message.parent_id, []).append(message)
        else:
            ready.append((message.id, message))
    heapq.heapify(ready)
    ordered: list[Message] = []
    while ready:
        _, message = heapq.heappop(ready)
        ordered.append(message)
        for child in children.get(message.id, []):
            heapq.heappush(ready, (child.id, child))
    return ordered


class Tree:
    """Reading and growing a conversation's tree: the active path, branches, and replies streamed in (the messages
    table; `Store.tree`)."""

    def __init__(self, database: Database, images: Images) -> None:
        self._database = database
        self._images = images

    def get_message(self, message_id: int) -> Message:
        """One message (MessageNotFound when it does not exist)."""
        with self._database.lock:
            row = self._database.connection.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise MessageNotFound(f"message {message_id} no longer exists")
        return message_from_row(row)

    def messages(self, conversation_id: int) -> list[Message]:
        """Every message of a conversation, all branches, oldest first."""
        with self._database.lock:
            rows = self._database.connection.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY created_at, id", (conversation_id,)
            ).fetchall()
        return [message_from_row(row) for row in rows]

    def active_path(self, conversation_id: int) -> list[Message]:
        """The branch on screen: messages from the root to the conversation's active leaf (ConversationNotFound when
        the conversation is gone)."""
        with self._database.lock:
            leaf_id = self._database.require_conversation(self._database.connection, conversation_id)["active_leaf_id"]
            messages = self.messages(conversation_id)
        by_id = {message.id: message for message in messages}
        if leaf_id is None and messages:  # no leaf recorded: show the most recent branch
            leaf_id = self._most_recent_leaf(messages, None)
        path: list[Message] = []
        seen: set[int] = set()
        while leaf_id is not None and leaf_id in by_id and leaf_id not in seen:
            seen.add(leaf_id)
            path.append(by_id[leaf_id])
            leaf_id = by_id[leaf_id].parent_id
        path.reverse()
        return path

    def siblings(self, message_id: int) -> Siblings:
        """The message and its alternatives (same parent, same conversation), oldest first."""
        with self._database.lock:
            message = self.get_message(message_id)
            rows = self._database.connection.execute(
                "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY created_at, id",
                (message.conversation_id, message.parent_id),
            ).fetchall()
        messages = [message_from_row(row) for row in rows]
        index = next(i for i, sibling in enumerate(messages) if sibling.id == message_id)
        return Siblings(messages, index)

    def switch_branch(self, message_id: int) -> list[Message]:
        """Show the branch through `message_id`: the active leaf becomes the most recently created leaf
        below it (the message itself when it has no replies). Returns the new active path."""
        with self._database.write() as connection:
            message = self.get_message(message_id)
            messages = self.messages(message.conversation_id)
            leaf_id = self._most_recent_leaf(messages, message_id)
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf_id, message.conversation_id)
            )
        return self.active_path(message.conversation_id)

    @staticmethod
    def _most_recent_leaf(messages: list[Message], top_id: int | None) -> int:
        """The leaf created last in the subtree under `top_id` (None: the whole conversation)."""
        children: dict[int | None, list[Message]] = {}
        for message in messages:
            children.setdefault(message.parent_id, []).append(message)
        by_id = {message.id: message for message in messages}
        pending = list(children.get(None, [])) if top_id is None else [by_id[top_id]]
        best: Message | None = None
        seen: set[int] = set()
        while pending:
            message = pending.pop()
            if message.id in seen:
                continue
            seen.add(message.id)
            below = children.get(message.id, [])
            if below:
                pending.extend(below)
            elif best is None or (message.created_at, message.id) > (best.created_at, best.id):
                best = message
        return best.id if best is not None else cast(int, top_id)

    def add_user_message(self, conversation_id: int, content: str, images: tuple[StoredImage, ...] = ()) -> Message:
        """Append the user's prompt (with the images kept for it by `keep_image`) after the active leaf and commit it
        (call before generating).

        An untitled conversation takes its title from its first user message.
        """
        with self._database.write() as connection:
            conversation = self._database.require_conversation(connection, conversation_id)
            message = self._insert_message(
                connection, conversation_id, conversation["active_leaf_id"], "user", content, "", "complete", "", images
            )
            if not conversation["title"]:
                connection.execute(
                    "UPDATE conversations SET title = ? WHERE id = ?",
                    (title_from_message(content), conversation_id),
                )
        return message

    def edit_user_message(
        self, message_id: int, content: str, images: tuple[StoredImage, ...] | None = None
    ) -> Message:
        """Edit-and-resend: a new user message beside `message_id` (same parent), made the active leaf, with the
        original's images (or `images`).

        The original and everything below it stay reachable through `siblings` and `switch_branch`.
        """
        with self._database.write() as connection:
            original = self.get_message(message_id)
            if original.role != "user":
                raise ValueError(f"message {message_id} is a {original.role} message, not a user message")
            return self._insert_message(
                connection,
                original.conversation_id,
                original.parent_id,
                "user",
                content,
                "",
                "complete",
                "",
                original.images if images is None else images,
            )

    def begin_assistant_message(self, conversation_id: int, parent_id: int | None, model: str) -> int:
        """Start a reply under `parent_id` (state 'streaming', made the active leaf); its id.

        Regenerating is calling this again with the same parent: the earlier reply stays a sibling.
        """
        with self._database.write() as connection:
            self._database.require_conversation(connection, conversation_id)
            message = self._insert_message(
                connection, conversation_id, parent_id, "assistant", "", "", "streaming", model
            )
            connection.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
        return message.id

    def checkpoint_assistant_message(self, message_id: int, content: str, reasoning: str) -> None:
        """Save the text streamed so far (one row update; call at most every second or so)."""
        with self._database.write() as connection:
            cursor = connection.execute(
                "UPDATE messages SET content = ?, reasoning = ?, updated_at = ? WHERE id = ? AND state = 'streaming'",
                (content, reasoning, self._database.now(), message_id),
            )
            if cursor.rowcount == 0:
                self.get_message(message_id)  # MessageNotFound if it is gone
                raise MessageNotStreaming(
                    f"reply {message_id} is no longer being written (another llmtui may have marked it "
                    "interrupted); its text was not updated"
                )

    def finish_assistant_message(
        self,
        message_id: int,
        content: str,
        reasoning: str,
        state: MessageState,
        stats: JSONObject,
        token_count: int | None = None,
    ) -> None:
        """Record the reply's final text, how it ended ('complete', 'stopped', 'error'…) and its stats."""
        if state not in FINISHED_STATES:
            raise ValueError(f"a finished reply's state is one of {FINISHED_STATES}, not {state!r}")
        with self._database.write() as connection:
            now = self._database.now()
            cursor = connection.execute(
                "UPDATE messages SET content = ?, reasoning = ?, state = ?, stats = ?, token_count = ?,"
                " updated_at = ? WHERE id = ?",
                (content, reasoning, state, dump_stats(stats), token_count, now, message_id),
            )
            if cursor.rowcount == 0:
                raise MessageNotFound(f"message {message_id} no longer exists")
            connection.execute(
                "UPDATE conversations SET updated_at = ?"
                " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                (now, message_id),
            )

    def edit_assistant_message(self, message_id: int, content: str) -> Message:
        """Change a finished reply's text in place (no new branch): fix it, or cut it and continue from there.

        Its stats say `edited`, which lets it be continued; the draft spans of speculative decoding are dropped, as
        they no longer match the text.
        """
        with self._database.write() as connection:
            message = self.get_message(message_id)
            if message.role != "assistant" or message.state == "streaming":
                raise ValueError(f"message {message_id} is not a finished reply")
            stats = {k: v for k, v in message.stats.items() if k != "draft_spans"} | {"edited": True}
            now = self._database.now()
            connection.execute(
                "UPDATE messages SET content = ?, stats = ?, updated_at = ? WHERE id = ?",
                (content, dump_stats(stats), now, message_id),
            )
            connection.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, message.conversation_id))
        return self.get_message(message_id)

    def resume_assistant_message(self, message_id: int) -> Message:
        """Continue a reply that can be (`Message.can_continue`): it becomes 'streaming' again, keeping its text,
        and the active leaf (checkpoint and finish it as a new reply)."""
        with self._database.write() as connection:
            message = self.get_message(message_id)
            if not message.can_continue:
                raise MessageNotStreaming(f"message {message_id} is not a reply that can be continued")
            now = self._database.now()
            connection.execute(
                "UPDATE messages SET state = 'streaming', updated_at = ? WHERE id = ?", (now, message_id)
            )
            connection.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (message_id, now, message.conversation_id),
            )
        return self.get_message(message_id)

    def recover_interrupted(self) -> int:
        """Mark replies left 'streaming' by a process that died as 'interrupted', keeping their text.

        Call it only at startup: a reply another running llmtui is writing would be marked too.
        """
        with self._database.write() as connection:
            cursor = connection.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
            return cursor.rowcount

    def _insert_message(
        self,
        connection: sqlite3.Connection,
        conversation_id: int,
        parent_id: int | None,
        role: Role,
        content: str,
        reasoning: str,
        state: MessageState,
        model: str,
        images: tuple[StoredImage, ...] = (),
    ) -> Message:
        """Insert a message, make it the active leaf and mark the conversation active now."""
        if parent_id is not None:
            parent = connection.execute("SELECT conversation_id FROM messages WHERE id = ?", (parent_id,)).fetchone()
            if parent is None or parent[0] != conversation_id:
                raise MessageNotFound(f"message {parent_id} is not part of conversation {conversation_id}")
        now = self._database.now()
        cursor = connection.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, state, created_at,"
            " updated_at, model, images) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, reasoning, state, now, now, model, dump_images(images)),
        )
        message_id = cast(int, cursor.lastrowid)
        self._images.written(images)
        connection.execute(
            "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
            (message_id, now, conversation_id),
        )
        return self.get_message(message_id)
