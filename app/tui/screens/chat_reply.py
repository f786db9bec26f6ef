"""The chat screen's side of a reply: the Textual adapter of the generation controller (app/core/generation).

The controller commits the message, begins, sends, records and ends the reply; this draws it (the question, the live
reply, the stats bar), forwards the keys (Enter, Esc, ctrl+g, ctrl+r) and takes the router's events for the chat's
requests (it is the router's default owner).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Final

from app.core.engine import ReplyHeld
from app.core.generation import end_state
from app.core.generation.repeats import RepeatWatch
from app.core.remote_engine import draft_summary
from app.core.store import Message, StoreError
from app.tui.screens.chat_documents import DocumentAttacher
from app.tui.screens.chat_view import ChatView, branch_map
from app.tui.streaming import chunk_draft_spans
from app.tui.widgets.draft_provenance import draft_spans_from_stats
from engine_ext.protocol import PromptProgress

if TYPE_CHECKING:
    from collections.abc import Sequence

    from app.core.engine import ReplyStats
    from app.core.generation.tools import ConsentAnswer
    from app.core.store import MessageState
    from app.core.tools.box import ToolEntry
    from app.core.tools.loop import CallRecord
    from app.tui.messages import DraftSpan
    from app.tui.shell import LlmtuiShell
    from engine_ext.protocol import Failed, Finished, SpeculativeStats, TokenChunk, ToolCall

IDLE_COLLECT_AFTER_S: Final = 2.0
FULL_COLLECTIONS_PAUSED: Final = 1_000_000
DEFAULT_OLD_THRESHOLD: Final = gc.get_threshold()[2]


def pause_full_collections() -> None:
    """Keep the garbage collector off the objects that exist now (the UI, the transcript) while a reply streams.

    A full collection walks every object Textual and Rich hold, 50–200 ms with a long transcript: the
    objects that exist are frozen (never scanned) and no full collection runs until `collect_now`, which
    runs one when the reply has ended and the app is idle. Young generations are still collected.
    """
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTIONS_PAUSED)


def collect_now() -> None:
    """Collect everything once (call when idle), freeze what survives, and allow full collections again."""
    young, middle, old = gc.get_threshold()
    if old == FULL_COLLECTIONS_PAUSED:
        gc.set_threshold(young, middle, DEFAULT_OLD_THRESHOLD)
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def held_note(ahead: int) -> str:
    """What a reply waiting for the API server's requests says in its header ("" once it starts)."""
    if not ahead:
        return ""
    requests = "an API request" if ahead == 1 else f"{ahead} API requests"
    return f"waiting for {requests} to finish · ctrl+k stops {'it' if ahead == 1 else 'them'}"


