"""The transcript: finished messages frozen into one static widget each, the streaming reply a live Markdown."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Final

from rich.console import Group, RenderableType
from rich.markdown import Markdown as RichMarkdown
from rich.padding import Padding
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from app.store import Message as StoredMessage

PAGE_SIZE: Final = 16  # messages mounted at a time; older ones are mounted when the user scrolls up to them
_CODE_BLOCK: Final = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)

EMPTY_HINT: Final = (
    "Type a message below and press Enter.  Shift+Enter or Ctrl+J adds a line · F1 lists every key · "
    "ctrl+p finds any action."
)

STATE_LABELS: Final[dict[str, str]] = {
    "stopped": "stopped",
    "interrupted": "interrupted",
    "error": "failed",
    "streaming": "writing…",
}


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order, without their fences."""
    return [match.group(1) for match in _CODE_BLOCK.finditer(markdown)]


@dataclass(frozen=True)
class BranchInfo:
    """Where a message sits among its alternatives (1-based position, total)."""

    position: int
    total: int


def _header(role: str, state: str, model: str, branch: BranchInfo | None) -> Text:
    header = Text()
    header.append("You" if role == "user" else "Assistant" if role == "assistant" else role.capitalize(),
                  style="bold")
    if role == "assistant" and model:
        header.append(f"  {model}", style="dim")
    label = STATE_LABELS.get(state)
    if label:
        header.append(f"  [{label}]", style="italic")
    if branch is not None and branch.total > 1:
        header.append(f"  ◀ {branch.position}/{branch.total} ▶", style="bold")
    return header


class RenderedOnce(Widget):
    """A widget drawing one Rich renderable that is rendered once per width into cached lines.

    Textual would render a plain widget's content twice (once to measure its height, once to paint it) and again
    after each refresh; finished messages never change, so their lines are kept until the width does.
    """

    def __init__(self, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self._strips: list[Strip] = []
        self._strips_width = -1

    def renderable(self) -> RenderableType:
        """What to draw (called again only after `invalidate` or a change of width)."""
        raise NotImplementedError

    def invalidate(self) -> None:
        """Render again on the next paint, and re-measure the height."""
        self._strips_width = -1
        self.refresh(layout=True)

    def _strips_for(self, width: int) -> list[Strip]:
        if width != self._strips_width:
            console = self.app.console
            options = self.app.console_options.update_width(width).update(highlight=False)
            lines = console.render_lines(self.renderable(), options, pad=False)
            self._strips = [Strip(line).adjust_cell_length(width) for line in lines]
            self._strips_width = width
        return self._strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._strips_for(width))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        strips = self._strips_for(width)
        strip = strips[y] if 0 <= y < len(strips) else Strip.blank(width)
        return strip.apply_style(self.rich_style)


