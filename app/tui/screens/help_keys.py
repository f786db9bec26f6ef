"""Every key of the app, read from the BINDINGS of the places where it works: F1's help, the command palette's keyed
entries and the README's key table are made from this, so a key is written once, where it is bound.

A binding says what its key does in two parts: `description`, the short label the footer shows, and `tooltip`, the
command's full name, then after a colon the detail ("Switch model: every model on this machine"). The help shows the
tooltip (or the description where there is none); the palette's title is the name, its help the detail and the key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from textual.actions import parse as parse_action
from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode
from textual.keys import format_key
from textual.screen import Screen
from textual.widgets import TextArea

from app.tui.modals.conversation_settings import ConversationSettingsModal
from app.tui.modals.crash import EngineCrashedModal
from app.tui.modals.make_vector import MakeVectorModal
from app.tui.modals.model_actions import DeleteModelModal, PullModal
from app.tui.modals.model_preset import ModelPresetModal
from app.tui.modals.model_switcher import ModelSwitcherModal
from app.tui.modals.pick import PickModal
from app.tui.modals.remote_endpoint import RemoteEndpointModal
from app.tui.modals.speculative import SpeculativeModal
from app.tui.modals.text_prompt import PathPromptModal
from app.tui.modals.tool_consent import ToolConsentModal
from app.tui.screens.ab_run import ABRunScreen
from app.tui.screens.chat_screen import ChatScreen
from app.tui.screens.first_run import FirstRunScreen
from app.tui.screens.models_screen import ModelsScreen
from app.tui.screens.settings_screen import SettingsScreen
from app.tui.screens.steering_panel import SteeringPanel, VectorSlider
from app.tui.widgets.attachments import AttachmentsBar
from app.tui.widgets.downloads import DownloadsPanel
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import ConversationList, ConversationOptions
from app.tui.widgets.source_block import SourceBlock
from app.tui.widgets.tool_call_block import ToolCallBlock
from app.tui.widgets.transcript import EarlierMessages


@dataclass(frozen=True)
class Place:
    """Where keys work: a screen, a dialog or a widget (its class), under a title."""

    title: str
    nodes: tuple[type[DOMNode], ...]
    """The classes whose BINDINGS are listed, in order (a screen and the widget that carries some of its keys)."""
    screen: type[Screen[Any]] | None = None
    """The screen a widget sits on: a key that screen (or the App) binds with priority is theirs, not the widget's."""
    textual: tuple[type[DOMNode], ...] = ()
    """Textual's classes among the bases whose keys are listed too (the message box's editing keys are TextArea's)."""


PLACES: Final[tuple[Place, ...]] = (
    Place("Chat", (ChatScreen,)),
    Place("Message box", (PromptInput,), ChatScreen, (TextArea,)),
    Place("Attached images (shift+tab from the message box)", (AttachmentsBar,), ChatScreen),
    Place("A message (ctrl+up)", (MessageView, ToolCallBlock, SourceBlock, EarlierMessages), ChatScreen),
    Place("Conversation list (ctrl+b)", (ConversationList, ConversationOptions), ChatScreen),
    Place("Steering panel (F6)", (SteeringPanel, VectorSlider), ChatScreen),
    Place("Models (F4)", (ModelsScreen, DownloadsPanel)),
    Place("Speculative settings (F9)", (SpeculativeModal,)),
    Place("Settings (F3)", (SettingsScreen,)),
    Place("Conversation settings (ctrl+s)", (ConversationSettingsModal,)),
    Place("Model switcher (ctrl+l)", (ModelSwitcherModal,)),
    Place("Remote engine (ctrl+l, then a remote)", (RemoteEndpointModal,)),
    Place("Download a quant (F4, Enter on a quant)", (PullModal,)),
    Place("Delete a model or a download (F4, x)", (DeleteModelModal,)),
    Place("A model's serve preset (F4 Local, e)", (ModelPresetModal,)),
    Place("A tool call", (ToolConsentModal,)),
    Place("The engine crashed", (EngineCrashedModal,)),
    Place("A path or a choice asked for", (PathPromptModal, PickModal)),
    Place("Make a vector (m in F6)", (MakeVectorModal,)),
    Place("A/B views and the speculation check", (ABRunScreen,)),
    Place("First start", (FirstRunScreen,)),
)
"""The places the help lists after the App's keys ("Anywhere"), in this order."""


