"""The transcript: the scrolled container of a conversation's messages. It mounts the finished messages (a page at a
time, older ones when the user scrolls up to them) and the reply being streamed, and follows that reply's end only
while the user is at the bottom."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Final

from textual import events
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.scrollbar import ScrollBar
from textual.widget import Widget
from textual.widgets import Static

from app.core.documents.retrieval import stored_citations
from app.core.store import Message as StoredMessage
from app.core.tools.loop import CallRecord, stored_calls
from app.tui.messages import DraftSpan
from app.tui.textual_internals.layout import LaidOutOnce
from app.tui.textual_internals.scrollbar import LinesOncePerPositionScrollBar, use_vertical_scrollbar
from app.tui.widgets.draft_provenance import DraftSpans
from app.tui.widgets.image_block import ImageBlock, ImageReader
from app.tui.widgets.live_body import LiveMessage
from app.tui.widgets.markdown_render import load_lexer_table
from app.tui.widgets.message_view import BranchInfo, MessageView
from app.tui.widgets.source_block import SourceBlock
from app.tui.widgets.tool_call_block import ToolCallBlock

PAGE_SIZE: Final = 16  # messages mounted at a time; older ones are mounted when the user scrolls up to them

EMPTY_HINT: Final = (
    "Type a message below and press Enter.  Shift+Enter or Ctrl+J adds a line · F1 lists every key · "
    "ctrl+p finds any action."
)


class EarlierMessages(Static, can_focus=True):
    """Stands in for the messages above those mounted; Enter or scrolling up to it loads more."""

    BINDINGS = [Binding("enter", "load", "Load earlier", tooltip="Load earlier messages: on the line above them")]

    class LoadRequested(Message):
        """Mount the next page of earlier messages."""

    def action_load(self) -> None:
        self.post_message(self.LoadRequested())

    def on_click(self, event: events.Click) -> None:
        self.post_message(self.LoadRequested())


class Transcript(LaidOutOnce, VerticalScroll):
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
        self._follow_pending = False
        self._live_top: tuple[object, int] | None = None  # (layout key, where the live reply's text starts)
        self._at_end = True  # whether the view showed the end of the conversation at its last scroll
        self._laid_out_height = 0  # the view's height at the last layout that resized it
        self.dark = True
        self.colour_drafts = False
        self.read_image: ImageReader | None = None
        """How a message's image is read from the history (the chat sets it); None: images are named, not drawn."""
        """Whether text from accepted draft tokens is coloured."""

    def on_mount(self) -> None:
        # The lexer table costs a scan of every installed package's entry points: build it off the event loop
        # once the first frame is drawn, not when the first code block is rendered.
        self.call_after_refresh(threading.Thread(target=load_lexer_table, name="llmtui-lexers", daemon=True).start)

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        # Widget.vertical_scrollbar, with the scrollbar that makes its lines once per position.
        return use_vertical_scrollbar(
            self,
            lambda: LinesOncePerPositionScrollBar(
                vertical=True, name="vertical", thickness=self.scrollbar_size_vertical
            ),
        )

    @property
    def at_bottom(self) -> bool:
        return self.scroll_y >= self.max_scroll_y - 1

    def _view(self, message: StoredMessage) -> MessageView:
        return MessageView(message, self.branches.get(message.id), dark=self.dark, colour_drafts=self.colour_drafts)

    def _views(self, message: StoredMessage) -> tuple[MessageView, list[ToolCallBlock | ImageBlock | SourceBlock]]:
        """A message's view, and (a reply) a folded block for each tool call it made and each source it was given,
        or (yours) its images."""
        reply = message.role == "assistant"
        calls = stored_calls(message.stats) if reply else []
        sources = stored_citations(message.stats) if reply else []
        images = [ImageBlock(image, self.read_image, message_id=message.id) for image in message.images]
        return self._view(message), [
            *images,
            *(ToolCallBlock(record, message_id=message.id) for record, _ in calls),
            *(SourceBlock(citation, cited, message_id=message.id) for citation, cited in sources),
        ]

    async def add_live_call(self, record: CallRecord) -> ToolCallBlock:
        """A call of the reply being written, shown folded below it as it is made."""
        block = ToolCallBlock(record, message_id=self.live.message_id if self.live is not None else None)
        await self.mount(block)
        if self.live is not None and self._following():
            self.call_after_refresh(self._follow)
        return block

    def set_colour_drafts(self, colour: bool) -> None:
        """Colour (or stop colouring) text from accepted draft tokens, in every message shown and the live one."""
        self.colour_drafts = colour
        for view in self.query(MessageView):
            view.set_colour_drafts(colour)
        if self.live is not None:
            self.live.body.set_colour_drafts(colour)

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
            for message in self.messages[self._first_mounted :]:
                view, blocks = self._views(message)
                widgets += [view, *blocks]
            await self.mount_all(widgets)
        self.scroll_end(animate=False, immediate=True)
        # Again once the new messages are laid out: the end above was the one before (the sizes the messages
        # take are known only after the layout; Textual's second layout used to come in time to fix it).
        self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

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
        views: list[Widget] = []
        for message in self.messages[start : self._first_mounted]:
            view, blocks = self._views(message)
            views += [view, *blocks]
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
        self._at_end = self.at_bottom
        if new <= 0 and self._first_mounted and self.max_scroll_y > 0:
            self.call_later(self.load_earlier)

    def resized_at_layout(self) -> None:
        # The view got shorter (the prompt grew a line, the speculative meter appeared): a view that showed the end
        # of the conversation keeps showing it, rather than the last lines going below it. Here rather than in a
        # Resize handler: Textual does not always send the transcript one. A streamed reply is followed by its own
        # logic: whether the view followed it is judged with the view's height before this layout, so that a view
        # made shorter under a following reader (F6's sliders below it) goes on following rather than leaving the
        # reply's end below it (issue 22).
        height = self._view_height()
        before, self._laid_out_height = self._laid_out_height, height
        if self.live is not None:
            if self._following(before or height):
                self.call_after_refresh(self._follow)
        elif self._at_end:
            self.scroll_end(animate=False)  # after the refresh

    async def append(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView:
        """Add a finished message at the end."""
        self.messages.append(message)
        if branch is not None:
            self.branches[message.id] = branch
        follow = self.at_bottom
        view, blocks = self._views(message)
        await self.query(".empty-hint").remove()
        await self.mount_all([view, *blocks])
        if follow:
            self.scroll_end(animate=False)
        return view

    async def start_live(
        self, message_id: int, model: str, *, content: str = "", reasoning: str = "", draft_spans: DraftSpans = ()
    ) -> LiveMessage:
        """Mount the streaming reply at the end (replacing a frozen view of the same message, when continuing)."""
        for view in self.query(MessageView):
            if view.message.id == message_id:
                await view.remove()
        await self.query(f".-reply-{message_id}").remove()  # its tool calls and sources
        self.messages = [message for message in self.messages if message.id != message_id]
        live = LiveMessage(
            message_id,
            model,
            content=content,
            reasoning=reasoning,
            dark=self.dark,
            draft_spans=draft_spans,
            colour_drafts=self.colour_drafts,
        )
        self.live = live
        await self.mount(live)
        # Not scroll_end: the live reply keeps room below its text (a screenful, so that new lines seldom change
        # its size) and the end of the transcript is that empty room. Show where the text will appear.
        self._follow_pending = True
        self.call_after_refresh(self._follow, True)
        return live

    def _live_target(self, *, clamp: bool = True, view_height: int | None = None) -> float:
        """The scroll offset that shows the end of the streamed text at the bottom of the view (unclamped: below 0
        when the text ends above the view's bottom at offset 0); `view_height`: the view's, unless given."""
        live = self.live
        if live is None:
            return self.max_scroll_y
        height = self._view_height() if view_height is None else view_height
        offset = self._live_text_top(live) + live.body.content_height + 1 - height
        return max(0.0, min(self.max_scroll_y, offset)) if clamp else offset

    def _view_height(self) -> int:
        """The height of the scrolled view, from the sizes kept at layout: the follow logic runs at every frame, and
        Widget.region, .size and .virtual_region look the widget up in the compositor's map, which Textual
        rebuilds for the whole screen when anything was re-laid out or scrolled since."""
        return self.outer_size.height - self.styles.gutter.height - self.scrollbar_gutter.height

    def _live_text_top(self, live: LiveMessage) -> int:
        """Where the live reply's text starts in the transcript, looked up again only when the layout may have
        moved it (see `_view_height`)."""
        key = (id(live), self.virtual_size, live.outer_size, live.body.outer_size)
        if self._live_top is None or self._live_top[0] != key:
            self._live_top = (key, live.virtual_region.y + live.content_bottom() - live.body.content_height)
        return self._live_top[1]

    def write_live(self, text: str, reasoning: str, draft_spans: Sequence[DraftSpan] = ()) -> None:
        """Append to the streaming reply; `draft_spans` (relative to `text`) came from accepted draft tokens."""
        live = self.live
        if live is None:
            return
        follow = self._following()
        live.write(text, reasoning, draft_spans)
        if follow and not self._follow_pending:
            self._follow_pending = True
            self.call_after_refresh(self._follow)

    def _following(self, view_height: int | None = None) -> bool:
        """Whether the view shows the end of the streamed text (or is past it, in the room kept below it);
        `view_height`: judged for a view of that height (the view's own, unless given)."""
        height = self._view_height() if view_height is None else view_height
        step = max(1, height // 3)
        return self.scroll_y >= self._live_target(view_height=height) - 1 - step

    def _follow(self, jump: bool = False) -> None:
        """Keep the end of the streamed text in view: in steps of a third of the view rather than a line at a time
        (a scroll repaints the whole view), and never further down than that (below is only empty room).

        Runs after the body has drawn the text appended so far (its render may wait up to `render_interval`) and the
        screen is laid out again: following earlier would leave the lines drawn later below the view."""
        live = self.live
        if live is not None and live.body.render_pending:
            live.body.when_drawn(lambda: self.call_after_refresh(self._follow, jump))
            return
        if live is not None and not live.outer_size:  # mounted but not laid out yet: its place is not known
            self.call_after_refresh(self._follow, jump)
            return
        self._follow_pending = False
        offset = self._live_target(clamp=False)
        target = max(0.0, min(self.max_scroll_y, offset))
        step = max(1, self._view_height() // 3)
        end = max(0.0, min(self.max_scroll_y, offset + step - 1))
        if jump or self.scroll_y < target or self.scroll_y > end:
            if live is not None:
                live.body.reserve(2 * step)
            self.scroll_to(y=end, animate=False, immediate=True)

    async def freeze_live(self, message: StoredMessage, branch: BranchInfo | None = None) -> MessageView | None:
        """Replace the live reply by a static view of its final state."""
        live = self.live
        self.live = None
        if live is None:
            return None
        follow = self.at_bottom or self._following()
        live.stop()
        if branch is not None:
            self.branches[message.id] = branch
        self.messages.append(message)
        view, blocks = self._views(message)
        width = live.body.size.width
        lines = live.body.plain_lines(width) if message.content == live.text and message.content.strip() else None
        if lines is not None:
            view.seed_body(width, lines)  # the streamed reply's lines: no second render of the whole reply
        with self.app.batch_update():
            await self.mount(view, before=live)
            await live.remove()
            if blocks:  # the stored calls replace the ones shown as they were made
                await self.query(f".-reply-{message.id}").remove()
                await self.mount_all(blocks, after=view)
        if follow:
            self.scroll_end(animate=False)
        return view

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def last_view(self) -> MessageView | None:
        views = self.views()
        return views[-1] if views else None
