"""`KeysBeforeTextArea`: a text area that can take a key before Textual's TextArea inserts it.

Relies on (Textual 8.2): TextArea handles keys in its private `_on_key(event)` handler (a coroutine), which inserts
printable keys and Enter; Textual dispatches a Key event to each class's `_on_key` or `on_key` along the MRO until
one calls `prevent_default()`, so this mixin's `_on_key` runs before TextArea's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events
from textual.widgets import TextArea

if TYPE_CHECKING:
    _TextAreaBase = TextArea
else:  # at run time a plain mixin, like LaidOutOnce: the widget's CSS type names stay those of its own classes
    _TextAreaBase = object


class KeysBeforeTextArea(_TextAreaBase):
    """Mixin (before TextArea): `take_key` sees each key before TextArea's own key handler.

    A binding's action runs after the key handlers, so a key bound to an action of the widget's own would land after
    the text typed behind it in a burst of keys; taking it here keeps the order.
    """

    def take_key(self, event: events.Key) -> bool:
        """Handle `event` before TextArea does (and stop it); whether it was taken."""
        return False

    async def _on_key(self, event: events.Key) -> None:
        if self.take_key(event):
            return
        await super()._on_key(event)
