"""Keys are declared once (issue 43, 4): every key a class handles is in its BINDINGS, every binding F1 lists runs a
real action, every class with keys is one of F1's places, and the README's key table is the bindings'."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from textual.actions import parse as parse_action
from textual.dom import DOMNode
from textual.screen import Screen

from app.tui.app import LlmtuiApp
from app.tui.screens.help import HelpScreen
from app.tui.screens.help_keys import PLACES, README_END, README_START, declared_bindings, key_sections, readme_keys

ROOT = Path(__file__).resolve().parents[2]
TUI = ROOT / "app" / "tui"


def tui_modules() -> Iterator[tuple[Path, ast.Module, object]]:
    for path in sorted(TUI.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix().removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        yield path, ast.parse(path.read_text(encoding="utf-8")), importlib.import_module(name)


def compared_keys(node: ast.AST, module: object) -> Iterator[str]:
    """The key names `node` compares a Key event's `.key` with (`event.key == "up"`, `event.key in NEWLINE_KEYS`)."""
    for compare in ast.walk(node):
        if isinstance(compare, ast.Call) and isinstance(compare.func, ast.Attribute) and compare.args:
            looked_up = compare.args[0]
            if (
                isinstance(compare.func.value, ast.Dict)
                and isinstance(looked_up, ast.Attribute)
                and looked_up.attr == "key"
            ):
                yield from (
                    k.value for k in compare.func.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                )
        if not isinstance(compare, ast.Compare):
            continue
        sides = [compare.left, *compare.comparators]
        if not any(isinstance(side, ast.Attribute) and side.attr == "key" for side in sides):
            continue
        for side in sides:
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                yield side.value
            elif isinstance(side, ast.Name) and isinstance(getattr(module, side.id, None), (str, tuple, frozenset)):
                value = getattr(module, side.id)
                yield from [value] if isinstance(value, str) else value
            elif isinstance(side, (ast.Tuple, ast.Set, ast.List)):
                yield from (e.value for e in side.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))


def bound_keys(node: type[DOMNode]) -> set[str]:
    """Every key `node` and its own bases bind with a description (a Textual base's binding of the key, such as
    TextArea's Up, does not say what the handler does)."""
    return {binding.key for binding in declared_bindings(node) if binding.description}


def test_every_key_a_class_handles_is_in_its_bindings() -> None:
    """A key taken in a handler (`on_key`, `take_key`, a `key_*` method) is bound too, with a description, so F1 and
    the palette know it; a handler may take it first (before TextArea types it), the binding says what it does."""
    unbound: list[str] = []
    for path, tree, module in tui_modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(module, node.name, None)
            if not (inspect.isclass(cls) and issubclass(cls, DOMNode)):
                continue
            keys = set(compared_keys(node, module))
            keys |= {
                f.name.removeprefix("key_")
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name.startswith("key_")
            }
            unbound += [f"{path.relative_to(ROOT)}: {node.name} handles {key!r}" for key in keys - bound_keys(cls)]
    assert not unbound, "handled but not in BINDINGS:\n" + "\n".join(unbound)


def test_the_check_finds_a_handled_key_that_is_not_bound() -> None:
    source = """
class X:
    def on_key(self, event):
        if event.key == "ctrl+z" or event.key in ("f2", "f3") or {"f4": 1}.get(event.key):
            pass
"""
    assert sorted(compared_keys(ast.parse(source), object())) == ["ctrl+z", "f2", "f3", "f4"]


def action_target(action: str, node: type[DOMNode], screen: type[Screen[Any]] | None) -> type[DOMNode] | None:
    destination, _, _ = parse_action(action)
    if destination == "app":
        return LlmtuiApp
    if destination == "screen":
        return screen if screen is not None else (node if issubclass(node, Screen) else None)
    return node


def test_every_binding_f1_lists_runs_an_action_that_exists() -> None:
    """Listed in help but not bound, or bound to an action nobody has: neither can happen unseen."""
    places = [(LlmtuiApp, None), (HelpScreen, None)] + [
        (node, place.screen) for place in PLACES for node in place.nodes
    ]
    broken = []
    for node, screen in places:
        for binding in declared_bindings(node):
            target = action_target(binding.action, node, screen)
            _, name, _ = parse_action(binding.action)
            if target is None or not hasattr(target, f"action_{name}"):
                broken.append(f"{node.__name__}: {binding.key} → {binding.action}")
            if not binding.system:
                assert binding.description, f"{node.__name__}: {binding.key} has no description for F1"
    assert not broken, "bound to no action:\n" + "\n".join(broken)


def test_every_class_with_keys_is_one_of_f1s_places() -> None:
    listed = {base for place in PLACES for node in place.nodes for base in node.__mro__} | {LlmtuiApp, HelpScreen}
    missing = []
    for _, tree, module in tui_modules():
        for node in ast.walk(tree):
            cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
            if (
                inspect.isclass(cls)
                and cls.__module__ == getattr(module, "__name__", "")
                and "BINDINGS" in cls.__dict__
            ):
                if cls not in listed:
                    missing.append(f"{cls.__module__}.{cls.__name__}")
    assert not missing, "classes with keys that F1 does not list (add them to help_keys.PLACES):\n" + "\n".join(missing)


def test_no_docstring_lists_keys_again() -> None:
    tables = [
        str(path.relative_to(ROOT)) for path in TUI.rglob("*.py") if "| Key |" in path.read_text(encoding="utf-8")
    ]
    assert not tables, f"key tables written by hand (the bindings are the list): {tables}"


def test_every_place_lists_keys_and_the_app_comes_first() -> None:
    sections = key_sections(LlmtuiApp)
    assert sections[0][0] == "Anywhere" and [t for t, _ in sections[1:]] == [p.title for p in PLACES]
    assert all(entries for _, entries in sections)
    anywhere = {key for entry in sections[0][1] for key in entry.keys}
    assert {"f1", "question_mark", "ctrl+p", "f3", "f4", "f10", "ctrl+q"} <= anywhere
    chat = {key for entry in sections[1][1] for key in entry.keys}
    assert "f1" not in chat and {"escape", "ctrl+l", "ctrl+n", "f12", "tab"} <= chat  # f1 is the App's: once


def test_the_readmes_key_table_is_the_bindings() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = readme.index(README_START), readme.index(README_END) + len(README_END)
    assert readme[start:end] == readme_keys(LlmtuiApp), (
        "README.md's key table differs from the bindings: run `python scripts/readme_keys.py`"
    )
