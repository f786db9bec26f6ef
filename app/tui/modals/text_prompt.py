"""A one-line text dialog (rename, import path): Enter accepts, Esc cancels; a path dialog completes with Tab."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label
from textual.worker import get_current_worker

from app.core.path_completion import Completion, complete_path


class TextPromptModal(ModalScreen[str | None]):
    """Asks for one line of text; dismisses with it, or None on Esc."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", tooltip="Cancel: nothing is taken")]

    HINT = "Enter to accept · Esc to cancel"

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.value = value
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.value, placeholder=self.placeholder, id="text-prompt-input")
            yield Label(self.HINT, classes="dialog-hint", id="text-prompt-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.accept(event.value)

    def accept(self, value: str) -> None:
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PathPromptModal(TextPromptModal):
    """Asks for a path: Tab completes the typed path as a shell does (folders, and files with `suffixes`), listing
    the matches under it when several fit; the folder is read in a thread, a bounded number of entries."""

    BINDINGS = [
        Binding("tab", "complete", "Complete", priority=True, tooltip="Complete the path: folders and matching files")
    ]

    HINT = "Tab completes the path · Enter to accept · Esc to cancel"

    def __init__(
        self,
        title: str,
        value: str = "",
        placeholder: str = "",
        suffixes: tuple[str, ...] = (),
        *,
        left_out: tuple[str, ...] = (),
        check: Callable[[str], str] | None = None,
    ) -> None:
        """`suffixes`: the files Tab offers (every one when empty), less those ending in `left_out`; `check`: run in
        a thread on Enter, the reason the typed path will not do ('' when it will): the dialog stays open with it."""
        super().__init__(title, value, placeholder)
        self.suffixes = suffixes
        self.left_out = left_out
        self.check = check
        self.checking = False
        self.completions = 0
        """Completions shown so far (tests wait on it)."""

    def accept(self, value: str) -> None:
        if self.check is None or not value.strip():
            self.dismiss(value)
        elif not self.checking:
            self.checking = True
            self._check(value)

    @work(thread=True, exclusive=True, group="path-check", exit_on_error=False)
    def _check(self, value: str) -> None:
        assert self.check is not None
        problem = self.check(value)
        self.app.call_from_thread(self._checked, value, problem)

    def _checked(self, value: str, problem: str) -> None:
        self.checking = False
        if not problem:
            self.dismiss(value)
            return
        hint = self.query_one("#text-prompt-hint", Label)
        hint.update(Text(problem))  # a path's brackets are not markup
        hint.add_class("error")

    def action_complete(self) -> None:
        # Tab is a priority binding: it runs as the App receives it, while keys typed just before it (a fast typist,
        # a paste and Tab) may still wait in the field's own queue. Read the field once it has taken them.
        field = self.query_one("#text-prompt-input", Input)
        field.call_later(lambda: self._complete(field.value))

    @work(thread=True, exclusive=True, group="path-completion", exit_on_error=False)
    def _complete(self, typed: str) -> None:
        completion = complete_path(typed, self.suffixes, self.left_out)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._completed, typed, completion)

    def _completed(self, typed: str, completion: Completion) -> None:
        field = self.query_one("#text-prompt-input", Input)
        if field.value == typed:  # not typed over meanwhile
            field.value = completion.text
            field.cursor_position = len(completion.text)
        hint = self.query_one("#text-prompt-hint", Label)
        hint.update(completion.note or self.HINT)
        hint.remove_class("error")
        self.completions += 1
