"""The conversation list: search box over titles and contents, and the conversations, newest first."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from app.core.store import Conversation, SearchHit
from engine_ext.untrusted_text import shown


class ConversationOptions(OptionList):
    """The list itself."""

    def on_focus(self) -> None:
        """Focused with nothing highlighted (Tab, ↓ from the search box): the first row is, so Enter opens it."""
        if self.highlighted is None and self.option_count:
            self.highlighted = 0

    BINDINGS = [
        Binding("enter", "select", "Open", show=False, tooltip="Open the conversation"),
        Binding("n", "screen.new_conversation", "New", show=False, tooltip="New conversation"),
        Binding("r", "screen.rename_conversation", "Rename", show=False, tooltip="Rename the conversation"),
        Binding("d,delete", "screen.delete_conversation", "Delete", tooltip="Delete the conversation: undo with u"),
        Binding("u", "screen.undo_delete", "Undo delete", tooltip="Undo delete: the last conversation deleted"),
        Binding(
            "x",
            "screen.export_conversation",
            "Export",
            show=False,
            tooltip="Export the conversation: Markdown and JSON, in the exports folder",
        ),
    ]


class ConversationList(Vertical):
    """Search and pick a conversation; posts `Selected` with the conversation id."""

    BINDINGS = [Binding("down", "to_results", "Results", show=False, tooltip="To the results: from the search box")]

    DEFAULT_CSS = """
    ConversationList {
        height: 1fr;
    }
    ConversationList > Input {
        margin: 0;
    }
    ConversationList > OptionList {
        height: 1fr;
    }
    """

    class Selected(Message):
        """The user picked a conversation."""

        def __init__(self, conversation_list: ConversationList, conversation_id: int) -> None:
            super().__init__()
            self.conversation_list = conversation_list
            self.conversation_id = conversation_id

        @property
        def control(self) -> ConversationList:
            return self.conversation_list

    class SearchChanged(Message):
        """The search text changed ('' shows every conversation)."""

        def __init__(self, conversation_list: ConversationList, query: str) -> None:
            super().__init__()
            self.conversation_list = conversation_list
            self.query_text = query

        @property
        def control(self) -> ConversationList:
            return self.conversation_list

    class Listed(Message):
        """The conversations were listed again: `count` of them (not the search's hits)."""

        def __init__(self, count: int) -> None:
            super().__init__()
            self.count = count

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search  (ctrl+f)", id="conversation-search", compact=True)
        yield ConversationOptions(id="conversation-options")

    @property
    def options(self) -> ConversationOptions:
        return self.query_one(ConversationOptions)

    @property
    def search_text(self) -> str:
        return self.query_one(Input).value

    def show_conversations(self, conversations: list[Conversation], current_id: int | None) -> None:
        options = self.options
        options.clear_options()
        for conversation in conversations:
            title = conversation.title or "New conversation"
            label = Text(shown(title), no_wrap=True, overflow="ellipsis")
            if conversation.damaged:
                label.append(" (damaged)", style="italic")
            options.add_option(Option(label, id=str(conversation.id)))
        self._highlight(current_id)
        self.post_message(self.Listed(len(conversations)))

    def show_hits(self, hits: list[SearchHit], current_id: int | None) -> None:
        options = self.options
        options.clear_options()
        for hit in hits:
            label = Text(shown(hit.title or "New conversation"), style="bold", no_wrap=True, overflow="ellipsis")
            if hit.message_id is not None:
                label.append("\n")
                label.append(shown(hit.snippet), style="dim")
            options.add_option(Option(label, id=str(hit.conversation_id)))
        if not hits:
            options.add_option(Option(Text("no matches", style="dim italic"), id="none", disabled=True))
        self._highlight(current_id)

    def _highlight(self, conversation_id: int | None) -> None:
        if conversation_id is None:
            return
        try:
            self.options.highlighted = self.options.get_option_index(str(conversation_id))
        except Exception:  # not in the list (filtered out by a search)
            pass

    def highlighted_id(self) -> int | None:
        options = self.options
        if options.highlighted is None:
            return None
        option_id = options.get_option_at_index(options.highlighted).id
        return int(option_id) if option_id and option_id.isdigit() else None

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.SearchChanged(self, event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.options.focus()

    def action_to_results(self) -> None:
        """↓ in the search box (the list binds ↓ itself, so only the box leaves it here)."""
        if self.options.option_count:
            self.options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        option_id = event.option.id
        if option_id and option_id.isdigit():
            self.post_message(self.Selected(self, int(option_id)))
