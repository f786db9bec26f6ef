"""Add or edit a remote engine (an OpenAI-compatible endpoint): name, base URL, key, default model."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from app.core.config import REMOTE_STALL_TIMEOUT_S, ConfigError, RemoteSettings
from app.core.remote_http import RemoteError, RemoteModel, list_models
from engine_ext.untrusted_text import one_line

ModelLister = Callable[[RemoteSettings], list[RemoteModel]]


class RemoteEndpointModal(ModalScreen[RemoteSettings | None]):
    """Enter (or ctrl+s) keeps the endpoint when it is valid (the reason shows inline when not), ctrl+t tests
    it (lists its models), Esc cancels. The settings screen saves it to config.toml."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: the remote engine unchanged"),
        Binding("ctrl+s", "keep", "Keep", priority=True, tooltip="Keep the remote engine: saved in config.toml"),
        Binding("ctrl+t", "test", "Test", priority=True, tooltip="Test the remote engine: asks it for its models"),
    ]

    def __init__(self, remote: RemoteSettings | None, taken_names: set[str], lister: ModelLister = list_models) -> None:
        super().__init__(classes="dialog-screen")
        self.remote = remote
        self.taken_names = {name.casefold() for name in taken_names}
        self._lister = lister

    def compose(self) -> ComposeResult:
        remote = self.remote or RemoteSettings("", "")
        with Vertical(classes="dialog wide", id="remote-dialog"):
            yield Label("Edit remote engine" if self.remote else "Add a remote engine", classes="dialog-title")
            with Grid(id="remote-grid"):
                yield Label("Name", classes="field-label")
                yield Input(remote.name, placeholder="e.g. gpu-box", id="remote-name", compact=True)
                yield Label("Base URL", classes="field-label")
                yield Input(remote.base_url, placeholder="http://127.0.0.1:8080/v1", id="remote-base-url", compact=True)
                yield Label("API key env variable", classes="field-label")
                yield Input(
                    remote.api_key_env, placeholder="e.g. VLLM_API_KEY (preferred)", id="remote-key-env", compact=True
                )
                yield Label("API key", classes="field-label")
                yield Input(
                    remote.api_key,
                    placeholder="stored in config.toml; prefer the variable above",
                    password=True,
                    id="remote-key",
                    compact=True,
                )
                yield Label("Default model", classes="field-label")
                yield Input(
                    remote.model, placeholder="empty: the first the server lists", id="remote-model", compact=True
                )
            yield Label("", id="remote-status")
            yield Static(
                "Works with llama-server, vLLM, SGLang and other OpenAI-compatible servers. Prefer the key's "
                "environment variable: it keeps the key out of config.toml (the variable wins when set). "
                "Keys are never shown.",
                classes="dialog-hint",
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Keep", variant="primary", id="remote-keep", compact=True)
                yield Button("Test (ctrl+t)", id="remote-test", compact=True)
                yield Button("Cancel", id="remote-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#remote-status").display = False

    def read(self) -> RemoteSettings:
        """The endpoint on screen, validated (ConfigError says what to fix)."""

        def value(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value.strip()

        remote = RemoteSettings(
            name=value("remote-name"),
            base_url=value("remote-base-url"),
            api_key_env=value("remote-key-env"),
            api_key=value("remote-key"),
            model=value("remote-model"),
            stall_timeout_s=self.remote.stall_timeout_s if self.remote else REMOTE_STALL_TIMEOUT_S,  # config.toml only
        )
        if not remote.name:
            raise ConfigError("give the remote engine a name")
        if not remote.base_url:
            raise ConfigError("give the base URL of the server's OpenAI API (for example http://127.0.0.1:8080/v1)")
        remote.validate()
        if remote.name.casefold() in self.taken_names:
            raise ConfigError(f"another remote engine is already named {remote.name!r}")
        return remote

    def show_status(self, text: str, *, error: bool) -> None:
        status = self.query_one("#remote-status", Label)
        status.update(text)
        status.set_class(error, "error")
        status.display = bool(text)

    def action_keep(self) -> None:
        try:
            remote = self.read()
        except ConfigError as error:
            self.show_status(str(error), error=True)
            return
        self.dismiss(remote)

    def action_test(self) -> None:
        try:
            remote = self.read()
        except ConfigError as error:
            self.show_status(str(error), error=True)
            return
        self.show_status(f"Asking {remote.base_url} for its models…", error=False)
        self.run_worker(
            lambda: self._test(remote), thread=True, group="remote-test", exclusive=True, exit_on_error=False
        )

    def _test(self, remote: RemoteSettings) -> None:
        try:
            models = self._lister(remote)
        except Exception as error:  # RemoteError says what to fix; anything else is shown as it is
            text = str(error) if isinstance(error, RemoteError) else one_line(f"{type(error).__name__}: {error}")
            self.app.call_from_thread(self.show_status, text, error=True)
            return
        names = ", ".join(m.id for m in models[:4]) + (" …" if len(models) > 4 else "")
        text = one_line(f"OK: {len(models)} model{'s' if len(models) != 1 else ''}" + (f" ({names})" if names else ""))
        if remote.model and all(m.id != remote.model for m in models):
            self.app.call_from_thread(self.show_status, f"{text}, but not {remote.model!r}", error=True)
            return
        self.app.call_from_thread(self.show_status, text, error=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_keep()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "remote-keep":
            self.action_keep()
        elif event.button.id == "remote-test":
            self.action_test()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)
