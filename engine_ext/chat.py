"""Chat prompt rendering (sandboxed GGUF Jinja templates) and streamed-reply post-processing."""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from types import TracebackType
from typing import Any, Literal, cast

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.parser import Parser
from jinja2.runtime import Context, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "ChatTemplateError",
    "ReasoningSplitter",
    "StopStringMatcher",
    "Utf8StreamDecoder",
    "prompt_opens_reasoning",
    "render_chat",
    "truncate_messages_to_fit",
]

# Plain ChatML, used when the model file ships no chat template.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TEMPLATE_NAME = "<template>"  # jinja's filename for from_string() sources
# An integer power whose result would exceed this many bits is refused (9**9**9 hangs CPython).
_MAX_POW_BITS = 1_000_000


class ChatTemplateError(Exception):
    """The model's chat template could not be rendered; the message says why."""


class _TemplateRaised(Exception):
    """Raised by the template's own ``raise_exception(msg)`` call."""


# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Budget:
    deadline: float  # time.monotonic() value
    time_limit_s: float
    max_chars: int


# Per-render limits; a ContextVar so one cached environment serves concurrent renders.
_budget: ContextVar[_Budget | None] = ContextVar("llmtui_chat_template_budget", default=None)


def _current_budget() -> _Budget | None:
    budget = _budget.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise ChatTemplateError(
            f"The chat template took longer than {budget.time_limit_s:g} s to render "
            "and was stopped (it may loop endlessly)."
        )
    return budget


def _refuse_if_huge(value: Any, budget: _Budget | None) -> None:
    """Stop runaway intermediate strings/lists before they exhaust memory."""
    if budget is not None and isinstance(value, (str, list, tuple)):
        if len(value) > budget.max_chars:
            raise ChatTemplateError(
                f"The chat template built a value larger than {budget.max_chars} characters and was stopped."
            )


class _GuardedCodeGenerator(CodeGenerator):
    """Wraps every ``{% for %}`` iterable so each iteration checks the deadline.

    Call/attribute hooks alone miss nested loops whose bodies do nothing.
    """

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
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
    intercepted_binops = frozenset({"+", "*", "**"})

    def guard_iteration(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            _current_budget()
            yield item

    def call(
        __self,  # dunder names as in the base: a template kwarg named `context` must not clash
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        budget = _current_budget()
        result = super().call(__context, __obj, *args, **kwargs)
        _refuse_if_huge(result, budget)
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget = _current_budget()
        result = super().getattr(obj, attribute)
        _refuse_if_huge(result, budget)
        return result

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _current_budget()
        result = super().getitem(obj, argument)
        _refuse_if_huge(result, budget)
        return result

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # Fail at access time instead of returning a lazily failing Undefined, so
        # probing (e.g. `{% if x.__class__ %}`) is refused too.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _current_budget()
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0:
            if right * max(1, abs(left).bit_length()) > _MAX_POW_BITS:
                raise ChatTemplateError("The chat template computed an enormous number and was stopped.")
        if operator == "*" and budget is not None:
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _is_int(count):
                    if len(seq) * count > budget.max_chars:
                        raise ChatTemplateError(
                            f"The chat template built a value larger than {budget.max_chars} "
                            "characters and was stopped."
                        )
        result = super().call_binop(context, operator, left, right)
        _refuse_if_huge(result, budget)
        return result


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


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
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=1)
def _environment() -> _GuardedSandbox:
    env = _GuardedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTagExtension],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    # Compiling is the slow part; templates rarely change between turns.
    return _environment().from_string(source)


