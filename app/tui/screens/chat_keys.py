"""The chat screen's keys. The footer shows the shown ones in this order, most useful first, and all of them fit in
80 columns (at most 69 cells beside "^p palette"; tests/tui/test_first_hour.py checks it): Stop while a reply is
written, then help, models, speculation, steering, a new conversation, Continue where a reply can go on, Quit. The
App's own bindings for f1, f4, f9, f6 and ctrl+q stay for the other screens. Each tooltip names the command, then
after a colon its detail: F1's help and the palette are made from them (`help_keys.py`)."""

from __future__ import annotations

from typing import Final

from textual.binding import Binding, BindingType

from app.tui.screens.chat_images import ATTACH_KEY

CHAT_BINDINGS: Final[list[BindingType]] = [
    Binding("escape", "stop", "Stop", priority=True, tooltip="Stop the reply: the text is kept, marked stopped"),
    Binding(
        "escape",
        "back",
        "Back",
        show=False,
        priority=True,
        tooltip="Back: leave editing a message, clear the search, or go back to the message box",
    ),
    Binding("f1", "app.help", "Help"),
    Binding("ctrl+l", "switch_model", "Model", tooltip="Switch model: every model on this machine"),
    Binding("f4", "app.models", "Models", tooltip="Catalog, Hugging Face search, downloads, local models"),
    Binding("f9", "app.speculative_panel", "Spec", tooltip="Speculative decoding: type, draft model, check"),
    Binding("f6", "app.steering", "Steer", priority=True, tooltip="Steering: control-vector sliders"),
    Binding("ctrl+n", "new_conversation", "New", tooltip="New conversation"),
    Binding(
        "ctrl+g",
        "continue_reply",
        "Go on",
        tooltip="Continue the reply from where it ends: stopped, failed, cut short by max tokens, or edited",
    ),
    Binding("ctrl+q", "app.quit", "Quit"),  # the App's (a priority binding) takes this place in the footer
    Binding(
        "ctrl+r",
        "regenerate",
        "Regenerate",
        show=False,
        tooltip="Regenerate the last reply: the old one stays as a branch",
    ),
    Binding(
        "ctrl+b",
        "toggle_sidebar",
        "Sidebar",
        show=False,
        tooltip="Conversation list: shown (focused) or hidden",
    ),
    Binding("ctrl+f", "search", "Search", show=False, tooltip="Search conversations: titles and messages"),
    Binding(
        "ctrl+s",
        "conversation_settings",
        "Settings",
        show=False,
        tooltip="Conversation settings: system prompt, sampling, presets, tools, output format",
    ),
    Binding("f2", "rename_conversation", "Rename", show=False, tooltip="Rename the conversation"),
    Binding(
        "f5",
        "restart_engine",
        "Restart engine",
        show=False,
        tooltip="Restart the engine: a fresh engine process, the model loaded again",
    ),
    Binding("ctrl+up", "focus_messages", "Messages", show=False, tooltip="Go to the messages: the last one focused"),
    Binding(
        ATTACH_KEY,
        "attach_image",
        "Attach",
        show=False,
        tooltip="Attach an image, or a text file or folder to answer from with citations: a path prompt (Tab "
        "completes it); an image dropped on the terminal attaches too",
    ),
    Binding(
        "f7",
        "toggle_draft_colouring",
        "Draft colours",
        show=False,
        priority=True,  # over the message box's select-all
        tooltip="Draft colouring: text from accepted draft tokens underlined (n-gram: accent, model: green; a "
        "rejected draft's token: bold red)",
    ),
    # Over the prompt's end-of-line while the model thinks (check_action); with text in the prompt otherwise, the
    # prompt's end of line; else one line saying the model is not thinking.
    Binding(
        "ctrl+e",
        "stop_thinking",
        "Answer now",
        show=False,
        priority=True,
        tooltip="Stop thinking: while the model thinks, it answers at once",
    ),
    # Over the prompt's delete-to-end-of-line only while the reply waits for the API server (check_action).
    Binding(
        "ctrl+k",
        "stop_api_requests",
        "Stop API requests",
        show=False,
        priority=True,
        tooltip="Stop API requests: while your reply waits for the API server's requests (F10), stop them so it "
        "starts now",
    ),
    Binding("tab", "app.focus_next", "Next", show=False, tooltip="Next part: the list, the messages, the message box"),
    Binding("shift+tab", "app.focus_previous", "Previous", show=False, tooltip="Previous part"),
]
