"""The App's keys: they work on every screen. Each binding's tooltip names its command, then after a colon its
detail; F1's help, the command palette and the README's key table are made from them (`screens/help_keys.py`)."""

from __future__ import annotations

from typing import Final

from textual.binding import Binding, BindingType

APP_BINDINGS: Final[list[BindingType]] = [
    Binding("f1,question_mark", "help", "Help", tooltip="Help: every key, by where it works"),
    Binding(
        "ctrl+p",
        "command_palette",
        "palette",
        show=False,
        priority=True,
        tooltip="Command palette: every action by name",
    ),
    Binding(
        "f3",
        "settings",
        "Settings",
        show=False,
        tooltip="Settings: engine options, model folders, remote engines, API server",
    ),
    Binding(
        "f4",
        "models",
        "Models",
        show=False,
        tooltip="Browse and download models: catalog, Hugging Face search, downloads, local models",
    ),
    Binding("ctrl+t", "toggle_theme", "Theme", show=False, tooltip="Dark / light theme"),
    Binding(
        "f6",
        "steering",
        "Steering",
        show=False,
        priority=True,
        tooltip="Steering panel: control-vector sliders, layer range, heat strip, beside or below the transcript",
    ),
    Binding(
        "f8",
        "toggle_speculation",
        "Speculation",
        show=False,
        tooltip="Speculative decoding on / off: the meter under the transcript shows acceptance and speedup",
    ),
    Binding(
        "f9",
        "speculative_panel",
        "Speculative settings",
        show=False,
        tooltip="Speculative settings: type (what the model supports), draft model, n_max / n_min / p_min",
    ),
    Binding(
        "ctrl+o",
        "toggle_spec_details",
        "Speculative details",
        show=False,
        tooltip="Speculative details: the meter's counts, acceptance by draft position, time, drafters",
    ),
    Binding(
        "f10",
        "toggle_server",
        "API server",
        show=False,
        tooltip="API server: serve the loaded model to other programs while you chat (stats bar: api), or stop",
    ),
    Binding("ctrl+q", "quit", "Quit", priority=True, tooltip="Quit: asks first while downloads are unfinished"),
]
