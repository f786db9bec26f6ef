"""The bounded Jinja sandbox that chat templates from model files render in: time, size, allocation, call-depth and
cancellation limits on every operation a template can make. `engine_ext/chat_prompt.py` renders chat prompts with it."""

from __future__ import annotations

import functools
import json
import re
import string
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.parser import Parser
from jinja2.runtime import Context, LoopContext, Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from engine_ext.untrusted_text import one_line

# An integer power whose result would exceed this many bits is refused (9**9**9 hangs CPython).
_MAX_POW_BITS = 1_000_000
# range() longer than this is refused (jinja's own sandbox limit, with our error message).
_MAX_RANGE = 100_000
# Macro calls and recursive loop() calls nested deeper than this are refused (well inside Python's own limit).
_MAX_CALL_DEPTH = 64
# lipsum(n, html, min, max): at most this many paragraphs and words per paragraph.
_MAX_LIPSUM_PARAGRAPHS = 100
_MAX_LIPSUM_WORDS = 1_000
# |slice(n) with more slices than this is refused (it loops n times even over an empty list).
_MAX_SLICES = 1_000
# |tojson(indent=…) wider than this is refused.
_MAX_JSON_INDENT = 64
# Bytes the template's operations may allocate in all, per character of the output limit (32 MB by default).
_ALLOC_BYTES_PER_CHAR = 32
# How often a render asks its cancelled() callback (it may poll a pipe).
_CANCEL_CHECK_INTERVAL_S = 0.02
# While compiling, constant folding stops after this long (the expression is then computed at render time).
_COMPILE_FOLD_LIMIT_S = 2.0


class ChatTemplateError(Exception):
    """The model's chat template could not be rendered; the message says why, in one line of at most 300
    characters with its control characters made visible, whatever the template raised or quoted (its own
    raise_exception() text, an unknown filter's name, a compile error)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class ChatTemplateCancelled(ChatTemplateError):
    """``render_chat``'s ``cancelled()`` said stop (Esc) while the template was rendering."""


class TemplateRaised(Exception):
    """Raised by the template's own ``raise_exception(msg)`` call."""


# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


@dataclass
class Budget:
    """One render's limits and what it has used so far (`budget_var` holds the current render's)."""

    deadline: float  # time.monotonic() value
    time_limit_s: float
    max_chars: int
    depth: int = 0  # macro / recursive-loop calls in progress
    cancelled: Callable[[], bool] | None = None
    next_cancel_check: float = 0.0
    allocated: int = 0  # bytes of the values the template's operations made, freed or not

    @property
    def max_alloc_bytes(self) -> int:
        return _ALLOC_BYTES_PER_CHAR * self.max_chars


# Per-render limits; a ContextVar so one cached environment serves concurrent renders.
budget_var: ContextVar[Budget | None] = ContextVar("llmtui_chat_template_budget", default=None)


def current_budget() -> Budget | None:
    budget = budget_var.get()
    if budget is None:
        return None
    now = time.monotonic()
    if now > budget.deadline:
        raise ChatTemplateError(
            f"The chat template took longer than {budget.time_limit_s:g} s to render "
            "and was stopped (it may loop endlessly)."
        )
    if budget.cancelled is not None and now >= budget.next_cancel_check:
        budget.next_cancel_check = now + _CANCEL_CHECK_INTERVAL_S
        if budget.cancelled():
            raise ChatTemplateCancelled("The chat template's rendering was cancelled.")
    return budget


_SIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset)
_CONTAINERS = (list, tuple, dict, set, frozenset, Namespace, types.MappingProxyType)


def _too_big(budget: Budget, what: str = "") -> ChatTemplateError:
    detail = f" ({what})" if what else ""
    return ChatTemplateError(
        f"The chat template built a value larger than {budget.max_chars} characters{detail} and was stopped."
    )


def _refuse_if_huge(value: Any, budget: Budget | None) -> None:
    """Stop runaway intermediate strings/lists before they exhaust memory."""
    if budget is not None and isinstance(value, _SIZED):
        if len(value) > budget.max_chars:
            raise _too_big(budget)


def _account(value: Any, budget: Budget | None) -> None:
    """Count a value an operation made against the render's allocation budget (many values each under the size
    limit, kept in a list, would otherwise add up to gigabytes within the time limit)."""
    if budget is not None and isinstance(value, (*_SIZED, int)):
        budget.allocated += sys.getsizeof(value)
        if budget.allocated > budget.max_alloc_bytes:
            raise ChatTemplateError(
                f"The chat template allocated more than {budget.max_alloc_bytes // 2**20} MB and was stopped."
            )


