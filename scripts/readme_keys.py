"""Rewrite README.md's key table from the bindings (app/tui/screens/help_keys.py): run after changing a BINDINGS.

tests/unit/test_keys.py fails while the table and the bindings differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.tui.app import LlmtuiApp
from app.tui.screens.help_keys import README_END, README_START, readme_keys

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> int:
    text = README.read_text(encoding="utf-8")
    try:
        start, end = text.index(README_START), text.index(README_END) + len(README_END)
    except ValueError:
        print(f"{README}: no key table markers ({README_START!r} … {README_END!r})", file=sys.stderr)
        return 1
    README.write_text(text[:start] + readme_keys(LlmtuiApp) + text[end:], encoding="utf-8")
    print(f"{README}: key table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
