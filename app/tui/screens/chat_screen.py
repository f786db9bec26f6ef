"""The chat screen: layout, keys, the footer, the message actions, the steering panel; its parts own the rest: the
conversation list and its actions (chat_conversations.py), the replies (chat_reply.py, the generation controller's
adapter), attaching images (chat_images.py), the engine's and the features' readouts (chat_readouts.py) and the edit
in progress (the `EditBanner`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

from rich.cells import cell_len
from textual import events, on
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input

from app.core.config import ConfigError, save_config
from app.core.generation import ActiveReply
from app.core.store import Message, StoreError
from app.tui.screens.chat_conversations import ConversationActions
from app.tui.screens.chat_documents import DocumentAttacher
from app.tui.screens.chat_images import ImageAttacher
from app.tui.screens.chat_keys import CHAT_BINDINGS
from app.tui.screens.chat_readouts import ChatReadouts
from app.tui.screens.chat_reply import ChatReplies
from app.tui.screens.steering_panel import SteeringPanel
from app.tui.textual_internals.compositor import use_cropped_compositor
from app.tui.widgets.attachments import AttachmentsBar
from app.tui.widgets.edit_banner import EditBanner
from app.tui.widgets.markdown_render import code_blocks
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import ConversationList
from app.tui.widgets.status import AppHeader, StatsBar
from app.tui.widgets.transcript import Transcript

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell

NARROW_WIDTH = 100  # below this many columns the conversation list is narrower
STEERING_BESIDE_WIDTH = 110  # from this many columns the steering panel sits beside the transcript, else below it


class ChatScreen(Screen[None]):
    """Where conversations happen: the transcript, the message box, the conversation list and the steering panel."""

    AUTO_FOCUS = "#prompt"
    """The prompt has the keys from the first frame, so keys typed while the app starts go to it, not to the
    conversation search (the first focusable widget: Textual's default focus until on_mount ends)."""

    BINDINGS = CHAT_BINDINGS

    @property
    def active_bindings(self) -> dict[str, ActiveBinding]:
        """Screen's, in the footer's order, trimmed to what fits its width (F1 lists every key).

        This screen's and the App's shown keys come in BINDINGS' order (a focused widget that binds one of them
        too, as the prompt's TextArea binds f6, would otherwise put it first); while a message, the conversation
        list or the steering panel has the focus, its own keys come before them. A key that does not fit, and every
        one after it, is not shown (it still works), nor is a second key for an action or a label already shown
        (`?` beside F1 Help)."""
        focused = self.focused
        widget_first = focused is not None and not isinstance(focused, PromptInput)

        def rank(item: tuple[str, ActiveBinding]) -> tuple[int, int]:
            key, active = item
            if active.node is not self and active.node is not self.app:  # a widget's own key
                return (0 if widget_first else 1, 0)
            return (1 if widget_first else 0, FOOTER_ORDER.get(key, len(FOOTER_ORDER)))

        room = (self.size.width or 80) - FOOTER_PALETTE_CELLS
        shown: set[str] = set()
        fitted: dict[str, ActiveBinding] = {}
        for key, active in sorted(super().active_bindings.items(), key=rank):
            binding = active.binding
            if binding.show:
                label = binding.description
                cells = cell_len(self.app.get_key_display(binding)) + cell_len(label) + 2  # "key label" + a gap
                if room < cells or label in shown or binding.action in shown:
                    active = active._replace(binding=replace(binding, show=False))
                    room = min(room, 0) if room < cells else room
                else:
                    room -= cells
                    shown.update((label, binding.action))
            fitted[key] = active
        return fitted

    app: LlmtuiShell

    def __init__(self) -> None:
        super().__init__()
        use_cropped_compositor(self)  # a streamed line repaints that line, not the widgets under it
        self.conversation_id: int | None = None
        """The conversation on screen (None: a new one, created with its first message)."""
        self._sidebar_waits = False
        """Whether the conversation list is shown once it lists a conversation (hidden while it lists none)."""
        self.conversations = ConversationActions(self)
        self.documents = DocumentAttacher(self)
        self.replies = ChatReplies(self, self.documents)
        self.images = ImageAttacher(self, self.documents)
        self.readouts = ChatReadouts(self, self.replies.model_loaded)

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield AppHeader(id="header")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield ConversationList(id="conversations")
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield EditBanner(id="edit-banner")
                yield AttachmentsBar(id="attachments")
                yield PromptInput(id="prompt")
                yield StatsBar(id="stats")
            yield SteeringPanel(id="steering-panel")  # F6: docked beside the chat (wide) or below it (narrow)
        yield Footer(compact=True)

    # ----- what the parts see (ChatView) -----

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def attachments(self) -> AttachmentsBar:
        return self.query_one(AttachmentsBar)

    @property
    def stats(self) -> StatsBar:
        return self.query_one(StatsBar)

    @property
    def steering_panel(self) -> SteeringPanel:
        return self.query_one(SteeringPanel)

    @property
    def header(self) -> AppHeader:
        return self.query_one(AppHeader)

    @property
    def conversation_list(self) -> ConversationList:
        return self.query_one(ConversationList)

    @property
    def edit_banner(self) -> EditBanner:
        return self.query_one(EditBanner)

    @property
    def generation(self) -> ActiveReply | None:
        """The reply being written (the generation controller's)."""
        return self.app.generation.active

    def busy(self) -> bool:
        """Whether a reply is being written (then saying so: the action waits for it)."""
        if self.app.generation.active is not None:
            self.notify("A reply is being written; press Esc to stop it first.", severity="warning")
            return True
        return False

    def measured(self, message_id: int) -> bool:
        return message_id in self.replies.measured

    async def reload_transcript(self) -> None:
        await self.conversations.reload_transcript()

    def refresh_conversation_list(self) -> None:
        self.conversations.refresh_conversation_list()

    async def toggle_steering(self) -> None:
        """F6: open the steering panel on its sliders, or close it (the prompt gets the keys back)."""
        panel = self.steering_panel
        if panel.is_open:
            panel.close()
        else:
            await panel.open()

    @on(SteeringPanel.Closed)
    def _steering_closed(self) -> None:
        self.prompt.focus()

    def _steering_has_focus(self) -> bool:
        focused = self.focused
        panel = self.steering_panel
        return panel.is_open and focused is not None and (focused is panel or panel in focused.ancestors)

    async def on_mount(self) -> None:
        self.app.generation.router.default = (
            self.replies
        )  # events of requests nobody registered (or with no id) come here
        self.watch(self.app, "features_version", self.readouts.features_changed, init=False)
        self.watch(self.app, "engine_version", self.readouts.engine_changed, init=False)
        self.query_one("#sidebar").display = False  # until the conversations are listed (on_conversation_list_listed)
        self._sidebar_waits = self.app.config.show_sidebar
        self.transcript.dark = self.app.current_theme.dark
        self.transcript.read_image = self.app.store.images.read_image
        self.transcript.colour_drafts = self.app.config.draft_colouring
        self.replies.measured_on = self.app.model.path if self.app.model else ""
        self.readouts.model_shown = self.app.model
        self.readouts.engine_changed()
        conversations = self.app.store.conversations.list_conversations()
        if conversations:
            await self.conversations.open_conversation(conversations[0].id)
        else:
            await self.conversations.open_conversation(None)
        self.prompt.focus()

    def on_unmount(self) -> None:
        self.documents.close()  # the embedding model's and the reranker's engines, when a question started them
        if self.app.generation.router.default is self.replies:
            self.app.generation.router.default = None

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_WIDTH, "-narrow")
        self.set_class(event.size.width >= STEERING_BESIDE_WIDTH, "-steering-beside")
        self.refresh_bindings()  # the footer shows what fits the new width

    def back(self) -> None:
        """Esc when no reply is being written: leave editing, clear the search, or go back to the prompt."""
        if self.edit_banner.target is not None:
            self.edit_banner.end(self.prompt, restore=True)
            return
        if self._clear_search():
            return
        if not self.prompt.has_focus:
            self.prompt.focus()

    def _clear_search(self) -> bool:
        """Esc in the search box clears it first (the list shows every conversation again); whether it did."""
        search = self.query_one("#conversation-search", Input)
        if search.has_focus and search.value:
            search.value = ""
            return True
        return False

    # ----- the parts' keys and messages -----

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.replies.send(event.text)

    @on(ConversationList.Selected)
    async def _conversation_selected(self, event: ConversationList.Selected) -> None:
        await self.conversations.select(event.conversation_id)

    @on(ConversationList.SearchChanged)
    def _search_changed(self, event: ConversationList.SearchChanged) -> None:
        self.conversations.refresh_conversation_list()

    @on(PromptInput.ImagePathPasted)
    def _image_path_pasted(self, event: PromptInput.ImagePathPasted) -> None:
        self.images.path_pasted(event.path)

    @on(AttachmentsBar.Left)
    def _attachments_left(self) -> None:
        self.prompt.focus()

    def action_back(self) -> None:
        self.back()

    def action_stop(self) -> None:
        self.replies.stop()

    def action_stop_api_requests(self) -> None:
        self.replies.stop_api_requests()

    def action_stop_thinking(self) -> None:
        """Stop thinking now: the model's thinking ends at the next token and it answers."""
        self.replies.stop_thinking()

    async def action_continue_reply(self) -> None:
        await self.replies.continue_reply()

    async def action_regenerate(self) -> None:
        await self.replies.regenerate()

    async def action_new_conversation(self) -> None:
        await self.conversations.new_conversation()

    def on_conversation_list_listed(self, event: ConversationList.Listed) -> None:
        """The conversation list is shown (when the settings say so) once it lists one: an empty one took 21 of 80
        columns on the first start."""
        if self._sidebar_waits and event.count:
            self._sidebar_waits = False
            self.query_one("#sidebar").display = True

    def action_toggle_sidebar(self) -> None:
        """Show the conversation list with the focus in it (its keys d, u, x work at once), or hide it."""
        self._sidebar_waits = False  # the user's choice from now on
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display
        if sidebar.display:
            self.conversation_list.options.focus()
        elif sidebar.has_focus_within:
            self.prompt.focus()
        self.app.remember_sidebar(bool(sidebar.display))

    def action_search(self) -> None:
        self._sidebar_waits = False
        self.query_one("#sidebar").display = True
        self.query_one("#conversation-search").focus()

    def action_rename_conversation(self) -> None:
        self.conversations.rename_conversation()

    async def action_delete_conversation(self) -> None:
        await self.conversations.delete_conversation()

    async def action_undo_delete(self) -> None:
        await self.conversations.undo_delete()

    def action_export_conversation(self) -> None:
        self.conversations.export_conversation()

    def action_conversation_settings(self) -> None:
        self.conversations.conversation_settings()

    def action_attach_image(self) -> None:
        """F12: ask for an image file's path (Tab completes it) and attach it."""
        self.images.ask_for_image()

    # ----- message actions -----

    @on(MessageView.Action)
    async def _message_action(self, event: MessageView.Action) -> None:
        message = event.view.message
        if event.action == "copy":
            self.app.copy_to_clipboard(message.content)
            self.notify("Message copied.")
        elif event.action == "copy_code":
            await self._copy_code(message)
        elif event.action == "edit":
            if not self.busy():
                self.edit_banner.begin(message, self.prompt)
        elif event.action == "regenerate":
            await self.replies.regenerate(message.id)
        elif event.action == "branch":
            await self._switch_branch(message, event.step)
        elif event.action == "leave":
            self.prompt.focus()

    async def _copy_code(self, message: Message) -> None:
        blocks = code_blocks(message.content)
        if not blocks:
            self.notify("This message has no code block.")
            return
        if len(blocks) == 1:
            self.app.copy_to_clipboard(blocks[0])
            self.notify("Code block copied.")
            return
        from app.tui.modals.pick import PickModal

        def copy(index: int | None) -> None:
            if index is not None:
                self.app.copy_to_clipboard(blocks[index])
                self.notify(f"Code block {index + 1} copied.")

        labels = [
            f"{i + 1}. {block.strip().splitlines()[0][:60] if block.strip() else '(empty)'}"
            for i, block in enumerate(blocks)
        ]
        self.app.push_screen(PickModal("Copy which code block?", labels), copy)

    async def _switch_branch(self, message: Message, step: int) -> None:
        if self.busy():
            return
        store = self.app.store
        siblings = store.tree.siblings(message.id)
        index = siblings.index + step
        if not 0 <= index < len(siblings.messages):
            return
        store.tree.switch_branch(siblings.messages[index].id)
        await self.reload_transcript()
        target_id = siblings.messages[index].id
        for view in self.transcript.views():
            if view.message.id == target_id:
                view.focus()
                view.scroll_visible(animate=False)
                break

    def action_toggle_draft_colouring(self) -> None:
        """Colour (or stop colouring) the text that came from accepted draft tokens; remembered in the settings."""
        colour = not self.transcript.colour_drafts
        self.transcript.set_colour_drafts(colour)
        self.app.config = replace(self.app.config, draft_colouring=colour)
        try:
            save_config(self.app.config)
        except ConfigError as error:
            self.notify(str(error), severity="error")
        self.notify(
            "Draft colouring on: text from accepted draft tokens is underlined." if colour else "Draft colouring off."
        )

    def action_focus_messages(self) -> None:
        last = self.transcript.last_view()
        if last is not None:
            last.focus()
            last.scroll_visible(animate=False)

    # ----- settings and models -----

    def action_switch_model(self) -> None:
        self.app.action_switch_model()

    def action_restart_engine(self) -> None:
        self.app.action_restart_engine()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop", "back") and self._steering_has_focus():
            return False  # Esc in the steering panel is its own: it closes the panel, the reply goes on
        if action == "stop":
            return self.generation is not None
        if action == "stop_api_requests":
            return self.generation is not None and self.replies.held_behind > 0
        if action == "stop_thinking":  # while it thinks; else the prompt's end of line, or one line saying why not
            reply = self.generation
            if reply is not None and not reply.answering and not reply.cancelling:
                return True
            return not (self.prompt.has_focus and self.prompt.text)
        if action == "back":
            return self.generation is None
        if action == "continue_reply":
            if self.generation is not None:
                return False
            try:
                last = self.app.generation.last_reply(self.conversation_id)
            except StoreError:
                return False
            return last is not None and last.can_continue
        if action == "regenerate":
            return self.generation is None and self.conversation_id is not None
        return True


FOOTER_PALETTE_CELLS: Final = 11
"""What the compact footer's "▏^p palette" at the right takes."""
FOOTER_ORDER: Final = {
    binding.key: n for n, binding in enumerate(ChatScreen.BINDINGS) if isinstance(binding, Binding) and binding.show
}
"""The chat footer's keys, in the order shown."""
