"""The private Textual and Rich API that app/tui/textual_internals/ relies on is still there, as it was read.

A Textual or Rich upgrade that renames, removes or reshapes one of these fails here, in one place, with the module to
read again, rather than as a blank screen, a missed repaint or a slow UI somewhere else.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
import threading
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.syntax import Syntax
from textual._compositor import Compositor
from textual.app import App
from textual.geometry import Region
from textual.screen import Screen
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import TextArea

from app.tui.textual_internals import CHECKED_WITH_RICH, CHECKED_WITH_TEXTUAL
from app.tui.textual_internals.scrollbar import SCROLLBAR_FIELDS
from app.tui.textual_internals.terminal_text import TEXTUAL_RENDER as TEXTUAL_STRIP_RENDER

TEXTUAL = version("textual")
RICH = version("rich")
EMPTY = inspect.Parameter.empty
POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
KEYWORD = inspect.Parameter.KEYWORD_ONLY

Shape = list[tuple[str, Any, Any]]


def shape(function: Callable[..., Any]) -> Shape:
    """The parameters of `function` as the code relying on it sees them: names, kinds, defaults (annotations are
    left out: a new spelling of the same type is not a change)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def changed(library: str, what: str, module: str) -> str:
    installed = TEXTUAL if library == "Textual" else RICH
    return f"{library} {installed} changed {what}: app/tui/textual_internals/{module} must be checked again"


# (what, the function, its expected parameters, the module relying on it)
SIGNATURES: list[tuple[str, Callable[..., Any], Shape, str]] = [
    (
        "Widget._size_updated",
        Widget._size_updated,
        [
            ("self", POSITIONAL, EMPTY),
            ("size", POSITIONAL, EMPTY),
            ("virtual_size", POSITIONAL, EMPTY),
            ("container_size", POSITIONAL, EMPTY),
            ("layout", POSITIONAL, True),
        ],
        "layout.py",
    ),
    ("Compositor.__init__", Compositor.__init__, [("self", POSITIONAL, EMPTY)], "compositor.py"),
    (
        "Compositor._get_renders",
        Compositor._get_renders,
        [("self", POSITIONAL, EMPTY), ("crop", POSITIONAL, None)],
        "compositor.py",
    ),
    (
        "Compositor._render_chops",
        Compositor._render_chops,
        [("self", POSITIONAL, EMPTY), ("crop", POSITIONAL, EMPTY), ("is_rendered_line", POSITIONAL, EMPTY)],
        "compositor.py",
    ),
    (
        "ScrollBar.__init__",
        ScrollBar.__init__,
        [
            ("self", POSITIONAL, EMPTY),
            ("vertical", POSITIONAL, True),
            ("name", POSITIONAL, None),
            ("thickness", KEYWORD, 1),
        ],
        "scrollbar.py",
    ),
    (
        "ScrollBar.render_lines",
        ScrollBar.render_lines,
        [("self", POSITIONAL, EMPTY), ("crop", POSITIONAL, EMPTY)],
        "scrollbar.py",
    ),
    (
        "App._start_widget",
        App._start_widget,
        [("self", POSITIONAL, EMPTY), ("parent", POSITIONAL, EMPTY), ("widget", POSITIONAL, EMPTY)],
        "scrollbar.py",
    ),
    (
        "Strip.render",
        TEXTUAL_STRIP_RENDER,
        [("self", POSITIONAL, EMPTY), ("console", POSITIONAL, EMPTY)],
        "terminal_text.py",
    ),
    ("TextArea._on_key", TextArea._on_key, [("self", POSITIONAL, EMPTY), ("event", POSITIONAL, EMPTY)], "text_area.py"),
    (
        "Syntax._get_syntax",
        Syntax._get_syntax,
        [("self", POSITIONAL, EMPTY), ("console", POSITIONAL, EMPTY), ("options", POSITIONAL, EMPTY)],
        "rich_render.py",
    ),
    ("Syntax._get_base_style", Syntax._get_base_style, [("self", POSITIONAL, EMPTY)], "rich_render.py"),
    (
        "Syntax._process_code",
        Syntax._process_code,
        [("self", POSITIONAL, EMPTY), ("code", POSITIONAL, EMPTY)],
        "rich_render.py",
    ),
    (
        "Syntax._get_number_styles",
        Syntax._get_number_styles,
        [("self", POSITIONAL, EMPTY), ("console", POSITIONAL, EMPTY)],
        "rich_render.py",
    ),
    (
        "Syntax.highlight",
        Syntax.highlight,
        [("self", POSITIONAL, EMPTY), ("code", POSITIONAL, EMPTY), ("line_range", POSITIONAL, None)],
        "rich_render.py",
    ),
]


@pytest.mark.parametrize(("what", "function", "expected", "module"), SIGNATURES, ids=[entry[0] for entry in SIGNATURES])
def test_each_private_method_relied_on_keeps_its_signature(
    what: str, function: Callable[..., Any], expected: Shape, module: str
) -> None:
    library = "Rich" if what.startswith("Syntax") else "Textual"
    assert shape(function) == expected, changed(library, what, module)


