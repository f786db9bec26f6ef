"""The multi-line prompt: Enter sends, Shift+Enter or Ctrl+J adds a line, Up on the first line recalls."""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import unquote, urlsplit

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from app.tui.textual_internals.text_area import KeysBeforeTextArea

NEWLINE_KEYS = ("shift+enter", "ctrl+j")
SELECT_ALL_KEY = "ctrl+a"  # as in most editors, so a long message is cleared or replaced at once (issue 37)
PLACEHOLDER = "Message  (Enter sends · Shift+Enter or Ctrl+J new line)"
SHORT_PLACEHOLDER = "Message  (Enter sends · Ctrl+J new line)"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
DROPPED_PATH_MAX_CHARS = 4096


def dropped_image_path(pasted: str) -> Path | None:
    """The image file a paste names when it is what terminals paste when a file is dropped on them: one absolute
    path (or `~/…`, or a file:// URL), quoted or backslash-escaped or bare, ending in an image suffix, and nothing
    else. None for any other paste (it is text for the message)."""
    text = pasted.strip()
    if not text or len(text) > DROPPED_PATH_MAX_CHARS or "\n" in text:
        return None
    if text.startswith("file://"):
        text = unquote(urlsplit(text).path)
    else:
        try:
            words = shlex.split(text)
        except ValueError:  # an unclosed quote
            return None
        if len(words) == 1:
            text = words[0]
    if not text.startswith(("/", "~/")) or not text.lower().endswith(IMAGE_SUFFIXES):
        return None
    return Path(text).expanduser()


class PromptInput(KeysBeforeTextArea, TextArea):
    """Where the user writes a message: Enter sends it, Shift+Enter or Ctrl+J adds a line, Up on the first line
    recalls an earlier one. TextArea's editing keys stay (but those the chat screen or the App take first), and the
    F1 help lists them from its BINDINGS with these."""

    BINDINGS = [
        Binding("enter", "submit", "Send", show=False, tooltip="Send the message"),
        Binding(",".join(NEWLINE_KEYS), "newline", "New line", show=False),
        Binding(
            SELECT_ALL_KEY,  # over TextArea's ctrl+a: the line start, which home still does
            "select_all",
            "Select all",
            show=False,
            tooltip="Select all: then type, or backspace, to replace or clear it",
        ),
        Binding("up", "recall(-1)", "Up", show=False, tooltip="Up: on the first line, recall an earlier message"),
        Binding("down", "recall(1)", "Down", show=False, tooltip="Down: on the last line, a later message recalled"),
    ]

    class ImagePathPasted(Message):
        """A paste that is the path of an image file (a file dropped on the terminal): to attach, not to type."""

        def __init__(self, prompt_input: PromptInput, path: Path) -> None:
            super().__init__()
            self.prompt_input = prompt_input
            self.path = path

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    class Submitted(Message):
        """The user pressed Enter on a message that is not blank."""

        def __init__(self, prompt_input: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt_input = prompt_input
            self.text = text

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(self, *, id: str | None = None, placeholder: str = PLACEHOLDER) -> None:  # noqa: A002
        super().__init__(
            id=id,
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            compact=True,
            placeholder=placeholder,
            highlight_cursor_line=False,
        )
        self._placeholders = (placeholder, SHORT_PLACEHOLDER if placeholder == PLACEHOLDER else placeholder)
        """The placeholder, and the one shown where it would be cut."""
        self.sent_history: list[str] = []
        """Messages sent, oldest first (recalled with Up)."""
        self._recall_index: int | None = None
        self._draft = ""

    def on_resize(self, event: events.Resize) -> None:
        """The placeholder whole: the shorter one where the longer would be cut (80 columns with the list)."""
        whole, short = self._placeholders
        self.placeholder = whole if self.content_size.width > len(whole) else short  # (event.size has the border)

    def action_newline(self) -> None:
        self.insert("\n")

    def on_paste(self, event: events.Paste) -> None:
        """A dropped image file's path becomes an attachment (ImagePathPasted); any other paste is typed, by
        TextArea's own handler."""
        path = dropped_image_path(event.text)
        if path is not None:
            event.prevent_default()  # TextArea's handler (later in the class order) does not type it
            event.stop()
            self.post_message(self.ImagePathPasted(self, path))

    def take_key(self, event: events.Key) -> bool:
        if event.key in NEWLINE_KEYS:
            # Here rather than only through the binding: a binding's action runs after the key handlers, so in a
            # burst of keys (fast typing while a reply streams, tmux send-keys) the newline landed after the text
            # typed behind it ("line oneline two" and then the line breaks).
            event.stop()
            event.prevent_default()
            self.action_newline()
            return True
        if event.key == SELECT_ALL_KEY:  # here too, for the same reason: a burst's next keys replace the selection
            event.stop()
            event.prevent_default()
            self.select_all()
            return True
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
            return True
        step = -1 if event.key == "up" else 1
        if event.key in ("up", "down") and self._recalls(step):
            event.stop()
            event.prevent_default()
            self._recall(step)
            return True
        return False

    def action_submit(self) -> None:
        """Send the message, unless it is blank."""
        text = self.text
        if text.strip():
            self.post_message(self.Submitted(self, text))

    def _recalls(self, step: int) -> bool:
        """Whether Up (`step` -1) or Down (+1) recalls a message here, rather than moving the cursor."""
        if step < 0:
            return self.cursor_location[0] == 0 and bool(self.sent_history)
        return self._recall_index is not None and self.cursor_location[0] == self.document.line_count - 1

    def action_recall(self, step: int) -> None:
        """Up or Down: a message recalled where it recalls one (`take_key` does it first), else the cursor moved."""
        if self._recalls(step):
            self._recall(step)
        elif step < 0:
            self.action_cursor_up()
        else:
            self.action_cursor_down()

    def _recall(self, step: int) -> None:
        if self._recall_index is None:
            if step > 0:
                return
            self._draft = self.text
            index = len(self.sent_history) - 1
        else:
            index = self._recall_index + step
        if index < 0:
            return
        if index >= len(self.sent_history):
            self._recall_index = None
            self.load_text(self._draft)
        else:
            self._recall_index = index
            self.load_text(self.sent_history[index])
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        """Add a sent message to the recall history and clear the box."""
        if not self.sent_history or self.sent_history[-1] != text:
            self.sent_history.append(text)
        self._recall_index = None
        self._draft = ""
        self.load_text("")
