"""The settings screen: engine options (llama.cpp's names), model folders and remote engines, validated and saved
to config.toml."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static, TextArea

from app.core import app_settings_schema as ui
from app.core.config import (
    THEMES,
    Config,
    ConfigError,
    DocumentsSettings,
    EngineSettings,
    RemoteSettings,
    ServerConfig,
    gpu_layers_text,
    parse_field,
    parse_gpu_layers,
)
from app.core.paths import prompt_cache_dir
from engine_ext import settings_schema as s
from engine_ext.settings_schema import Setting
from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell

# Every engine setting (engine_ext.settings_schema.ENGINE), in the order shown; labels carry llama.cpp's flag.
TEXT_FORMS = (s.N_GPU_LAYERS, s.TENSOR_SPLIT, s.RPC_SERVERS)
"""The settings typed as text with their own form ("auto", "3,1", "HOST:PORT, …")."""
NUMBER_FIELDS = tuple(
    setting for setting in s.ENGINE if setting.kind is int and setting not in TEXT_FORMS and not setting.choices
)
CHOICE_FIELDS = tuple(setting for setting in s.ENGINE if setting.choices)
BOOL_FIELDS = tuple(setting for setting in s.ENGINE if setting.kind is bool)
ON_OFF = [("on", True), ("off", False)]
PLACEHOLDERS = {s.N_GPU_LAYERS: "auto", s.TENSOR_SPLIT: "empty: automatic", s.RPC_SERVERS: "none"}
FIELD_ORDER = tuple(setting.name for setting in s.ENGINE)
assert set(FIELD_ORDER) == {f.name for f in fields(EngineSettings)}, "every engine setting is on the screen"


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """'3,1' or '0.75 0.25' → shares per device ('' : automatic)."""
    parts = [part for part in text.replace(",", " ").split() if part]
    try:
        return tuple(float(part) for part in parts)
    except ValueError:
        raise ConfigError(f"tensor split: {text.strip()!r} should be numbers separated by commas, e.g. 3,1") from None


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.replace(",", " ").split() if part)


def remote_line(remote: RemoteSettings) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(remote.name, style="bold")
    line.append(f"  {remote.base_url}")
    line.append(f"  {remote.masked_key()}", style="dim")
    if remote.model:
        line.append(f"  model {remote.model}", style="dim")
    return line


def shown(value: object) -> str:
    """A setting's value as the screen writes it: on/off, a list with commas, "none" for nothing."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(f"{part:g}" if isinstance(part, float) else str(part) for part in value) or "none"
    return str(value) if value != "" else "none"


def settings_changes(old: Config, new: Config) -> tuple[str, ...]:
    """What the settings screen changed, a phrase each ("context size 4096 → 8192"), for the toast on save."""
    changes = [
        f"{setting.label} {shown(getattr(old.engine, setting.name))} → {shown(getattr(new.engine, setting.name))}"
        for setting in s.ENGINE
        if getattr(old.engine, setting.name) != getattr(new.engine, setting.name)
    ]
    if old.theme != new.theme:
        changes.append(f"theme {old.theme} → {new.theme}")
    if old.model_folders != new.model_folders:
        changes.append("model folders")
    if old.remotes != new.remotes:
        changes.append("remote engines")
    changes += [
        f"API server: {setting.label} {shown(getattr(old.server, setting.name))} → "
        f"{shown(getattr(new.server, setting.name))}"
        for setting in ui.SERVER
        if getattr(old.server, setting.name) != getattr(new.server, setting.name)
    ]
    changes += [
        f"documents: {setting.label} {getattr(old.documents, setting.name) or 'default'} → "
        f"{getattr(new.documents, setting.name) or 'default'}"
        for setting in ui.DOCUMENTS
        if getattr(old.documents, setting.name) != getattr(new.documents, setting.name)
    ]
    return tuple(changes)


