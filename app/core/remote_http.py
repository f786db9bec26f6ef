"""The HTTP side of a remote engine (an OpenAI-compatible server: llama-server, vLLM, SGLang…): its model list,
the chat request, its server-sent events and its errors, on the one HTTP client stack (models_catalog.http_client).

Why plain streaming HTTP and not the `openai` SDK: Esc must stop a reply at once, even while the server is silent
(processing a long prompt). That needs the socket shut down from the UI thread (http_client.Guard.abort), which an
SDK stream only allows between chunks. The fields llmtui reads beyond the OpenAI schema (llama-server's `timings`
with `draft_n`/`draft_n_accepted`, `reasoning_content`) are plain JSON the SDK keeps in untyped extras, and the SSE
format takes a few lines to parse. So: cancel and error handling fully under our control.

Remote engines are reached directly: HTTP(S)_PROXY is not used for them (it is for the Hub), and a redirect is an
answer, not followed.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from app.core.config import RemoteSettings, SamplingSettings
from engine_ext.settings_schema import effort_or_none
from engine_ext.untrusted_text import one_line
from models_catalog.http_client import (
    MAX_HEADER_LINE,
    MAX_HEADERS,
    Guard,
    HTTPFailure,
    HTTPResponse,
    format_size,
    iter_lines,
    json_items,
    open_response,
    read_body,
    retry_after,
)

CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 600.0  # a slow server may think this long about a long prompt before the first token
MAX_ERROR_BODY: Final = 64 * 1024
# What a server may send before llmtui stops reading and says so: a JSON answer (a model list) and one line or one
# event of a reply's stream. A hostile or broken server sending an endless body or line grew the app to 4 GB.
MAX_JSON_BODY: Final = 8 * 1024 * 1024
MAX_SSE_LINE: Final = 1024 * 1024
MAX_SSE_EVENT: Final = 4 * 1024 * 1024
# A server dripping bytes never trips a read timeout (each byte comes in time), so time is bounded too: a model
# list within 3 connect timeouts, and one stream line (which a real server writes at once) within SSE_LINE_TIME_S
# of its first byte. The exchange's Guard bounds each read by what is left of its time.
SSE_LINE_TIME_S: Final = 30.0
# Values in one JSON answer or stream event, counted before parsing (models_catalog.http_client.json_items): within
# the byte limits, "[{},{},..." would still parse into millions of objects (hundreds of MB).
MAX_JSON_ITEMS: Final = 500_000


class RemoteError(Exception):
    """Something went wrong talking to a remote engine; the message is one line a user can act on."""


@dataclass(frozen=True)
class RemoteModel:
    """A model a remote server lists at GET /v1/models."""

    id: str
    n_ctx: int = 0  # vLLM/SGLang's max_model_len, llama-server's n_ctx_train; 0 when the server does not say
    loaded: bool | None = None  # a router's (llama-server's, `llmtui serve`'s): loaded now; None: it does not say


def api_path(remote: RemoteSettings, endpoint: str) -> str:
    """The request path: the base URL's path (a bare host gets /v1, as the OpenAI SDK's base_url does) + endpoint."""
    prefix = urlsplit(remote.base_url).path.rstrip("/") or "/v1"
    return f"{prefix}/{endpoint}"


def _url(remote: RemoteSettings, endpoint: str) -> str:
    parts = urlsplit(remote.base_url)
    return f"{parts.scheme}://{parts.netloc}{api_path(remote, endpoint)}"


def _headers(remote: RemoteSettings) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "User-Agent": "llmtui",
    }
    key = remote.resolved_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def open_request(
    remote: RemoteSettings,
    method: str,
    endpoint: str,
    guard: Guard,
    *,
    body: bytes | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> HTTPResponse:
    """Send a request to the server; its answer with the body unread (HTTPFailure for no answer)."""
    return open_response(
        method,
        _url(remote, endpoint),
        guard=guard,
        headers=_headers(remote),
        content=body,
        read_timeout_s=read_timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_redirects=0,
    )


def error_detail(body: bytes) -> str:
    """The message in an OpenAI-style error body ({"error": {"message"}}, {"error": "..."}, {"detail": ...})."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return one_line(text, 200)
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str | list):
                    return one_line(str(error[key]), 200)
        if isinstance(error, str):
            return one_line(error, 200)
    return one_line(text, 200)