class MessageView(RenderedOnce, can_focus=True):
    """One finished message, drawn as a single static widget (header, folded reasoning, Markdown body).

    | Key | Action |
    | :- | :- |
    | c | Copy the message. |
    | y | Copy a code block. |
    | e | Edit a message of yours and resend it (a new branch). |
    | r | Regenerate this reply (a new branch). |
    | left / right | Previous / next branch. |
    | t | Show or hide the reasoning. |
    """

    BINDINGS = [
        Binding("c", "copy", "Copy"),
        Binding("y", "copy_code", "Copy code"),
        Binding("e", "edit", "Edit"),
        Binding("r", "regenerate", "Regenerate"),
        Binding("left,[", "branch(-1)", "◀ Branch"),
        Binding("right,]", "branch(1)", "Branch ▶"),
        Binding("t", "toggle_reasoning", "Reasoning"),
        Binding("up,k", "move(-1)", "Previous", show=False),
        Binding("down,j", "move(1)", "Next", show=False),
    ]

    COMPONENT_CLASSES = {"message-view--reasoning"}

    DEFAULT_CSS = """
    MessageView {
        height: auto;
        padding: 0 1;
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

    def __init__(self, message: StoredMessage, branch: BranchInfo | None = None, *, dark: bool = True) -> None:
        super().__init__(classes=f"message -{message.role} -{message.state}")
        self.message = message
        self.branch = branch
        self.dark = dark
        self._body: RenderableType | None = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "edit":
            return self.message.role == "user"
        if action == "regenerate":
            return self.message.role == "assistant"
        if action == "copy_code":
            return bool(code_blocks(self.message.content))
        if action == "toggle_reasoning":
            return bool(self.message.reasoning.strip())
        if action == "branch":
            return self.branch is not None and self.branch.total > 1
        return True

    def _reasoning_renderable(self) -> RenderableType | None:
        reasoning = self.message.reasoning.strip()
        if not reasoning:
            return None
        style = self.get_component_rich_style("message-view--reasoning", partial=True)
        if not self.show_reasoning:
            words = len(reasoning.split())
            return Text(f"▸ Reasoning ({words} words) — t to show", style=style)
        return Group(Text("▾ Reasoning — t to hide", style=style), Padding(Text(reasoning, style=style), (0, 0, 0, 2)))

    def watch_show_reasoning(self) -> None:
        self.invalidate()

    def renderable(self) -> RenderableType:
        if self._body is None:
            content = self.message.content
            if not content.strip() and self.message.state != "complete":
                self._body = Text("(no text)", style="dim italic")
            else:
                self._body = RichMarkdown(content, code_theme="monokai" if self.dark else "default", hyperlinks=False)
        parts: list[RenderableType] = [_header(self.message.role, self.message.state, self.message.model,
                                               self.branch)]
        reasoning = self._reasoning_renderable()
        if reasoning is not None:
            parts.append(reasoning)
        parts.append(self._body)
        return Group(*parts)

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


def freeze_point(text: str, min_chars: int) -> int:
    """Where the streamed `text` can be cut so the part before is finished Markdown: the end of the last blank
    line outside a fenced code block at or after `min_chars` (-1 when there is none)."""
    cut = -1
    in_fence = False
    position = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence = not in_fence
        position += len(line)
        if not in_fence and not line.strip() and line.endswith("\n") and position >= min_chars:
            # Only a blank line before top-level text: the next block starts a new paragraph, heading or fence.
            rest = text[position : position + 1]
            if rest and not rest.isspace() and position < len(text):
                cut = position
    return cut


class FrozenSegment(RenderedOnce):
    """A finished part of the reply being streamed, drawn once as static Markdown."""

    DEFAULT_CSS = """
    FrozenSegment {
        height: auto;
        margin-bottom: 1;
    }
    """

    def __init__(self, markdown: str, *, dark: bool) -> None:
        super().__init__()
        self.markdown = markdown
        self._renderable = RichMarkdown(markdown, code_theme="monokai" if dark else "default", hyperlinks=False)

    def renderable(self) -> RenderableType:
        return self._renderable


class LiveTail(Vertical):
    """Holds the live Markdown at a height allocated in steps, so most updates re-lay out only this box."""

    DEFAULT_CSS = """
    LiveTail {
        height: 3;
        overflow: hidden hidden;
    }
    LiveTail > Markdown {
        margin: 0;
        padding: 0;
    }
    """


class LiveMessage(Vertical):
    """The reply being streamed: reasoning (folded) and the answer.

    Only the tail of the answer is a live `Markdown` fed through `Markdown.get_stream`; whenever the tail holds
    FREEZE_CHARS of finished blocks they are frozen into a static `FrozenSegment`, so re-parsing and layout stay
    small however long the reply gets. The tail's box grows in steps of GROW_LINES, so a new line of text
    usually changes no size outside it.
    """

    FREEZE_CHARS: ClassVar[int] = 1200
    GROW_LINES: ClassVar[int] = 16

    DEFAULT_CSS = """
    LiveMessage {
        height: auto;
        padding: 0 1;
    }
    """

    def __init__(self, message_id: int, model: str, *, content: str = "", reasoning: str = "",
                 dark: bool = True) -> None:
        super().__init__(classes="message -assistant -streaming")
        self.message_id = message_id
        self.model = model
        self.dark = dark
        self._text = content
        self._frozen_chars = 0
        self._reasoning = reasoning
        self._stream: MarkdownStream | None = None
        self._markdown = Markdown()
        self.show_reasoning = False

    @property
    def text(self) -> str:
        return self._text

    def compose(self) -> ComposeResult:
        yield Static(_header("assistant", "streaming", self.model, None), classes="live-header")
        yield Static("", classes="live-reasoning")
        cut = freeze_point(self._text, 0)
        if cut > 0:
            yield FrozenSegment(self._text[:cut], dark=self.dark)
            self._frozen_chars = cut
        self._markdown = Markdown(self._text[self._frozen_chars :], classes="live-body")
        with LiveTail():
            yield self._markdown

    @property
    def markdown(self) -> Markdown:
        """The live Markdown (the tail of the answer)."""
        return self._markdown

    def on_mount(self) -> None:
        self._stream = Markdown.get_stream(self.markdown)
        self._update_reasoning()
        self.set_interval(0.05, self._fit_tail)

    async def write(self, text: str, reasoning: str) -> None:
        """Append streamed text (the Markdown stream batches fragments it cannot draw fast enough)."""
        if reasoning:
            self._reasoning += reasoning
            self._update_reasoning()
        if not text:
            return
        self._text += text
        tail = self._text[self._frozen_chars :]
        cut = freeze_point(tail, self.FREEZE_CHARS) if len(tail) > self.FREEZE_CHARS else -1
        if cut > 0:
            await self._freeze(cut)
        elif self._stream is not None:
            await self._stream.write(text)

    async def _freeze(self, cut: int) -> None:
        """Move the first `cut` characters of the tail into a static segment and continue in a fresh live
        Markdown; the old one is hidden at once and retired in the background once its last append is done."""
        tail = self._text[self._frozen_chars :]
        self._frozen_chars += cut
        old_markdown, old_stream = self.markdown, self._stream
        old_markdown.remove_class("live-body")
        old_markdown.display = False
        markdown = self._markdown = Markdown(tail[cut:], classes="live-body")
        live_tail = self.query_one(LiveTail)
        with self.app.batch_update():
            await self.mount(FrozenSegment(tail[:cut], dark=self.dark), before=live_tail)
            await live_tail.mount(markdown)
        self._stream = Markdown.get_stream(markdown)
        self._fit_tail()

        async def retire() -> None:
            if old_stream is not None:
                await old_stream.stop()
            await old_markdown.remove()

        self.call_later(retire)

    def _fit_tail(self) -> None:
        """Grow (or after a freeze, shrink) the tail's box to the live Markdown's height plus some room."""
        tail = self.query_one(LiveTail)
        needed = self.markdown.outer_size.height
        allocated = int(tail.styles.height.value) if tail.styles.height is not None else 0
        if needed + 1 > allocated or needed + 2 * self.GROW_LINES < allocated:
            tail.styles.height = needed + self.GROW_LINES

    def content_bottom(self) -> int:
        """The y of the end of the streamed text, relative to this widget's top."""
        tail = self.query_one(LiveTail)
        return tail.virtual_region.y + min(tail.outer_size.height, self.markdown.outer_size.height)

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.has_class("live-reasoning"):
            self.show_reasoning = not self.show_reasoning
            self._update_reasoning()

    def _update_reasoning(self) -> None:
        widget = self.query_one(".live-reasoning", Static)
        reasoning = self._reasoning.strip()
        widget.display = bool(reasoning)
        if not reasoning:
            return
        if self.show_reasoning:
            widget.update(Text("▾ Reasoning (click to hide)\n" + reasoning, style="dim italic"))
        else:
            words = len(reasoning.split())
            widget.update(Text(f"▸ Thinking… ({words} words; click to show)", style="dim italic"))

    async def stop(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None


class EarlierMessages(Static, can_focus=True):
    """Stands in for the messages above those mounted; Enter or scrolling up to it loads more."""

    BINDINGS = [Binding("enter", "load", "Load earlier")]

    class LoadRequested(Message):
        """Mount the next page of earlier messages."""

    def action_load(self) -> None:
        self.post_message(self.LoadRequested())

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.LoadRequested())