class SettingsScreen(Screen[bool]):
    """Ctrl+S saves (dismisses with True), Esc goes back without saving (False).

    A value llama.cpp would reject, or a combination it would abort on, is refused with the reason shown above the
    fields (and as a notification); nothing is saved until every value is valid.
    """

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Save the settings: to config.toml"),
        Binding("escape", "cancel", "Back", tooltip="Back: without saving"),
    ]

    app: LlmtuiShell

    def __init__(self, config: Config, *, focus: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.focus_field = focus  # an engine setting's name to focus at once (FIELD_ORDER), or None
        self.remotes: list[RemoteSettings] = list(config.remotes)

    def compose(self) -> ComposeResult:
        with Vertical(id="settings"):
            yield Label("Settings", classes="screen-title")
            yield Static("", id="settings-error")
            with VerticalScroll(id="settings-body"):
                yield Label("Engine (applies when a model is next loaded)", classes="section-title")
                with Grid(classes="settings-grid"):
                    for setting in s.ENGINE:
                        yield Label(setting.screen_label, classes="field-label")
                        yield self._field(setting)
                    yield Label("Theme", classes="field-label")
                    yield Select(
                        [(t, t) for t in THEMES],
                        value=self.config.theme,
                        allow_blank=False,
                        id="setting-theme",
                        compact=True,
                    )
                yield Label("Model folders (one per line; their .gguf files show in ctrl+l)", classes="section-title")
                yield TextArea("\n".join(self.config.model_folders), id="setting-model-folders", compact=True)
                yield Label(
                    "Remote engines (OpenAI-compatible servers; their models show in ctrl+l)", classes="section-title"
                )
                yield Vertical(id="remote-list")
                yield Button("Add remote engine", id="remote-add", compact=True)
                yield Label(
                    "API server (F10 serves the loaded model to other programs; a change applies at once)",
                    classes="section-title",
                )
                yield Static(self.server_state(), id="server-state", classes="field-label", markup=False)
                with Grid(classes="settings-grid"):
                    for setting in ui.SERVER:
                        yield Label(setting.plain_label, classes="field-label")
                        yield self._server_field(setting)
                yield Label(
                    "Prompt cache on disk (conversations resume after a restart; [cache] in config.toml, "
                    "`llmtui cache list|clear`)",
                    classes="section-title",
                    markup=False,  # [cache] is the table's name, not a style
                )
                yield Static(self._cache_state(), id="settings-cache-usage", classes="field-label")
                yield Label(
                    "Documents (F12, --doc: the models searching them besides BM25; [documents] in config.toml)",
                    classes="section-title",
                    markup=False,
                )
                with Grid(classes="settings-grid"):
                    for setting in ui.DOCUMENTS:
                        yield Label(setting.plain_label, classes="field-label")
                        yield Input(
                            getattr(self.config.documents, setting.name),
                            id=f"documents-{setting.name}",
                            placeholder="the catalog's, once downloaded",
                            compact=True,
                            tooltip=setting.help,
                        )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Back", id="cancel", compact=True)
        yield Footer()

    def _field(self, setting: Setting[Any]) -> Input | Select[object]:
        """The input of an engine setting, from its declaration: a choice, on/off, a number or a text form."""
        engine = self.config.engine
        value = getattr(engine, setting.name)
        field_id = f"setting-{setting.name}"
        if setting.choices or setting.kind is bool:
            options = [(c, c) for c in setting.choices] if setting.choices else ON_OFF
            return Select(options, value=value, allow_blank=False, id=field_id, compact=True)
        if setting in NUMBER_FIELDS:
            return Input(str(value), id=field_id, type="integer", compact=True)
        texts = {
            s.N_GPU_LAYERS: gpu_layers_text(engine.n_gpu_layers),
            s.TENSOR_SPLIT: ",".join(f"{v:g}" for v in engine.tensor_split),
            s.RPC_SERVERS: ", ".join(engine.rpc_servers),
        }
        return Input(texts[setting], id=field_id, placeholder=PLACEHOLDERS[setting], compact=True)

    def _server_field(self, setting: Setting[Any]) -> Input | Select[object]:
        value = getattr(self.config.server, setting.name)
        field_id = f"server-{setting.name}"
        if setting.kind is bool:
            return Select(ON_OFF, value=value, allow_blank=False, id=field_id, compact=True, tooltip=setting.help)
        if setting.kind is int:
            return Input(str(value), id=field_id, type="integer", compact=True, tooltip=setting.help)
        return Input(str(value), id=field_id, compact=True, tooltip=setting.help)

    def _read_server(self) -> ServerConfig:
        values: dict[str, object] = {}
        for setting in ui.SERVER:
            if setting.kind is bool:
                values[setting.name] = self.query_one(f"#server-{setting.name}", Select).value is True
            else:
                text = self.query_one(f"#server-{setting.name}", Input).value
                values[setting.name] = parse_field(setting, text, f"API server: {setting.plain_label}")
        return ServerConfig(**values)  # type: ignore[arg-type]

    def _cache_state(self) -> str:
        return "on: reading its size…" if self.config.cache.disk else "off ([cache] disk = false)"

    @work(thread=True, exclusive=True, group="cache-usage")
    def read_cache_usage(self) -> None:
        """The cache's files, size against the budget and bytes per token of the loaded model, read in a thread (a
        folder scan and one header per file)."""
        from engine_ext.disk_cache import usage_line

        model = Path(self.app.model_path).name if self.app.model_path else ""
        try:
            line = f"on: {usage_line(prompt_cache_dir(), self.config.cache.budget_mib, model)}"
        except OSError as e:
            line = f"on: {one_line(str(e))}"
        self.app.call_from_thread(self.query_one("#settings-cache-usage", Static).update, line)

    async def on_mount(self) -> None:
        self.query_one("#settings-error").display = False
        if self.config.cache.disk:
            self.read_cache_usage()
        await self.refresh_remotes()
        self.set_interval(1.0, self.show_server_state)
        # The field asked for (the palette's), else the first: typing at once goes into a field.
        field = self.query_one(f"#setting-{self.focus_field if self.focus_field in FIELD_ORDER else FIELD_ORDER[0]}")
        field.focus()
        if self.focus_field in FIELD_ORDER:
            self.call_after_refresh(field.scroll_visible, animate=False)

    def server_state(self) -> str:
        """The API server's live state, beside its start-up switch: F10 serves whatever that switch says."""
        server = self.app.server
        if server.starting:
            return "Now: starting (F10)."
        if server.server is None:
            return "Now: off. F10 starts it."
        return f"Now: serving at {server.server.address.url()}. F10 stops it."

    def show_server_state(self) -> None:
        self.query_one("#server-state", Static).update(self.server_state())

    async def refresh_remotes(self) -> None:
        """Rebuild the remote engines' rows from `self.remotes`."""
        container = self.query_one("#remote-list", Vertical)
        await container.remove_children()
        rows: list[Horizontal | Label] = []
        for index, remote in enumerate(self.remotes):
            rows.append(
                Horizontal(
                    Label(remote_line(remote), classes="remote-line"),
                    Button("Edit", id=f"remote-edit-{index}", compact=True),
                    Button("Remove", id=f"remote-remove-{index}", compact=True),
                    classes="remote-row",
                )
            )
        if not rows:
            rows.append(Label("None yet.", classes="field-label"))
        await container.mount_all(rows)

    def read_config(self) -> Config:
        """The values on screen as a validated Config (ConfigError names the bad one)."""
        values: dict[str, object] = {}
        for setting in NUMBER_FIELDS:
            text = self.query_one(f"#setting-{setting.name}", Input).value
            values[setting.name] = parse_field(setting, text, setting.screen_label)
        for setting in CHOICE_FIELDS:
            values[setting.name] = str(self.query_one(f"#setting-{setting.name}", Select).value)
        for setting in BOOL_FIELDS:
            values[setting.name] = self.query_one(f"#setting-{setting.name}", Select).value is True
        values["n_gpu_layers"] = parse_gpu_layers(self.query_one("#setting-n_gpu_layers", Input).value)
        values["tensor_split"] = parse_tensor_split(self.query_one("#setting-tensor_split", Input).value)
        values["rpc_servers"] = parse_list(self.query_one("#setting-rpc_servers", Input).value)
        merged = {f.name: values.get(f.name, getattr(self.config.engine, f.name)) for f in fields(EngineSettings)}
        engine = EngineSettings(**merged)  # type: ignore[arg-type]
        folders_text = self.query_one("#setting-model-folders", TextArea).text
        folders = tuple(line.strip() for line in folders_text.splitlines() if line.strip())
        config = replace(
            self.config,
            engine=engine,
            model_folders=folders,
            theme=str(self.query_one("#setting-theme", Select).value),
            remotes=tuple(self.remotes),
            server=self._read_server(),
            documents=DocumentsSettings(
                *(self.query_one(f"#documents-{setting.name}", Input).value.strip() for setting in ui.DOCUMENTS)
            ),
        )
        config.validate()
        return config

    def show_error(self, message: str) -> None:
        error = self.query_one("#settings-error", Static)
        error.update(Text(message, style="bold"))
        error.display = bool(message)

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        button_id = event.button.id or ""
        if button_id == "save":
            self.action_save()
        elif button_id == "cancel":
            self.action_cancel()
        elif button_id == "remote-add":
            self.edit_remote(None)
        elif button_id.startswith("remote-edit-"):
            self.edit_remote(int(button_id.rsplit("-", 1)[1]))
        elif button_id.startswith("remote-remove-"):
            removed = self.remotes.pop(int(button_id.rsplit("-", 1)[1]))
            await self.refresh_remotes()
            self.notify(f"Removed {removed.name}; Save (ctrl+s) to keep the change.")

    def edit_remote(self, index: int | None) -> None:
        """Open the endpoint dialog for a new remote (None) or the one at `index`."""
        from app.tui.modals.remote_endpoint import RemoteEndpointModal

        current = self.remotes[index] if index is not None else None
        taken = {r.name for i, r in enumerate(self.remotes) if i != index}

        async def keep(remote: RemoteSettings | None) -> None:
            if remote is None:
                return
            if index is None:
                self.remotes.append(remote)
            else:
                self.remotes[index] = remote
            await self.refresh_remotes()

        self.app.push_screen(RemoteEndpointModal(current, taken), keep)

    def action_save(self) -> None:
        try:
            config = self.read_config()
            self.app.save_settings(config, settings_changes(self.config, config))
        except ConfigError as error:
            self.show_error(str(error))
            self.notify(str(error), severity="error", timeout=8)
            return
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
