"""The settings screen: engine options (llama.cpp's names), model folders and remote engines, validated and saved
to config.toml."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static, TextArea

from app.config import (
    FLASH_ATTENTION_MODES,
    THEMES,
    Config,
    ConfigError,
    EngineSettings,
    RemoteSettings,
    gpu_layers_text,
    parse_gpu_layers,
)
from engine_ext.params import KV_CACHE_TYPES, SPLIT_MODES

if TYPE_CHECKING:
    from app.shell import LlmtuiShell

# Every EngineSettings field, in the order shown; labels carry llama.cpp's flag.
NUMBER_FIELDS = {
    "n_ctx": "Context size (-c; 0: the model's)",
    "n_threads": "Threads (-t; 0: one per core)",
    "n_batch": "Batch size (-b)",
    "n_ubatch": "Micro-batch size (-ub)",
    "main_gpu": "Main GPU (-mg; device index)",
    "n_cpu_moe": "Experts on CPU, layers (--n-cpu-moe)",
    "fit_target_mib": "Kept free by auto, MiB (--fit-target)",
}
CHOICE_FIELDS = {
    "split_mode": ("Split mode (-sm)", SPLIT_MODES),
    "flash_attn": ("Flash attention (-fa)", FLASH_ATTENTION_MODES),
    "type_k": ("KV cache type K (-ctk)", KV_CACHE_TYPES),
    "type_v": ("KV cache type V (-ctv)", KV_CACHE_TYPES),
}
BOOL_FIELDS = {
    "use_mmap": "Map the model file (off: --no-mmap)",
    "use_mlock": "Lock the model in RAM (--mlock)",
    "use_extra_bufts": "Repack weights for this CPU (off: --no-repack)",
}
ON_OFF = [("on", True), ("off", False)]
GPU_LAYERS_LABEL = "GPU layers (-ngl; auto, -1 all, 0 none)"
TENSOR_SPLIT_LABEL = "Tensor split (-ts; shares, e.g. 3,1)"
RPC_LABEL = "RPC servers (--rpc; HOST:PORT, …)"
FIELD_ORDER = (
    "n_ctx",
    "n_threads",
    "n_gpu_layers",
    "fit_target_mib",
    "split_mode",
    "tensor_split",
    "main_gpu",
    "n_cpu_moe",
    "flash_attn",
    "type_k",
    "type_v",
    "n_batch",
    "n_ubatch",
    "use_mmap",
    "use_mlock",
    "use_extra_bufts",
    "rpc_servers",
)
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


class SettingsScreen(Screen[bool]):
    """Ctrl+S saves (dismisses with True), Esc goes back without saving (False).

    A value llama.cpp would reject, or a combination it would abort on, is refused with the reason shown above the
    fields (and as a notification); nothing is saved until every value is valid.
    """

    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("escape", "cancel", "Back"),
    ]

    app: LlmtuiShell

    def __init__(self, config: Config, *, focus: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.focus_field = focus  # an engine setting's name to focus at once (FIELD_ORDER), or None
        self.remotes: list[RemoteSettings] = list(config.remotes)

    def compose(self) -> ComposeResult:
        engine = self.config.engine
        with Vertical(id="settings"):
            yield Label("Settings", classes="screen-title")
            yield Static("", id="settings-error")
            with VerticalScroll(id="settings-body"):
                yield Label("Engine (applies when a model is next loaded)", classes="section-title")
                with Grid(classes="settings-grid"):
                    for name in FIELD_ORDER:
                        if name in NUMBER_FIELDS:
                            yield Label(NUMBER_FIELDS[name], classes="field-label")
                            yield Input(str(getattr(engine, name)), id=f"setting-{name}", type="integer", compact=True)
                        elif name in CHOICE_FIELDS:
                            label, choices = CHOICE_FIELDS[name]
                            yield Label(label, classes="field-label")
                            yield Select(
                                [(c, c) for c in choices],
                                value=getattr(engine, name),
                                allow_blank=False,
                                id=f"setting-{name}",
                                compact=True,
                            )
                        elif name in BOOL_FIELDS:
                            yield Label(BOOL_FIELDS[name], classes="field-label")
                            yield Select(
                                ON_OFF,
                                value=getattr(engine, name),
                                allow_blank=False,
                                id=f"setting-{name}",
                                compact=True,
                            )
                        elif name == "n_gpu_layers":
                            yield Label(GPU_LAYERS_LABEL, classes="field-label")
                            yield Input(
                                gpu_layers_text(engine.n_gpu_layers),
                                id="setting-n_gpu_layers",
                                placeholder="auto",
                                compact=True,
                            )
                        elif name == "tensor_split":
                            yield Label(TENSOR_SPLIT_LABEL, classes="field-label")
                            yield Input(
                                ",".join(f"{v:g}" for v in engine.tensor_split),
                                id="setting-tensor_split",
                                placeholder="empty: automatic",
                                compact=True,
                            )
                        elif name == "rpc_servers":
                            yield Label(RPC_LABEL, classes="field-label")
                            yield Input(
                                ", ".join(engine.rpc_servers),
                                id="setting-rpc_servers",
                                placeholder="none",
                                compact=True,
                            )
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
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Back", id="cancel", compact=True)
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#settings-error").display = False
        await self.refresh_remotes()
        if self.focus_field in FIELD_ORDER:
            field = self.query_one(f"#setting-{self.focus_field}")
            field.focus()
            self.call_after_refresh(field.scroll_visible, animate=False)

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
        for name, label in NUMBER_FIELDS.items():
            text = self.query_one(f"#setting-{name}", Input).value.strip()
            try:
                values[name] = int(text)
            except ValueError:
                raise ConfigError(f"{label}: {text!r} is not a whole number") from None
        for name in CHOICE_FIELDS:
            values[name] = str(self.query_one(f"#setting-{name}", Select).value)
        for name in BOOL_FIELDS:
            values[name] = self.query_one(f"#setting-{name}", Select).value is True
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
        from app.modals.remote_endpoint import RemoteEndpointModal

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
            self.app.save_settings(config)
        except ConfigError as error:
            self.show_error(str(error))
            self.notify(str(error), severity="error", timeout=8)
            return
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
