"""`llmtui serve`'s request log (issue 49, 19): one line per request, as llama-server prints one (method, path,
status, tokens, time), refusals included, a health check answered 200 left out; a client's path shown harmless.
And the speculative figures say no speedup where nothing was drafted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
from starlette.testclient import TestClient

from app.cli import build_parser
from app.server.asgi import build_app
from app.server.backend import EngineBackend, ServerSettings
from app.server.metrics import Metrics
from app.server.request_log import log_line
from app.server.requests import Limits
from engine_ext.params import SamplingParams
from engine_ext.protocol import Finished, GenerationStats, SpeculativeStats
from tests.unit.test_server_http import ScriptedClient

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def logged() -> Iterator[tuple[TestClient, list[str]]]:
    lines: list[str] = []
    metrics = Metrics()
    settings = ServerSettings(model_id="tiny", sampling=SamplingParams(temperature=0.0), limits=Limits())
    backend = EngineBackend(ScriptedClient(["Hello", ",", " world"]), settings, metrics)  # type: ignore[arg-type]
    app = build_app(backend, metrics, request_log=lines.append)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        yield client, lines
    backend.close()


def test_each_request_is_one_line_with_its_status_tokens_and_time(logged: tuple[TestClient, list[str]]) -> None:
    client, lines = logged
    assert client.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
    [line] = lines
    # The scripted engine reads a 5-token prompt and writes 3 tokens.
    head, prompt, generated, took = line.split(" · ")
    assert head == "testclient POST /v1/chat/completions 200" and prompt == "prompt 5" and generated == "3 generated"
    assert took.endswith(" s") and float(took.removesuffix(" s")) >= 0

    with client.stream("POST", "/v1/chat/completions", json={"messages": USER, "stream": True}) as streamed:
        assert streamed.status_code == 200 and "[DONE]" in streamed.read().decode()
    assert lines[-1].startswith("testclient POST /v1/chat/completions 200 · prompt 5 · 3 generated · ")

    assert client.get("/health").status_code == 200 and len(lines) == 2  # a health check answered 200: left out
    assert client.post("/v1/chat/completions", json={"messages": USER, "n": 2}).status_code == 400
    assert lines[-1].startswith("testclient POST /v1/chat/completions 400 · ") and "prompt" not in lines[-1]
    refused = client.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert refused.status_code == 415 and " 415 · " in lines[-1]  # refused by the gate, logged all the same
    assert client.get("/no/such/%1b[2Jroute").status_code == 404
    assert "\x1b" not in lines[-1] and "/no/such/␛[2Jroute 404 · " in lines[-1]


def test_a_line_sums_a_requests_replies_and_names_its_drafts() -> None:
    stats = GenerationStats(20, 12, 8, 10.0, 40, 20.0, 12.0, 512, 60)
    spec = SpeculativeStats(1, 4, 20, 15, 0.75, 4.75, (0.8,), (0.75,), 1.0, 2.0, 30.0, 20.0, ())
    replies = [Finished(1, "eos", stats, speculative=spec)] * 2  # a completion of two prompts
    line = log_line("POST", "/v1/completions", "10.0.0.2", 200, replies, 1.234)
    assert line == (
        "10.0.0.2 POST /v1/completions 200 · prompt 40 (24 cached) · 80 generated · drafts 40, 30 accepted · 1.23 s"
    )
    long = log_line("GET", "/x" * 500, "-", 0, [], 0.0)  # a client's path, bounded; no answer sent: status -
    assert long.startswith("- GET /x/x") and long.endswith(" - · 0.00 s") and len(long) < 160


def test_no_speedup_is_reported_where_nothing_was_drafted() -> None:
    nothing = SpeculativeStats(1, 0, 0, 0, 0.0, 1.0, (), (), 0.0, 0.0, 19.6, 20.0, ())
    assert nothing.to_dict()["speedup"] is None
    unmeasured = SpeculativeStats(1, 4, 20, 15, 0.75, 4.75, (), (), 1.0, 2.0, 30.0, 0.0, ())
    assert unmeasured.to_dict()["speedup"] is None
    drafted = SpeculativeStats(1, 4, 20, 15, 0.75, 4.75, (), (), 1.0, 2.0, 30.0, 20.0, ())
    assert drafted.to_dict()["speedup"] == 1.5


def test_serve_writes_the_request_log_unless_told_not_to() -> None:
    parser = build_parser()
    assert not parser.parse_args(["serve"]).no_request_log
    assert parser.parse_args(["serve", "--no-request-log"]).no_request_log


def test_an_answer_whose_end_was_never_sent_is_logged_cut_off() -> None:
    """A stream its client closed (OpenCode's 300 s timeout): the line said only `200 · 300.07 s`."""
    import asyncio

    from app.server.request_log import RequestLog

    async def half(scope: object, receive: object, send: Callable[[dict[str, object]], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

    async def whole(scope: object, receive: object, send: Callable[[dict[str, object]], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def sent(message: object) -> None:
        pass

    async def nothing() -> dict[str, object]:
        return {"type": "http.disconnect"}

    lines: list[str] = []
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("127.0.0.1", 1)}
    for app in (half, whole):
        asyncio.run(RequestLog(app, lines.append)(dict(scope), nothing, sent))  # type: ignore[arg-type]
    assert lines[0].endswith("· cut off before its end (the client closed it, or the server stopped)")
    assert "cut off" not in lines[1]