def test_the_checked_versions_are_the_installed_ones() -> None:
    # Fails rather than warns on a new major or minor version: the signature checks above catch a renamed or
    # reshaped internal, not one that behaves differently behind the same signature (the order in which
    # Compositor._get_renders reads visible_widgets, what ScrollBar.render draws), and such a change shows only as a
    # missed repaint or a slower UI that no other test may notice. A person reads app/tui/textual_internals/ against the
    # new sources once, then updates CHECKED_WITH_*. Patch releases are taken as they come.
    for library, installed, checked in (("Textual", TEXTUAL, CHECKED_WITH_TEXTUAL), ("Rich", RICH, CHECKED_WITH_RICH)):
        assert installed.split(".")[:2] == checked.split(".")[:2], (
            f"{library} {installed} is installed; app/tui/textual_internals/ was checked against {checked}: "
            f"read each of its modules again against {library} {installed} and update CHECKED_WITH_{library.upper()}"
        )


def test_the_compositor_reads_visible_widgets_before_its_first_render() -> None:
    """CroppedCompositor narrows visible_widgets only around the first step of _get_renders."""
    reads: list[int] = []

    class Counting(Compositor):
        @property
        def visible_widgets(self) -> dict[Widget, tuple[Region, Region]]:
            reads.append(1)
            return {}

    renders = Counting()._get_renders(Region(0, 0, 10, 1))
    assert not reads, changed(
        "Textual", "Compositor._get_renders (reads visible_widgets before it is iterated)", "compositor.py"
    )
    assert next(iter(renders), None) is None
    assert reads == [1], changed(
        "Textual", "Compositor._get_renders (reads visible_widgets once, on its first step)", "compositor.py"
    )
    assert isinstance(inspect.getattr_static(Compositor, "visible_widgets"), property), changed(
        "Textual", "Compositor.visible_widgets (no longer a property)", "compositor.py"
    )


def test_the_private_attributes_relied_on_are_there() -> None:
    assert isinstance(Screen()._compositor, Compositor), changed("Textual", "Screen._compositor", "compositor.py")
    assert Widget()._vertical_scrollbar is None, changed("Textual", "Widget._vertical_scrollbar", "scrollbar.py")
    assert inspect.iscoroutinefunction(TextArea._on_key), changed(
        "Textual", "TextArea._on_key (not a coroutine)", "text_area.py"
    )
    assert isinstance(Console()._lock, type(threading.RLock())), changed("Rich", "Console._lock", "rich_render.py")
    assert Strip([])._render_cache is None, changed("Textual", "Strip._render_cache", "terminal_text.py")


def test_the_scrollbar_render_has_the_fields_its_lines_are_kept_by() -> None:
    fields = [name for name, _, _ in shape(ScrollBarRender.__init__)][1:]
    assert fields == list(SCROLLBAR_FIELDS), changed("Textual", f"ScrollBarRender's fields ({fields})", "scrollbar.py")
    bar = ScrollBarRender()
    assert all(hasattr(bar, name) for name in SCROLLBAR_FIELDS), changed(
        "Textual", "ScrollBarRender's attributes", "scrollbar.py"
    )


# Private names of Textual or Rich that app/ outside app/tui/textual_internals/ still uses, each with where it should
# go.
KNOWN_OUTSIDE: dict[tuple[str, str], str] = {}


@functools.cache
def _private_names_defined_by(base: type) -> frozenset[str]:
    """The private names (`_x`, not dunder) that the Textual or Rich class `base` itself defines or assigns."""
    names = {name for name in vars(base) if name.startswith("_") and not name.startswith("__")}
    try:
        source = textwrap.dedent(inspect.getsource(base))
    except (OSError, TypeError):
        return frozenset(names)
    names |= {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    }
    return frozenset(names)


def _private_names_of_library_bases(cls: type) -> set[str]:
    """The private names that the Textual and Rich classes among `cls`'s bases define or assign."""
    return {
        name
        for base in cls.__mro__
        if base.__module__.startswith(("textual", "rich"))
        for name in _private_names_defined_by(base)
    }


def test_no_private_textual_or_rich_api_is_used_outside_textual_internals() -> None:
    """Outside app/tui/textual_internals/: no import of a private Textual or Rich module, and no class of ours overrides
    or reads a private name of its Textual or Rich bases (`def _on_key`, `self._compositor`), nor `x.app._...`."""
    root = Path(__file__).resolve().parents[2]
    found: list[str] = []
    for path in sorted((root / "app").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("app/tui/textual_internals/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = importlib.import_module(relative.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in ("textual", "rich")
                and any(part.startswith("_") for part in node.module.split("."))
            ):
                found.append(f"{relative}:{node.lineno} imports {node.module}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("app", "screen")
            ):
                if (relative, node.attr) not in KNOWN_OUTSIDE:
                    found.append(f"{relative}:{node.lineno} reads .{node.value.attr}.{node.attr}")
            if not isinstance(node, ast.ClassDef) or not inspect.isclass(cls := getattr(module, node.name, None)):
                continue
            private = _private_names_of_library_bases(cls)
            for inner in ast.walk(node):
                name = (
                    inner.name
                    if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef)
                    else (
                        inner.attr
                        if isinstance(inner, ast.Attribute)
                        and isinstance(inner.value, ast.Name)
                        and inner.value.id == "self"
                        else None
                    )
                )
                if name in private and (relative, name) not in KNOWN_OUTSIDE:
                    found.append(f"{relative}:{inner.lineno} {node.name} uses {name}, private to its Textual/Rich base")
    assert not found, "Textual's or Rich's private API belongs in app/tui/textual_internals/:\n" + "\n".join(found)
