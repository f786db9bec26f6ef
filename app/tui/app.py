"""The Textual app: opens the store, the settings and the engine, creates the controllers, and routes engine events to
them and to the screens (generation events to the request's owner)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import events, work
from textual.app import SystemCommand
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer

from app.core import paths
from app.core.config import (
    Config,
    ConfigError,
    RemoteSettings,
    SamplingSettings,
    SpeculativeSettings,
    save_config,
)
from app.core.engine import Engine, ModelSummary
from app.core.generation import GenerationController, GenerationRouter
from app.core.model_paths import user_path
from app.core.remote_engine import RemoteChoice
from app.core.store import Store
from app.tui.app_keys import APP_BINDINGS
from app.tui.bridge import EngineBridge
from app.tui.controllers import (
    ConversationsController,
    ModelsController,
    SpeculationController,
    SteeringController,
)
from app.tui.controllers.server import ServerController
from app.tui.engine_events import EngineEvents
from app.tui.modals.pick import PickModal
from app.tui.palette import palette_commands
from app.tui.remote_bridge import RemoteBridge
from app.tui.reply_owner import ReplyOwner
from app.tui.screens.chat_screen import ChatScreen
from app.tui.start_up import StartUpRead, read_start_up
from app.tui.textual_internals.terminal_text import drop_controls_from_terminal_output
from app.tui.widgets.image_preview import detect_terminal_graphics
from engine_ext.untrusted_text import shown

THEME_NAMES = {"dark": "textual-dark", "light": "textual-light"}


class LlmtuiApp(EngineEvents):
    """llmtui's chat app. `model`: a path or 'starter' (default: the last model used, else the starter)."""

    features_version: var[int] = var(0)
    """Bumped when speculation or steering state changes (the controllers publish, the chat screen watches)."""
    engine_version: var[int] = var(0)
    """Bumped when the engine's state, its model or the load's progress changes (the chat screen watches)."""

    CSS_PATH = str(paths.assets_dir() / "llmtui.tcss")
    TITLE = "llmtui"
    BINDINGS = APP_BINDINGS

    def __init__(
        self,
        model: str | None = None,
        *,
        start_engine: bool = True,
        default_sampling: SamplingSettings | None = None,
        engine_overrides: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        drop_controls_from_terminal_output()  # the last check: no control character from any widget's text
        self.requested_model = model
        self.engine_overrides: dict[str, Any] = dict(engine_overrides or {})
        """Engine settings for this session over the saved ones (--no-repack, a crash fallback), by field name."""
        self.start_engine = start_engine
        self.default_sampling = default_sampling or SamplingSettings()
        """Sampling for new conversations."""
        self.config = Config()
        self.store: Store
        self.started = False
        """Whether the settings and the history are read (on_mount reads them in a thread)."""
        self._keys_before_start: list[events.Key] = []
        """Keys typed while the app starts, for the first screen's prompt (but ctrl+q, which quits at once)."""
        self.bridge: Engine = self.local_bridge()
        """The engine in use: the local worker, or a remote OpenAI-compatible server (ctrl+l switches)."""
        self.engine_state = "starting"
        self.model: ModelSummary | None = None
        self.load_progress: float | None = None
        self.model_path: str | None = None
        self.speculation = SpeculationController(self)
        self.models = ModelsController(self, self.speculation)
        self.steering = SteeringController(self, self.models)
        self.generation: GenerationController[ReplyOwner] = GenerationController(self, GenerationRouter())
        """Every reply's lifecycle; its router takes generation events to the request's owner (the chat, a view)."""
        self.conversations = ConversationsController(self)
        self.server = ServerController(self)
        """The API server (F10): the loaded model served to other programs while you chat."""
        self._server_timer: Timer | None = None

    # ----- startup and shutdown -----

    def on_mount(self) -> None:
        """The first frame comes first: the settings, the history (opened and migrated) and the model to start with
        are read in a thread (`_read_start_up`); `on_start_up_read` goes on with them on the event loop."""
        self.screen_change_signal.subscribe(self, self._toasts_on_top_screen_only)
        self._read_start_up()

    def _toasts_on_top_screen_only(self, _screen: Screen[Any]) -> None:
        """Each screen has its toasts; a screen under a dialog (drawn through its dimmed backdrop) hides its own, so
        a notice shows once, in the dialog's. Its toasts come back when it is on top again (Textual shows them)."""
        for screen in self.screen_stack[:-1]:
            for rack in screen.query("ToastRack"):
                rack.display = False

    @work(thread=True, exclusive=True, group="start-up")
    def _read_start_up(self) -> None:
        start = read_start_up(self.requested_model)
        if not self.post_message(StartUpRead(start)) and start.store is not None:
            start.store.close()  # the app ended meanwhile

    def on_start_up_read(self, event: StartUpRead) -> None:
        start = event.start
        for message, severity, timeout in start.notices:
            self.notify(message, severity=severity, timeout=timeout)
        if start.store is None:
            self.exit(message=start.failure)
            return
        self.config = start.config
        self.theme = THEME_NAMES.get(self.config.theme, "textual-dark")
        self.store = start.store
        self.started = True
        if start.remote is not None:
            self.push_screen(ChatScreen())
            self.use_remote(start.remote)
            self._replay_keys_before_start()
            return
        if start.model is None:
            from app.tui.screens.first_run import FirstRunScreen

            self.engine_state = "no model"
            self.push_screen(FirstRunScreen())
        else:
            self.push_screen(ChatScreen())
            self.load_model(start.model)
        self._replay_keys_before_start()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not self.started and not event.is_forwarded and event.key != "ctrl+q":
            self._keys_before_start.append(event)  # for the first screen, in order
            return
        await super().on_event(event)

    def _replay_keys_before_start(self) -> None:
        """The keys typed while the app started go to the first screen, queued after its mount as they were when
        on_mount pushed it at once."""
        keys, self._keys_before_start = self._keys_before_start, []
        for key in keys:
            self.post_message(events.Key(key.key, key.character))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Until the settings and the history are read, only quitting (a setting saved then would save defaults)."""
        return True if self.started or action == "quit" else None

    def local_bridge(self) -> EngineBridge:
        return EngineBridge(self, paths.log_dir() / "engine.log", backlog=lambda: self.message_queue_size)

    def remote_bridge(self, remote: RemoteSettings, model: str) -> RemoteBridge:
        return RemoteBridge(self, remote, model)

    def use_remote(self, choice: RemoteChoice) -> None:
        """Switch to a remote engine's model (the local engine is shut down; picking a local model starts it)."""
        if self.server.running and not self.config.server.router:
            self.server.stop()  # it serves the app's own engine only (the router: every local model)
        self.models.use_remote(choice)

    def load_model(self, path: Path) -> None:
        self.models.load(path)

    async def on_unmount(self) -> None:
        self.server.stop(quiet=True)
        self.bridge.close()
        await asyncio.to_thread(self.generation.chat_tools.close)  # the MCP servers the chat started
        self.models.join_closing(5.0)
        store = getattr(self, "store", None)
        if store is not None:
            store.close()

    # ----- state -----

    @property
    def chat(self) -> ChatScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        return None

    def reply_in_progress(self) -> bool:
        return self.generation.active is not None

    def reply_position(self) -> tuple[int, int] | None:
        active = self.generation.active
        return (active.message_id, active.recorder.tokens) if active is not None else None

    def features_changed(self) -> None:
        """The controllers publish a change of speculation or steering state; the chat screen watches this."""
        self.features_version += 1
        self.server.app_changed()

    def action_toggle_server(self) -> None:
        """F10: serve the loaded model to other programs (an OpenAI-compatible API), or stop."""
        self.server.toggle()
        if self._server_timer is None:
            self._server_timer = self.set_interval(1.0, self.server.poll)  # the readout's requests in flight

    def refresh_feature_readouts(self) -> None:
        """Redraw the meter under the transcript (while speculation is on) and the stats bar's spec/steer readouts."""
        self.features_changed()

    def set_engine_state(self, state: str) -> None:
        self.engine_state = state
        self.engine_changed()

    def engine_changed(self) -> None:
        """Publish a change of the engine's state, its model or the load's progress (the chat screen watches)."""
        self.engine_version += 1

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every notification (screens' and widgets' too) with its control characters made visible: a message often
        quotes a name or an error from outside (engine_ext.untrusted_text.shown). A message whose markup does not
        parse (a name holding "[/x]") is shown as plain text: Textual's toast would raise in its render and end the
        app."""
        text = shown(message, multiline=True)
        if markup:
            try:
                Content.from_markup(text)
            except Exception:  # MarkupError, and what a malformed tag's value raises
                markup = False
        super().notify(text, title=shown(title), severity=severity, timeout=timeout, markup=markup)

    def default_conversation_settings(self) -> dict[str, object]:
        return {"sampling": self.default_sampling.to_json()}

    def remember_sidebar(self, shown: bool) -> None:
        self.config = replace(self.config, show_sidebar=shown)
        self.save_config_quietly()

    def save_config_quietly(self) -> None:
        try:
            save_config(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="error")

    def save_settings(self, config: Config, changes: tuple[str, ...] | None = None) -> None:
        """Save new settings (ConfigError when invalid or unwritable) and apply the theme; `changes`: what the
        settings screen changed, said in the toast."""
        save_config(config)
        engine_changed = config.engine != self.config.engine
        for name in list(self.engine_overrides):  # a setting saved anew is the user's choice over the session's
            if getattr(config.engine, name) != getattr(self.config.engine, name):
                del self.engine_overrides[name]
        self.bridge.settings_saved(config)
        server_changed = config.server != self.config.server
        self.config = config
        self.theme = THEME_NAMES.get(config.theme, "textual-dark")
        if server_changed:
            self.server.config_changed()
        message = "Settings saved."
        if changes is not None:
            message = f"Settings saved: {'; '.join(changes)}." if changes else "Settings saved: nothing changed."
        if engine_changed and self.model_path:
            message += " Engine options apply when a model is next loaded (ctrl+l)."
        self.notify(message, markup=False)

    # ----- actions -----

    def action_toggle_speculation(self) -> None:
        self.speculation.toggle()

    def action_toggle_spec_details(self) -> None:
        self.speculation.toggle_details()

    def action_speculative_panel(self) -> None:
        from app.tui.modals.speculative import SpeculativeModal

        if isinstance(self.screen, SpeculativeModal):
            return
        speculation = self.speculation
        name = self.model.name if self.model else ""
        panel = SpeculativeModal(
            self.config.speculative, self.model_path, name, speculation.draft_sidecars, speculation.missing_drafts
        )

        def chosen(settings: SpeculativeSettings | None) -> None:
            if settings is not None:
                speculation.apply(settings)
                if panel.check_after:
                    self.action_spec_check(settings)

        self.push_screen(panel, chosen)

    def action_spec_check(self, settings: SpeculativeSettings | None = None) -> None:
        """Open the speculation check: the prompt decoded plainly and with `settings` (default: the user's)."""
        from app.tui.screens.spec_check import DEFAULT_PROMPT, SpecCheckScreen

        if self.model_path is None or not self.bridge.capabilities.speculation:  # (a model may be loading)
            self.notify("Load a local model first (ctrl+l): the check runs on llmtui's own engine.", severity="warning")
            return
        if self.open_screen(SpecCheckScreen) is not None:
            return
        self.push_screen(SpecCheckScreen(settings or self.config.speculative, self._last_user_message(DEFAULT_PROMPT)))

    async def action_steering(self) -> None:
        """F6: the steering panel of the chat, opened or closed (it sits beside or below the transcript)."""
        chat = self.chat
        if chat is None:
            return
        if not chat.steering_panel.is_open and self.model is None:
            self.notify("Load a model first (ctrl+l): steering acts on the loaded model.", severity="warning")
            return
        if self.screen is not chat:
            if chat.steering_panel.is_open:
                return  # a dialog over the chat (make, add a file) has the keys
            self.notify("The steering panel is part of the chat: go back to it (Esc) and press F6.")
            return
        await chat.toggle_steering()

    def action_make_vector(self) -> None:
        from app.tui.modals.make_vector import MakeVectorModal

        if self.model is None:
            self.notify("Load a model first (ctrl+l): a vector is made for one model.", severity="warning")
            return
        self.push_screen(MakeVectorModal(Path(self.model.path).stem))

    def action_steering_ab(self) -> None:
        from app.tui.screens.steering_ab import DEFAULT_PROMPT, SteeringABScreen

        if self.model is None:
            self.notify("Load a model first (ctrl+l).", severity="warning")
            return
        prompt = self._last_user_message(DEFAULT_PROMPT)
        mix = self.steering.mix_summary()
        if not mix:
            self.notify("Every strength is 0: B will be the same as A. Move a slider first.")
        self.push_screen(SteeringABScreen(prompt, mix))

    def _last_user_message(self, default: str) -> str:
        """The open conversation's last message from the user (what the A/B views run by default)."""
        chat = self.chat
        if chat is None or chat.conversation_id is None:
            return default
        path = self.store.tree.active_path(chat.conversation_id)
        return next((m.content for m in reversed(path) if m.role == "user"), default)

    def action_restart_engine(self) -> None:
        if self.engine_state not in ("crashed", "error", "ready"):
            self.notify("The engine is busy; stop the reply first.")
            return
        self.model = None
        self.set_engine_state("starting")
        self.bridge.start()
        self.bridge.restart(self.models.engine_settings())  # the settings saved since the model was loaded apply

    def action_help(self) -> None:
        from app.tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        theme = "light" if self.config.theme == "dark" else "dark"
        self.config = replace(self.config, theme=theme)
        self.theme = THEME_NAMES[theme]
        self.save_config_quietly()

    def action_settings(self, field: str | None = None) -> None:
        """F3; `field`: an engine setting's name to focus (the palette's entries for one setting)."""
        from app.tui.screens.settings_screen import SettingsScreen

        if not isinstance(self.screen, SettingsScreen):
            self.push_screen(SettingsScreen(self.config, focus=field))

    def action_repack_setting(self) -> None:
        """The palette's "Repack weights": Settings with the repacking field focused (the crash toasts name it)."""
        self.action_settings("use_extra_bufts")

    def action_switch_model(self) -> None:
        from app.tui.modals.model_switcher import ModelSwitcherModal

        if self.generation.active is not None:
            self.notify("A reply is being written; press Esc to stop it first.", severity="warning")
            return

        def switch(choice: Path | RemoteChoice | None) -> None:
            if isinstance(choice, RemoteChoice):
                if self.chat is None:
                    self.switch_screen(ChatScreen())
                self.use_remote(choice)
            elif choice is not None:
                self.open_model(choice)

        # The local files are looked for by the switcher, in a thread (no folder scan on the event loop).
        self.push_screen(
            ModelSwitcherModal(
                None, self.model_path, self.config.remotes, folders=self.config.model_folders, served=self.server.served
            ),
            switch,
        )

    def open_model(self, path: Path) -> None:
        """Load a model file and show the chat (the model switcher and the models screen's "use" call this)."""
        if self.chat is None:
            self.switch_screen(ChatScreen())
        self.load_model(path)

    def unfinished_downloads(self) -> list[str]:
        """The downloads the models screen (F4) has not finished: running, queued or paused ("name (state)")."""
        from app.tui.screens.models_screen import SCREEN_NAME, ModelsScreen
        from models_catalog.download import FINAL_STATES

        if not self.is_screen_installed(SCREEN_NAME):
            return []
        screen = self.get_screen(SCREEN_NAME)
        downloads = screen.downloads if isinstance(screen, ModelsScreen) else None
        if downloads is None:
            return []
        return [f"{t.file.name} ({t.state})" for t in downloads.queue.tasks() if t.state not in FINAL_STATES]

    async def action_quit(self) -> None:
        """ctrl+q: quit at once, unless downloads are unfinished: then ask (a second ctrl+q quits). Quitting pauses
        them; their bytes are kept and the next pull of the same model resumes them."""
        unfinished = self.unfinished_downloads()
        if not unfinished or isinstance(self.screen, QuitWithDownloadsModal):
            self.exit()
            return
        shown = ", ".join(unfinished[:3]) + (f" and {len(unfinished) - 3} more" if len(unfinished) > 3 else "")
        title = f"{len(unfinished)} download{'s' if len(unfinished) > 1 else ''} not finished: {shown}"

        def chosen(index: int | None) -> None:
            if index == 0:
                self.exit()

        self.push_screen(
            QuitWithDownloadsModal(
                title, ["Quit: they pause, and a pull of the same model later resumes them", "Stay"]
            ),
            chosen,
        )

    def action_models(self) -> None:
        from app.tui.screens.models_screen import open_models_screen

        open_models_screen(self)

    def action_import_conversation(self) -> None:
        from app.tui.modals.text_prompt import TextPromptModal

        def import_file(text: str | None) -> None:
            if not text:
                return
            path = user_path(text.strip())
            if path is None:
                self.notify(f"{text.strip()!r} cannot be a path.", severity="error", timeout=10)
                return
            self.conversations.import_file(path)

        self.push_screen(
            TextPromptModal("Import a conversation (JSON exported by llmtui)", "", "path to .json"), import_file
        )

    def show_conversation(self, conversation_id: int) -> None:
        chat = self.chat
        if chat is not None and self.generation.active is None:
            self.call_later(chat.conversations.open_conversation, conversation_id)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette's entries: the app's own, grouped (app/tui/palette.py)."""
        return palette_commands(self, screen, self.chat)


class QuitWithDownloadsModal(PickModal):
    """ctrl+q with unfinished downloads: quit (they pause, resumable) or stay."""


def run_tui(model: str | None = None, *, no_repack: bool = False) -> int:
    """Run the app until the user quits; the exit status. `no_repack`: --no-repack for this session."""
    app = LlmtuiApp(model, engine_overrides={"use_extra_bufts": False} if no_repack else None)
    detect_terminal_graphics()  # Kitty or Sixel pictures: asked now, as the terminal cannot be asked once the app draws
    app.run()
    return app.return_code or 0