def http_error_message(
    remote: RemoteSettings, status: int, reason: str, body: bytes, retry_after_header: str | None = None
) -> str:
    """One line for an HTTP error answer, with what to check (the wait a 429 or 503 asks for, when it says)."""
    detail = error_detail(body)
    message = f"{remote.name} answered {status} {one_line(reason, 60)}".rstrip()
    if detail:
        message += f": {one_line(detail, 120)}"
    if status in (401, 403):
        message += f" (check the API key: {remote.masked_key()})"
    elif status == 404:
        message += " (check the base URL, which usually ends in /v1, and the model name)"
    elif status == 429 or status >= 500:
        wait = retry_after(retry_after_header)
        if wait is not None:
            message += f"; retry after {wait:.0f} s"
        elif status == 429:
            message += "; try again later"
    return one_line(message)


def failure_message(remote: RemoteSettings, failure: HTTPFailure) -> str:
    """One line for an exchange that got no usable answer."""
    where = f"{remote.name} at {remote.base_url}"
    error = failure.os_error
    if failure.kind == "header-line":
        return one_line(
            f"{where} sent a response header line longer than {MAX_HEADER_LINE // 1024} KiB; llmtui "
            "stopped reading (is it an OpenAI-compatible server?)"
        )
    if failure.kind == "header-count":
        return one_line(
            f"{where} sent more than {MAX_HEADERS} response headers; llmtui stopped reading (is it an "
            "OpenAI-compatible server?)"
        )
    if failure.kind == "protocol":
        return one_line(f"{where} did not answer with HTTP ({failure.detail[:80]}); is it an OpenAI-compatible server?")
    if isinstance(error, ConnectionRefusedError):
        return f"cannot connect to {where}: connection refused (is the server running?)"
    if failure.kind in ("stall", "deadline"):
        return f"{where} did not answer in time"
    if isinstance(error, ssl.SSLError):
        return one_line(f"TLS error talking to {where}: {error.reason or error}")
    if isinstance(error, socket.gaierror):
        return f"cannot find the host of {where}: {error.strerror or error}"
    return one_line(f"cannot reach {where}: {error or failure}")


def too_slow(remote: RemoteSettings, what: str, seconds: float) -> RemoteError:
    return RemoteError(f"{remote.name} took longer than the {seconds:g} s limit to send {what}; llmtui stopped reading")


def read_error(remote: RemoteSettings, response: HTTPResponse) -> RemoteError:
    """The error an answer other than 200 stands for, its body read (in part) for the server's message."""
    try:
        detail, _, _ = read_body(response, MAX_ERROR_BODY)
    except HTTPFailure:
        detail = b""
    return RemoteError(
        http_error_message(remote, response.status, response.reason, detail, response.header("Retry-After"))
    )