def _check_size(size: int, budget: Budget | None, what: str = "") -> None:
    """Refuse an operation whose result would hold ``size`` characters/items, before it is computed."""
    if budget is not None and size > budget.max_chars:
        raise _too_big(budget, what)


def _flat_size(value: Any, budget: Budget | None) -> int:
    """Characters that ``str(value)`` would take, roughly, counting shared elements each time they repeat.

    A list holding the same big list 100,000 times prints it 100,000 times, and ``[x, x]`` sixty times over prints
    2**60 zeros. Each distinct container is sized once (post-order, by id), so the walk takes the number of distinct
    containers and elements, and stops as soon as one passes the limit (the whole holds it, so it is bigger still).
    """
    if budget is None or not isinstance(value, _CONTAINERS):
        return _leaf_size(value)
    limit = budget.max_chars
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    steps = 0
    while stack:
        item, expanded = stack.pop()
        key = id(item)
        if key in sizes or (not expanded and key in visiting):
            continue
        children = _children(item)
        if not expanded:
            visiting.add(key)
            sizes_pending = [
                c for c in children if isinstance(c, _CONTAINERS) and id(c) not in sizes and id(c) not in visiting
            ]
            stack.append((item, True))
            stack.extend((child, False) for child in sizes_pending)
            steps += len(sizes_pending) + 1
            if steps > 50_000:
                steps = 0
                current_budget()
            continue
        total = 2 + 2 * len(children)
        for child in children:
            # A container still being sized here is a cycle (a namespace holding itself): printed as "...".
            total += sizes.get(id(child), 8) if isinstance(child, _CONTAINERS) else _leaf_size(child)
            if total > limit:
                return total
        sizes[key] = total
    return sizes[id(value)]


def _children(item: Any) -> Sequence[Any]:
    if isinstance(item, (dict, types.MappingProxyType)):
        return [*item.keys(), *item.values()]
    if isinstance(item, Namespace):
        return [item._Namespace__attrs]  # type: ignore[attr-defined]
    return item if isinstance(item, (list, tuple)) else list(item)


def _leaf_size(item: Any) -> int:
    if isinstance(item, (str, bytes, bytearray)):
        return len(item) + 2
    if isinstance(item, int) and not isinstance(item, bool):
        return 2 + item.bit_length() // 3
    return 8


def _check_printable(value: Any, budget: Budget | None, what: str = "printing a nested value") -> None:
    """Refuse turning a container into text when the text would pass the size limit."""
    if budget is not None and isinstance(value, _CONTAINERS):
        _check_size(_flat_size(value, budget), budget, what)


def _as_int(value: Any, default: int = 0) -> int:
    return value if _is_int(value) else default


# %-formatting conversion specifiers: %(name)-10.5s, %*d, %%.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)?", re.DOTALL)


def _check_percent_format(fmt: Any, args: Any, budget: Budget | None) -> None:
    """Bound ``fmt % args`` (the ``%`` operator and the ``format`` filter) before formatting."""
    if budget is None or not isinstance(fmt, (str, bytes)):
        return
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    size = len(text) + _flat_size(args, budget)
    for match in _PERCENT_SPEC.finditer(text):
        for number in (match.group(1), match.group(2)):
            if number == "*":
                raise ChatTemplateError("The chat template used a '*' width in %-formatting, which is refused.")
            if number:
                if len(number) > 9:
                    raise _too_big(budget, "a %-format width")
                size += int(number)
    _check_size(size, budget, "a %-format width")


class _GuardedBuffer(list[Any]):
    """The output buffer of a macro or block: refuses to hold more than the size limit, and counts what it takes
    against the allocation budget."""

    _size = 0

    def _take(self, items: Iterable[Any]) -> list[Any]:
        budget = current_budget()
        taken = list(items)
        added = sum(len(item) for item in taken if isinstance(item, str))
        self._size += added
        if budget is not None:
            _check_size(self._size, budget, "a macro's or block's output")
            budget.allocated += added
            _account("", budget)
        return taken

    def append(self, item: Any) -> None:
        super().extend(self._take((item,)))

    def extend(self, items: Iterable[Any]) -> None:
        super().extend(self._take(items))


