"""Chat prompt rendering (GGUF Jinja templates, in the sandbox of engine_ext/chat_sandbox.py) and fitting a
conversation into the context window.

The reply's text as it streams (UTF-8, stop strings, reasoning apart) is engine_ext/reply_stream.py's job."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import jinja2
from jinja2.exceptions import SecurityError

from engine_ext.chat_sandbox import (
    Budget,
    ChatTemplateCancelled,
    ChatTemplateError,
    TemplateRaised,
    budget_var,
    compile_template,
    current_budget,
)

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "ChatTemplateCancelled",
    "ChatTemplateError",
    "render_chat",
    "template_thinking_controls",
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
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
    time_limit_s: float = 2.0,
    max_output_chars: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    started_at: float | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Render a HF/GGUF Jinja chat template in a sandbox, within time and size limits.

    ``template`` None or blank uses :data:`FALLBACK_CHAT_TEMPLATE` (ChatML). The size limit (by default 1,000,000
    characters plus four times the messages' own) stops a template that blows up, not a long conversation: a
    pasted file too long for the context is then refused by the context check, which says so.
    Raises :class:`ChatTemplateError` for any failure, including refused sandbox escapes. ``cancelled`` (asked
    every 20 ms or so while rendering) stops the render with :class:`ChatTemplateCancelled` when it returns True.
    ``started_at`` (a ``time.monotonic()`` value) starts the time limit earlier: renders that share one start share
    one limit, so a prompt that takes several renders (trimming a long conversation) is bounded as a whole.
    ``tools`` (OpenAI-shaped definitions, engine_ext.tool_calls) are the template's ``tools``; messages may hold
    ``tool_calls``, ``tool_call_id`` and ``name`` as templates expect them (tool_calls.template_message).
    """
    source = template if template and template.strip() else FALLBACK_CHAT_TEMPLATE
    try:
        compiled = compile_template(source)
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
        "tools": [dict(t) for t in tools] if tools else None,
        "documents": None,
    }
    if enable_thinking is not None:
        context["enable_thinking"] = enable_thinking
    if reasoning_effort is not None:
        context["reasoning_effort"] = reasoning_effort  # gpt-oss, Qwen3.5-style templates: low | medium | high

    if max_output_chars is None:
        max_output_chars = 1_000_000 + 4 * (
            sum(len(str(value)) for m in messages for value in m.values()) + len(str(tools or ""))
        )
    start = time.monotonic() if started_at is None else started_at
    budget = Budget(start + time_limit_s, time_limit_s, max_output_chars, cancelled=cancelled)
    token = budget_var.set(budget)
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
            current_budget()
    except ChatTemplateError:
        raise
    except TemplateRaised as exc:
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
        raise ChatTemplateError(f"The chat template failed{_at_line(exc)}: {type(exc).__name__}: {exc}") from None
    finally:
        stream.close()
        budget_var.reset(token)
    return "".join(chunks)


THINKING_CONTROLS = ("enable_thinking", "reasoning_effort")


def render_reply_prompt(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    continue_reply: bool,
    enable_thinking: bool | None,
    reasoning_effort: str | None,
    tools: Sequence[Mapping[str, Any]] | None,
    bos_token: str,
    eos_token: str,
    cancelled: Callable[[], bool] | None = None,
    started_at: float | None = None,
) -> tuple[str, bool]:
    """A reply's prompt text, and whether it ends inside the answer of the reply being continued (`continue_reply`
    with an assistant message last: cut right after its text as given, so that reply goes on from there, leading
    space and all)."""
    continue_reply = continue_reply and bool(messages) and messages[-1]["role"] == "assistant"
    if continue_reply and not messages[-1]["content"]:
        # Stopped before any answer text (while thinking, say): the reply starts again from the beginning.
        messages, continue_reply = messages[:-1], False
    text = render_chat(
        template,
        messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=not continue_reply,
        enable_thinking=enable_thinking,
        reasoning_effort=reasoning_effort,
        cancelled=cancelled,
        started_at=started_at,
        tools=tools,
    )
    if continue_reply:
        # Continue a stopped reply: cut the rendered prompt right after the partial reply text.
        # A template that trims message text renders the partial reply without its outer whitespace.
        content = messages[-1]["content"]
        for partial in (content, content.strip()):
            cut = text.rfind(partial) if partial else -1
            if cut >= 0:
                return text[: cut + len(partial)], partial == content
    return text, False


def template_thinking_controls(template: str | None) -> tuple[str, ...]:
    """Which of the thinking controls (enable_thinking, reasoning_effort) a chat template's source reads, in that
    order: the ones a conversation's settings can change for this model (a template that never names a variable
    ignores it)."""
    source = template or ""
    return tuple(name for name in THINKING_CONTROLS if re.search(rf"\b{name}\b", source))


# ---------------------------------------------------------------------------
# Context-window fitting
# ---------------------------------------------------------------------------


def truncate_messages_to_fit(
    messages: Sequence[Mapping[str, Any]],
    count_tokens: Callable[[Sequence[Mapping[str, Any]]], int],
    budget: int,
) -> tuple[list[dict[str, Any]], int]:
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

    def without(n_turns: int) -> list[dict[str, Any]]:
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
