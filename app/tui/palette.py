"""The command palette's entries (ctrl+p): the app's own commands, grouped by what they act on.

The keyed entries are made from the bindings (`app/tui/screens/help_keys.py`): the App's, and while the palette opens
on the chat, the chat's and its conversation list's; a binding's tooltip names the command and says its detail. The
few commands no key runs are listed here. Each title starts with its group ("Chat: …", "Models: …", "Speculation: …",
"Steering: …", "View: …", "llmtui: …"), so the list reads by topic and typing a group's name lists its commands. The
palette sorts the titles as strings, so the app-wide group, lowercase "llmtui", comes last: the first entry,
highlighted when the palette opens, is a chat command, not Quit. Textual's generic system commands (Keys, Maximize,
Screenshot) are left out: F1 lists every key, and the others are not part of this app; its theme picker is kept, as
"View: Theme".
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, Final

from textual.actions import parse as parse_action
from textual.app import App, SystemCommand
from textual.dom import DOMNode
from textual.screen import Screen

from app.tui.screens.chat_screen import ChatScreen
from app.tui.screens.help_keys import KeyEntry, place_entries
from app.tui.widgets.sidebar import ConversationOptions

GROUPS: Final = ("Chat", "Models", "Speculation", "Steering", "View", "llmtui")
"""The groups (the palette lists its entries by title, so group by group, in this order)."""

ACTION_GROUPS: Final[dict[str, str]] = {
    "switch_model": "Models",
    "models": "Models",
    "restart_engine": "Models",
    "toggle_speculation": "Speculation",
    "speculative_panel": "Speculation",
    "toggle_spec_details": "Speculation",
    "toggle_draft_colouring": "Speculation",
    "steering": "Steering",
    "help": "View",
    "toggle_theme": "View",
    "toggle_sidebar": "View",
}
"""The group of a keyed command that is not its place's ("llmtui" for the App's, "Chat" for the chat's)."""

NOT_COMMANDS: Final = frozenset({"command_palette", "focus_next", "focus_previous", "back"})
"""Bound actions the palette does not list: itself, moving the focus, and Esc's "back"."""

# (title, what it does, the App's action): the commands no key runs.
UNKEYED_APP_COMMANDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("Chat: Import conversation", "Import a JSON export", "import_conversation"),
    ("Speculation: Check", "One prompt, greedy, without and with speculation: the same text?", "spec_check"),
    ("Steering: Make a control vector", "From a prompt set, on the loaded model", "make_vector"),
    ("Steering: A/B", "One prompt without and with steering, side by side", "steering_ab"),
    ("View: Theme", "Choose a colour theme", "change_theme"),
    (
        "llmtui: Repack weights (CPU)",
        "Turn CPU weight repacking on or off: Settings, at its field (--no-repack for one run)",
        "repack_setting",
    ),
)


def command(entry: KeyEntry, target: DOMNode, group: str) -> SystemCommand:
    """A keyed entry as a palette command: "Group: name", its detail and keys, running its action on `target`."""
    _, name, params = parse_action(entry.binding.action)
    help_text = " · ".join(part for part in (entry.detail, entry.key_text) if part)
    return SystemCommand(f"{group}: {entry.name}", help_text, partial(getattr(target, f"action_{name}"), *params))


def palette_commands(app: App[None], screen: Screen[Any], chat: Screen[Any] | None) -> Iterator[SystemCommand]:
    """The palette's entries: the App's, and the chat's while `screen` is the chat."""
    places: list[tuple[tuple[type[DOMNode], ...], DOMNode, str]] = [((type(app),), app, "llmtui")]
    if chat is not None and screen is chat:
        places.append(((ChatScreen, ConversationOptions), chat, "Chat"))
    listed: set[str] = set()
    for nodes, namespace, group in places:
        for entry in place_entries(nodes, set()):
            destination = parse_action(entry.binding.action)[0]
            target = app if destination == "app" else namespace
            if entry.action_name in NOT_COMMANDS or entry.action_name in listed:
                continue
            if not hasattr(target, f"action_{entry.action_name}"):  # the list's own (Enter opens what it highlights)
                continue
            listed.add(entry.action_name)
            yield command(entry, target, ACTION_GROUPS.get(entry.action_name, group))
    for title, help_text, action in UNKEYED_APP_COMMANDS:
        yield SystemCommand(title, help_text, getattr(app, f"action_{action}"))