class _GuardedFormatterMixin:
    """``str.format`` with format-spec widths and the total output bounded."""

    _llmtui_size = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget = current_budget()
        if budget is not None:
            widths = [int(n) if len(n) <= 9 else budget.max_chars + 1 for n in re.findall(r"\d+", format_spec)]
            size = max(widths, default=0) + _flat_size(value, budget)
            self._llmtui_size += size
            _check_size(max(size, self._llmtui_size), budget, "str.format")
        return super().format_field(value, format_spec)  # type: ignore[misc]


class _GuardedFormatter(_GuardedFormatterMixin, SandboxedFormatter):
    pass


class _GuardedEscapeFormatter(_GuardedFormatterMixin, SandboxedEscapeFormatter):
    pass


def _check_str_method(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], budget: Budget) -> tuple[Any, ...]:
    """Bound the str/bytes methods whose result can be far larger than their inputs; returns the (maybe
    materialised) positional arguments."""
    if not isinstance(obj, types.BuiltinMethodType) or not isinstance(obj.__self__, (str, bytes, bytearray)):
        return args
    base: Any = obj.__self__
    name = obj.__name__
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        _check_size(_as_int(width), budget, f"str.{name}")
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        _check_size(len(base) * max(1, _as_int(tabsize)), budget, "str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, type(base)) and isinstance(new, type(base)):
            count = base.count(old) if old else len(base) + 1
            if len(args) > 2 and _is_int(args[2]) and args[2] >= 0:
                count = min(count, args[2])
            _check_size(len(base) + count * max(0, len(new) - len(old)), budget, "str.replace")
    elif name == "join" and args:
        items = list(_guard_items(args[0], budget))
        size = len(base) * max(0, len(items) - 1)
        size += sum(len(x) if isinstance(x, (str, bytes, bytearray)) else 0 for x in items)
        _check_size(size, budget, "str.join")
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
        _check_size(len(base) * max(1, longest), budget, "str.translate")
    return args


def _guard_items(iterable: Any, budget: Budget) -> Iterator[Any]:
    """Iterate, checking the deadline and refusing more items than the size limit."""
    for count, item in enumerate(iterable):
        if count > budget.max_chars:
            raise _too_big(budget, "too many items")
        if count % 10_000 == 0:
            current_budget()
        yield item


class _GuardedCodeGenerator(CodeGenerator):
    """Wraps every ``{% for %}`` iterable so each iteration checks the deadline.

    Call/attribute hooks alone miss nested loops whose bodies do nothing.
    """

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        node = cast(nodes.Template, _ConcatGuard().visit(node))
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Call(
                nodes.EnvironmentAttribute("guard_iteration", lineno=loop.lineno),
                [loop.iter],
                [],
                None,
                None,
                lineno=loop.lineno,
            )
        super().visit_Template(node, frame)

    def buffer(self, frame: Frame) -> None:
        # Macro bodies, {% set %}…{% endset %}, {% filter %} and {% call %} collect their output in a list that
        # never passes the streamed-output check: make it one that counts what it holds.
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.guarded_buffer()")


class _ConcatGuard(NodeTransformer):
    """Turns every ``a ~ b`` into ``environment.guard_concat(a, b)``, which checks the size before joining, and
    every list, tuple or dict literal with variable items into ``environment.guard_literal(…)``: ``[x, x]`` sixty
    times over makes a value whose printing, comparison or hashing would take 2**60 steps."""

    def _guard_literal(self, node: nodes.Expr, items: list[nodes.Node]) -> nodes.Node:
        self.generic_visit(node)
        if all(isinstance(item, nodes.Const) for item in items):
            return node
        return nodes.Call(
            nodes.EnvironmentAttribute("guard_literal", lineno=node.lineno), [node], [], None, None, lineno=node.lineno
        )

    def visit_List(self, node: nodes.List) -> nodes.Node:
        return self._guard_literal(node, list(node.items))

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        if node.ctx != "load":  # an assignment target
            return cast(nodes.Node, self.generic_visit(node))
        return self._guard_literal(node, list(node.items))

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        return self._guard_literal(node, [part for pair in node.items for part in (pair.key, pair.value)])

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(
            nodes.EnvironmentAttribute("guard_concat", lineno=node.lineno),
            list(node.nodes),
            [],
            None,
            None,
            lineno=node.lineno,
        )


class _GenerationTagExtension(jinja2.ext.Extension):
    """HF's ``{% generation %}…{% endgeneration %}`` marker; rendered as its plain body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _GuardedSandbox(ImmutableSandboxedEnvironment):
    """Immutable sandbox that also enforces the per-render time and size budget."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def guard_iteration(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            current_budget()
            yield item

    def guarded_buffer(self) -> list[Any]:
        return _GuardedBuffer()

    def guard_literal(self, value: Any) -> Any:
        budget = current_budget()
        _check_printable(value, budget, "a nested value")
        _account(value, budget)
        return value

    def guard_concat(self, *parts: Any) -> str:
        budget = current_budget()
        for part in parts:
            _check_printable(part, budget)
        texts = [str(part) for part in parts]
        _check_size(sum(len(text) for text in texts), budget, "joined with ~")
        result = "".join(texts)
        _account(result, budget)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # As jinja's, with a formatter that bounds widths and the total size.
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"
        formatter: string.Formatter
        if isinstance(f_self, Markup):
            formatter = _GuardedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = _GuardedFormatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                kwargs, args = args[0], ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)

    def call(
        __self,  # dunder names as in the base: a template kwarg named `context` must not clash
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        budget = current_budget()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        args = _check_str_method(__obj, args, kwargs, budget)
        nested = isinstance(__obj, (Macro, LoopContext))
        if nested:
            if budget.depth >= _MAX_CALL_DEPTH:
                raise ChatTemplateError(
                    f"The chat template recursed too deeply (more than {_MAX_CALL_DEPTH} nested macro or "
                    "loop calls) and was stopped."
                )
            budget.depth += 1
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            if nested:
                budget.depth -= 1
        _refuse_if_huge(result, budget)
        _account(result, budget)
        if isinstance(result, _CONTAINERS):
            _check_printable(result, budget, "a nested value")
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget = current_budget()
        result = super().getattr(obj, attribute)
        _refuse_if_huge(result, budget)
        return result

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = current_budget()
        result = super().getitem(obj, argument)
        _refuse_if_huge(result, budget)
        return result

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # Fail at access time instead of returning a lazily failing Undefined, so
        # probing (e.g. `{% if x.__class__ %}`) is refused too.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = current_budget()
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0:
            if right * max(1, abs(left).bit_length()) > _MAX_POW_BITS:
                raise ChatTemplateError("The chat template computed an enormous number and was stopped.")
        if operator == "*" and budget is not None:
            if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_POW_BITS:
                raise ChatTemplateError("The chat template computed an enormous number and was stopped.")
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, bytearray, list, tuple)) and _is_int(count):
                    _check_size(len(seq) * count, budget)
                    if isinstance(seq, (list, tuple)) and count > 1:
                        _check_size(_flat_size(seq, budget) * count, budget, "a repeated nested value")
        if operator == "%" and isinstance(left, (str, bytes)):
            _check_percent_format(left, right, budget)
        result = super().call_binop(context, operator, left, right)
        _refuse_if_huge(result, budget)
        if operator == "+" and isinstance(result, (list, tuple)):
            _check_printable(result, budget, "a nested value")
        _account(result, budget)
        return result


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF semantics: plain json.dumps, no HTML escaping, non-ASCII kept as is.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` passes here before it becomes text: refuse printing a container that is too big."""
    _check_printable(value, budget_var.get())
    return value


def _safe_range(*args: Any) -> range:
    result = range(*args)
    if len(result) > _MAX_RANGE:
        raise ChatTemplateError(
            f"The chat template asked for a range of more than {_MAX_RANGE} items (MAX_RANGE) and was stopped."
        )
    return result


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - jinja's names
    if not (_is_int(n) and _is_int(min) and _is_int(max)):
        raise TypeError("lipsum() takes integer counts")
    if n > _MAX_LIPSUM_PARAGRAPHS or max > _MAX_LIPSUM_WORDS or min > _MAX_LIPSUM_WORDS:
        raise ChatTemplateError(
            f"The chat template asked for lipsum of more than {_MAX_LIPSUM_PARAGRAPHS} paragraphs or "
            f"{_MAX_LIPSUM_WORDS} words per paragraph and was stopped."
        )
    return cast(str, generate_lorem_ipsum(n, html, min, max))


# Filters whose result is text made from their input: a container input is checked for its printed size first.
_NON_PRINTING_FILTERS = frozenset(
    "abs attr batch bool count d default dictsort first float groupby int items join last length list map max min "
    "random reject rejectattr reverse round select selectattr slice sort sum unique".split()
)


def _check_filter(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], budget: Budget) -> tuple[Any, ...]:
    """Size checks before a filter runs; returns the (maybe materialised) positional arguments."""
    value = args[0] if args else None

    def arg(index: int, key: str, default: Any) -> Any:
        return args[index] if len(args) > index else kwargs.get(key, default)

    if name not in _NON_PRINTING_FILTERS:
        _check_printable(value, budget)
    text_len = len(value) if isinstance(value, (str, bytes)) else 0
    if name == "center":
        _check_size(_as_int(arg(1, "width", 80)), budget, "|center width")
    elif name == "indent":
        width = arg(1, "width", 4)
        step = len(width) if isinstance(width, str) else _as_int(width)
        lines = value.count("\n") + 1 if isinstance(value, str) else 1
        _check_size(text_len + lines * step, budget, "|indent width")
    elif name == "wordwrap":
        wrapstring = arg(3, "wrapstring", None)
        extra = len(wrapstring) if isinstance(wrapstring, str) else 1
        _check_size(text_len * (1 + extra), budget, "|wordwrap")
    elif name == "format":
        _check_percent_format(value, kwargs or args[1:], budget)
    elif name == "replace" and len(args) >= 3:
        old, new = args[1], args[2]
        if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
            count = value.count(old) if old else len(value) + 1
            _check_size(len(value) + count * max(0, len(new) - len(old)), budget, "|replace")
    elif name == "join" and args:
        items = list(_guard_items(value, budget))
        sep = arg(1, "d", "")
        size = len(sep) * max(0, len(items) - 1) if isinstance(sep, str) else 0
        for item in items:
            size += _flat_size(item, budget)
            _check_size(size, budget, "|join")
        return (items, *args[1:])
    elif name == "batch":
        _check_size(_as_int(arg(1, "linecount", 0)), budget, "|batch size")
    elif name == "slice":
        if _as_int(arg(1, "slices", 0)) > _MAX_SLICES:
            raise ChatTemplateError(f"The chat template asked for |slice of more than {_MAX_SLICES} parts.")
    elif name == "sum":
        start = arg(2, "start", 0)
        if not isinstance(start, (int, float)):
            items = list(_guard_items(value, budget))
            size = len(start) if isinstance(start, _SIZED) else 0
            size += sum(len(item) if isinstance(item, _SIZED) else 1 for item in items)
            _check_size(size, budget, "|sum")
            _check_size(len(items) * size // 100, budget, "|sum")  # quadratic: each step copies the total so far
            return (items, *args[1:])
    elif name == "tojson":
        indent = arg(2, "indent", None)
        width = len(indent) if isinstance(indent, str) else _as_int(indent)
        if width > _MAX_JSON_INDENT:
            raise ChatTemplateError(f"The chat template asked for a JSON indent wider than {_MAX_JSON_INDENT}.")
    return args


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    pass_arg = getattr(func, "jinja_pass_arg", None)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        if budget is None:
            return func(*args, **kwargs)
        # Filters that take the environment/context get it first; the value comes next.
        lead, rest = (args[:1], args[1:]) if pass_arg is not None else ((), args)
        rest = _check_filter(name, rest, kwargs, budget)
        result = func(*lead, *rest, **kwargs)
        _refuse_if_huge(result, budget)
        _account(result, budget)
        return result

    return guarded


@lru_cache(maxsize=1)
def _environment() -> _GuardedSandbox:
    env = _GuardedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTagExtension],
        finalize=_finalize,
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _guard_filter(name, func) for name, func in env.filters.items()}
    env.globals["range"] = _safe_range
    env.globals["lipsum"] = _lipsum
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    # Compiling is the slow part; templates rarely change between turns. Jinja folds constant expressions while
    # compiling ('%1000000000s'|format(1)): the guards apply then too, and what they refuse is left to the render.
    token = budget_var.set(Budget(time.monotonic() + _COMPILE_FOLD_LIMIT_S, _COMPILE_FOLD_LIMIT_S, 1_000_000))
    try:
        return _environment().from_string(source)
    finally:
        budget_var.reset(token)