def _get_json(remote: RemoteSettings, endpoint: str, timeout: float) -> Any:
    path = api_path(remote, endpoint)
    what = f"{remote.name}'s answer to GET {path}"
    limit_s = 3 * timeout
    guard = Guard(limit_s)
    try:
        response = open_request(remote, "GET", endpoint, guard, connect_timeout_s=timeout, read_timeout_s=timeout)
        try:
            if response.status != 200:
                raise read_error(remote, response)
            body, more, short = read_body(response, MAX_JSON_BODY)
        finally:
            response.close()
    except HTTPFailure as failure:
        if failure.kind == "deadline":
            raise too_slow(remote, f"its answer to GET {path}", limit_s) from None
        raise RemoteError(failure_message(remote, failure)) from None
    if more:
        raise RemoteError(
            f"{what} passed {format_size(MAX_JSON_BODY)}; llmtui stopped reading (is it an OpenAI-compatible server?)"
        )
    if short is not None:
        announced = response.header("Content-Length") or "?"
        raise RemoteError(
            one_line(
                f"{what} ended after {len(body)} bytes, short of the Content-Length ({announced[:20]}) it "
                "announced (the server closed the connection)"
            )
        )
    if json_items(body) > MAX_JSON_ITEMS:
        raise RemoteError(
            f"{what} holds more than {MAX_JSON_ITEMS:,} JSON values; llmtui stopped before reading "
            "them (is it an OpenAI-compatible server?)"
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:
        raise RemoteError(
            f"{remote.name} did not answer GET {path} with JSON; is it an OpenAI-compatible server?"
        ) from error


def list_models(remote: RemoteSettings, timeout: float = CONNECT_TIMEOUT_S) -> list[RemoteModel]:
    """The models the server offers (GET /v1/models); RemoteError says why not."""
    data = _get_json(remote, "models", timeout)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise RemoteError(
            f"{remote.name} did not answer GET {api_path(remote, 'models')} with a model list; "
            "is it an OpenAI-compatible server?"
        )
    models = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        meta = item.get("meta")
        n_ctx = item.get("max_model_len") or (meta.get("n_ctx_train") if isinstance(meta, dict) else 0) or 0
        status = item.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        models.append(
            RemoteModel(
                item["id"],
                n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else 0,
                value == "loaded" if isinstance(value, str) else None,
            )
        )
    return models


def request_body(
    model: str, messages: Sequence[tuple[str, str]], sampling: SamplingSettings, continue_reply: bool
) -> dict[str, Any]:
    """The streamed /v1/chat/completions request for a conversation and its sampling settings."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": role, "content": content} for role, content in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    # Extensions llama-server, vLLM and SGLang accept (OpenAI itself would refuse them).
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.min_p > 0:
        body["min_p"] = sampling.min_p
    if sampling.repeat_penalty != 1.0:
        body["repeat_penalty"] = body["repetition_penalty"] = sampling.repeat_penalty
    if sampling.max_tokens > 0:
        body["max_tokens"] = sampling.max_tokens
    if sampling.seed >= 0:
        body["seed"] = sampling.seed
    if sampling.reasoning_budget >= 0:
        body["thinking_budget_tokens"] = sampling.reasoning_budget  # llama-server's name for --reasoning-budget
    effort = effort_or_none(sampling.reasoning_effort)
    if effort is not None:
        body["reasoning_effort"] = effort
    if continue_reply:
        # The last message is the stopped reply: llama-server continues a trailing assistant message by itself;
        # vLLM and SGLang need to be told.
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return body


def sse_events(
    chunks: Iterator[bytes],
    name: str = "the server",
    line_time_s: float = SSE_LINE_TIME_S,
    on_idle: Callable[[], None] | None = None,
) -> Iterator[str]:
    """The `data` of each server-sent event in a body's chunks, as text ("[DONE]" included); ends at the end of
    the stream. A line longer than MAX_SSE_LINE (or slower than `line_time_s`) or an event longer than
    MAX_SSE_EVENT is a RemoteError, not read to its end. `on_idle` is called for every line that brings no event
    data (a keep-alive comment, a blank line, another field); it may raise to stop a stream that brings nothing."""
    data: list[str] = []
    size = 0
    for raw in _lines(chunks, name, line_time_s):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data, size = [], 0
            elif on_idle is not None:
                on_idle()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(line)
            if size > MAX_SSE_EVENT:
                raise RemoteError(
                    f"{name} sent a stream event longer than {MAX_SSE_EVENT // (1024 * 1024)} MiB; "
                    "llmtui stopped reading"
                )
        elif on_idle is not None:  # other fields (event:, id:, retry:) and comments (":" keep-alives)
            on_idle()
    if data:
        yield "\n".join(data)


def _lines(chunks: Iterator[bytes], name: str, line_time_s: float) -> Iterator[bytes]:
    try:
        yield from iter_lines(chunks, MAX_SSE_LINE, line_time_s)
    except HTTPFailure as failure:
        if failure.kind == "line":
            raise RemoteError(
                f"{name} sent a stream line longer than {MAX_SSE_LINE // 1024} KiB; llmtui stopped reading"
            ) from None
        if failure.kind == "slow-line":
            raise RemoteError(
                f"{name} took longer than {line_time_s:g} s to send one stream line (a slow drip); "
                "llmtui stopped reading"
            ) from None
        raise
