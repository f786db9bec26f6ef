"""Layering: the engine and the catalog never import the UI toolkit (checked in a fresh interpreter)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules_of(package: str) -> list[str]:
    """Every module of `package`, subpackages included (found from the files, nothing imported)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_modules_of_walks_subpackages() -> None:
    engine = modules_of("engine_ext")
    assert {"engine_ext", "engine_ext.speculative.ngram", "engine_ext.steering.cvec_file"} <= set(engine)
    assert len(engine) == len(list((ROOT / "engine_ext").rglob("*.py")))


def test_import_contracts_hold() -> None:
    """pyproject's [tool.importlinter] contracts: the floors (app → models_catalog → engine_ext) and no UI toolkit
    below app, no import cycle inside app/ (screens never import the App), indirect imports included."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        lint = Path(shutil.which("lint-imports") or "lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


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


def _ruff() -> str:
    ruff = Path(sys.executable).parent / "ruff"
    return str(ruff) if ruff.exists() else shutil.which("ruff") or "ruff"


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_code_is_formatted_and_linted(command: list[str]) -> None:
    """`ruff format` is applied and `ruff check` is clean (pyproject pins ruff: its formatting changes between
    versions). To fix: `.venv/bin/ruff format . && .venv/bin/ruff check --fix .`."""
    result = subprocess.run(
        [_ruff(), *command, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
