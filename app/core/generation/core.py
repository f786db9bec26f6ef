"""The generation controller: a reply's lifecycle (send, stream, checkpoint, stop, continue, regenerate, record).

Plain Python, no Textual: the chat screen drives it through a thin adapter (`app/tui/screens/chat_reply.py`), the A/B
views through `run`, and the CLI or an API server can drive it the same way with any engine that has `generate`
and `cancel` (the local bridge, the remote one, or a double in tests). What happens is told to whoever listens by
return values and plain data; rendering it is the caller's job.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol

from app.core.config import SamplingSettings
from app.core.documents.retrieval import Citation, Retrieval, citations_record
from app.core.generation.routing import OwnerT
from app.core.generation.tools import (
    ChatTools,
    ReplyTools,
    messages_with_calls,
    tools_choice,
)
from app.core.recording import ReplyRecorder
from app.core.store import StoreError
from app.core.tools.loop import stored_calls
from engine_ext.image_input import ImageRefused, read_image_file
from engine_ext.protocol import ChatMessage, ImageRef
from engine_ext.untrusted_text import one_line

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from pathlib import Path

    from app.core.engine import Engine
    from app.core.generation.routing import GenerationRouter
    from app.core.generation.tools import Ask
    from app.core.store import Conversation, JSONObject, Message, MessageState, Store, StoredImage
    from app.core.tools.loop import CallRecord
    from engine_ext.protocol import ToolCall


class GenerationHost(Protocol):
    """Where the controller finds the history and the engine in use (the App; a CLI session; a test)."""

    @property
    def store(self) -> Store: ...

    @property
    def bridge(self) -> Engine: ...

    def default_conversation_settings(self) -> dict[str, object]:
        """The settings a new conversation starts with (its sampling)."""


@dataclass
class ActiveReply:
    """The reply being streamed."""

    request_id: int
    """0 until the request is sent (the chat sends it once the new reply is drawn)."""
    conversation_id: int
    message_id: int
    recorder: ReplyRecorder
    messages: list[tuple[str, str] | ChatMessage] = field(default_factory=list)
    """What the engine is asked to answer (system prompt, then the branch up to the reply)."""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    continue_reply: bool = False
    cancelling: bool = False
    answering: bool = False
    """Answer text has come (the reply no longer thinks)."""
    tools: ReplyTools | None = None
    """The reply's tools and calls (None: the conversation offers none)."""
    citations: tuple[Citation, ...] = ()
    """The documents' passages its question was sent with, numbered (kept with the reply in the history)."""


def conversation_sampling(conversation: Conversation) -> SamplingSettings:
    """A conversation's sampling settings (saved with it; missing values are the defaults)."""
    data = conversation.settings.get("sampling", {})
    return SamplingSettings.from_json(data if isinstance(data, dict) else {})


def engine_messages(path: Sequence[Message], conversation: Conversation) -> list[tuple[str, str]]:
    """The engine's view of a branch: the system prompt (when there is one), then the user and assistant turns."""
    messages: list[tuple[str, str]] = []
    if conversation.system_prompt.strip():
        messages.append(("system", conversation.system_prompt))
    messages.extend((m.role, m.content) for m in path if m.role in ("user", "assistant"))
    return messages


def with_images(
    messages: Sequence[tuple[str, str] | ChatMessage],
    path: Sequence[Message],
    refs: Callable[[Message], tuple[ImageRef, ...]],
) -> list[tuple[str, str] | ChatMessage]:
    """`messages` (engine_messages of `path`, calls expanded or not) with each user message that has images sent as a
    ChatMessage carrying them (`refs` says which of a message's images go)."""
    users = iter(m for m in path if m.role == "user")
    out: list[tuple[str, str] | ChatMessage] = []
    for item in messages:
        if isinstance(item, tuple) and item[0] == "user":
            images = refs(next(users))
            out.append(ChatMessage("user", item[1], images=images) if images else item)
        else:
            out.append(item)
    return out


def with_sources(messages: list[tuple[str, str] | ChatMessage], asked: str) -> list[tuple[str, str] | ChatMessage]:
    """`messages` with the last user message's text replaced by `asked` (its question with the documents' numbered
    passages: app.core.documents.retrieval); its images kept."""
    for i in range(len(messages) - 1, -1, -1):
        item = messages[i]
        if isinstance(item, ChatMessage) and item.role == "user":
            return [*messages[:i], replace(item, content=asked), *messages[i + 1 :]]
        if isinstance(item, tuple) and item[0] == "user":
            return [*messages[:i], ("user", asked), *messages[i + 1 :]]
    return messages


def end_state(stop_reason: str) -> MessageState:
    """How a finished reply is recorded: stopped by the user, else complete (max tokens and context full included)."""
    return "stopped" if stop_reason == "cancelled" else "complete"


