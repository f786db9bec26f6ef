"""The HTTP surface: a Starlette app with llama-server's routes, OpenAI's shapes, the gate (Host, Origin, JSON bodies:
`gate.py`), the API key, body limits, CORS only when asked, SSE streaming, and a client's disconnect cancelling its
generation.

Every error a request can cause is an OpenAI-shaped JSON answer with its status; the server goes on.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from app.core.server_access import Access
from app.server import anthropic, responses
from app.server.api_errors import ApiError
from app.server.backend import ServedModel, ServerSettings, Ticket
from app.server.blocks import BlockShaper
from app.server.embeddings import embeddings_answer, parse_embeddings, parse_rerank, refused_off, rerank_answer
from app.server.gate import RequestGate
from app.server.metrics import Metrics
from app.server.openai_responses import ResponseShaper, ResponseStore, parse_response_request
from app.server.request_log import RequestLog, note_finished
from app.server.requests import Job, parse_body, parse_chat, parse_completion, slot_filename, slot_id
from engine_ext.protocol import Embed, Embedded, Finished, SlotDone, TokenChunk
from engine_ext.tool_calls import CallTextFilter
from engine_ext.untrusted_text import one_line

_DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks whether its client is still there
# A streamed request whose first event (its prompt read) has not come this long after it was submitted opens its
# stream and sends a keep-alive every _KEEPALIVE_S: agents end a request after minutes of silence (Claude Code: 5)
# and send it again, and a long prompt on a CPU takes that. Errors from then on are the stream's last event.
_SILENT_START_S = 5.0
_KEEPALIVE_S = 10.0
_RETRY_AFTER_S = 2
_PUBLIC = frozenset({"/health"})


class Backend(Protocol):
    """What the HTTP side needs from whatever runs the jobs (the CLI's dispatcher, the app's controller)."""

    settings: ServerSettings

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket: ...

    def settings_for(self, model: str | None) -> ServerSettings: ...

    def served(self) -> tuple[ServedModel, ...]: ...

    def unload(self, model: str) -> None: ...


def json_error(error: ApiError, shape: Callable[[ApiError], dict[str, object]] | None = None) -> JSONResponse:
    """The error as JSON: in `shape` (Anthropic's routes), else the error's own body (OpenAI's, or llama-server's for
    a prompt longer than the context)."""
    headers = {"Retry-After": str(_RETRY_AFTER_S)} if error.status == 503 else None
    return JSONResponse(error.body() if shape is None else shape(error), status_code=error.status, headers=headers)


@dataclass
class ServerState:
    """What every handler reads (the Starlette app's `state.llmtui`): the dispatcher, the counters, the API key, when
    the server started, and the stored answers of /v1/responses."""

    backend: Backend
    metrics: Metrics
    key: bytes | None
    started: int = field(default_factory=lambda: int(time.time()))
    response_store: ResponseStore = field(default_factory=ResponseStore)


def server_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.llmtui
    return state


Handler = Callable[[Request], Awaitable[Response]]
ErrorShape = Callable[[ApiError], dict[str, object]]


def authorised(request: Request) -> bool:
    key = server_of(request).key
    if key is None or request.url.path in _PUBLIC:
        return True
    given = request.headers.get("authorization", "")
    token = given[7:] if given[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    return hmac.compare_digest(token.encode(errors="replace"), key)


def guarded(handler: Handler, shape: ErrorShape | None = None) -> Handler:
    """`handler` behind the API key, its ApiErrors answered as JSON (in `shape`, else their own body)."""

    async def endpoint(request: Request) -> Response:
        if not authorised(request):
            server_of(request).metrics.refused()
            return json_error(ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)"), shape)
        try:
            return await handler(request)
        except ApiError as e:
            server_of(request).metrics.refused()
            return json_error(e, shape)

    return endpoint


async def read_body(request: Request) -> bytes:
    limit = server_of(request).backend.settings.limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ApiError(413, f"the request body is larger than this server's limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is larger than this server's limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(499, "the client went away before its request body ended") from None
    return b"".join(chunks)


async def next_event(request: Request, ticket: Ticket, within: float | None = None) -> object:
    """The ticket's next event; a client that went away cancels the generation (ApiError 499); None when `within`
    seconds passed without one."""
    events = ticket.events
    deadline = None if within is None else time.monotonic() + within
    while True:
        try:
            event = await asyncio.wait_for(events.get(), _DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                ticket.cancel()
                return ApiError(499, "the client went away")
            if deadline is not None and time.monotonic() >= deadline:
                return None
            continue
        if isinstance(event, Finished):
            note_finished(request.scope, event)  # its tokens, for the request log
        return event


async def first_event(request: Request, ticket: Ticket, within: float | None = None) -> object:
    """The ticket's first event (its error raised), None when `within` seconds passed without it; the generation
    cancelled if waiting for it fails."""
    try:
        first = await next_event(request, ticket, within)
    except BaseException:
        ticket.cancel()
        raise
    if isinstance(first, ApiError):
        raise first
    return first


def event_stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


# ----- llama-server's and OpenAI's routes -----------------------------------------------------------------------


async def health(request: Request) -> Response:
    return JSONResponse(server_of(request).metrics.health())


def model_card(request: Request, model: ServedModel) -> dict[str, object]:
    """A model as OpenAI lists it, with llama-server's router fields (its aliases and status: loaded or not) and
    Anthropic's (`type`, `display_name`, `created_at`): one card both APIs' clients read."""
    status: dict[str, object] = {"value": model.status}
    if model.status == "loading":
        status["progress"] = round(model.progress, 3)
    if model.error:
        status.update(failed=True, error=model.error)
    if model.pinned:
        status["pinned"] = True
    started = server_of(request).started
    card: dict[str, object] = {"id": model.id, "object": "model", "created": started, "owned_by": "llmtui"}
    if model.n_ctx:
        card["max_model_len"] = model.n_ctx  # vLLM's name for the served context; clients size their history by it
    created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    anthropics = {"type": "model", "display_name": model.id, "created_at": created_at}
    return {**card, **anthropics, "aliases": list(model.aliases), "status": status}


async def models(request: Request) -> Response:
    """OpenAI's list of models, with Anthropic's paging fields (every model on one page)."""
    cards = [model_card(request, model) for model in server_of(request).backend.served()]
    first, last = (cards[0]["id"], cards[-1]["id"]) if cards else (None, None)
    return JSONResponse({"object": "list", "data": cards, "has_more": False, "first_id": first, "last_id": last})


async def one_model(request: Request) -> Response:
    """OpenAI's model retrieval: a served model by its id or an alias (a 404 in OpenAI's shape for any other)."""
    name = request.path_params["model_id"]
    for model in server_of(request).backend.served():
        if name == model.id or name in model.aliases:
            return JSONResponse(model_card(request, model))
    raise ApiError(404, f"the model {one_line(name, 80)!r} does not exist here", "model", "model_not_found")


async def unload_model(request: Request) -> Response:
    """llama-server's router's POST /models/unload {"model": NAME}: the model's worker ends, its memory freed."""
    name = parse_body(await read_body(request)).get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model must name a model (GET /v1/models lists them)", "model")
    server_of(request).backend.unload(name)
    return JSONResponse({"success": True})


def settings_for(request: Request, body: dict[str, object]) -> ServerSettings:
    """The settings of the model the request names (`model`; a server of one model: its own)."""
    name = body.get("model")
    return server_of(request).backend.settings_for(name if isinstance(name, str) else None)


async def metrics_text(request: Request) -> Response:
    s = server_of(request)
    return PlainTextResponse(
        s.metrics.render(),
        media_type="text/plain; version=0.0.4",
        headers={"Process-Start-Time-Unix": str(s.started)},  # as llama-server sends it
    )


async def chat(request: Request) -> Response:
    s = server_of(request)
    body = parse_body(await read_body(request))
    s.metrics.request()
    settings = settings_for(request, body)
    return await run(request, parse_chat(body, settings.sampling, settings.limits, settings.model_id))


async def completions(request: Request) -> Response:
    s = server_of(request)
    body = parse_body(await read_body(request))
    s.metrics.request()
    settings = settings_for(request, body)
    job = parse_completion(body, settings.sampling, settings.limits, settings.model_id)
    if len(job.prompts) < 2:
        return await run(request, job)
    # A list of prompts: one choice each, run one after another.
    jobs = [replace(job, prompt=prompt, prompts=(prompt,)) for prompt in job.prompts]
    if job.stream:
        return event_stream(stream_prompts(request, jobs))
    replies = [await collected(request, one, *await submitted(request, one)) for one in jobs]
    return JSONResponse(responses.text_completions(replies, settings.model_id, job.return_provenance))


def new_reply(request: Request, job: Job) -> responses.Reply:
    return responses.Reply(
        calls_hidden=CallTextFilter() if job.tools and job.tool_choice != "none" else None,
        fingerprint=responses.system_fingerprint(server_of(request).backend.settings_for(job.model).model_path),
    )


async def submitted(request: Request, job: Job, within: float | None = None) -> tuple[Ticket, object]:
    """`job` submitted, and its first event (an ApiError raised: nothing was answered yet; None when `within`
    seconds passed without it); the client that sent it is the one talking now (the app's stats bar names it)."""
    s = server_of(request)
    s.metrics.client(request.headers.get("user-agent"))
    ticket = s.backend.submit(job, asyncio.get_running_loop())
    return ticket, await first_event(request, ticket, within)


async def run(request: Request, job: Job) -> Response:
    ticket, first = await submitted(request, job, _SILENT_START_S if job.stream else None)
    if job.stream:
        return event_stream(stream(request, ticket, job, new_reply(request, job), first))
    reply = await collected(request, job, ticket, first)
    shape = responses.chat_completion if job.endpoint == "chat" else responses.text_completion
    return JSONResponse(shape(reply, job.model, job.return_provenance))


async def collected(request: Request, job: Job, ticket: Ticket, first: object) -> responses.Reply:
    """The whole reply of a request that does not stream."""
    reply = new_reply(request, job)
    try:
        event: object = first
        while True:
            if isinstance(event, ApiError):
                raise event
            if isinstance(event, TokenChunk):
                reply.text.append(reply.visible(event.text))
                if event.reasoning:
                    reply.reasoning.append(event.reasoning)
                reply.provenance.extend(event.provenance)
            elif isinstance(event, Finished):
                reply.text.append(reply.rest(event))
                reply.finished = event
                break
            event = await next_event(request, ticket)
    finally:
        ticket.cancel()  # a no-op once finished; stops the generation when the client left
    if job.echo:
        reply.text.insert(0, job.prompt or "")
    return reply


async def stream_prompts(request: Request, jobs: list[Job]) -> AsyncIterator[bytes]:
    """Several prompts' completions streamed one after another, each chunk with its choice's index."""
    for index, job in enumerate(jobs):
        try:
            ticket, first = await submitted(request, job)
        except ApiError as e:
            yield responses.sse(e.body())
            return
        last = index == len(jobs) - 1
        async for chunk in stream(request, ticket, job, new_reply(request, job), first, index=index, done=last):
            yield chunk


async def stream(
    request: Request,
    ticket: Ticket,
    job: Job,
    reply: responses.Reply,
    first: object,
    *,
    index: int = 0,
    done: bool = True,
) -> AsyncIterator[bytes]:
    """The request's events as SSE chunks (`index`: its choice; `done`: the stream ends with it)."""
    model = job.model
    chat_endpoint = job.endpoint == "chat"
    try:
        if chat_endpoint:
            # The role first, its content null (as llama-server: a content delta is never empty)
            yield responses.sse(responses.chat_chunk(reply, model, {"role": "assistant", "content": None}))
        elif job.echo:
            yield responses.sse(responses.text_chunk(reply, model, job.prompt or "", index=index))
        event = first
        while event is None:  # the prompt is still read (run's _SILENT_START_S)
            yield responses.KEEPALIVE
            event = await next_event(request, ticket, _KEEPALIVE_S)
        while True:
            if isinstance(event, ApiError):
                yield responses.sse(event.body())
                return
            if isinstance(event, TokenChunk):
                extra: dict[str, object] | None = (
                    {"provenance": list(event.provenance)} if job.return_provenance else None
                )
                if chat_endpoint:
                    if event.reasoning:
                        delta: dict[str, object] = {"reasoning_content": event.reasoning}
                        yield responses.sse(responses.chat_chunk(reply, model, delta, extra=extra))
                        extra = None
                    text = reply.visible(event.text)
                    if text or extra:
                        yield responses.sse(responses.chat_chunk(reply, model, {"content": text}, extra=extra))
                elif event.text:
                    yield responses.sse(responses.text_chunk(reply, model, event.text, index=index))
            elif isinstance(event, Finished):
                for chunk in final_chunks(job, reply, model, event, index):
                    yield responses.sse(chunk)
                if done:
                    yield responses.sse("[DONE]")
                return
            event = await next_event(request, ticket)
    finally:
        ticket.cancel()


def final_chunks(
    job: Job, reply: responses.Reply, model: str, event: Finished, index: int = 0
) -> list[dict[str, object]]:
    """A streamed reply's last chunks: its tool calls, the finish reason with the timings, the usage if asked."""
    chat_endpoint = job.endpoint == "chat"
    finish = responses.reply_finish_reason(event)
    chunks = (
        [responses.chat_chunk(reply, model, d) for d in responses.tool_deltas(reply, event)] if chat_endpoint else []
    )
    last = (
        responses.chat_chunk(reply, model, {}, finish)
        if chat_endpoint
        else responses.text_chunk(reply, model, "", finish, index=index)
    )
    last["timings"] = responses.timings(event)
    chunks.append(last)
    if job.include_usage:
        usage_chunk = responses.chat_chunk(reply, model, {}) if chat_endpoint else dict(last)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = responses.usage(event)
        usage_chunk["timings"] = last["timings"]  # llama-server's usage chunk carries them too
        chunks.append(usage_chunk)
    return chunks


# ----- Anthropic's Messages and OpenAI's Responses: answers made of blocks (app/server/blocks.py) -----------------


async def anthropic_messages(request: Request) -> Response:
    s = server_of(request)
    body = parse_body(await read_body(request))
    s.metrics.request()
    settings = settings_for(request, body)
    job = anthropic.parse_messages(body, settings.sampling, settings.limits, settings.model_id)
    return await shaped(request, job, anthropic.MessageShaper(job, settings.model_id))


async def anthropic_count(request: Request) -> Response:
    body = parse_body(await read_body(request))
    settings = settings_for(request, body)
    job = anthropic.parse_messages(body, settings.sampling, settings.limits, settings.model_id, count_only=True)
    return await shaped(request, job, anthropic.CountShaper(job, settings.model_id))


async def openai_response(request: Request) -> Response:
    s = server_of(request)
    body = parse_body(await read_body(request))
    s.metrics.request()
    settings, store = settings_for(request, body), s.response_store
    job, conversation = parse_response_request(body, settings.sampling, settings.limits, settings.model_id, store)
    return await shaped(request, job, ResponseShaper(job, settings.model_id, body, conversation, store))


async def shaped(request: Request, job: Job, shaper: BlockShaper) -> Response:
    """Run `job` and answer with `shaper`'s object, or stream its events."""
    ticket, first = await submitted(request, job, _SILENT_START_S if job.stream else None)
    if job.stream:
        return event_stream(shaped_stream(request, ticket, shaper, first))
    try:
        event = first
        while not isinstance(event, Finished):
            if isinstance(event, ApiError):
                raise event
            shaper.feed(event)
            event = await next_event(request, ticket)
        shaper.feed(event)
    finally:
        ticket.cancel()
    return JSONResponse(shaper.answer())


async def shaped_stream(request: Request, ticket: Ticket, shaper: BlockShaper, first: object) -> AsyncIterator[bytes]:
    try:
        event = first
        if event is None:  # the prompt is still read (_SILENT_START_S)
            yield shaper.opened_early()
            while event is None:
                event = await next_event(request, ticket, _KEEPALIVE_S)
                if event is None:
                    yield shaper.keepalive()
        while True:
            if isinstance(event, ApiError):
                yield shaper.error(event)
                return
            for chunk in shaper.feed(event):
                yield chunk
            if isinstance(event, Finished):
                return
            event = await next_event(request, ticket)
    finally:
        ticket.cancel()


async def slots(request: Request) -> Response:
    """llama-server's `POST /slots/{id}?action=save|restore|erase` on sequence `id` (`serve --slot-save-path DIR`, any
    --parallel N; an action on a sequence that is answering waits for its reply to end); files in the prompt cache's
    format, checked whole before the engine reads them."""
    backend = server_of(request).backend
    action = request.query_params.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise ApiError(400, "action must be save, restore or erase", "action")
    folder = backend.settings.slot_save_path
    if not folder:
        raise ApiError(501, "this server does not support slot actions: start it with --slot-save-path DIR")
    settings = backend.settings
    id_slot = slot_id(request.path_params.get("id_slot", ""), settings.slots)
    filename = "" if action == "erase" else slot_filename(parse_body(await read_body(request)))
    path = str(Path(folder) / filename) if filename else ""
    job = Job("completion", settings.model_id, settings.sampling, slot=(action, path, id_slot))  # type: ignore[arg-type]
    ticket = backend.submit(job, asyncio.get_running_loop())
    done = await next_event(request, ticket)
    if isinstance(done, ApiError):
        raise done
    assert isinstance(done, SlotDone)
    if action == "erase":
        return JSONResponse({"id_slot": id_slot, "n_erased": done.n_tokens})
    counts = (
        {"n_saved": done.n_tokens, "n_written": done.n_bytes}
        if action == "save"
        else {"n_restored": done.n_tokens, "n_read": done.n_bytes}
    )
    timings = {f"{action}_ms": done.ms}
    return JSONResponse({"id_slot": id_slot, "filename": filename, **counts, "timings": timings})


async def pooled(request: Request, settings: ServerSettings, embed: Embed) -> Embedded:
    """The engine's answer to `embed` on the settings' model, run in turn with the replies; its refusal raised as an
    ApiError."""
    job = Job("completion", settings.model_id, settings.sampling, embed=embed)
    done = await next_event(request, server_of(request).backend.submit(job, asyncio.get_running_loop()))
    if isinstance(done, ApiError):
        raise done
    assert isinstance(done, Embedded)
    return done


async def embeddings(request: Request) -> Response:
    """OpenAI's `POST /v1/embeddings` (float or base64), with `serve --embeddings` or an embedding model (the model
    the request names, when the server serves several)."""
    body = parse_body(await read_body(request))
    settings = settings_for(request, body)
    if settings.embeddings != "embed":
        raise refused_off("embeddings")
    embed, fmt = parse_embeddings(body, settings.limits)
    return JSONResponse(embeddings_answer(await pooled(request, settings, embed), settings.model_id, fmt))


async def rerank(request: Request) -> Response:
    """llama-server's `POST /v1/rerank` (query, documents, top_n): relevance scores, best first, from a reranker (the
    model the request names, when the server serves several)."""
    body = parse_body(await read_body(request))
    settings = settings_for(request, body)
    if settings.embeddings != "rank":
        raise refused_off("rerank (it needs a reranker model)")
    embed, top_n, return_text = parse_rerank(body, settings.limits)
    done = await pooled(request, settings, embed)
    return JSONResponse(rerank_answer(done, embed, settings.model_id, top_n, return_text))


async def not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = {404: f"no route {request.url.path[:100]}", 405: "method not allowed"}.get(status, "server error")
    return json_error(ApiError(status, message))


# ----- the route table: one line per route (method, path, handler, the shape of its errors: None for OpenAI's) -----

ROUTES: Final[tuple[tuple[str, str, Handler, ErrorShape | None], ...]] = (
    ("GET", "/health", health, None),
    ("GET", "/v1/health", health, None),
    ("GET", "/v1/models", models, None),
    ("GET", "/models", models, None),
    ("GET", "/v1/models/{model_id:path}", one_model, None),
    ("GET", "/models/{model_id:path}", one_model, None),
    ("GET", "/metrics", metrics_text, None),
    ("POST", "/v1/chat/completions", chat, None),
    ("POST", "/chat/completions", chat, None),
    ("POST", "/v1/completions", completions, None),
    ("POST", "/completions", completions, None),
    ("POST", "/v1/messages", anthropic_messages, anthropic.error_body),
    ("POST", "/v1/messages/count_tokens", anthropic_count, anthropic.error_body),
    ("POST", "/v1/responses", openai_response, None),
    ("POST", "/responses", openai_response, None),
    ("POST", "/slots/{id_slot}", slots, None),
    ("POST", "/models/unload", unload_model, None),
    ("POST", "/v1/embeddings", embeddings, None),
    ("POST", "/v1/rerank", rerank, None),
    ("POST", "/rerank", rerank, None),
)


def build_app(
    backend: Backend,
    metrics: Metrics,
    *,
    api_key: str | None = None,
    access: Access | None = None,
    request_log: Callable[[str], None] | None = None,
) -> Starlette:
    """The Starlette app: ROUTES behind the gate (and CORS when asked), its state what the handlers read;
    `request_log` takes one line per request (`llmtui serve`'s stderr), refusals of the gate included."""
    access = access or Access()
    routes = [Route(path, guarded(handler, shape), methods=[method]) for method, path, handler, shape in ROUTES]
    middleware = [Middleware(RequestGate, access=access, refused=metrics.refused)]
    if request_log is not None:
        middleware.insert(0, Middleware(RequestLog, write=request_log))
    if access.cors:  # preflights and CORS headers for the origins the gate lets through
        middleware.append(
            Middleware(CORSMiddleware, allow_origins=list(access.origins), allow_methods=["*"], allow_headers=["*"])
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: not_found, 404: not_found, 405: not_found},
    )
    app.state.llmtui = ServerState(backend, metrics, api_key.encode() if api_key else None)
    return app
