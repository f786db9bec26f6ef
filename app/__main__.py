"""`python -m app` and the `llmtui` command: see app/cli."""

from __future__ import annotations

import sys

from app.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
