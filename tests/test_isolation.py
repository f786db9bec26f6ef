"""Layering: the engine and the catalog never import the UI toolkit (checked in a fresh interpreter)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules_of(package: str) -> list[str]:
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / package)])] + [package]


@pytest.mark.parametrize("package", ["engine_ext", "models_catalog"])
def test_core_packages_never_import_textual_or_rich(package: str) -> None:
    modules = modules_of(package)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_only_engine_ext_imports_llama_cpp() -> None:
    offenders = []
    for package in ("app", "models_catalog"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if "import llama_cpp" in text or "from llama_cpp" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_the_ui_process_never_loads_llama_cpp() -> None:
    # The engine runs in the worker; the app (CLI entry point and the Textual app) only speaks the protocol.
    code = (
        "import sys, app.__main__, app.tui, app.bridge\n"
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported in the UI process'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
