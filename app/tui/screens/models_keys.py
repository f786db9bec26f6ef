"""The models screen's (F4) keys, the most useful first: at 80 columns the footer shows what fits. Each tooltip names
the command, then after a colon its detail: F1's help and the palette are made from them (`help_keys.py`)."""

from __future__ import annotations

from typing import Final

from textual.binding import Binding, BindingType
from textual.widgets import Input

SEARCH_BOXES = ("search-query", "search-author")
"""The search tab's text boxes: holding text, they take the keys typed (/ and digits too); empty, 1/2/3 and / act."""
KEYS_OF_AN_EMPTY_BOX = frozenset({"1", "2", "3", "slash"})


class SearchBox(Input):
    """A search tab's box: while empty it leaves 1/2/3 and / to the screen's keys (the tabs, the search box), so
    they work from it; once it holds text they are typed (qwen3, org/name)."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        if key in KEYS_OF_AN_EMPTY_BOX and not self.value:
            return False
        return super().check_consume_key(key, character)


MODELS_BINDINGS: Final[list[BindingType]] = [
    Binding(
        "slash",
        "search",
        "Search",
        priority=True,
        tooltip="Search Hugging Face: the search box focused (in a box holding text, / is typed: org/name)",
    ),
    Binding("down", "to_results", "Results", show=False, tooltip="To the results: from the search box"),
    Binding("d", "download", "Download", tooltip="Download the highlighted quant: with the sidecars you tick"),
    Binding("u", "use", "Use", tooltip="Use the model in the chat: a local model or a downloaded quant"),
    Binding("p", "pause_download", "Pause", tooltip="Pause or resume the highlighted download: wherever the focus is"),
    # On a finished download: says p has nothing to do (the same key, not a second entry in F1).
    Binding("p", "pause_finished", "Pause", show=False, system=True),
    Binding("r", "resume_partial", "Resume", tooltip="Resume the highlighted partial download: Local tab"),
    Binding(
        "x,delete",
        "delete",
        "Delete",
        tooltip="Delete the highlighted model or partial download: Local tab (asks first, says the space freed)",
    ),
    Binding(
        "e",
        "edit_preset",
        "Serve preset",
        show=False,
        tooltip="The model's serve preset: Local tab (how `llmtui serve` loads it: alias, context, sampling, pin)",
    ),
    Binding("x", "cancel_download", "Cancel", tooltip="Cancel the highlighted download: elsewhere (asks first)"),
    Binding("escape", "back", "Back", tooltip="Back to the chat: from a search box, to the results or tabs first"),
    Binding("ctrl+r", "reload_local", "Reload", show=False, tooltip="Reload the local models and partial downloads"),
    # Before the search box (priority): an empty box lets 1/2/3 and / act; one holding text takes them (qwen3).
    Binding("1", "tab('catalog')", "Catalog", show=False, priority=True, tooltip="Catalog tab"),
    Binding(
        "2", "tab('search')", "Search tab", show=False, priority=True, tooltip="Search tab: the results shown before"
    ),
    Binding("3", "tab('local')", "Local", show=False, priority=True, tooltip="Local tab: the models on this machine"),
]