class Transcript(VerticalScroll):
    """The messages of the branch on screen. Only the last PAGE_SIZE are mounted at first (first paint stays
    fast for long conversations); follow-scroll while streaming only when the user is at the bottom."""

    DEFAULT_CSS = """
    Transcript {
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, can_focus=False)
        self.messages: list[StoredMessage] = []
        self.branches: dict[int, BranchInfo] = {}
        self.live: LiveMessage | None = None
        self._first_mounted = 0
        self.dark = True

    @property
    def at_bottom(self) -> bool:
        return self.scroll_y >= self.max_scroll_y - 1

    def _view(self, message: StoredMessage) -> MessageView:
        return MessageView(message, self.branches.get(message.id), dark=self.dark)

    async def show(self, messages: list[StoredMessage], branches: dict[int, BranchInfo]) -> None:
        """Replace the transcript with `messages` (system messages are not shown)."""
        self.messages = [message for message in messages if message.role != "system"]
        self.branches = branches
        self.live = None
        self._first_mounted = max(0, len(self.messages) - PAGE_SIZE)
        with self.app.batch_update():
            await self.remove_children()
            widgets: list[Widget] = []
            if not self.messages:
                widgets.append(Static(EMPTY_HINT, classes="empty-hint"))
            if self._first_mounted:
                widgets.append(self._earlier())
            widgets.extend(self._view(message) for message in self.messages[self._first_mounted :])
            await self.mount_all(widgets)
        self.scroll_end(animate=False, immediate=True)

    def _earlier(self) -> EarlierMessages:
        return EarlierMessages(
            f"▲ {self._first_mounted} earlier messages — scroll up or press Enter to show them",
            classes="earlier",
        )

    async def load_earlier(self) -> None:
        """Mount the previous page of messages above the ones shown, keeping the view where it is."""
        if not self._first_mounted:
            return
        start = max(0, self._first_mounted - PAGE_SIZE)
        views = [self._view(message) for message in self.messages[start : self._first_mounted]]
        self._first_mounted = start
        placeholder = self.query(EarlierMessages)
        old_height = self.virtual_size.height
        with self.app.batch_update():
            await placeholder.remove()
            await self.mount_all(views, before=0 if self.children else None)
            if self._first_mounted:
                await self.mount(self._earlier(), before=0)

        def keep_place() -> None:
            self.scroll_to(y=self.scroll_y + self.virtual_size.height - old_height, animate=False)

        self.call_after_refresh(keep_place)

    async def on_earlier_messages_load_requested(self, event: EarlierMessages.LoadRequested) -> None:
        event.stop()
        await self.load_earlier()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new <= 0 and self._first_mounted and self.max_scroll_y > 0:
            self.call_later(self.load_earlier)

    async def append(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView:
        """Add a finished message at the end."""
        self.messages.append(message)
        if branch is not None:
            self.branches[message.id] = branch
        follow = self.at_bottom
        view = self._view(message)
        await self.query(".empty-hint").remove()
        await self.mount(view)
        if follow:
            self.scroll_end(animate=False)
        return view

    async def start_live(self, message_id: int, model: str, *, content: str = "", reasoning: str = "") -> LiveMessage:
        """Mount the streaming reply at the end (replacing a frozen view of the same message, when continuing)."""
        for view in self.query(MessageView):
            if view.message.id == message_id:
                await view.remove()
        self.messages = [message for message in self.messages if message.id != message_id]
        live = LiveMessage(message_id, model, content=content, reasoning=reasoning, dark=self.dark)
        self.live = live
        await self.mount(live)
        self.scroll_end(animate=False)
        return live

    def _live_target(self) -> float:
        """The scroll offset that shows the end of the streamed text at the bottom of the view."""
        live = self.live
        if live is None:
            return self.max_scroll_y
        bottom = live.virtual_region.y + live.content_bottom() + 1
        return max(0.0, min(self.max_scroll_y, bottom - self.scrollable_content_region.height))

    async def write_live(self, text: str, reasoning: str) -> None:
        live = self.live
        if live is None:
            return
        step = max(1, self.scrollable_content_region.height // 3)
        follow = self.scroll_y >= self._live_target() - 1 - step
        await live.write(text, reasoning)
        if follow:
            self.call_after_refresh(self._follow)

    def _follow(self) -> None:
        # Scroll in steps of a third of the view rather than a line at a time: a scroll repaints the whole view.
        target = self._live_target()
        if self.scroll_y < target:
            step = max(1, self.scrollable_content_region.height // 3)
            self.scroll_to(y=min(self.max_scroll_y, target + step - 1), animate=False, immediate=True)

    async def freeze_live(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView | None:
        """Replace the live reply by a static view of its final state."""
        live = self.live
        self.live = None
        if live is None:
            return None
        follow = self.at_bottom
        await live.stop()
        if branch is not None:
            self.branches[message.id] = branch
        self.messages.append(message)
        view = self._view(message)
        with self.app.batch_update():
            await self.mount(view, before=live)
            await live.remove()
        if follow:
            self.scroll_end(animate=False)
        return view

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def last_view(self) -> MessageView | None:
        views = self.views()
        return views[-1] if views else None
