"""The chat screen: conversation list, transcript, prompt, stats bar; sending, streaming, branching."""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rich.cells import cell_len
from textual import events, on
from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Input, Static

from app.config import ConfigError, SamplingSettings, save_config
from app.messages import (
    EngineCrashed,
    GenerationFailed,
    GenerationFinished,
    GenerationStatsUpdated,
    PromptProgressed,
    TokensArrived,
)
from app.recording import ReplyRecorder
from app.screens.steering import SteeringPanel
from app.speculation import short_summary
from app.store import Conversation, Message, StoreError
from app.textual_internals.compositor import use_cropped_compositor
from app.widgets.draft_provenance import draft_spans_from_stats
from app.widgets.markdown_render import code_blocks
from app.widgets.message_view import BranchInfo, MessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.sidebar import ConversationList
from app.widgets.spec_meter import SpecMeter
from app.widgets.status import AppHeader, StatsBar
from app.widgets.transcript import Transcript

if TYPE_CHECKING:
    from app.shell import LlmtuiShell
    from engine_ext.protocol import SpeculativeStats

PURGE_AFTER = timedelta(days=30)
IDLE_COLLECT_AFTER_S = 2.0
NARROW_WIDTH = 100  # below this many columns the conversation list is narrower
STEERING_BESIDE_WIDTH = 110  # from this many columns the steering panel sits beside the transcript, else below it
FULL_COLLECTIONS_PAUSED = 1_000_000
DEFAULT_OLD_THRESHOLD = gc.get_threshold()[2]


def pause_full_collections() -> None:
    """Keep the garbage collector off the objects that exist now (the UI, the transcript) while a reply streams.

    A full collection walks every object Textual and Rich hold, 50–200 ms with a long transcript: the
    objects that exist are frozen (never scanned) and no full collection runs until `collect_now`, which
    runs one when the reply has ended and the app is idle. Young generations are still collected.
    """
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTIONS_PAUSED)


def collect_now() -> None:
    """Collect everything once (call when idle), freeze what survives, and allow full collections again."""
    young, middle, old = gc.get_threshold()
    if old == FULL_COLLECTIONS_PAUSED:
        gc.set_threshold(young, middle, DEFAULT_OLD_THRESHOLD)
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@dataclass
class ActiveGeneration:
    """The reply being streamed."""

    request_id: int
    """0 until the request is sent (just after the screen shows the new reply)."""
    conversation_id: int
    message_id: int
    recorder: ReplyRecorder
    cancelling: bool = False


def branch_map(messages: list[Message]) -> dict[int, BranchInfo]:
    """Each message's position among its siblings (same parent), from one list of a conversation's messages."""
    by_parent: dict[int | None, list[Message]] = {}
    for message in messages:
        by_parent.setdefault(message.parent_id, []).append(message)
    branches: dict[int, BranchInfo] = {}
    for siblings in by_parent.values():
        siblings.sort(key=lambda m: (m.created_at, m.id))
        for index, message in enumerate(siblings):
            branches[message.id] = BranchInfo(index + 1, len(siblings))
    return branches


