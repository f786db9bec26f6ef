"""Every use of Textual's and Rich's private API in llmtui, one module per internal, each saying what it relies on.

Checked against Textual 8.2.8 and Rich 15.0.0 (CHECKED_WITH_TEXTUAL, CHECKED_WITH_RICH).
tests/unit/test_textual_internals.py checks that every private name used here still exists with the signature relied
on, and that the installed versions are the ones checked; after an upgrade, read each module here again against the
new sources, then update the constants.

- `layout`: `LaidOutOnce`, skipping the second layout after a change of size (`Widget._size_updated`).
- `compositor`: `CroppedCompositor` and `use_cropped_compositor` (`textual._compositor.Compositor`,
  `Screen._compositor`).
- `scrollbar`: `LinesOncePerPositionScrollBar` and `use_vertical_scrollbar` (`Widget._vertical_scrollbar`,
  `App._start_widget`, what `ScrollBar.render` draws).
- `text_area`: `KeysBeforeTextArea`, taking keys before `TextArea._on_key` inserts them.
- `terminal_text`: `drop_controls_from_terminal_output`, the last check that no control character of a widget's text
  reaches the terminal (`Strip.render`, `Strip._render_cache`).
- `rich_render`: `SyntaxLineByLine` (`Syntax._get_syntax` and its helpers) and `console_with_own_lock`
  (`Console._lock`).
"""

from typing import Final

CHECKED_WITH_TEXTUAL: Final = "8.2.8"
"""The Textual version this package was read against."""
CHECKED_WITH_RICH: Final = "15.0.0"
"""The Rich version this package was read against."""
