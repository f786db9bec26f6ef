"""Layering: the import contracts, the declared dependencies, llama_cpp only in the worker, formatting, lint and types
(what importing a module loads is tests/unit/test_import_hygiene.py's)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_import_hygiene import ROOT, modules_of


def test_modules_of_walks_subpackages() -> None:
    engine = modules_of("engine_ext")
    assert {"engine_ext", "engine_ext.speculative.ngram", "engine_ext.steering.cvec_file"} <= set(engine)
    assert len(engine) == len(list((ROOT / "engine_ext").rglob("*.py")))


def test_import_contracts_hold() -> None:
    """pyproject's [tool.importlinter] contracts: the floors (app → models_catalog → engine_ext), inside app the CLI
    above the TUI above the API server above the core, and no UI toolkit outside app.tui, indirect imports included
    (the CLI's only through app.tui); no import cycle inside app/ (screens never import the App), engine_ext/ or
    models_catalog/; GGUF read only through engine_ext's reader; private modules (engine_ext/gguf/_*.py) imported only
    inside their package, so everything outside uses engine_ext.gguf's public surface."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        lint = Path(shutil.which("lint-imports") or "lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "8 kept, 0 broken" in result.stdout


def test_every_imported_package_is_declared() -> None:
    """Each third-party package that app/, models_catalog/ or engine_ext/ imports is a dependency in pyproject (not
    only there because another package brings it)."""
    import ast
    import importlib.metadata
    import re
    import tomllib

    imported: set[str] = set()
    for package in ("app", "models_catalog", "engine_ext"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    ours = {"app", "models_catalog", "engine_ext", "llmtui_assets"}
    third_party = sorted(imported - set(sys.stdlib_module_names) - ours)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {
        normal(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]) for requirement in project["dependencies"]
    }
    distributions = importlib.metadata.packages_distributions()
    undeclared = [name for name in third_party if not {normal(d) for d in distributions.get(name, [name])} & declared]
    assert third_party and not undeclared, f"imported but not in [project] dependencies: {undeclared}"


def test_only_engine_ext_imports_llama_cpp() -> None:
    offenders = []
    for package in ("app", "models_catalog"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if "import llama_cpp" in text or "from llama_cpp" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


_LLAMA_TRIPWIRE = """
import importlib, sys, traceback

class Tripwire:
    \"\"\"Notes which of our modules were being imported when llama_cpp was (it still imports).\"\"\"

    chains = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "llama_cpp" and not self.chains:
            ours = [frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_stack(None)]
            ours = [n for n in reversed(ours) if n.split(".")[0] in ("app", "models_catalog", "engine_ext")]
            self.chains.append(" -> ".join(dict.fromkeys(ours)))
        return None

sys.meta_path.insert(0, Tripwire())
for name in sys.argv[1:]:
    importlib.import_module(name)
assert "llama_cpp" not in sys.modules, "llama_cpp imported in the UI process: " + "; ".join(Tripwire.chains)
print(len(sys.argv) - 1, "modules")
"""


def test_the_ui_process_never_loads_llama_cpp() -> None:
    """The engine runs in the worker; the app (the CLI, the Textual app, every screen and dialog) and the catalog
    only speak the protocol: importing every module of app/ and models_catalog/ loads no llama_cpp (a failure
    names the import chain that did)."""
    modules = modules_of("app") + modules_of("models_catalog")
    result = subprocess.run(
        [sys.executable, "-c", _LLAMA_TRIPWIRE, *modules], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(len(modules)), "modules"]


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


def test_the_types_check() -> None:
    """mypy over engine_ext, models_catalog and app ([tool.mypy] in pyproject: every def typed). To see the
    findings: `.venv/bin/python -m mypy`."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "no issues found" in result.stdout


MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120


def oversized(package: str) -> list[str]:
    """Modules of `package` over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES (nested ones too)."""
    import ast

    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return found


@pytest.mark.parametrize("package", ["app", "engine_ext", "models_catalog"])
def test_no_module_over_700_lines_and_no_function_over_120(package: str) -> None:
    """A module or a function that long does several jobs: split it by job (ARCHITECTURE.md)."""
    assert oversized(package) == []


def test_oversized_finds_a_long_module_and_a_long_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text(f"def f() -> None:\n{body}\n" + "\n" * MAX_MODULE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert oversized("pkg") == [
        f"pkg/long.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines",
        "pkg/long.py:1 f: 121 lines",
    ]