class ChatScreen(Screen[None]):
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
        Binding("f7", "toggle_draft_colouring", "Draft colours", show=False, priority=True),  # over select-all
    ]

    app: LlmtuiShell

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
        self.generation: ActiveGeneration | None = None
        self.edit_target: int | None = None
        self.editing_reply = False
        """Whether `edit_target` is a reply (changed in place) rather than a question (resent as a new branch)."""
        self._draft_before_edit = ""
        self._deleted: list[int] = []
        self._prompt_blink = True  # the prompt's cursor blink setting, restored when a reply ends
        self.replies_started = 0
        """Replies started since the screen opened (tests and benchmarks wait on it)."""
        self.measured: set[int] = set()
        """Replies whose figures (tok/s, TTFT…) were measured in this session on the model loaded now: the only ones
        the stats bar shows (an earlier session's or another model's figures would mislead)."""
        self._measured_on = ""  # the model those were measured on

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield AppHeader(id="header")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield ConversationList(id="conversations")
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield Static("", id="edit-banner")
                yield PromptInput(id="prompt", placeholder="Message  (Enter sends · Shift+Enter or Ctrl+J new line)")
                yield StatsBar(id="stats")
            yield SteeringPanel(id="steering-panel")  # F6: docked beside the chat (wide) or below it (narrow)
        yield Footer(compact=True)

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def stats(self) -> StatsBar:
        return self.query_one(StatsBar)

    @property
    def steering_panel(self) -> SteeringPanel:
        return self.query_one(SteeringPanel)

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

    @property
    def header(self) -> AppHeader:
        return self.query_one(AppHeader)

    @property
    def conversation_list(self) -> ConversationList:
        return self.query_one(ConversationList)

    async def on_mount(self) -> None:
        self.app.generation.default = self  # events of requests nobody registered (or with no id) come here
        self.watch(self.app, "features_version", self.refresh_feature_readouts, init=False)
        self.query_one("#edit-banner").display = False
        self.query_one("#sidebar").display = self.app.config.show_sidebar
        self.transcript.dark = self.app.current_theme.dark
        self.transcript.colour_drafts = self.app.config.draft_colouring
        self._measured_on = self.app.model.path if self.app.model else ""
        self.sync_engine_state()
        conversations = self.app.store.list_conversations()
        if conversations:
            await self.open_conversation(conversations[0].id)
        else:
            await self.open_conversation(None)
        self.prompt.focus()

    def on_unmount(self) -> None:
        if self.app.generation.default is self:
            self.app.generation.default = None

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
        extras = {k: v for k, v in stats_bar.extras.items() if k not in ("spec", "steer")}
        if settings.enabled:
            extras["spec"] = (
                short_summary(speculation.stats, speculation.speed_noise) if speculation.stats else settings.spec_type
            )
        steer = self.app.steering.readout()
        if steer:
            extras["steer"] = steer
        if extras != stats_bar.extras:
            stats_bar.extras = extras

    # ----- generation events (the app routes this screen's requests here) -----

    async def generation_tokens(self, event: TokensArrived) -> None:
        await self.on_tokens_arrived(event)

    async def generation_finished(self, event: GenerationFinished) -> None:
        await self.on_generation_finished(event)

    async def generation_failed(self, event: GenerationFailed) -> None:
        await self.on_generation_failed(event)

    def generation_progress(self, event: PromptProgressed | GenerationStatsUpdated) -> None:
        if isinstance(event, PromptProgressed):
            self.on_prompt_progressed(event)
        else:
            self.on_generation_stats_updated(event)

    def generation_stats(self, stats: SpeculativeStats) -> None:
        """The chat's statistics go to the speculation controller (the app sends them there)."""

    def generation_lost(self) -> None:
        """The app ends the chat's reply itself (on_engine_crashed)."""

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
        for widget in (header, stats):
            widget.engine_state = app.engine_state
            widget.backend = model.backend if model else ""
        header.model_name = model.name if model else ""
        if model is not None and not stats.n_ctx:
            stats.n_ctx = model.n_ctx
        stats.progress = app.load_progress
        self.refresh_bindings()

    # ----- conversations -----

    def refresh_conversation_list(self) -> None:
        listing = self.conversation_list
        query = listing.search_text.strip()
        if query:
            listing.show_hits(self.app.store.search(query), self.conversation_id)
        else:
            listing.show_conversations(self.app.store.list_conversations(), self.conversation_id)

    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a conversation (None: a new, empty one that is created on the first message)."""
        self.conversation_id = conversation_id
        self._leave_edit_mode(restore=False)
        if conversation_id is None:
            await self.transcript.show([], {})
            self.header.conversation_title = "New conversation"
            self.stats.set_stats({})  # nothing measured in this conversation yet
        else:
            store = self.app.store
            conversation = store.get_conversation(conversation_id)
            path = store.active_path(conversation_id)
            await self.transcript.show(path, branch_map(store.messages(conversation_id)))
            self.header.conversation_title = conversation.title or "New conversation"
            self._show_last_stats(path)
        self.refresh_conversation_list()
        self.refresh_bindings()  # Continue and Regenerate depend on the conversation's last reply

    def _show_last_stats(self, path: list[Message]) -> None:
        """The stats bar shows the last reply of the branch on screen measured in this session on this model
        (none: "–", and the loaded model's context)."""
        last_stats = next(
            (
                m.stats
                for m in reversed(path)
                if m.id in self.measured and m.role == "assistant" and m.stats and "n_ctx_used" in m.stats
            ),
            None,
        )
        self.stats.set_stats(last_stats or {})
        if last_stats is None:
            self.stats.cpu = None

    def model_loaded(self, path: str) -> None:
        """A model is loaded: another model's figures no longer describe this one, so the stats bar starts over
        (the same model reloaded, after a crash or F5, keeps them)."""
        if path == self._measured_on:
            return
        self._measured_on = path
        self.measured.clear()
        if self.generation is None:
            self.stats.set_stats({})
            self.stats.cpu = None

    async def reload_transcript(self) -> None:
        if self.conversation_id is not None:
            store = self.app.store
            path = store.active_path(self.conversation_id)
            await self.transcript.show(path, branch_map(store.messages(self.conversation_id)))
            if self.generation is None:
                self._show_last_stats(path)  # another branch: its own reply's numbers
            self.refresh_bindings()

    def _ensure_conversation(self) -> Conversation:
        if self.conversation_id is None:
            conversation = self.app.store.create_conversation(settings=self.app.default_conversation_settings())
            self.conversation_id = conversation.id
            return conversation
        return self.app.store.get_conversation(self.conversation_id)

    def conversation_sampling(self, conversation: Conversation) -> SamplingSettings:
        data = conversation.settings.get("sampling", {})
        return SamplingSettings.from_json(data if isinstance(data, dict) else {})

    def _busy(self) -> bool:
        if self.generation is not None:
            self.notify("A reply is being written; press Esc to stop it first.", severity="warning")
            return True
        return False

    @on(ConversationList.Selected)
    async def _conversation_selected(self, event: ConversationList.Selected) -> None:
        if event.conversation_id == self.conversation_id or self._busy():
            return
        await self.open_conversation(event.conversation_id)
        self.prompt.focus()

    @on(ConversationList.SearchChanged)
    def _search_changed(self, event: ConversationList.SearchChanged) -> None:
        self.refresh_conversation_list()

    async def action_new_conversation(self) -> None:
        if self._busy():
            return
        await self.open_conversation(None)
        self.prompt.focus()

    def action_toggle_sidebar(self) -> None:
        """Show the conversation list with the focus in it (its keys d, u, x work at once), or hide it."""
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display
        if sidebar.display:
            self.conversation_list.options.focus()
        elif sidebar.has_focus_within:
            self.prompt.focus()
        self.app.remember_sidebar(bool(sidebar.display))

    def action_search(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one("#conversation-search").focus()

    def _target_conversation(self) -> int | None:
        """The conversation highlighted in the list when it has focus, else the one on screen."""
        if self.conversation_list.has_focus_within:
            highlighted = self.conversation_list.highlighted_id()
            if highlighted is not None:
                return highlighted
        return self.conversation_id

    def action_rename_conversation(self) -> None:
        from app.modals.text_prompt import TextPromptModal

        target = self._target_conversation()
        if target is None:
            self.notify("Send a first message to start the conversation, then rename it.")
            return
        current = self.app.store.get_conversation(target).title

        def rename(title: str | None) -> None:
            if title is None or not title.strip():
                return
            self.app.store.rename_conversation(target, title.strip())
            if target == self.conversation_id:
                self.header.conversation_title = title.strip()
            self.refresh_conversation_list()

        self.app.push_screen(TextPromptModal("Rename conversation", current, "Title"), rename)

    async def action_delete_conversation(self) -> None:
        target = self._target_conversation()
        if target is None or (self.generation is not None and target == self.generation.conversation_id):
            if target is not None:
                self._busy()
            return
        title = self.app.store.get_conversation(target).title or "New conversation"
        self.app.store.delete_conversation(target)
        self._deleted.append(target)
        self.notify(f"Deleted “{title}”. Press u in the list (or “Chat: Undo delete” in ctrl+p) to bring it back.")
        if target == self.conversation_id:
            remaining = self.app.store.list_conversations()
            await self.open_conversation(remaining[0].id if remaining else None)
        else:
            self.refresh_conversation_list()

    async def action_undo_delete(self) -> None:
        while self._deleted:
            target = self._deleted.pop()
            try:
                self.app.store.undo_delete(target)
            except StoreError:
                continue
            self.notify(f"Restored “{self.app.store.get_conversation(target).title or 'New conversation'}”.")
            if self.generation is None:
                await self.open_conversation(target)
            else:
                self.refresh_conversation_list()
            return
        self.notify("Nothing to undo.")

    def action_export_conversation(self) -> None:
        target = self._target_conversation()
        if target is None:
            self.notify("Nothing to export yet.")
            return
        try:
            self.app.conversations.export_in_background(target, self._exported)  # the files are written in a thread
        except StoreError as error:
            self.notify(f"Export failed: {error}", severity="error")

    def _exported(self, result: tuple[Path, Path] | str) -> None:
        if isinstance(result, str):
            self.app.notify(f"Export failed: {result}", severity="error")
            return
        markdown_path, json_path = result
        self.app.notify(f"Exported to {markdown_path} and {json_path.name}.", timeout=8)

    # ----- sending and streaming -----

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    def _engine_ready(self) -> bool:
        state = self.app.engine_state
        if state == "ready":
            return True
        if state in ("loading", "starting"):
            self.notify("The model is still loading; send again in a moment.", severity="warning")
        elif state == "crashed":
            self.notify("The engine stopped. Press F5 to restart it.", severity="error")
        else:
            self.notify("No model is loaded. Press ctrl+l to pick one.", severity="warning")
        return False

    async def send(self, text: str) -> None:
        """Commit the user's message, then start the reply (or, editing a reply, save its new text)."""
        if self.edit_target is not None and self.editing_reply:
            await self._save_reply_edit(self.edit_target, text)
            return
        if self._busy() or not self._engine_ready():
            return
        store = self.app.store
        conversation = self._ensure_conversation()
        try:
            if self.edit_target is not None:
                message = store.edit_user_message(self.edit_target, text)
            else:
                message = store.add_user_message(conversation.id, text)
        except StoreError as error:
            self.notify(str(error), severity="error")
            return
        editing = self.edit_target is not None
        self._leave_edit_mode(restore=False)
        self.prompt.remember(text)
        if editing:
            await self.reload_transcript()
        else:
            branch = branch_map(store.messages(conversation.id)).get(message.id)
            await self.transcript.append(message, branch)
        self.header.conversation_title = store.get_conversation(conversation.id).title or "New conversation"
        self.refresh_conversation_list()
        await self.start_reply(message.id)

    def _engine_messages(self, path: list[Message], conversation: Conversation) -> list[tuple[str, str]]:
        messages: list[tuple[str, str]] = []
        if conversation.system_prompt.strip():
            messages.append(("system", conversation.system_prompt))
        messages.extend((m.role, m.content) for m in path if m.role in ("user", "assistant"))
        return messages

    async def start_reply(self, parent_id: int, *, resume: Message | None = None, reload: bool = False) -> None:
        """Start streaming a reply under `parent_id`, or continue the stopped reply `resume`."""
        store = self.app.store
        assert self.conversation_id is not None
        conversation = store.get_conversation(self.conversation_id)
        model_name = self.app.model.name if self.app.model else ""
        if resume is not None:
            store.resume_assistant_message(resume.id)
            path = store.active_path(conversation.id)
            message_id = resume.id
            # Stopped before any answer text: the engine starts the reply again, thinking included.
            reasoning = resume.reasoning if resume.content else ""
            recorder = ReplyRecorder(store, message_id, content=resume.content, reasoning=reasoning)
            await self.transcript.start_live(
                message_id,
                model_name,
                content=resume.content,
                reasoning=reasoning,
                draft_spans=draft_spans_from_stats(resume.stats),
            )
        else:
            message_id = store.begin_assistant_message(conversation.id, parent_id, model_name)
            path = store.active_path(conversation.id)[:-1]
            recorder = ReplyRecorder(store, message_id)
            if reload:
                await self.reload_transcript()
            await self.transcript.start_live(message_id, model_name)
        sampling = self.conversation_sampling(conversation)
        generation = ActiveGeneration(0, conversation.id, message_id, recorder)
        self.generation = generation
        self.replies_started += 1
        # A steady cursor while the reply streams: each blink repaints the prompt (twice a second), CPU time that a
        # machine whose cores all run the engine takes from decoding.
        self._prompt_blink, self.prompt.cursor_blink = self.prompt.cursor_blink, False
        pause_full_collections()
        self.app.set_engine_state("generating")
        self.stats.decode_tps = self.stats.ttft_ms = None  # the new reply's, once known
        self.stats.generated_tokens = 0
        # The request goes out once the screen has drawn the new messages: mounting them, laying the screen out
        # and repainting it takes tens of milliseconds that would otherwise run alongside the engine's first
        # tokens and, on a machine whose cores all run the engine, slow them (the same wait, paid up front).
        messages = self._engine_messages(path, conversation)
        self.call_after_refresh(self._request_reply, generation, messages, sampling, resume is not None)

    def _request_reply(
        self,
        generation: ActiveGeneration,
        messages: list[tuple[str, str]],
        sampling: SamplingSettings,
        continue_reply: bool,
    ) -> None:
        if self.generation is not generation:
            return  # ended before it was sent (the engine crashed)
        generation.request_id = self.app.bridge.generate(messages, sampling, continue_reply=continue_reply)
        self.app.generation.register(generation.request_id, self)
        if generation.cancelling:  # Esc came first: the engine stops at once and the reply ends as stopped
            self.app.bridge.cancel(generation.request_id)

    async def on_tokens_arrived(self, event: TokensArrived) -> None:
        generation = self.generation
        if generation is None or event.request_id != generation.request_id:
            return
        try:
            generation.recorder.append(event.text, event.reasoning, event.n_tokens)
        except StoreError as error:
            self.notify(f"Could not save the reply: {error}", severity="error")
        self.transcript.write_live(event.text, event.reasoning, event.draft_spans)

    def on_prompt_progressed(self, event: PromptProgressed) -> None:
        if self.generation is None or event.request_id != self.generation.request_id:
            return
        live = self.transcript.live
        if live is not None:
            live.reading(event.done, event.total)

    def on_generation_stats_updated(self, event: GenerationStatsUpdated) -> None:
        if self.generation is None or event.request_id != self.generation.request_id:
            return
        stats = self.stats
        stats.decode_tps = event.tokens_per_s
        stats.generated_tokens = event.n_tokens
        stats.ttft_ms = event.ttft_ms
        stats.cpu = event.cpu  # this reply's: none until measured (the note stays with the finished reply)
        if event.prompt_tokens is not None:
            stats.prompt_tokens = event.prompt_tokens
            stats.n_ctx_used = event.prompt_tokens + event.n_tokens
        if event.n_ctx:
            stats.n_ctx = event.n_ctx

    async def _end_generation(self, state: str, stats: dict[str, Any]) -> None:
        generation = self.generation
        if generation is None:
            return
        self.generation = None
        self.app.generation.release(generation.request_id or None)
        self.prompt.cursor_blink = self._prompt_blink
        store = self.app.store
        live = self.transcript.live
        if live is not None and live.body.draft_spans:
            stats = dict(stats, draft_spans=[list(span) for span in live.body.draft_spans])
        if "n_ctx_used" in stats:
            self.measured.add(generation.message_id)
        try:
            generation.recorder.finish(state, stats)  # type: ignore[arg-type]
            message = store.get_message(generation.message_id)
        except StoreError as error:
            self.notify(f"Could not save the reply: {error}", severity="error")
            return
        branch = branch_map(store.messages(generation.conversation_id)).get(message.id)
        await self.transcript.freeze_live(message, branch)
        self.refresh_bindings()
        self.set_timer(IDLE_COLLECT_AFTER_S, self._collect_when_idle)

    def _collect_when_idle(self) -> None:
        if self.generation is None:
            collect_now()

    async def on_generation_finished(self, event: GenerationFinished) -> None:
        if self.generation is None or event.request_id != self.generation.request_id:
            return
        state = "stopped" if event.stop_reason == "cancelled" else "complete"
        stats = dict(event.stats, stop_reason=event.stop_reason)
        self.stats.set_stats(event.stats)
        await self._end_generation(state, stats)
        self.app.set_engine_state("ready")
        for notice in event.notices:
            self.notify(notice, severity="warning")
        if event.stop_reason == "context_full":
            self.notify(
                "The context is full; start a new conversation or raise the context size (F3).", severity="warning"
            )

    async def on_generation_failed(self, event: GenerationFailed) -> None:
        generation = self.generation
        if generation is not None and event.request_id in (generation.request_id, None):
            await self._end_generation("error", {"error": event.error})
            self.app.set_engine_state("ready" if self.app.model else "no model")
        self.notify(f"Generation failed: {event.error}", severity="error", timeout=10)

    async def on_engine_crashed(self, event: EngineCrashed) -> None:
        await self._end_generation("error", {"error": event.description})

    def action_stop(self) -> None:
        if self.generation is not None:
            if not self.generation.cancelling:
                self.generation.cancelling = True
                if self.generation.request_id:  # else cancelled as soon as it is sent
                    self.app.bridge.cancel(self.generation.request_id)
            return
        self.action_back()

    def action_back(self) -> None:
        """Esc when no reply is being written: leave editing, clear the search, or go back to the prompt."""
        if self.edit_target is not None:
            self._leave_edit_mode(restore=True)
            return
        search = self.query_one("#conversation-search", Input)
        if search.has_focus and search.value:
            search.value = ""  # Esc in the search box clears it first (the list shows every conversation again)
            return
        if not self.prompt.has_focus:
            self.prompt.focus()

    def _last_assistant(self) -> Message | None:
        if self.conversation_id is None:
            return None
        path = self.app.store.active_path(self.conversation_id)
        return path[-1] if path and path[-1].role == "assistant" else None

    async def action_continue_reply(self) -> None:
        if self._busy():
            return
        last = self._last_assistant()
        if last is None or not last.can_continue:
            self.notify(
                "The last reply is complete; there is nothing to continue (edit it with e to cut or change it first)."
            )
            return
        if not self._engine_ready():
            return
        await self.start_reply(last.parent_id or 0, resume=last)

    async def action_regenerate(self, message_id: int | None = None) -> None:
        if self._busy() or self.conversation_id is None:
            return
        store = self.app.store
        if message_id is None:
            last = self._last_assistant()
            if last is None:
                self.notify("There is no reply to regenerate.")
                return
            message = last
        else:
            message = store.get_message(message_id)
        if message.parent_id is None:
            return
        if not self._engine_ready():
            return
        await self.start_reply(message.parent_id, reload=True)

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
        from app.modals.pick import PickModal

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
        last = self._last_assistant()
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

    def action_conversation_settings(self) -> None:
        from app.modals.conversation_settings import ConversationSettingsModal, ConversationSettingsResult

        if self._busy():
            return
        conversation = self._ensure_conversation()
        self.refresh_conversation_list()
        sampling = self.conversation_sampling(conversation)

        def apply(result: ConversationSettingsResult | None) -> None:
            if result is None:
                return
            settings = dict(conversation.settings, sampling=result.sampling.to_json())
            if result.preset_name:
                settings["preset"] = result.preset_name
            try:
                self.app.store.update_settings(conversation.id, system_prompt=result.system_prompt, settings=settings)
                if result.save_as:
                    self.app.store.save_preset(result.save_as, result.sampling.to_json())
            except (StoreError, ValueError) as error:
                self.notify(f"Could not save the settings: {error}", severity="error")
                return
            saved_preset = f" Preset “{result.save_as}” saved." if result.save_as else ""
            self.notify("Conversation settings saved." + saved_preset)

        self.app.push_screen(
            ConversationSettingsModal(conversation.system_prompt, sampling, self.app.store.list_presets()), apply
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop", "back") and self._steering_has_focus():
            return False  # Esc in the steering panel is its own: it closes the panel, the reply goes on
        if action == "stop":
            return self.generation is not None
        if action == "back":
            return self.generation is None
        if action == "continue_reply":
            if self.generation is not None:
                return False
            try:
                last = self._last_assistant()
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


def sampling_from_preset(settings: dict[str, Any]) -> SamplingSettings:
    """A preset's settings as SamplingSettings (bad values fall back to the defaults)."""
    sampling = SamplingSettings.from_json(settings)
    try:
        sampling.validate()
    except ConfigError:
        return replace(SamplingSettings())
    return sampling
