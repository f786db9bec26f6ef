"""The command palette's entries (ctrl+p): the app's own commands, grouped by what they act on.

Each title starts with its group ("Chat: …", "Models: …", "Speculation: …", "Steering: …", "View: …", "llmtui: …"),
so the list reads by topic and typing a group's name lists its commands. The palette sorts the titles as strings, so
the app-wide group, lowercase "llmtui", comes last: the first entry, highlighted when the palette opens, is a chat
command, not Quit. Textual's generic system commands (Keys,
Maximize, Screenshot) are left out: F1 lists every key, and the others are not part of this app; its theme picker
is kept, as "View: Theme".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from textual.app import App, SystemCommand
from textual.screen import Screen

# (title, what it does with its key, the action's name): on the App…
APP_COMMANDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("Chat: Import conversation", "Import a JSON export", "import_conversation"),
    ("Models: Switch model", "Load a local model or use a remote engine's (ctrl+l)", "switch_model"),
    ("Models: Browse and download", "Catalog, Hugging Face search, downloads, local models (F4)", "models"),
    ("Models: Restart engine", "Start a fresh engine process and reload the model (F5)", "restart_engine"),
    ("Speculation: On / off", "Turn speculative decoding on or off (F8)", "toggle_speculation"),
    ("Speculation: Settings", "Type, draft model, n_max/n_min/p_min (F9)", "speculative_panel"),
    (
        "Speculation: Details",
        "Expand the meter: counts, acceptance by draft position, time, drafters (ctrl+o)",
        "toggle_spec_details",
    ),
    (
        "Speculation: Check",
        "One prompt, greedy, without and with speculation: the same text? (ctrl+b in F9)",
        "spec_check",
    ),
    ("Steering: Sliders", "Control-vector sliders, layer range, heat strip (F6)", "steering"),
    ("Steering: Make a control vector", "From a prompt set, on the loaded model", "make_vector"),
    ("Steering: A/B", "One prompt without and with steering, side by side", "steering_ab"),
    ("View: Help (keys)", "Every key, by where it works (F1)", "help"),
    ("View: Dark / light", "Switch the theme (ctrl+t)", "toggle_theme"),
    ("View: Theme", "Choose a colour theme", "change_theme"),
    ("llmtui: API server", "Serve the loaded model to other programs, or stop (F10)", "toggle_server"),
    ("llmtui: Settings", "Engine options, model folders, remote engines, API server (F3)", "settings"),
    (
        "llmtui: Repack weights (CPU)",
        "Turn CPU weight repacking on or off: Settings, at its field (F3; --no-repack)",
        "repack_setting",
    ),
    ("llmtui: Quit", "Quit llmtui (asks first while downloads are unfinished) (ctrl+q)", "quit"),
)

# … and on the chat screen (listed while it is the screen the palette opened on).
CHAT_COMMANDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("Chat: New conversation", "Start a new conversation (ctrl+n)", "new_conversation"),
    ("Chat: Stop reply", "Stop the reply being written (Esc)", "stop"),
    (
        "Chat: Stop thinking now",
        "End the model's thinking; it answers at once (ctrl+e while it thinks)",
        "stop_thinking",
    ),
    ("Chat: Continue reply", "Continue a stopped reply (ctrl+g)", "continue_reply"),
    ("Chat: Regenerate reply", "Write the last reply again as a new branch (ctrl+r)", "regenerate"),
    ("Chat: Conversation settings", "System prompt, sampling, presets (ctrl+s)", "conversation_settings"),
    ("Chat: Rename conversation", "Change the title (F2)", "rename_conversation"),
    ("Chat: Delete conversation", "Delete it (undo from the list with u)", "delete_conversation"),
    ("Chat: Undo delete", "Bring back the last deleted conversation", "undo_delete"),
    ("Chat: Export conversation", "Write it as Markdown and JSON", "export_conversation"),
    ("Chat: Search conversations", "Titles and messages (ctrl+f)", "search"),
    ("Chat: Go to messages", "Focus the last message (ctrl+up)", "focus_messages"),
    (
        "Chat: Attach image or document",
        "A picture for a vision model, or files and a folder to cite (F12)",
        "attach_image",
    ),
    ("View: Conversation list", "Show or hide the sidebar (ctrl+b)", "toggle_sidebar"),
    (
        "Speculation: Draft colouring",
        "Underline text from accepted draft tokens (F7)",
        "toggle_draft_colouring",
    ),
)

GROUPS: Final = ("Chat", "Models", "Speculation", "Steering", "View", "llmtui")
"""The groups (the palette lists its entries by title, so group by group, in this order)."""


def palette_commands(app: App[None], screen: Screen[Any], chat: Screen[Any] | None) -> Iterator[SystemCommand]:
    """The palette's entries: the App's, and the chat's while `screen` is the chat."""
    for title, help_text, action in APP_COMMANDS:
        yield SystemCommand(title, help_text, getattr(app, f"action_{action}"))
    if chat is not None and screen is chat:
        for title, help_text, action in CHAT_COMMANDS:
            yield SystemCommand(title, help_text, getattr(chat, f"action_{action}"))
