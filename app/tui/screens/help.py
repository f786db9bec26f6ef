"""The help screen (F1 or ?): every key, grouped by where it works."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from app.tui.screens.models_local import STATUS_WORDS

KEYS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Anywhere",
        (
            ("F1, ?", "this help"),
            ("ctrl+p", "command palette: every action by name"),
            ("ctrl+t", "dark / light theme"),
            ("F3", "settings (engine options, model folders)"),
            ("F4", "models: catalog, Hugging Face search, downloads, local models"),
            (
                "F10",
                "API server: serve the loaded model to other programs while you chat (stats bar: api), or stop",
            ),
            ("ctrl+q", "quit"),
        ),
    ),
    (
        "Chat",
        (
            ("enter", "send the message"),
            ("shift+enter, ctrl+j", "new line in the message"),
            ("up / down", "recall earlier messages (first / last line of the prompt)"),
            ("escape", "stop the reply (the text is kept, marked stopped) · leave edit mode"),
            ("ctrl+e", "while the model thinks: stop thinking now, it answers at once (else: end of the line)"),
            ("ctrl+g", "continue the last reply: stopped, failed, cut short by max tokens, or edited"),
            ("ctrl+r", "regenerate the last reply (the old one stays as a branch)"),
            ("ctrl+n", "new conversation"),
            ("ctrl+l", "switch model"),
            ("ctrl+s", "conversation settings: system prompt, sampling, presets"),
            ("ctrl+b", "show / hide the conversation list"),
            ("ctrl+f", "search titles and messages (escape clears the search)"),
            ("F2", "rename the conversation"),
            ("F5", "restart the engine"),
            ("tab, shift+tab", "move between the list, the messages and the prompt"),
            ("ctrl+up", "go to the last message"),
            ("F12", "attach an image, or a text file or folder to answer from with citations (Tab completes the path)"),
            ("shift+tab, then Del", "on the attached images above the message box: remove the highlighted one"),
        ),
    ),
    (
        "Message box (editing)",
        (
            ("ctrl+a", "select all (then type, or backspace, to replace or clear it)"),
            ("home / end, ctrl+e", "start / end of the line"),
            ("ctrl+left / ctrl+right", "previous / next word"),
            ("shift+arrows, shift+home / end", "select (with ctrl+shift+left / right: by word)"),
            ("ctrl+w, ctrl+backspace", "delete the word before the cursor (alt+delete: the word after)"),
            ("ctrl+u / ctrl+k", "delete to the start / end of the line (ctrl+shift+k: the whole line)"),
            ("ctrl+z / ctrl+y", "undo / redo"),
            ("ctrl+x / ctrl+c / ctrl+v", "cut / copy / paste (the terminal's own paste works too)"),
        ),
    ),
    (
        "A message (focused)",
        (
            ("up / down, k / j", "previous / next message"),
            ("c", "copy the message (OSC 52: works over SSH)"),
            ("y", "copy a code block"),
            ("e", "edit your message and resend it as a new branch, or change a reply in place (ctrl+g continues it)"),
            ("r", "regenerate this reply as a new branch"),
            ("left / right, [ / ]", "previous / next branch"),
            ("t", "show / hide the reasoning; a long message of yours (a pasted file) is folded: t shows it all"),
        ),
    ),
    (
        "Conversation list (focused)",
        (
            ("enter", "open"),
            ("n", "new conversation"),
            ("r", "rename"),
            ("d, delete", "delete"),
            ("u", "undo the last delete"),
            ("x", "export to Markdown and JSON"),
        ),
    ),
    (
        "Models (F4)",
        (
            ("1 / 2 / 3", "catalog / search / local tab (2 returns to the results shown)"),
            ("/", "focus the Hugging Face search box (author and sort below it); in the box, / is typed (org/name)"),
            ("down", "in the search box: to the results"),
            ("enter", "open a repo: quants, fit, sidecars · on a quant: download it · on a partial: resume it"),
            ("d", "download the highlighted quant, with the sidecars you tick"),
            ("u", "chat with a local model or a downloaded quant"),
            ("p", "pause or resume the highlighted download, wherever the focus is"),
            ("x, delete", "local tab: delete the model or partial download (asks, says the space freed)"),
            ("x, c", "elsewhere, or in the downloads panel: cancel the highlighted download"),
            ("r", "local tab: resume the highlighted partial download"),
            ("up / down", "in the downloads panel: highlight another download"),
            ("ctrl+r", "reload the local models and partial downloads"),
            ("escape, F4", "back to the chat"),
        ),
    ),
    (
        "Models: words",
        tuple(STATUS_WORDS.items()) + (("unreadable", "ctrl+l: the model's GGUF header could not be read"),),
    ),
    (
        "Speculative decoding and steering",
        (
            (
                "F8",
                "speculative decoding on / off (the meter under the transcript shows acceptance and speedup; "
                "~×1.3: within the spread of the last replies, or one reply so far: no measurable difference)",
            ),
            ("F9", "speculative settings: type (what the model supports), draft model, n_max / n_min / p_min"),
            (
                "ctrl+o",
                "speculative details under the transcript: counts, acceptance by draft position, time, drafters",
            ),
            (
                "",
                "proposed: tokens the drafters proposed · drafted: those sent to verify (llama.cpp's n_drafted; cut"
                " after an end-of-generation token) · accepted: drafted tokens kept",
            ),
            ("ctrl+b", "in the F9 panel: check the same prompt, greedy, without and with speculation (the same text?)"),
            ("ctrl+d", "in the F9 panel: pick a draft model among those found on this machine that fit the model"),
            (
                "F7",
                "underline text from accepted draft tokens (n-gram: accent, model: green; rejected draft: bold red)",
            ),
            ("F6", "steering panel beside / below the transcript: sliders, layer range, heat strip (F6, Esc close)"),
            ("←/→, shift+←/→, 0", "on a slider: strength ±1/40, ±1/8 of its range, reset (applies at the next token)"),
            ("enter", "on a slider: type a strength, past the slider's range too (any number within ±1000)"),
            ("m / b / a / c", "in the steering panel: make a vector · A/B view · add a file · clear all"),
            ("tab", "in the steering panel: to the message box (it stays open); Tab there comes back"),
            ("↑/↓ to Layers", "the layer range: typed, then Enter applies it (0: the default); a half-typed one waits"),
            ("tab (a path)", "in the add-file prompt: complete the path (folders and .gguf files)"),
        ),
    ),
)


def keys_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for index, (section, keys) in enumerate(KEYS):
        if index:
            table.add_row("", "")
        table.add_row(Text(section, style="bold underline"), "")
        for key, what in keys:
            table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    """Esc, F1, ? or q closes it."""

    BINDINGS = [Binding("escape,f1,question_mark,q", "close", "Close")]

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="help-dialog"):
            yield Label("Keys", classes="dialog-title")
            with VerticalScroll(id="help-body"):
                yield Static(keys_table())
            yield Label("Esc close · ctrl+p finds any action by name", classes="dialog-hint")

    def action_close(self) -> None:
        self.dismiss(None)
