"""The chat screen: layout, keys, the footer, editing a message, the steering panel; put together with its
conversation list (chat_conversations.py) and its replies (chat_reply.py, the generation controller's adapter)."""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from rich.cells import cell_len
from textual import events, on
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import Footer, Static

from app.core.config import ConfigError, save_config
from app.core.speculation_facts import short_summary
from app.core.store import Message, StoreError
from app.tui.screens.chat_conversations import ChatConversations
from app.tui.screens.chat_images import ATTACH_KEY, ChatImages
from app.tui.screens.chat_reply import ChatReply
from app.tui.screens.steering import SteeringPanel
from app.tui.textual_internals.compositor import use_cropped_compositor
from app.tui.widgets.attachments import AttachmentsBar
from app.tui.widgets.markdown_render import code_blocks
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import ConversationList
from app.tui.widgets.spec_meter import SpecMeter
from app.tui.widgets.status import AppHeader, StatsBar
from app.tui.widgets.transcript import Transcript

NARROW_WIDTH = 100  # below this many columns the conversation list is narrower
STEERING_BESIDE_WIDTH = 110  # from this many columns the steering panel sits beside the transcript, else below it


class ChatScreen(ChatReply, ChatConversations, ChatImages):
    """Where conversations happen.

    | Key | Action |
    | :- | :- |
    | enter | Send (in the prompt). |
    | escape | Stop the reply (keeps the text, marked stopped); leave edit mode. |
    | ctrl+g | Continue the last reply: stopped, failed, cut short by max tokens, or edited. |
    | ctrl+r | Regenerate the last reply. |
    | ctrl+n | New conversation. |
    | ctrl+b | Show the conversation list, focused, or hide it. |
    | ctrl+f | Search conversations. |
    | ctrl+l | Switch model. |
    | ctrl+s | Conversation settings (system prompt, sampling, presets). |
    | f2 | Rename the conversation. |
    | f5 | Restart the engine. |
    | ctrl+up | Go to the messages (then c copy, y copy code, e edit, r regenerate, ←/→ branches). |
    | f6 | Steering panel, beside the transcript (wide) or below it (narrow); F6 or Esc in it closes it. |
    | f7 | Colour the text that came from accepted draft tokens (speculative decoding), or stop. |
    | f10 | Serve the loaded model to other programs (an OpenAI-compatible API; F3 → Server: address, key), or stop. |
    | f12 | Attach an image, or a text file or folder to answer from with citations (a path prompt; Tab completes). |
    """

    AUTO_FOCUS = "#prompt"
    """The prompt has the keys from the first frame, so keys typed while the app starts go to it, not to the
    conversation search (the first focusable widget: Textual's default focus until on_mount ends)."""

    # The footer shows the shown bindings in this order, most useful first, and all of them fit in 80 columns (at
    # most 69 cells beside "^p palette"; tests/tui/test_first_hour.py checks it): Stop while a reply is written,
    # then help, models, speculation, steering, a new conversation, Continue where a reply can go on, Quit. F1
    # lists every key; the app's own bindings for f1, f4, f9, f6 and ctrl+q stay for the other screens.
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),  # shown while a reply is written
        Binding("escape", "back", "Back", show=False, priority=True),  # otherwise: leave editing, clear search, …
        Binding("f1", "app.help", "Help"),
        Binding("ctrl+l", "switch_model", "Model", tooltip="Switch model: every model on this machine"),
        Binding("f4", "app.models", "Models", tooltip="Catalog, Hugging Face search, downloads, local models"),
        Binding("f9", "app.speculative_panel", "Spec", tooltip="Speculative decoding: type, draft model, check"),
        Binding("f6", "app.steering", "Steer", priority=True, tooltip="Steering: control-vector sliders"),
        Binding("ctrl+n", "new_conversation", "New", tooltip="New conversation"),
        Binding("ctrl+g", "continue_reply", "Go on", tooltip="Continue the last reply from where it ends"),
        Binding("ctrl+q", "app.quit", "Quit"),  # the App's (a priority binding) takes this place in the footer
        Binding("ctrl+r", "regenerate", "Regenerate", show=False),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False),
        Binding("ctrl+f", "search", "Search", show=False),
        Binding("ctrl+s", "conversation_settings", "Settings", show=False),
        Binding("f2", "rename_conversation", "Rename", show=False),
        Binding("f5", "restart_engine", "Restart engine", show=False),
        Binding("ctrl+up", "focus_messages", "Messages", show=False),
        Binding(ATTACH_KEY, "attach_image", "Attach image or document", show=False),
        Binding("f7", "toggle_draft_colouring", "Draft colours", show=False, priority=True),  # over select-all
        # Over the prompt's end-of-line only while the model thinks (check_action; otherwise ctrl+e is the prompt's).
        Binding("ctrl+e", "stop_thinking", "Answer now", show=False, priority=True),
    ]

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

    def __init__(self) -> None:
        super().__init__()
        use_cropped_compositor(self)  # a streamed line repaints that line, not the widgets under it
        self.conversation_id: int | None = None
        self.edit_target: int | None = None
        self.editing_reply = False
        """Whether `edit_target` is a reply (changed in place) rather than a question (resent as a new branch)."""
        self._draft_before_edit = ""
        self._deleted: list[int] = []
        self._prompt_blink = True  # the prompt's cursor blink setting, restored when a reply ends
        self.measured: set[int] = set()
        self._measured_on = ""  # the model those were measured on
        self._model_shown: object = None  # the loaded model the stats bar was last told of
        self._steering_shown: tuple[object, tuple[int, str]] = (None, (0, ""))  # the panel's applied mix, new vector

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield AppHeader(id="header")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield ConversationList(id="conversations")
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield Static("", id="edit-banner")
                yield AttachmentsBar(id="attachments")
                yield PromptInput(id="prompt", placeholder="Message  (Enter sends · Shift+Enter or Ctrl+J new line)")
                yield StatsBar(id="stats")
            yield SteeringPanel(id="steering-panel")  # F6: docked beside the chat (wide) or below it (narrow)
        yield Footer(compact=True)

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
        self.app.generation.router.default = self  # events of requests nobody registered (or with no id) come here
        self.watch(self.app, "features_version", self.refresh_feature_readouts, init=False)
        self.watch(self.app, "engine_version", self.sync_engine_state, init=False)
        self.query_one("#edit-banner").display = False
        self.query_one("#sidebar").display = self.app.config.show_sidebar
        self.transcript.dark = self.app.current_theme.dark
        self.transcript.read_image = self.app.store.read_image
        self.transcript.colour_drafts = self.app.config.draft_colouring
        self._measured_on = self.app.model.path if self.app.model else ""
        self._model_shown = self.app.model
        self.sync_engine_state()
        conversations = self.app.store.list_conversations()
        if conversations:
            await self.open_conversation(conversations[0].id)
        else:
            await self.open_conversation(None)
        self.prompt.focus()

    def on_unmount(self) -> None:
        if self.app.generation.router.default is self:
            self.app.generation.router.default = None

    def refresh_feature_readouts(self) -> None:
        """The meter under the transcript (while speculation is on) and the stats bar's spec/steer readouts."""
        try:
            stats_bar = self.stats
        except NoMatches:
            return
        speculation = self.app.speculation
        settings = self.app.config.speculative
        meters = list(self.query(SpecMeter))
        container = stats_bar.parent
        if settings.enabled and not meters and isinstance(container, Widget):
            meter = SpecMeter(id="spec-meter")
            container.mount(meter, before=stats_bar)
            meters = [meter]
        elif not settings.enabled:
            for meter in meters:
                meter.remove()
            meters = []
        for meter in meters:
            meter.expanded = self.app.config.spec_details
            meter.spec_type = settings.spec_type
            meter.drafters = speculation.drafters
            meter.noise = speculation.speed_noise
            meter.stats = speculation.stats
        extras = {k: v for k, v in stats_bar.extras.items() if k not in ("spec", "steer", "api")}
        if settings.enabled:
            extras["spec"] = (
                short_summary(speculation.stats, speculation.speed_noise) if speculation.stats else settings.spec_type
            )
        steer = self.app.steering.readout()
        if steer:
            extras["steer"] = steer
        api = self.app.server.readout()
        if api:
            extras["api"] = api
        if extras != stats_bar.extras:
            stats_bar.extras = extras
        self._sync_steering_panel()

    def _sync_steering_panel(self) -> None:
        """What the steering controller learnt since: the mix the engine applies now, a vector just made (listed,
        focused, when the panel is open)."""
        steering, panel = self.app.steering, self.steering_panel
        applied_shown, made_shown = self._steering_shown
        self._steering_shown = (steering.applied, steering.vectors_made)
        if steering.applied is not None and steering.applied is not applied_shown:
            panel.show_applied(steering.applied)
        if steering.vectors_made != made_shown and steering.vectors_made[0] and panel.is_open:
            self.call_later(panel.refresh_vectors, focus_path=steering.vectors_made[1])

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_WIDTH, "-narrow")
        self.set_class(event.size.width >= STEERING_BESIDE_WIDTH, "-steering-beside")
        self.refresh_bindings()  # the footer shows what fits the new width

    def sync_engine_state(self) -> None:
        """Copy the app's engine state into the header and the stats bar."""
        try:
            header, stats = self.header, self.stats
        except NoMatches:  # not composed yet (on_mount syncs) or closing
            return
        app = self.app
        model = app.model
        if model is not None and model is not self._model_shown:  # a model was loaded
            self._model_shown = model
            self.model_loaded(model.path)
            stats.n_ctx = model.n_ctx
        for widget in (header, stats):
            widget.engine_state = app.engine_state
            # "vision": the model loaded with its projector, so it sees attached images
            widget.backend = (f"{model.backend} · vision" if model.sees_images else model.backend) if model else ""
        header.model_name = model.name if model else ""
        if model is not None and not stats.n_ctx:
            stats.n_ctx = model.n_ctx
        stats.progress = app.load_progress
        self.refresh_bindings()

    def model_loaded(self, path: str) -> None:
        """A model is loaded: another model's figures no longer describe this one, so the stats bar starts over
        (the same model reloaded, after a crash or F5, keeps them)."""
        if path == self._measured_on:
            return
        self._measured_on = path
        self.measured.clear()
        if self.app.generation.active is None:
            self.stats.set_stats({})
            self.stats.cpu = None

    def action_back(self) -> None:
        """Esc when no reply is being written: leave editing, clear the search, or go back to the prompt."""
        if self.edit_target is not None:
            self._leave_edit_mode(restore=True)
            return
        if self._clear_search():
            return
        if not self.prompt.has_focus:
            self.prompt.focus()

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
            if not self._busy():
                self._enter_edit_mode(message)
        elif event.action == "regenerate":
            await self.action_regenerate(message.id)
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
        if self._busy():
            return
        store = self.app.store
        siblings = store.siblings(message.id)
        index = siblings.index + step
        if not 0 <= index < len(siblings.messages):
            return
        store.switch_branch(siblings.messages[index].id)
        await self.reload_transcript()
        target_id = siblings.messages[index].id
        for view in self.transcript.views():
            if view.message.id == target_id:
                view.focus()
                view.scroll_visible(animate=False)
                break

    async def _save_reply_edit(self, message_id: int, text: str) -> None:
        """Change a reply's text in place; ctrl+g then continues it from its new end."""
        try:
            message = self.app.store.edit_assistant_message(message_id, text)
        except (StoreError, ValueError) as error:
            self.notify(f"The reply was not changed: {error}", severity="error")
            return
        self._leave_edit_mode(restore=True)
        await self.reload_transcript()
        last = self.app.generation.last_reply(self.conversation_id)
        more = " ctrl+g continues it from there." if last is not None and last.id == message.id else ""
        self.notify("Reply changed." + more)

    def _enter_edit_mode(self, message: Message) -> None:
        if self.edit_target is None:
            self._draft_before_edit = self.prompt.text
        self.edit_target = message.id
        self.editing_reply = message.role == "assistant"
        banner = self.query_one("#edit-banner", Static)
        banner.update(
            "Editing a reply: Enter saves the new text in place (then ctrl+g continues it if it is the "
            "last one), Esc cancels."
            if self.editing_reply
            else "Editing an earlier message: Enter resends it as a new branch (the old one stays), Esc cancels."
        )
        banner.display = True
        self.prompt.load_text(message.content)
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()

    def _leave_edit_mode(self, *, restore: bool) -> None:
        if self.edit_target is None:
            return
        self.edit_target = None
        self.editing_reply = False
        self.query_one("#edit-banner").display = False
        if restore:
            self.prompt.load_text(self._draft_before_edit)
        self._draft_before_edit = ""

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
        if action == "stop_thinking":
            return self.generation is not None and not self.generation.answering and not self.generation.cancelling
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