class GenerationController(Generic[OwnerT]):
    """Owns the chat's reply: the user's message committed before generation starts, the reply's row begun (or a
    stopped one resumed), the request sent and registered with the router, its text checkpointed as it streams
    (ReplyRecorder: a crash loses at most a second) and its end recorded. One reply at a time.

    Side runs that record nothing (the A/B views) go through `run` and `cancel`, so every request of the app is sent
    and routed in one place.
    """

    def __init__(self, host: GenerationHost, router: GenerationRouter[OwnerT]) -> None:
        self.host = host
        self.router = router
        self.active: ActiveReply | None = None
        self.replies_started = 0
        """Replies started (tests and benchmarks wait on it)."""
        self.chat_tools = ChatTools()
        """Each conversation's tools and the MCP servers they use."""
        self.images_checked: set[str] = set()
        """Image files found whole this session (by hash): not read again before each reply."""
        self.images_unusable: dict[str, str] = {}
        """Image files found missing or damaged (hash: which), left out of what the engine is sent."""
        self.images_left_out: set[str] = set()
        """The images the next reply is written without (unusable, or the model cannot see images)."""
        self.retrieval: Retrieval | None = None
        """The next reply's question with the documents' passages (app.core.documents), set before `begin`."""

    # ----- what the user asks for -----

    def ensure_conversation(self, conversation_id: int | None) -> Conversation:
        """The conversation, created now (with the default settings) when it is None."""
        store = self.host.store
        if conversation_id is None:
            return store.conversations.create_conversation(settings=self.host.default_conversation_settings())
        return store.conversations.get_conversation(conversation_id)

    def commit_user_message(
        self,
        conversation_id: int,
        text: str,
        *,
        edit_of: int | None = None,
        images: tuple[StoredImage, ...] = (),
    ) -> Message:
        """Save the user's message and its attached images before anything is generated (StoreError when it cannot
        be): a new message at the end of the branch, or, editing an earlier one, a new branch beside it (with the
        earlier one's images, and `images` after them)."""
        store = self.host.store
        if edit_of is not None:
            earlier = store.tree.get_message(edit_of).images
            return store.tree.edit_user_message(edit_of, text, earlier + images if images else None)
        return store.tree.add_user_message(conversation_id, text, images)

    # ----- images -----

    def attach_image(self, path: Path) -> StoredImage:
        """Read and check an image file the user attaches, and keep it in the history's image folder (call it in a
        thread); ImageRefused (one line) or OSError when it cannot be."""
        image = read_image_file(path)
        if image.format == "WebP":  # checked, but the engine's decoder (libmtmd's stb_image) does not read it
            raise ImageRefused(f"{path.name}: WebP is not decoded by the engine's projector; convert it to PNG")
        stored = self.host.store.images.keep_image(image, path.name)
        self.images_unusable.pop(stored.sha256, None)  # kept again: whole now
        self.images_checked.add(stored.sha256)
        return stored

    async def check_images(self, conversation_id: int, *, sees_images: bool) -> str | None:
        """Before a reply: which of the branch's images go to the engine. A file missing or damaged in the history
        (read once a session, then its size looked at; in a thread) is left out, as are all of them when the model
        cannot see images; a line to show the first time that happens (None: all go, or it was said already)."""
        store = self.host.store
        images = {image.sha256: image for m in store.tree.active_path(conversation_id) for image in m.images}
        if not images:
            self.images_left_out = set()
            return None
        if not sees_images:
            self.images_left_out = set(images)
            return "The model in use cannot see images (it has no projector): this reply is written without them."
        found = await asyncio.to_thread(lambda: [(image, self._image_problem(image)) for image in images.values()])
        said = [image for image, _ in found if image.sha256 in self.images_unusable]
        for image, problem in found:
            if problem is None:
                self.images_checked.add(image.sha256)
                self.images_unusable.pop(image.sha256, None)
            else:
                self.images_unusable[image.sha256] = problem
        self.images_left_out = {sha for sha in images if sha in self.images_unusable}
        new = [(image, problem) for image, problem in found if problem is not None and image not in said]
        if not new:
            return None
        names = ", ".join(f"{one_line(image.name, 40)} ({problem})" for image, problem in new)
        return f"Image file of the history {names}: the message is sent without it."

    def _image_problem(self, image: StoredImage) -> str | None:
        """What is wrong with an image's file: read and hashed the first time, then only its size looked at."""
        store = self.host.store
        if image.sha256 in self.images_checked:
            try:
                if store.images.image_path(image.sha256).stat().st_size == image.size:
                    return None
            except OSError:
                pass
        return store.images.image_problem(image)

    def image_refs(self, message: Message) -> tuple[ImageRef, ...]:
        """A message's images as the engine takes them: the kept file's path (the engine reads it only when it has
        not encoded that hash yet) and its name; those left out are not sent."""
        store = self.host.store
        return tuple(
            ImageRef(image.sha256, path=str(store.images.image_path(image.sha256)), name=image.name)
            for image in message.images
            if image.sha256 not in self.images_left_out
        )

    def last_reply(self, conversation_id: int | None) -> Message | None:
        """The branch's last message when it is a reply (what ctrl+g continues and ctrl+r regenerates)."""
        if conversation_id is None:
            return None
        path = self.host.store.tree.active_path(conversation_id)
        return path[-1] if path and path[-1].role == "assistant" else None

    def begin(
        self, conversation_id: int, parent_id: int, model_name: str, *, resume: Message | None = None
    ) -> ActiveReply:
        """Start a reply under `parent_id` (a new row in the store), or continue the stopped reply `resume`. The
        request is not sent yet: `send` sends it (the chat first draws the new reply)."""
        store = self.host.store
        conversation = store.conversations.get_conversation(conversation_id)
        if resume is not None:
            store.tree.resume_assistant_message(resume.id)
            path = store.tree.active_path(conversation_id)
            # Stopped before any answer text: the engine starts the reply again, thinking included.
            reasoning = resume.reasoning if resume.content else ""
            recorder = ReplyRecorder(store, resume.id, content=resume.content, reasoning=reasoning)
        else:
            message_id = store.tree.begin_assistant_message(conversation_id, parent_id, model_name)
            path = store.tree.active_path(conversation_id)[:-1]
            recorder = ReplyRecorder(store, message_id)
        tools = self.chat_tools.ready(conversation_id, tools_choice(conversation)) if self.takes_tools else None
        plain = engine_messages(path, conversation)
        messages = with_images(
            list(plain) if tools is None else messages_with_calls(plain, path), path, self.image_refs
        )
        retrieval, self.retrieval = self.retrieval, None
        if retrieval is not None and resume is None and retrieval.citations:
            messages = with_sources(messages, retrieval.message)
        reply = ActiveReply(
            0,
            conversation_id,
            recorder.message_id,
            recorder,
            messages,
            conversation_sampling(conversation),
            continue_reply=resume is not None,
            answering=resume is not None and bool(resume.content),
            tools=None if tools is None else ReplyTools(tools),
            citations=retrieval.citations if retrieval is not None and resume is None else (),
        )
        if reply.tools is not None and resume is not None:  # the calls the stopped reply made are kept
            reply.tools.records = stored_calls(resume.stats)
            reply.tools.round_text_from = max((at for _, at in reply.tools.records), default=0)
        self.active = reply
        self.replies_started += 1
        return reply

    def send(self, reply: ActiveReply, owner: OwnerT | None = None) -> None:
        """Send the reply's request to the engine (nothing when it already ended: the engine crashed meanwhile);
        its events go to `owner` (None: the router's default). Stopped before it went out: cancelled at once."""
        if self.active is not reply:
            return
        if reply.tools is None:
            reply.request_id = self.host.bridge.generate(
                reply.messages, reply.sampling, continue_reply=reply.continue_reply
            )
        else:
            reply.request_id = self.host.bridge.generate(
                reply.messages,
                reply.sampling,
                continue_reply=reply.continue_reply,
                tools=reply.tools.tools.box.definitions_json(),
            )
        if owner is not None:
            self.router.register(reply.request_id, owner)
        if reply.cancelling:  # the engine stops at once and the reply ends as stopped
            self.host.bridge.cancel(reply.request_id)

    def stop(self) -> bool:
        """Stop the reply being written (its text is kept, marked stopped when it ends); whether there was one."""
        reply = self.active
        if reply is None:
            return False
        if not reply.cancelling:
            reply.cancelling = True
            if reply.tools is not None:
                reply.tools.stopped.set()
            if reply.request_id:  # else cancelled as soon as it is sent
                self.host.bridge.cancel(reply.request_id)
        return True

    def end_thinking(self) -> bool:
        """Stop the reply's thinking now: the engine forces the end of thinking at the next token and the model
        answers (Esc still stops the whole reply). Whether the reply was thinking and the engine could."""
        reply = self.active
        if reply is None or not reply.request_id or reply.cancelling or reply.answering:
            return False
        return self.host.bridge.end_thinking(reply.request_id)

    # ----- what the engine says -----

    def owns(self, request_id: int | None, *, unnamed: bool = False) -> bool:
        """Whether an event of `request_id` is the active reply's (`unnamed`: an event without an id counts too)."""
        reply = self.active
        if reply is None:
            return False
        return request_id == reply.request_id or (unnamed and request_id is None)

    def record(self, request_id: int, text: str, reasoning: str, n_tokens: int) -> bool:
        """Streamed text of the active reply, checkpointed now and then (StoreError when a checkpoint fails; the text
        is kept and saved at the next one). Whether it was the active reply's."""
        if not self.owns(request_id):
            return False
        assert self.active is not None
        if text:
            self.active.answering = True
        self.active.recorder.append(text, reasoning, n_tokens)
        return True

    def end(self, state: MessageState, stats: JSONObject) -> tuple[ActiveReply, Message] | None:
        """Record how the active reply ended and let it go; the reply and its saved row (None: none was active).
        StoreError when it could not be saved (the reply is let go all the same)."""
        reply = self.active
        if reply is None:
            return None
        self.active = None
        self.router.release(reply.request_id or None)
        if reply.tools is not None and reply.tools.records:
            stats = dict(stats, tool_calls=reply.tools.stored())
        if reply.citations:
            stats = dict(stats, citations=citations_record(reply.citations, reply.recorder.content, with_text=True))
        reply.recorder.finish(state, stats)
        return reply, self.host.store.tree.get_message(reply.message_id)

    # ----- tools -----

    @property
    def takes_tools(self) -> bool:
        """Whether the engine in use reads tool calls back (the app's own does; a remote one is offered none)."""
        return self.host.bridge.capabilities.tools

    async def prepare_tools(self, conversation_id: int) -> str | None:
        """Make the conversation's tools before its reply begins (in a thread: an MCP server may be started); a line
        to show when they cannot be made (the reply then goes without them)."""
        from app.core.tools.box import ToolError

        choice = tools_choice(self.host.store.conversations.get_conversation(conversation_id))
        try:
            tools = await asyncio.to_thread(self.chat_tools.prepare, conversation_id, choice)
        except ToolError as error:
            return f"Tools are off for this reply: {error}"
        return "; ".join(tools.box.notices) if tools is not None and tools.box.notices else None

    def visible(self, request_id: int | None, text: str) -> str:
        """Streamed text of the active reply without its tool calls' markup (all of it when it offers no tools)."""
        reply = self.active
        if reply is None or reply.tools is None or not self.owns(request_id):
            return text
        return reply.tools.text_filter.feed(text)

    def calls_ended(self, request_id: int, calls: Sequence[ToolCall]) -> str:
        """The active reply's request ended (with `calls`, when it made any): what the filter held back to show."""
        reply = self.active
        if reply is None or reply.tools is None or not self.owns(request_id):
            return ""
        return reply.tools.text_filter.finish(bool(calls))

    def wants_tool_round(self, request_id: int, calls: Sequence[ToolCall]) -> bool:
        """Whether the active reply's request ended with calls to answer (the reply goes on after a tool round)."""
        reply = self.active
        return bool(calls) and reply is not None and reply.tools is not None and self.owns(request_id)

    async def tool_round(
        self,
        calls: Sequence[ToolCall],
        ask: Ask,
        on_record: Callable[[CallRecord], Awaitable[None]],
        owner: OwnerT | None = None,
    ) -> str | None:
        """Ask about and run the active reply's calls, then send the request again with their results; None when it
        was sent, else why the reply ends here ("stopped" by Esc, or the bound on calls)."""
        reply = self.active
        assert reply is not None and reply.tools is not None
        self.router.release(reply.request_id)
        why = await reply.tools.run_round(
            calls, reply.recorder.content, ask, self.chat_tools, on_record, reply.messages
        )
        if why is not None or self.active is not reply:
            return why or "stopped"
        reply.continue_reply = False
        self.send(reply, owner)
        return None

    async def crashed(self, description: str) -> None:
        """The engine died: the active reply ends as failed (its owner, the router's default, draws the end; without
        one it is recorded here), and every side run's owner is told its run will never end."""
        owner = self.router.default
        if self.active is not None and owner is not None:
            await owner.generation_crashed(description)
        if self.active is not None:
            try:
                self.end("error", {"error": description})
            except StoreError:
                pass  # the row stays as its last checkpoint left it, marked as interrupted when the store opens next
        self.router.lost()

    # ----- side runs (nothing recorded) -----

    def run(
        self, messages: Sequence[tuple[str, str]], sampling: SamplingSettings, owner: OwnerT, **options: Any
    ) -> int:
        """Send a request whose events go to `owner` (an A/B view's side); its request id."""
        request_id = self.host.bridge.generate(messages, sampling, **options)
        self.router.register(request_id, owner)
        return request_id

    def cancel(self, request_id: int | None) -> None:
        """Stop a side run and stop routing its events."""
        if request_id is not None:
            self.host.bridge.cancel(request_id)
            self.router.release(request_id)