class ChatReplies:
    """Sending, streaming and ending the chat's replies, drawn in the transcript and the stats bar: the generation
    router's default owner. It knows which replies were measured on the model loaded now."""

    def __init__(self, view: ChatView, documents: DocumentAttacher) -> None:
        self._view = view
        self._documents = documents  # the conversation's documents: a new question's passages are found first
        self._prompt_blink = True  # the prompt's cursor blink setting, restored when a reply ends
        self.measured: set[int] = set()
        """Replies whose figures (tok/s, TTFT…) were measured in this session on the model loaded now: the only ones
        the stats bar shows (an earlier session's or another model's figures would mislead)."""
        self.measured_on = ""
        """The model those were measured on (the screen sets it when it opens)."""
        self.held_behind = 0
        """How many API server requests the reply being written waits for before it starts (0: none)."""
        self.repeats = (RepeatWatch(), RepeatWatch())
        """The reply being written, watched for a loop: its answer and its thinking."""
        self._repeat_told = False  # the toast said it once for this reply
        self._repeat_shown = 0  # the count the line under the reply last showed

    @property
    def app(self) -> LlmtuiShell:
        return self._view.app

    @property
    def replies_started(self) -> int:
        """Replies started since the app opened (tests and benchmarks wait on it)."""
        return self.app.generation.replies_started

    # ----- sending -----

    def _engine_ready(self) -> bool:
        state = self.app.engine_state
        if state == "ready":
            return True
        if state in ("loading", "starting"):
            self._view.notify("The model is still loading; send again in a moment.", severity="warning")
        elif state == "crashed":
            self._view.notify("The engine stopped. Press F5 to restart it.", severity="error")
        else:
            self._view.notify("No model is loaded. Press ctrl+l to pick one.", severity="warning")
        return False

    async def send(self, text: str) -> None:
        """Commit the user's message, then start the reply (or, editing a reply, save its new text)."""
        banner = self._view.edit_banner
        if banner.target is not None and banner.is_reply:
            await self.save_reply_edit(banner.target, text)
            return
        if self._view.busy() or not self._engine_ready():
            return
        replies = self.app.generation
        editing = banner.target
        images = self._view.attachments.take()
        try:
            conversation = replies.ensure_conversation(self._view.conversation_id)
            self._view.conversation_id = conversation.id
            message = replies.commit_user_message(conversation.id, text, edit_of=editing, images=images)
        except StoreError as error:
            self._view.attachments.images = images  # still attached, for sending again
            self._view.notify(str(error), severity="error")
            return
        store = self.app.store
        banner.end(self._view.prompt, restore=False)
        self._view.prompt.remember(text)
        if editing is not None:
            await self._view.reload_transcript()
        else:
            await self._view.transcript.append(
                message, branch_map(store.tree.messages(conversation.id)).get(message.id)
            )
        self._view.header.conversation_title = (
            store.conversations.get_conversation(conversation.id).title or "New conversation"
        )
        self._view.refresh_conversation_list()
        await self.start_reply(message.id)

    async def start_reply(self, parent_id: int, *, resume: Message | None = None, reload: bool = False) -> None:
        """Start streaming a reply under `parent_id`, or continue the stopped reply `resume`."""
        assert self._view.conversation_id is not None
        model_name = self.app.model.name if self.app.model else ""
        if self.app.generation.takes_tools:  # the conversation's tools (an MCP server starts on demand, in a thread)
            notice = await self.app.generation.prepare_tools(self._view.conversation_id)
            if notice:
                self._view.notify(notice, severity="warning", timeout=10)
        model = self.app.model
        notice = await self.app.generation.check_images(  # a file missing in the history: sent without it
            self._view.conversation_id, sees_images=model is not None and model.sees_images
        )
        if notice:
            self._view.notify(notice, severity="warning", timeout=10)
        if resume is None:  # the attached documents' passages for this question (chat_documents)
            await self._documents.find_sources(parent_id)
        reply = self.app.generation.begin(self._view.conversation_id, parent_id, model_name, resume=resume)
        self.repeats, self._repeat_told, self._repeat_shown = (RepeatWatch(), RepeatWatch()), False, 0
        if resume is not None:
            await self._view.transcript.start_live(
                reply.message_id,
                model_name,
                content=reply.recorder.content,
                reasoning=reply.recorder.reasoning,
                draft_spans=draft_spans_from_stats(resume.stats),
            )
        else:
            if reload:
                await self._view.reload_transcript()
            await self._view.transcript.start_live(reply.message_id, model_name)
        # A steady cursor while the reply streams: each blink repaints the prompt (twice a second), CPU time that a
        # machine whose cores all run the engine takes from decoding.
        self._prompt_blink, self._view.prompt.cursor_blink = self._view.prompt.cursor_blink, False
        pause_full_collections()
        self.app.set_engine_state("generating")
        self._view.stats.decode_tps = self._view.stats.ttft_ms = None  # the new reply's, once known
        self._view.stats.generated_tokens, self._view.stats.reasoning_tokens = 0, None  # split once the reply is done
        # The request goes out once the screen has drawn the new messages: mounting them, laying the screen out
        # and repainting it takes tens of milliseconds that would otherwise run alongside the engine's first
        # tokens and, on a machine whose cores all run the engine, slow them (the same wait, paid up front).
        self._view.call_after_refresh(self.app.generation.send, reply, self)

    # ----- the router's events for the chat's requests -----

    async def generation_tokens(self, event: TokenChunk) -> None:
        text = self.app.generation.visible(event.request_id, event.text)  # a tool call's markup is not shown
        spans = chunk_draft_spans(event)
        self._write_reply(event.request_id, text, event.reasoning, len(event.token_ids), spans, event.text)

    def _write_reply(
        self, request_id: int, text: str, reasoning: str, n_tokens: int, spans: Sequence[DraftSpan], streamed: str
    ) -> None:
        """Record and draw the reply's text (`spans` are of `streamed`: dropped when the text shown is not it)."""
        try:
            if not self.app.generation.record(request_id, text, reasoning, n_tokens):
                return
        except StoreError as error:
            self._view.notify(f"Could not save the reply: {error}", severity="error")
        self._view.transcript.write_live(text, reasoning, spans if text == streamed else ())
        answer, thinking = self.repeats
        if answer.feed(text) | thinking.feed(reasoning):
            self._repeating()

    def _repeating(self) -> None:
        """The reply repeats itself: said under it as it streams (the first time in a toast too: the reply's end
        may be out of view), and kept with it when it ends."""
        note = self.repeat_note()
        live = self._view.transcript.live
        times = max(watch.times for watch in self.repeats)
        # Shown when found and again each time the count doubles: a loop within a line counts up with every few
        # characters, and each new line under the reply lays the screen out again.
        if live is not None and (times >= 2 * self._repeat_shown or times < self._repeat_shown):
            self._repeat_shown = times
            live.notice(f"↻ {note} Esc stops it.")
        if not self._repeat_told:
            self._repeat_told = True
            self._view.notify(f"{note} Esc stops it.", severity="warning", timeout=10)

    def repeat_note(self) -> str:
        """One line on the reply's loop, its answer's or its thinking's ("" when none)."""
        answer, thinking = self.repeats
        if answer.period:
            return answer.note()
        return thinking.note().replace("The reply repeats", "The reply's thinking repeats")

    def generation_progress(self, event: PromptProgress | ReplyStats | ReplyHeld) -> None:
        if not self.app.generation.owns(event.request_id):
            return
        if isinstance(event, ReplyHeld):  # it waits for the API server's requests on the app's engine
            self.held_behind = event.ahead
            live = self._view.transcript.live
            if live is not None:
                live.waiting(held_note(event.ahead))
            self._view.refresh_bindings()
            return
        if isinstance(event, PromptProgress):  # how far the prompt is read
            live = self._view.transcript.live
            if live is not None:
                live.reading(event.done, event.total)
            return
        stats = self._view.stats
        stats.decode_tps = event.tokens_per_s
        stats.generated_tokens = event.n_tokens
        stats.ttft_ms = event.ttft_ms
        stats.cpu = event.cpu  # this reply's: none until measured (the note stays with the finished reply)
        if event.prompt_tokens is not None:
            stats.prompt_tokens = event.prompt_tokens
            stats.n_ctx_used = event.prompt_tokens + event.n_tokens
        if event.n_ctx:
            stats.n_ctx = event.n_ctx

    def generation_stats(self, stats: SpeculativeStats) -> None:
        """The chat's statistics go to the speculation controller (the app sends them there)."""

    def generation_lost(self) -> None:
        """The engine died: the reply ends as failed (`generation_crashed`)."""

    async def generation_finished(self, event: Finished) -> None:
        stats: dict[str, Any] = event.stats.to_dict()
        # A server's own speculative decoding (llama-server's timings: draft_n / draft_n_accepted).
        summary = draft_summary(stats)
        extras = {k: v for k, v in self._view.stats.extras.items() if k != "draft"}
        if summary:
            extras["draft"] = summary
        if extras != self._view.stats.extras:
            self._view.stats.extras = extras
        if not self.app.generation.owns(event.request_id):
            return
        self._view.stats.set_stats(stats)
        if await self._tool_calls_made(event):
            return
        await self._end_generation(end_state(event.stop_reason), dict(stats, stop_reason=event.stop_reason))
        self.app.set_engine_state("ready")
        for notice in event.notices:
            self._view.notify(notice, severity="warning")
        if event.stop_reason == "max_tokens":
            self._view.notify(
                f"The reply stopped at its limit of {event.stats.generated_tokens} tokens: ctrl+g continues it; "
                "ctrl+s sets the conversation's limit (max tokens).",
                severity="warning",
            )
        if event.stop_reason == "context_full":
            self._view.notify(
                "The context is full; start a new conversation or raise the context size (F3).", severity="warning"
            )

    # ----- tool calls (app/core/generation/tools.py) -----

    async def _tool_calls_made(self, event: Finished) -> bool:
        """Show what the filter held back of the reply's text; when it ended with calls to answer, start the tool
        round (in a worker: the consent dialog is awaited there) and say so."""
        replies = self.app.generation
        rest = replies.calls_ended(event.request_id, event.tool_calls)
        if rest:
            self._write_reply(event.request_id, rest, "", 0, (), rest)
        if not replies.wants_tool_round(event.request_id, event.tool_calls):
            return False
        self._view.run_worker(self._tool_round(event), group="tool-round", exit_on_error=False)
        return True

    async def _tool_round(self, event: Finished) -> None:
        reply = self.app.generation.active
        why = await self.app.generation.tool_round(event.tool_calls, self._ask_tool, self._show_call, self)
        if why is None or self.app.generation.active is not reply:  # it goes on with the results, or ended meanwhile
            return
        if why != "stopped":
            self._view.notify(why, severity="warning")
        state: MessageState = "stopped" if why == "stopped" else "complete"
        stop_reason = "cancelled" if state == "stopped" else "eos"
        await self._end_generation(state, dict(event.stats.to_dict(), stop_reason=stop_reason))
        self.app.set_engine_state("ready")

    async def _ask_tool(self, call: ToolCall, entry: ToolEntry) -> ConsentAnswer:
        from app.tui.modals.tool_consent import ToolConsentModal

        return await self.app.push_screen_wait(ToolConsentModal(call, entry.source))

    async def _show_call(self, record: CallRecord) -> None:
        await self._view.transcript.add_live_call(record)
        reply = self.app.generation.active
        made = len(reply.tools.records) if reply is not None and reply.tools is not None else 0
        self._view.stats.extras = {**self._view.stats.extras, "tools": f"{made} call{'s' if made != 1 else ''}"}

    async def generation_failed(self, event: Failed) -> None:
        if self.app.generation.owns(event.request_id, unnamed=True):
            await self._end_generation("error", {"error": event.message})
            self.app.set_engine_state("ready" if self.app.model else "no model")
        self._view.notify(f"Generation failed: {event.message}", severity="error", timeout=10)

    async def generation_crashed(self, description: str) -> None:
        await self._end_generation("error", {"error": description})

    async def _end_generation(self, state: MessageState, stats: dict[str, Any]) -> None:
        replies = self.app.generation
        if replies.active is None:
            return
        self.held_behind = 0
        self._view.prompt.cursor_blink = self._prompt_blink
        live = self._view.transcript.live
        if live is not None and live.body.draft_spans:
            stats = dict(stats, draft_spans=[list(span) for span in live.body.draft_spans])
        if "n_ctx_used" in stats:
            self.measured.add(replies.active.message_id)
        if state != "error":  # the steering mix and speculative settings it was written with (the exports say them)
            stats = dict(stats, **self.app.steering.in_use(), **self.app.speculation.in_use())
        if note := self.repeat_note():
            stats = dict(stats, repeats=note)
        try:
            ended = replies.end(state, stats)
        except StoreError as error:
            self._view.notify(f"Could not save the reply: {error}", severity="error")
            return
        assert ended is not None
        reply, message = ended
        branch = branch_map(self.app.store.tree.messages(reply.conversation_id)).get(message.id)
        await self._view.transcript.freeze_live(message, branch)
        self._view.refresh_bindings()
        self._view.set_timer(IDLE_COLLECT_AFTER_S, self._collect_when_idle)

    def _collect_when_idle(self) -> None:
        if self.app.generation.active is None:
            collect_now()

    # ----- keys -----

    def stop(self) -> None:
        if not self.app.generation.stop():
            self._view.back()

    def stop_api_requests(self) -> None:
        """Stop the API server's requests that the reply waits for: it starts at once."""
        if self.held_behind:
            self.app.bridge.stop_served()
            self._view.notify("Stopped the API server's requests: your reply starts now.")

    def stop_thinking(self) -> None:
        """Stop thinking now: the model's thinking ends at the next token and it answers."""
        if not self.app.generation.end_thinking():
            reply = self.app.generation.active
            if reply is not None and not reply.answering and not reply.cancelling:
                why = "This engine cannot stop a reply's thinking (Esc stops the reply)."
            elif reply is not None and not reply.cancelling:
                why = "The model is not thinking: it is answering (Esc stops the reply)."
            else:
                why = "The model is not thinking: ctrl+e ends its thinking while a reply thinks."
            self._view.notify(why)

    async def continue_reply(self) -> None:
        if self._view.busy():
            return
        last = self.app.generation.last_reply(self._view.conversation_id)
        if last is None or not last.can_continue:
            self._view.notify(
                "The last reply is complete; there is nothing to continue (edit it with e to cut or change it first)."
            )
            return
        if not self._engine_ready():
            return
        await self.start_reply(last.parent_id or 0, resume=last)

    async def regenerate(self, message_id: int | None = None) -> None:
        if self._view.busy() or self._view.conversation_id is None:
            return
        if message_id is None:
            message = self.app.generation.last_reply(self._view.conversation_id)
            if message is None:
                self._view.notify("There is no reply to regenerate.")
                return
        else:
            message = self.app.store.tree.get_message(message_id)
        if message.parent_id is None:
            return
        if not self._engine_ready():
            return
        await self.start_reply(message.parent_id, reload=True)

    def model_loaded(self, path: str) -> None:
        """A model is loaded: another model's figures no longer describe this one, so the stats bar starts over
        (the same model reloaded, after a crash or F5, keeps them)."""
        if path == self.measured_on:
            return
        self.measured_on = path
        self.measured.clear()
        if self.app.generation.active is None:
            self._view.stats.set_stats({})
            self._view.stats.cpu = None

    async def save_reply_edit(self, message_id: int, text: str) -> None:
        """Change a reply's text in place; ctrl+g then continues it from its new end."""
        try:
            message = self.app.store.tree.edit_assistant_message(message_id, text)
        except (StoreError, ValueError) as error:
            self._view.notify(f"The reply was not changed: {error}", severity="error")
            return
        self._view.edit_banner.end(self._view.prompt, restore=True)
        await self._view.reload_transcript()
        last = self.app.generation.last_reply(self._view.conversation_id)
        more = " ctrl+g continues it from there." if last is not None and last.id == message.id else ""
        self._view.notify("Reply changed." + more)
