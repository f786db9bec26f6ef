"""Only app/tui loads the UI toolkit: every other module of app/, engine_ext/ and models_catalog/ is imported in a fresh
interpreter (one per package root) and neither textual nor rich (nor textual_image) is in `sys.modules` after it. The
import-linter contracts (pyproject) say which imports are written; this says what importing them does."""

from __future__ import annotations

import ast
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


SAME_CONCEPT_PAIRS = {
    "conversations.py": {"app/core/store/conversations.py", "app/tui/controllers/conversations.py"},
    "doctor.py": {"app/cli/doctor.py", "engine_ext/doctor.py"},
}
"""Module names used twice, each pair one concept's parts in two layers: the conversations table in the store and
the App's conversations controller (import, export); `llmtui doctor` and the engine facts it prints."""


def modules_by_name(roots: tuple[str, ...] = ("app", "engine_ext", "models_catalog")) -> dict[str, set[str]]:
    """Every module's file name (`__init__.py` aside) → the files with that name, under `roots`."""
    found: dict[str, set[str]] = {}
    for root in roots:
        for path in (ROOT / root).rglob("*.py"):
            if path.name != "__init__.py":
                found.setdefault(path.name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_two_modules_share_a_name_only_as_one_concepts_parts() -> None:
    """A name used twice is a decision (one concept's parts, listed above), never an accident: four unrelated
    `models.py` would say nothing."""
    shared = {name: paths for name, paths in modules_by_name().items() if len(paths) > 1}
    assert shared == SAME_CONCEPT_PAIRS


def stubs_in(paths: list[Path], base: Path = ROOT) -> list[str]:
    """`raise NotImplementedError` statements in `paths` ("path:line", relative to `base`): a method standing in
    for another's."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                    found.append(f"{path.relative_to(base).as_posix()}:{node.lineno}")
    return found


def test_no_method_is_a_not_implemented_stub(tmp_path: Path) -> None:
    """An interface is declared (a Protocol, or `abc.abstractmethod`, which mypy holds every subclass to), never a
    body that raises; the check finds one written either way."""
    code = [path for root in ("app", "engine_ext", "models_catalog") for path in sorted((ROOT / root).rglob("*.py"))]
    assert stubs_in(code) == []
    planted = tmp_path / "stubs.py"
    planted.write_text(
        "class A:\n    def f(self):\n        raise NotImplementedError\n"
        "    def g(self):\n        raise NotImplementedError('later')\n",
        encoding="utf-8",
    )
    assert stubs_in([planted], tmp_path) == ["stubs.py:3", "stubs.py:5"]


def abstract_left(cls: type) -> set[str]:
    """The abstract methods `cls` has not implemented (Textual's classes have no ABCMeta, so Python does not say)."""
    return {name for name in dir(cls) if getattr(getattr(cls, name, None), "__isabstractmethod__", False)}


def test_every_screen_app_and_widget_implements_its_abstract_base() -> None:
    """LlmtuiApp implements its shell (what screens see of it), each A/B view its run's hooks, each kept-lines
    widget its rendering; a subclass that implements nothing is found."""
    from app.tui.app import LlmtuiApp
    from app.tui.screens.spec_check import SpecCheckScreen
    from app.tui.screens.steering_ab import SteeringABScreen
    from app.tui.shell import LlmtuiShell
    from app.tui.widgets.live_body import LiveBody
    from app.tui.widgets.message_view import MessageView

    for concrete in (LlmtuiApp, SpecCheckScreen, SteeringABScreen, LiveBody, MessageView):
        assert abstract_left(concrete) == set(), concrete.__name__
    declared = abstract_left(type("Bare", (LlmtuiShell,), {}))
    assert {"features_changed", "save_config_quietly", "set_engine_state", "action_toggle_server"} <= declared


ENGINE_CLASSES = {"Engine", "EngineBridge", "RemoteBridge", "RemoteClient", "EngineClient"}
"""The engine interface and what implements it (app/core/engine.py's `Engine`, the two bridges, their clients)."""


def engine_type_checks(source: str) -> list[int]:
    """Lines that ask which engine they hold: isinstance/issubclass on an engine class, getattr/hasattr/type on an
    engine (held as `bridge`, or as an `EngineMessage`'s `engine`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {ast.unparse(kind).split(".")[-1] for kind in kinds}
            if named & ENGINE_CLASSES:
                found.append(node.lineno)
        elif node.func.id in ("getattr", "hasattr", "type"):
            held = ast.unparse(node.args[0])
            if held.split(".")[-1].endswith("bridge") or held.endswith("message.engine"):
                found.append(node.lineno)
    return found


def test_no_code_asks_which_engine_it_holds() -> None:
    """An engine is an `Engine`: what only some engines do is in its `capabilities` or a method with a default, so
    no code in app/ tells the local bridge from the remote one (the check finds each way of asking)."""
    asked = [
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for line in engine_type_checks(path.read_text(encoding="utf-8"))
    ]
    assert asked == []
    planted = (
        "isinstance(self.bridge, RemoteBridge)\n"
        "isinstance(engine, (EngineBridge, int))\n"
        "getattr(self.app.bridge, 'takes_tools', False)\n"
        "hasattr(message.engine, 'pid')\n"
        "type(bridge) is EngineBridge\n"
        "getattr(config.engine, name)\n"
        "isinstance(event, TokenChunk)\n"
    )
    assert engine_type_checks(planted) == [1, 2, 3, 4, 5]
