"""A finished message on screen: `MessageView`, one static widget drawing its header, folded reasoning and Markdown
body (a long one folded, or rendered on a thread), with the keys that act on it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip

from app.core.store import Message as StoredMessage
from app.tui.textual_internals.rich_render import console_with_own_lock
from app.tui.widgets.draft_provenance import DraftSpans, draft_spans_from_stats, draft_styles, mark_provenance
from app.tui.widgets.markdown_render import Lines, code_blocks, markdown_renderable
from app.tui.widgets.rendered_once import RenderedOnce, to_strips
from engine_ext.untrusted_text import shown

STATE_LABELS: Final[dict[str, str]] = {
    "stopped": "stopped",
    "interrupted": "interrupted",
    "error": "failed",
    "streaming": "writing…",
}


@dataclass(frozen=True)
class BranchInfo:
    """Where a message sits among its alternatives (1-based position, total)."""

    position: int
    total: int


def message_header(role: str, state: str, model: str, branch: BranchInfo | None, width: int = 0) -> Text:
    """A message's first line: who wrote it, the model, its state and where it sits among its branches. In `width`
    cells (0: any), the model's name is shortened first, so the state and the branch counter stay whole."""
    header = Text()
    header.append("You" if role == "user" else "Assistant" if role == "assistant" else role.capitalize(), style="bold")
    name = shown(model) if role == "assistant" and model else ""
    if name and width:
        rest = message_header(role, state, "", branch).cell_len
        room = width - rest - 2
        name = name if len(name) <= room else (name[: room - 1] + "…" if room >= 8 else "")
    if name:
        header.append(f"  {name}", style="dim")
    label = STATE_LABELS.get(state)
    if label:
        header.append(f"  [{label}]", style="italic")
    if branch is not None and branch.total > 1:
        header.append(f"  ◀ {branch.position}/{branch.total} ▶", style="bold")
    return header


@runtime_checkable
class FollowsTheEnd(Protocol):
    """A container that keeps showing the end of the conversation when a message in it grows (the transcript)."""

    @property
    def at_bottom(self) -> bool:
        """Whether it shows the end now."""
        ...


FOLD_MIN_LINES = 40  # a message of yours longer than this many lines, or than FOLD_MIN_CHARS, is shown folded…
FOLD_MIN_CHARS = 4000
FOLD_HEAD_LINES = 12  # …to its first lines (and at most FOLD_HEAD_CHARS), until t shows it all
FOLD_HEAD_CHARS = 1500


BACKGROUND_RENDER_CHARS = 20_000
"""A message body at least this long is rendered in a thread: the event loop would otherwise stop for as long as
Rich and Pygments take (0.6-0.8 s for a 44k-character code reply here, seconds for longer ones)."""


def fold_head(text: str) -> str | None:
    """The start of a long message that is shown while it is folded; None when it is short enough to show whole.

    A pasted file or log can be hundreds of thousands of characters: drawn whole (as Markdown, with its code
    highlighted) it held the event loop for seconds, and it pushed the conversation out of view.
    """
    if len(text) <= FOLD_MIN_CHARS and text.count("\n") < FOLD_MIN_LINES:
        return None
    head = "\n".join(text[: FOLD_HEAD_CHARS * 2].split("\n", FOLD_HEAD_LINES)[:FOLD_HEAD_LINES])
    return head[:FOLD_HEAD_CHARS].rstrip()


def reply_note(stats: Mapping[str, object]) -> str:
    """The note kept with a reply that repeated itself (its stats' "repeats"), on one line; "" when none."""
    note = stats.get("repeats")
    return shown(" ".join(note.split()))[:200] if isinstance(note, str) else ""


def reasoning_size(reasoning: str, stats: Mapping[str, object]) -> str:
    """How much a reply thought: its thinking tokens and time as the engine counted them, else its words."""
    tokens, ms = stats.get("reasoning_tokens"), stats.get("reasoning_ms")
    if isinstance(tokens, int) and tokens > 0 and isinstance(ms, int | float):
        return f"{tokens} tokens, {ms / 1000.0:.1f} s"
    return f"{len(reasoning.split())} words"