def _template_line(tb: TracebackType | None) -> int | None:
    """Template line of the innermost frame jinja mapped back to the template source."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_NAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _at_line(exc: BaseException) -> str:
    line = _template_line(exc.__traceback__)
    return f" (line {line})" if line is not None else ""


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, str]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    time_limit_s: float = 2.0,
    max_output_chars: int | None = None,
) -> str:
    """Render a HF/GGUF Jinja chat template in a sandbox, within time and size limits.

    ``template`` None or blank uses :data:`FALLBACK_CHAT_TEMPLATE` (ChatML). The size limit (by default 1,000,000
    characters plus four times the messages' own) stops a template that blows up, not a long conversation: a
    pasted file too long for the context is then refused by the context check, which says so.
    Raises :class:`ChatTemplateError` for any failure, including refused sandbox escapes.
    """
    source = template if template and template.strip() else FALLBACK_CHAT_TEMPLATE
    try:
        compiled = _compile(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"The model's chat template has a syntax error on line {exc.lineno}: {exc.message}"
        ) from None
    except Exception as exc:  # e.g. RecursionError on absurdly nested source
        raise ChatTemplateError(f"The model's chat template could not be compiled: {exc}") from None

    context: dict[str, Any] = {
        "messages": [dict(m) for m in messages],
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
        # HF and llama-cpp-python always pass these; templates test `tools is not none`.
        "tools": None,
        "documents": None,
    }
    if enable_thinking is not None:
        context["enable_thinking"] = enable_thinking

    if max_output_chars is None:
        max_output_chars = 1_000_000 + 4 * sum(len(str(value)) for m in messages for value in m.values())
    budget = _Budget(time.monotonic() + time_limit_s, time_limit_s, max_output_chars)
    token = _budget.set(budget)
    chunks: list[str] = []
    size = 0
    # generate() is a generator; close it on abort so jinja's frames are released.
    stream = cast(Generator[str, None, None], compiled.generate(**context))
    try:
        for chunk in stream:
            size += len(chunk)
            if size > max_output_chars:
                raise ChatTemplateError(
                    f"The chat template produced more than {max_output_chars} characters and was stopped."
                )
            chunks.append(chunk)
            _current_budget()
    except ChatTemplateError:
        raise
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"The chat template rejected this conversation: {exc}") from None
    except SecurityError as exc:
        raise ChatTemplateError(
            f"Chat template refused: it tried to escape the sandbox{_at_line(exc)}: {exc}"
        ) from None
    except OverflowError as exc:  # also the sandbox's range() size limit
        raise ChatTemplateError(f"Chat template refused: {exc}{_at_line(exc)}") from None
    except RecursionError:
        raise ChatTemplateError("The chat template recursed too deeply and was stopped.") from None
    except MemoryError:
        raise ChatTemplateError("The chat template ran out of memory and was stopped.") from None
    except Exception as exc:  # anything else the untrusted template triggers
        raise ChatTemplateError(
            f"The chat template failed{_at_line(exc)}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        stream.close()
        _budget.reset(token)
    return "".join(chunks)


# ---------------------------------------------------------------------------
# Streaming helpers
# ---------------------------------------------------------------------------


def _partial_suffix_len(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a needle."""
    longest = max((len(n) for n in needles), default=0)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(n.startswith(tail) for n in needles):
            return k
    return 0


class StopStringMatcher:
    """Cuts a streamed reply at the first stop string, holding back possible partial matches."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = [s for s in stop_strings if s]  # an empty stop string would match at once
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was hit)."""
        if self._stopped:
            return "", True
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            self._stopped = True
            return buffer[: min(hits)], True
        keep = _partial_suffix_len(buffer, self._stops)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Held-back text at the end of generation (empty once stopped)."""
        held, self._held = self._held, ""
        return held


ReplyPart = Literal["reasoning", "answer"]


class ReasoningSplitter:
    """Splits a streamed reply into reasoning (inside ``<think>…</think>``) and answer text.

    Leading whitespace of the reasoning and of the answer is dropped (but with `starts_in_answer`, for a reply
    continued from the middle of its answer). Use one instance per reply.
    """

    def __init__(
        self,
        *,
        starts_in_reasoning: bool = False,
        starts_in_answer: bool = False,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
    ) -> None:
        if not open_tag or not close_tag:
            raise ValueError("reasoning tags must be non-empty")
        self._open = open_tag
        self._close = close_tag
        self._state: Literal["pre", "reasoning", "answer"] = "reasoning" if starts_in_reasoning else "pre"
        # At the start of a segment: drop whitespace; in reasoning, also one
        # (repeated) open tag, since some models echo the prompt's <think>.
        self._segment_start = True
        if starts_in_answer:
            self._state, self._segment_start = "answer", False
        self._held = ""

    def feed(self, text: str) -> list[tuple[ReplyPart, str]]:
        out: list[tuple[ReplyPart, str]] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._state == "answer":
                if self._segment_start:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    self._segment_start = False
                _emit(out, "answer", buf)
                break
            if self._segment_start:
                buf = buf.lstrip()
                if not buf:
                    break
                if buf.startswith(self._open):
                    buf = buf[len(self._open) :]
                    self._state = "reasoning"
                    continue  # still at segment start: skip whitespace after the tag
                if self._open.startswith(buf):
                    self._held = buf  # could still become the open tag
                    break
                self._segment_start = False
                if self._state == "pre":
                    self._state = "answer"  # no think block at all
                    continue
            # state == "reasoning"
            end = buf.find(self._close)
            if end >= 0:
                _emit(out, "reasoning", buf[:end])
                buf = buf[end + len(self._close) :]
                self._state = "answer"
                self._segment_start = True
                continue
            keep = _partial_suffix_len(buf, [self._close])
            _emit(out, "reasoning", buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return out

    def flush(self) -> list[tuple[ReplyPart, str]]:
        """Emit any held-back partial tag as plain text of the current kind."""
        held, self._held = self._held, ""
        if not held:
            return []
        kind: ReplyPart = "reasoning" if self._state == "reasoning" else "answer"
        return [(kind, held)]


def _emit(out: list[tuple[ReplyPart, str]], kind: ReplyPart, text: str) -> None:
    if not text:
        return
    if out and out[-1][0] == kind:
        out[-1] = (kind, out[-1][1] + text)
    else:
        out.append((kind, text))


def prompt_opens_reasoning(rendered_prompt: str, open_tag: str = "<think>") -> bool:
    """True when the prompt ends inside an unclosed reasoning block (``<think>`` + whitespace)."""
    return rendered_prompt.rstrip().endswith(open_tag)


class Utf8StreamDecoder:
    """Decodes UTF-8 byte pieces, emitting only complete characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """Decode what is left; an unfinished character becomes U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


# ---------------------------------------------------------------------------
# Context-window fitting
# ---------------------------------------------------------------------------


def truncate_messages_to_fit(
    messages: Sequence[Mapping[str, str]],
    count_tokens: Callable[[Sequence[Mapping[str, str]]], int],
    budget: int,
) -> tuple[list[dict[str, str]], int]:
    """Drop the oldest whole turns until ``count_tokens(kept) <= budget``.

    A turn runs from a non-system message up to the next user message. System
    messages and the last user message (everything from it on) are never dropped;
    if even that minimum does not fit it is returned anyway, for the caller to
    report. Returns (kept messages, number of messages dropped).

    Assumes dropping messages never increases the count, so it binary-searches
    the number of turns to drop instead of re-counting after every turn.
    """
    msgs = [dict(m) for m in messages]
    user_idx = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
    protected = user_idx[-1] if user_idx else len(msgs) - 1

    # Non-system message indices of each droppable turn, oldest first.
    turns: list[list[int]] = []
    for i in range(max(protected, 0)):
        if msgs[i].get("role") == "system":
            continue
        if not turns or msgs[i].get("role") == "user":
            turns.append([])
        turns[-1].append(i)

    def without(n_turns: int) -> list[dict[str, str]]:
        dropped = {i for turn in turns[:n_turns] for i in turn}
        return [m for i, m in enumerate(msgs) if i not in dropped]

    def dropped_count(n_turns: int) -> int:
        return sum(len(turn) for turn in turns[:n_turns])

    if count_tokens(msgs) <= budget or not turns:
        return msgs, 0
    # Smallest n in [1, len(turns)] that fits; len(turns) (the minimum) if none does.
    low, high = 1, len(turns)
    while low < high:
        mid = (low + high) // 2
        if count_tokens(without(mid)) <= budget:
            high = mid
        else:
            low = mid + 1
    return without(low), dropped_count(low)