@dataclass(frozen=True)
class KeyEntry:
    """One action of a place and every key bound to it there."""

    keys: tuple[str, ...]
    """Textual's key names ("ctrl+p", "question_mark")."""
    binding: Binding
    """The first of its bindings (the description and tooltip)."""
    node: type[DOMNode]
    """The class that binds it."""

    @property
    def key_text(self) -> str:
        return ", ".join(key_text(key) for key in self.keys)

    @property
    def what(self) -> str:
        """What the help says: the tooltip, or the description where there is none."""
        return self.binding.tooltip or self.binding.description

    @property
    def name(self) -> str:
        """The command's name: the tooltip up to its first colon, or the description."""
        return self.what.split(": ", 1)[0]

    @property
    def detail(self) -> str:
        """The tooltip after its first colon ('' where there is none)."""
        parts = self.what.split(": ", 1)
        return parts[1] if len(parts) == 2 else ""

    @property
    def action_name(self) -> str:
        """The action without its namespace and arguments ("app.help" → "help")."""
        return parse_action(self.binding.action)[1]


SPELLED_OUT: Final = frozenset({"enter", "backspace"})
"""Keys written by name rather than as Textual's symbols (⏎, ⌫), which a newcomer may not know."""


def key_text(key: str) -> str:
    """A key as the help and the README write it: "ctrl+p", "?", "esc", "↑", "enter"."""
    *modifiers, name = key.split("+")
    return "+".join([*modifiers, name if name in SPELLED_OUT else format_key(name)])


def declared_bindings(node: type[DOMNode], textual: tuple[type[DOMNode], ...] = ()) -> Iterator[Binding]:
    """The bindings `node` and its own bases declare (and those of the Textual classes in `textual`), one per key,
    the class's own first: a key a subclass binds hides its bases' bindings of that key, as in Textual."""
    claimed: set[str] = set()
    for base in node.__mro__:
        own = base.__module__.startswith("app.") or base in textual
        if not (isinstance(base, type) and issubclass(base, DOMNode)) or not own:
            continue
        bindings = list(Binding.make_bindings(base.__dict__.get("BINDINGS", [])))
        fresh = [binding for binding in bindings if binding.key not in claimed]
        claimed.update(binding.key for binding in bindings)
        yield from fresh


def priority_keys(*nodes: type[DOMNode] | None) -> set[str]:
    """The keys `nodes` bind with priority: they take them before any focused widget."""
    return {b.key for node in nodes if node is not None for b in declared_bindings(node) if b.priority}


def place_entries(
    nodes: tuple[type[DOMNode], ...], taken: set[str], textual: tuple[type[DOMNode], ...] = ()
) -> list[KeyEntry]:
    """The entries of `nodes`: their described, non-system bindings but `taken` keys, by action in the order bound."""
    entries: dict[tuple[type[DOMNode], str, str], KeyEntry] = {}
    for node in nodes:
        for binding in declared_bindings(node, textual):
            if binding.system or not binding.description or binding.key in taken:
                continue
            slot = (node, binding.action, binding.description)
            entry = entries.get(slot)
            keys = (*entry.keys, binding.key) if entry is not None else (binding.key,)
            entries[slot] = KeyEntry(keys, entry.binding if entry is not None else binding, node)
    return list(entries.values())


def key_sections(app: type[App[object]], textual: bool = True) -> list[tuple[str, list[KeyEntry]]]:
    """Every place's keys, the App's first ("Anywhere"); a key a place binds to the App's action that the App binds
    to the same key is listed once, under Anywhere. `textual`: with the keys of Textual's classes a place names (the
    message box's editing keys)."""
    anywhere = place_entries((app,), set())
    app_keys = {(key, f"app.{entry.binding.action}") for entry in anywhere for key in entry.keys}
    sections = [("Anywhere", anywhere)]
    for place in PLACES:
        taken = priority_keys(app, place.screen) if place.screen is not None else set()
        entries = [
            entry
            for entry in place_entries(place.nodes, taken, place.textual if textual else ())
            if not all((key, entry.binding.action) in app_keys for key in entry.keys)
        ]
        sections.append((place.title, entries))
    return sections


README_START: Final = "<!-- keys: generated from the bindings by scripts/readme_keys.py; edit BINDINGS, not this -->"
README_END: Final = "<!-- keys: end -->"


def readme_keys(app: type[App[object]]) -> str:
    """The README's key table, between its markers: llmtui's own keys (F1 lists Textual's editing keys too)."""
    lines = [README_START, "", "| where | key | what |", "|---|---|---|"]
    textual = {place.title: place.textual for place in PLACES}
    for title, entries in key_sections(app, textual=False):
        rows = [(entry.key_text, entry.what) for entry in entries]
        if textual.get(title):
            names = ", ".join(node.__name__ for node in textual[title])
            rows.append(("…", f"{names}'s editing keys (arrows, selection, words, cut / copy / paste): F1 lists them"))
        for key, what in rows:
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in (title, key, what)) + " |")
    return "\n".join([*lines, "", README_END])