class MessageView(RenderedOnce, can_focus=True):
    """One finished message, drawn as a single static widget (header, folded reasoning, Markdown body)."""

    BINDINGS = [
        Binding("c", "copy", "Copy", tooltip="Copy the message: OSC 52, works over SSH"),
        Binding("y", "copy_code", "Copy code", tooltip="Copy a code block"),
        Binding(
            "e",
            "edit",
            "Edit",
            tooltip="Edit: your message is resent as a new branch; a reply is changed in place (ctrl+g continues it)",
        ),
        Binding("r", "regenerate", "Regenerate", tooltip="Regenerate this reply: a new branch"),
        Binding("left,[", "branch(-1)", "◀ Branch", tooltip="Previous branch"),
        Binding("right,]", "branch(1)", "Branch ▶", tooltip="Next branch"),
        Binding("t", "toggle_reasoning", "Reasoning", tooltip="Show or hide the reasoning"),
        Binding("t", "toggle_fold", "Show all", tooltip="Show all of a long message of yours, or fold it again"),
        Binding("up,k", "move(-1)", "Previous", show=False, tooltip="Previous message"),
        Binding("down,j", "move(1)", "Next", show=False, tooltip="Next message"),
    ]

    COMPONENT_CLASSES = {
        "message-view--reasoning",
        "message-view--draft",
        "message-view--draft-model",
        "message-view--draft-rejected",
        "message-view--failure",
        "message-view--notice",
    }

    DEFAULT_CSS = """
    MessageView {
        height: auto;
        padding: 0 1;
    }
    MessageView > .message-view--draft {
        color: $text-accent;
        text-style: underline;
    }
    MessageView > .message-view--draft-model {
        color: $text-success;
        text-style: underline;
    }
    MessageView > .message-view--draft-rejected {
        color: $text-error;
        text-style: bold;
    }
    MessageView > .message-view--failure {
        color: $text-error;
    }
    MessageView > .message-view--notice {
        color: $text-warning;
    }
    """

    show_reasoning: reactive[bool] = reactive(False, layout=True)
    """Whether the reasoning is unfolded."""

    class Action(Message):
        """The user asked for something on this message: copy, copy_code, edit, regenerate, branch."""

        def __init__(self, view: MessageView, action: str, step: int = 0) -> None:
            super().__init__()
            self.view = view
            self.action = action
            self.step = step

        @property
        def control(self) -> MessageView:
            return self.view

    def __init__(
        self,
        message: StoredMessage,
        branch: BranchInfo | None = None,
        *,
        dark: bool = True,
        colour_drafts: bool = False,
    ) -> None:
        super().__init__(classes=f"message -{message.role} -{message.state}")
        self.message = message
        self.branch = branch
        self.dark = dark
        self.draft_spans: DraftSpans = draft_spans_from_stats(message.stats) if message.role == "assistant" else ()
        """Where the text came from accepted draft tokens."""
        self.colour_drafts = colour_drafts
        """Whether those spans are coloured."""
        self.fold_head = fold_head(message.content) if message.role == "user" else None
        """The start of a long message of yours, shown while it is folded (None: a message shown whole)."""
        self.folded = self.fold_head is not None
        self._body_lines: Lines = []
        self._body_width = -1
        self._rendering_width = -1
        """The width a body is being rendered at in a thread (-1: none)."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "edit":  # a question (resent as a new branch) or a finished reply (changed in place)
            return self.message.role == "user" or (
                self.message.role == "assistant" and self.message.state != "streaming"
            )
        if action == "regenerate":
            return self.message.role == "assistant"
        if action == "copy_code":
            return bool(code_blocks(self.message.content))
        if action == "toggle_reasoning":
            return bool(self.message.reasoning.strip())
        if action == "toggle_fold":
            return self.fold_head is not None
        if action == "branch":
            return self.branch is not None and self.branch.total > 1
        return True

    def _reasoning_renderable(self) -> RenderableType | None:
        reasoning = self.message.reasoning.strip()
        if not reasoning:
            return None
        style = self.get_component_rich_style("message-view--reasoning", partial=True)
        if not self.show_reasoning:
            return Text(f"▸ Reasoning ({reasoning_size(reasoning, self.message.stats)}) — t to show", style=style)
        return Group(
            Text("▾ Reasoning — t to hide", style=style),
            Padding(Text(shown(reasoning, multiline=True), style=style), (0, 0, 0, 2)),
        )

    def watch_show_reasoning(self) -> None:
        self.invalidate()

    def set_colour_drafts(self, colour: bool) -> None:
        """Colour (or stop colouring) the text that came from accepted draft tokens."""
        if colour != self.colour_drafts:
            self.colour_drafts = colour
            if self.draft_spans:
                self.invalidate()

    def seed_body(self, width: int, lines: Lines) -> None:
        """Use `lines` (the streamed reply's, already rendered at `width`) as the body instead of rendering it."""
        self._body_lines = lines
        self._body_width = width

    def body_lines(self, width: int) -> Lines:
        """The body (Markdown) rendered at `width`, without draft colouring.

        A long body (BACKGROUND_RENDER_CHARS) is rendered in a thread; until it is ready, a line says so.
        """
        if width != self._body_width:
            content = self.message.content
            build = self._body_builder()
            if len(content) >= BACKGROUND_RENDER_CHARS and not self.folded:
                if self._rendering_width != width:
                    self._rendering_width = width
                    self._render_in_thread(build, width)
                note = f"drawing {len(content):,} characters…"
                return self.render_renderable(Text(note, style="dim italic"), width)
            self._body_lines = self.render_renderable(build(), width)
            self._body_width = width
        return self._body_lines

    def _body_builder(self) -> Callable[[], RenderableType]:
        """What the body draws, made when called: the Markdown is parsed there, which may be on another thread
        (the styles, read from the widget, are looked up here)."""
        content, dark = self.message.content, self.dark
        if not content.strip() and self.message.state != "complete":
            empty = Text("(no text)", style="dim italic")
            return lambda: empty
        if self.fold_head is None:
            line_breaks = self.message.role == "user"
            return lambda: markdown_renderable(content, dark=dark, line_breaks=line_breaks)
        style = self.get_component_rich_style("message-view--reasoning", partial=True)
        if self.folded:
            head, lines = self.fold_head, content.count("\n") + 1
            note = Text(f"▸ {lines:,} lines, {len(content):,} characters in all — t to show all", style=style)
            return lambda: Group(markdown_renderable(head, dark=dark, line_breaks=True), note)
        fold = Text("▾ t to fold", style=style)
        return lambda: Group(markdown_renderable(content, dark=dark, line_breaks=True), fold)

    def _render_in_thread(self, build: Callable[[], RenderableType], width: int) -> None:
        app = self.app  # (Textual finds the app through a context variable that other threads do not have)
        options = app.console_options.update_width(max(1, width)).update(highlight=False)
        # The app's console, with a lock of its own: Console.render_lines holds the console's lock for the whole
        # render, and every widget Textual draws in the meantime would wait for it.
        console = console_with_own_lock(app.console)

        def render() -> None:
            lines = console.render_lines(build(), options, pad=False)  # as render_renderable does
            try:
                app.call_from_thread(self._body_ready, width, lines)
            except RuntimeError:  # the app has ended
                pass

        threading.Thread(target=render, name="llmtui-render", daemon=True).start()

    def _body_ready(self, width: int, lines: Lines) -> None:
        if width != self._rendering_width or not self.is_mounted:
            return  # the width changed again (a new render is on its way), or the message is gone
        self._rendering_width = -1
        self._body_lines, self._body_width = lines, width
        transcript = self.parent
        self.invalidate()
        if isinstance(transcript, FollowsTheEnd) and transcript.at_bottom:  # keep showing the end of the conversation
            transcript.call_after_refresh(transcript.scroll_end, animate=False, immediate=True)

    def render_strips(self, width: int) -> list[Strip]:
        message = self.message
        head: list[RenderableType] = [message_header(message.role, message.state, message.model, self.branch, width)]
        reasoning = self._reasoning_renderable()
        if reasoning is not None:
            head.append(reasoning)
        body = self.body_lines(width)
        if self.colour_drafts and self.draft_spans and self._body_width == width:  # (not while it is being drawn)
            styles = draft_styles(self, "message-view")
            body = mark_provenance(body, self.message.content, self.draft_spans, styles)
        if message.failure:  # why it failed, kept with the reply (its stats' "error")
            style = self.get_component_rich_style("message-view--failure", partial=True)
            body = body + self.render_renderable(Text(f"✗ {message.failure}", style=style), width)
        if repeats := reply_note(message.stats):  # it repeated itself (app/core/generation/repeats.py)
            style = self.get_component_rich_style("message-view--notice", partial=True)
            body = body + self.render_renderable(Text(f"↻ {repeats}", style=style), width)
        return to_strips(self.render_renderable(Group(*head), width) + body, width)

    def action_copy(self) -> None:
        self.post_message(self.Action(self, "copy"))

    def action_copy_code(self) -> None:
        self.post_message(self.Action(self, "copy_code"))

    def action_edit(self) -> None:
        self.post_message(self.Action(self, "edit"))

    def action_regenerate(self) -> None:
        self.post_message(self.Action(self, "regenerate"))

    def action_branch(self, step: int) -> None:
        self.post_message(self.Action(self, "branch", step))

    def action_toggle_reasoning(self) -> None:
        self.show_reasoning = not self.show_reasoning

    def action_toggle_fold(self) -> None:
        self.folded = not self.folded
        self._body_width = self._rendering_width = -1
        self.invalidate()

    def action_move(self, step: int) -> None:
        if self.parent is None:
            return
        views = [child for child in self.parent.children if child.focusable]
        index = views.index(self) + step if self in views else -1
        if 0 <= index < len(views):
            views[index].focus()
        elif step > 0:
            self.post_message(self.Action(self, "leave"))

    def on_click(self, event: events.Click) -> None:
        self.focus()
