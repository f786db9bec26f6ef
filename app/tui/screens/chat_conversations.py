"""The chat screen's conversation list and what acts on a whole conversation: open, new, search, rename, delete and
undo, export, its settings (system prompt, sampling, presets)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.core.generation import conversation_sampling
from app.core.output_format import FORMAT_LABELS
from app.core.store import Message, StoreError
from app.tui.screens.chat_view import ChatView, branch_map

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell


class ConversationActions:
    """The chat screen's conversation list and its conversation actions (the screen's keys call them); it keeps the
    conversations deleted in this session, for undo."""

    def __init__(self, view: ChatView) -> None:
        self._view = view
        self._deleted: list[int] = []

    @property
    def app(self) -> LlmtuiShell:
        return self._view.app

    def refresh_conversation_list(self) -> None:
        """List the conversations again (or the search's hits)."""
        listing = self._view.conversation_list
        query = listing.search_text.strip()
        if query:
            listing.show_hits(self.app.store.search.find(query), self._view.conversation_id)
        else:
            listing.show_conversations(self.app.store.conversations.list_conversations(), self._view.conversation_id)

    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a conversation (None: a new, empty one that is created on the first message)."""
        self._view.conversation_id = conversation_id
        self._view.edit_banner.end(self._view.prompt, restore=False)
        if conversation_id is None:
            await self._view.transcript.show([], {})
            self._view.header.conversation_title = "New conversation"
            sampling = self.app.default_conversation_settings().get("sampling")
            fmt = sampling.get("output_format") if isinstance(sampling, dict) else None
            self._view.header.output_format = FORMAT_LABELS.get(fmt, "") if isinstance(fmt, str) else ""
            self._view.stats.set_stats({})  # nothing measured in this conversation yet
        else:
            store = self.app.store
            conversation = store.conversations.get_conversation(conversation_id)
            path = store.tree.active_path(conversation_id)
            await self._view.transcript.show(path, branch_map(store.tree.messages(conversation_id)))
            self._view.header.conversation_title = conversation.title or "New conversation"
            self._view.header.output_format = FORMAT_LABELS.get(conversation_sampling(conversation).output_format, "")
            self._show_last_stats(path)
        self.refresh_conversation_list()
        self._view.refresh_bindings()  # Continue and Regenerate depend on the conversation's last reply

    def _show_last_stats(self, path: list[Message]) -> None:
        """The stats bar shows the last reply of the branch on screen measured in this session on this model
        (none: "–", and the loaded model's context)."""
        last_stats = next(
            (
                m.stats
                for m in reversed(path)
                if self._view.measured(m.id) and m.role == "assistant" and m.stats and "n_ctx_used" in m.stats
            ),
            None,
        )
        self._view.stats.set_stats(last_stats or {})
        if last_stats is None:
            self._view.stats.cpu = None

    async def reload_transcript(self) -> None:
        if self._view.conversation_id is not None:
            store = self.app.store
            path = store.tree.active_path(self._view.conversation_id)
            await self._view.transcript.show(path, branch_map(store.tree.messages(self._view.conversation_id)))
            if self.app.generation.active is None:
                self._show_last_stats(path)  # another branch: its own reply's numbers
            self._view.refresh_bindings()

    async def select(self, conversation_id: int) -> None:
        """A conversation picked in the list: shown, unless a reply is being written."""
        if conversation_id == self._view.conversation_id or self._view.busy():
            return
        await self.open_conversation(conversation_id)
        self._view.prompt.focus()

    async def new_conversation(self) -> None:
        if self._view.busy():
            return
        await self.open_conversation(None)
        self._view.prompt.focus()

    def _target_conversation(self) -> int | None:
        """The conversation highlighted in the list when it has focus, else the one on screen."""
        if self._view.conversation_list.has_focus_within:
            highlighted = self._view.conversation_list.highlighted_id()
            if highlighted is not None:
                return highlighted
        return self._view.conversation_id

    def rename_conversation(self) -> None:
        from app.tui.modals.text_prompt import TextPromptModal

        target = self._target_conversation()
        if target is None:
            self._view.notify("Send a first message to start the conversation, then rename it.")
            return
        current = self.app.store.conversations.get_conversation(target).title

        def rename(title: str | None) -> None:
            if title is None or not title.strip():
                return
            self.app.store.conversations.rename_conversation(target, title.strip())
            if target == self._view.conversation_id:
                self._view.header.conversation_title = title.strip()
            self.refresh_conversation_list()

        self.app.push_screen(TextPromptModal("Rename conversation", current, "Title"), rename)

    async def delete_conversation(self) -> None:
        target = self._target_conversation()
        reply = self.app.generation.active
        if target is None or (reply is not None and target == reply.conversation_id):
            if target is not None:
                self._view.busy()
            return
        title = self.app.store.conversations.get_conversation(target).title or "New conversation"
        self.app.store.conversations.delete_conversation(target)
        self._deleted.append(target)
        self._view.notify(
            f"Deleted “{title}”. Press u in the list (or “Chat: Undo delete” in ctrl+p) to bring it back."
        )
        if target == self._view.conversation_id:
            remaining = self.app.store.conversations.list_conversations()
            await self.open_conversation(remaining[0].id if remaining else None)
        else:
            self.refresh_conversation_list()

    async def undo_delete(self) -> None:
        while self._deleted:
            target = self._deleted.pop()
            try:
                self.app.store.conversations.undo_delete(target)
            except StoreError:
                continue
            self._view.notify(
                f"Restored “{self.app.store.conversations.get_conversation(target).title or 'New conversation'}”."
            )
            if self.app.generation.active is None:
                await self.open_conversation(target)
            else:
                self.refresh_conversation_list()
            return
        self._view.notify("Nothing to undo.")

    def export_conversation(self) -> None:
        target = self._target_conversation()
        if target is None:
            self._view.notify("Nothing to export yet.")
            return
        try:
            self.app.conversations.export_in_background(target, self._exported)  # the files are written in a thread
        except StoreError as error:
            self._view.notify(f"Export failed: {error}", severity="error")

    def _exported(self, result: tuple[Path, Path] | str) -> None:
        if isinstance(result, str):
            self.app.notify(f"Export failed: {result}", severity="error")
            return
        markdown_path, json_path = result
        self.app.notify(f"Exported to {markdown_path} and {json_path.name}.", timeout=8)

    def conversation_settings(self) -> None:
        from app.core.generation.tools import tool_choices, tools_choice
        from app.core.tools.box import ToolError
        from app.core.tools.tool_config import ToolSettings, read_tool_settings
        from app.tui.modals.conversation_settings import ConversationSettingsModal, ConversationSettingsResult

        if self._view.busy():
            return
        conversation = self.app.generation.ensure_conversation(self._view.conversation_id)
        self._view.conversation_id = conversation.id
        self.refresh_conversation_list()
        sampling = conversation_sampling(conversation)

        def apply(result: ConversationSettingsResult | None) -> None:
            if result is None:
                return
            settings = dict(conversation.settings, sampling=result.sampling.to_json(), tools=result.tools)
            if result.preset_name:
                settings["preset"] = result.preset_name
            try:
                self.app.store.conversations.update_settings(
                    conversation.id, system_prompt=result.system_prompt, settings=settings
                )
                if result.save_as:
                    self.app.store.presets.save_preset(result.save_as, result.sampling.to_json())
            except (StoreError, ValueError) as error:
                self._view.notify(f"Could not save the settings: {error}", severity="error")
                return
            self._view.header.output_format = FORMAT_LABELS.get(result.sampling.output_format, "")
            saved_preset = f" Preset “{result.save_as}” saved." if result.save_as else ""
            changed = f": {'; '.join(result.changes)}." if result.changes else ": nothing changed."
            self._view.notify("Conversation settings saved" + changed + saved_preset, markup=False)

        try:
            choices = tool_choices(read_tool_settings())
        except ToolError as error:  # config.toml's tool tables are wrong: say so, and offer the built-in tools
            self._view.notify(str(error), severity="warning", timeout=10)
            choices = tool_choices(ToolSettings())
        modal = ConversationSettingsModal(
            conversation.system_prompt,
            sampling,
            self.app.store.presets.list_presets(),
            self.app.model.thinking_controls if self.app.model is not None else None,
            tools_choice(conversation),
            choices if self.app.generation.takes_tools else choices[:1],
            self.app.model.tool_format if self.app.model is not None else "",
        )
        self.app.push_screen(modal, apply)
