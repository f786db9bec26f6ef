"""Only app/tui loads the UI toolkit: every other module of app/, engine_ext/ and models_catalog/ is imported in a fresh
interpreter (one per package root) and neither textual nor rich (nor textual_image) is in `sys.modules` after it. The
import-linter contracts (pyproject) say which imports are written; this says what importing them does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UI_PACKAGES = ("textual", "rich", "textual_image")
TUI = "app.tui"

_CHECK = """
import importlib, sys
ui = {ui!r}
for name in sys.argv[1:]:
    importlib.import_module(name)
    loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set(ui))
    if loaded:
        sys.exit(f"importing {{name}} loaded {{', '.join(loaded)}}")
print(len(sys.argv) - 1, "modules")
"""


def modules_of(package: str) -> list[str]:
    """Every module of `package`, subpackages included (found from the files, nothing imported)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def outside_the_tui(package: str) -> list[str]:
    return [name for name in modules_of(package) if name != TUI and not name.startswith(TUI + ".")]


def imports_without_ui(modules: list[str]) -> subprocess.CompletedProcess[str]:
    """Import `modules` in order in a fresh interpreter that stops at the first one that loaded a UI package."""
    return subprocess.run(
        [sys.executable, "-c", _CHECK.format(ui=UI_PACKAGES), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("package", ["app", "engine_ext", "models_catalog"])
def test_no_module_outside_app_tui_loads_textual_or_rich(package: str) -> None:
    modules = outside_the_tui(package)
    result = imports_without_ui(modules)
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    assert result.stdout.split() == [str(len(modules)), "modules"]


def test_the_check_finds_a_module_that_loads_textual() -> None:
    """The check can fail: a TUI module in the list is named, with what it loaded."""
    result = imports_without_ui(["app.core.paths", "app.tui.shell"])
    assert result.returncode != 0
    assert result.stderr.strip() == "importing app.tui.shell loaded rich, textual"


def test_the_app_package_is_the_cli_the_tui_the_server_and_the_core() -> None:
    """A newcomer reads the layout from the tree: app/ holds its entry point and four packages, no loose modules;
    the walk above covers the CLI, the server and the core."""
    entries = {path.name for path in (ROOT / "app").iterdir() if path.name != "__pycache__"}
    assert entries == {"__init__.py", "__main__.py", "cli", "core", "server", "tui"}
    checked = outside_the_tui("app")
    assert {"app.cli.run", "app.server.asgi", "app.core.config", "app.core.generation.core"} <= set(checked)
    assert not any(name.startswith("app.tui") for name in checked)
