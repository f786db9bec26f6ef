"""`llmtui serve` without -m (app/server/model_router.py) over scripted engines: listing, load on demand, requests
waiting for a load while other models answer, LRU at --models-max, idle unload, pinning, the memory check, a failing
load isolated, POST /models/unload. Real workers on tiny models: tests/engine/test_serve_router.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.server.api_errors import ApiError
from app.server.asgi import build_app
from app.server.backend import EngineBackend, ServerSettings
from app.server.metrics import Metrics
from app.server.model_router import ModelRouter, RoutedModel, RouterLimits, StartedModel
from app.server.requests import Job
from models_catalog.fit import GIB, MachineMemory
from tests.unit.test_server_http import ScriptedClient
from tests.waits import wait_for

HI = [{"role": "user", "content": "hi"}]


@dataclass
class FakeStarter:
    """Starts a scripted engine per model; a model in `failing` raises, one in `gated` waits for its gate."""

    words: dict[str, list[str]] = field(default_factory=dict)
    failing: dict[str, Exception] = field(default_factory=dict)
    gated: dict[str, threading.Event] = field(default_factory=dict)
    engines: dict[str, ScriptedClient] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    needs: dict[str, int] = field(default_factory=dict)  # a model's need at the context it loads with
    together: threading.Barrier | None = None  # loads that reach their room check together

    def settings(self, model: RoutedModel) -> ServerSettings:
        return ServerSettings(model_id=model.id, model_path=str(model.path), queue=4)

    def check(self, model: RoutedModel) -> int | None:
        if self.together is not None:
            self.together.wait(10)
        return self.needs.get(model.id)

    def job(self, model: RoutedModel, job: Job) -> Job:
        return job

    def start(self, model: RoutedModel, metrics: Metrics, progress: Callable[[float], None]) -> StartedModel:
        progress(0.5)
        gate = self.gated.get(model.id)
        if gate is not None:
            assert gate.wait(30), "the test never opened the gate"
        if model.id in self.failing:
            raise self.failing[model.id]
        engine = self.engines[model.id] = ScriptedClient(self.words.get(model.id, [model.id, "!"]))
        backend = EngineBackend(engine, self.settings(model), metrics)  # type: ignore[arg-type]
        self.started.append(model.id)

        def close() -> None:
            backend.stop()
            backend.close()
            self.closed.append(model.id)

        return StartedModel(backend, close)


MODELS = (
    RoutedModel("a", Path("/models/a.gguf"), ("a.gguf",), need_bytes=5 * GIB),
    RoutedModel("b", Path("/models/b.gguf"), ("b.gguf",), need_bytes=5 * GIB),
    RoutedModel("huge", Path("/models/huge.gguf"), need_bytes=20 * GIB),
)


@contextmanager
def routed(
    starter: FakeStarter, limits: RouterLimits | None = None, models: tuple[RoutedModel, ...] = MODELS
) -> Iterator[tuple[TestClient, ModelRouter]]:
    metrics = Metrics()
    router = ModelRouter(models, ServerSettings(model_id="", queue=4), metrics, starter, limits or RouterLimits())
    with TestClient(build_app(router, metrics), base_url="http://127.0.0.1:8080") as client:
        yield client, router
    router.stop()
    router.close()


def ask(client: TestClient, model: str, results: list[Any] | None = None) -> Any:
    answer = client.post("/v1/chat/completions", json={"model": model, "messages": HI})
    if results is not None:
        results.append(answer)
    return answer


def status(client: TestClient) -> dict[str, dict[str, Any]]:
    return {card["id"]: card["status"] for card in client.get("/v1/models").json()["data"]}


def in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def one_line_error(answer: Any, code: int, words: str) -> None:
    assert answer.status_code == code, answer.text
    message = answer.json()["error"]["message"]
    assert words in message and "\n" not in message and len(message) <= 300, message


def test_every_model_is_listed_and_loads_on_the_first_request_that_names_it() -> None:
    starter = FakeStarter()
    with routed(starter) as (client, _):
        cards = client.get("/v1/models").json()["data"]
        assert [(c["id"], c["aliases"], c["status"]) for c in cards] == [
            ("a", ["a.gguf"], {"value": "unloaded"}),
            ("b", ["b.gguf"], {"value": "unloaded"}),
            ("huge", [], {"value": "unloaded"}),
        ]
        answer = ask(client, "b.gguf")  # by its alias
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "b" and answer.json()["choices"][0]["message"]["content"] == "b!"
        assert starter.started == ["b"] and status(client)["b"] == {"value": "loaded"}
        assert client.get("/v1/models/b.gguf").json()["id"] == "b"
        listing = client.get("/v1/models").json()  # Anthropic's fields too: its clients list models on this route
        assert (listing["has_more"], listing["first_id"], listing["last_id"]) == (False, "a", "huge")
        card = client.get("/v1/models/b").json()
        assert (card["type"], card["display_name"]) == ("model", "b") and card["created_at"].endswith("Z")
        streamed = client.post("/v1/chat/completions", json={"model": "b", "messages": HI, "stream": True})
        assert '"model":"b"' in streamed.text and streamed.text.rstrip().endswith("[DONE]")
        one_line_error(ask(client, "gpt-5"), 404, "the model 'gpt-5' does not exist here")
        nameless = client.post("/v1/chat/completions", json={"messages": HI})
        one_line_error(nameless, 400, "model is required")
        assert starter.started == ["b"]


def test_requests_wait_for_their_models_load_while_other_models_answer() -> None:
    gate = threading.Event()
    starter = FakeStarter(gated={"b": gate})
    with routed(starter) as (client, _):
        assert ask(client, "a").status_code == 200
        waiting: list[Any] = []
        thread = in_thread(lambda: ask(client, "b", waiting))
        wait_for(lambda: status(client)["b"].get("progress") == 0.5, "b to be half loaded")
        assert client.get("/health").json()["models_loading"] == {"b": 0.5}
        assert 'llmtui_model_load_progress{model="b"} 0.5' in client.get("/metrics").text
        assert client.get("/v1/models/b").json()["status"] == {"value": "loading", "progress": 0.5}
        assert ask(client, "a").status_code == 200 and not waiting  # a answers while b loads
        gate.set()
        thread.join(30)
        assert waiting[0].status_code == 200 and waiting[0].json()["model"] == "b"
        assert "models_loading" not in client.get("/health").json()
        assert "llmtui_model_load_progress" not in client.get("/metrics").text


def test_past_models_max_the_least_recently_used_idle_model_unloads_never_a_busy_one() -> None:
    starter = FakeStarter(words={"a": ["w"] * 60})
    with routed(starter, RouterLimits(models_max=1)) as (client, _):
        assert ask(client, "b").status_code == 200
        assert ask(client, "a").status_code == 200  # b was idle: unloaded for a
        assert starter.closed == ["b"] and status(client)["b"] == {"value": "unloaded"}
        starter.engines["a"].step_s = 0.02  # a 1.2-second reply
        results: list[Any] = []
        long_reply = in_thread(lambda: ask(client, "a", results))
        wait_for(lambda: starter.engines["a"].sent and not results, "a's long reply to start")
        second = in_thread(lambda: ask(client, "b", results))
        long_reply.join(30)
        assert starter.closed == ["b"], "a was unloaded while it answered"
        second.join(30)
        assert [r.json()["model"] for r in results] == ["a", "b"]
        assert starter.closed == ["b", "a"] and starter.started == ["b", "a", "b"]


def test_two_cold_models_asked_for_together_at_models_max_1_both_answer() -> None:
    """Each load counted the other, still waiting for room, as holding it: both waited the whole room wait, then one
    was refused (60 s, then a 503)."""
    starter = FakeStarter(together=threading.Barrier(2))
    with routed(starter, RouterLimits(models_max=1, room_wait_s=20)) as (client, _):
        results: list[Any] = []
        started = time.monotonic()
        asks = [in_thread(lambda model=model: ask(client, model, results)) for model in ("a", "b")]
        for thread in asks:
            thread.join(30)
        assert sorted(r.status_code for r in results) == [200, 200], [r.text for r in results]
        assert time.monotonic() - started < 15, "the loads waited for each other"
        assert len(starter.started) == 2 and starter.closed == starter.started[:1]  # the first unloaded for the second


def test_idle_models_unload_and_a_pinned_one_stays() -> None:
    models = (replace(MODELS[0], pinned=True), MODELS[1])
    starter = FakeStarter()
    with routed(starter, RouterLimits(idle_unload_s=0.3), models) as (client, _):
        assert ask(client, "a").status_code == 200 and ask(client, "b").status_code == 200
        wait_for(lambda: starter.closed == ["b"], "b to unload after 0.3 s idle", timeout_s=10)
        assert status(client) == {"a": {"value": "loaded", "pinned": True}, "b": {"value": "unloaded"}}
        assert ask(client, "b").status_code == 200  # loads again on demand


def test_a_load_is_checked_against_memory_and_idle_models_make_room() -> None:
    starter = FakeStarter()
    memory = MachineMemory(ram_total=11 * GIB, ram_available=11 * GIB)  # 9.9 GB usable: one 5 GB model at a time
    with routed(starter, RouterLimits(memory=memory)) as (client, _):
        assert ask(client, "a").status_code == 200
        assert ask(client, "b").status_code == 200
        assert starter.closed == ["a"]  # not for the count (4), for memory
        one_line_error(ask(client, "huge"), 400, "huge needs 20.00 GiB: too big for this machine (RAM 11.00 GiB)")
        assert starter.closed == ["a"] and status(client)["b"] == {"value": "loaded"}
        assert status(client)["huge"]["failed"] is True


def test_memory_is_judged_at_the_context_each_model_loads_with() -> None:
    """The listing's figure is F4's (the model's context, up to 8192); a load counts the one at the context it loads
    with (its preset's or -c): smaller, both models stay; larger, too big is said."""
    starter = FakeStarter(needs={"a": 2 * GIB, "b": 2 * GIB})
    memory = MachineMemory(ram_total=11 * GIB, ram_available=11 * GIB)  # 9.9 GB usable
    with routed(starter, RouterLimits(memory=memory)) as (client, _):
        assert ask(client, "a").status_code == 200 and ask(client, "b").status_code == 200
        assert starter.closed == [] and status(client)["a"] == {"value": "loaded"}
        starter.needs["huge"] = 4 * GIB  # 20 GB listed, 4 GB as it loads
        assert ask(client, "huge").status_code == 200 and starter.closed == []
        starter.needs["a"] = 12 * GIB
        assert client.post("/models/unload", json={"model": "a"}).json() == {"success": True}
        one_line_error(ask(client, "a"), 400, "a needs 12.00 GiB: too big for this machine")


def test_a_load_that_cannot_find_room_says_why_after_its_wait() -> None:
    starter = FakeStarter(words={"a": ["w"] * 100})
    with routed(starter, RouterLimits(models_max=1, room_wait_s=0.3)) as (client, _):
        assert ask(client, "a").status_code == 200
        starter.engines["a"].step_s = 0.02  # a 2-second reply
        results: list[Any] = []
        long_reply = in_thread(lambda: ask(client, "a", results))
        wait_for(lambda: starter.engines["a"].sent[1:], "a's long reply to start")
        one_line_error(ask(client, "b"), 503, "b waits for a model to unload: 1 are loaded (--models-max 1): a (busy)")
        long_reply.join(30)
        assert results[0].status_code == 200 and starter.closed == []


def test_a_load_that_only_pinned_models_keep_out_is_refused_at_once() -> None:
    """Waiting frees no room a pinned model holds: the refusal came after the whole wait (60 s by default)."""
    models = (replace(MODELS[0], pinned=True), *MODELS[1:])
    memory = MachineMemory(ram_total=11 * GIB, ram_available=11 * GIB)  # one 5 GB model at a time
    for limits in (RouterLimits(models_max=1, room_wait_s=30), RouterLimits(memory=memory, room_wait_s=30)):
        starter = FakeStarter()
        with routed(starter, limits, models) as (client, _):
            assert ask(client, "a").status_code == 200
            started = time.monotonic()
            refused = ask(client, "b")
            assert time.monotonic() - started < 10, "b's refusal waited for room that a pinned model holds"
            one_line_error(refused, 503, "a (pinned); POST /models/unload frees a pinned one")
            if limits.memory is not None:
                one_line_error(refused, 503, "b needs 5.00 GiB beside the 5.00 GiB that loaded models use (RAM 11.00")
            assert client.post("/models/unload", json={"model": "a"}).json() == {"success": True}
            assert ask(client, "b").status_code == 200 and starter.started == ["a", "b"]


def test_a_failing_load_fails_its_own_requests_only() -> None:
    starter = FakeStarter(failing={"b": RuntimeError("unknown model architecture: 'x'\nmore")})
    with routed(starter) as (client, _):
        assert ask(client, "a").status_code == 200
        one_line_error(ask(client, "b"), 500, "b could not be loaded: unknown model architecture: 'x' more")
        refusal = ApiError(503, "b waits")
        starter.failing["b"] = refusal
        one_line_error(ask(client, "b"), 503, "b waits")
        assert ask(client, "a").status_code == 200
        assert status(client)["b"] == {"value": "unloaded", "failed": True, "error": "b waits"}
        del starter.failing["b"]
        assert ask(client, "b").status_code == 200 and status(client)["b"] == {"value": "loaded"}


def test_models_unload_frees_a_model_and_refuses_what_it_cannot() -> None:
    starter = FakeStarter()
    with routed(starter) as (client, _):
        assert ask(client, "a").status_code == 200
        assert client.post("/models/unload", json={"model": "a.gguf"}).json() == {"success": True}
        assert starter.closed == ["a"] and status(client)["a"] == {"value": "unloaded"}
        one_line_error(client.post("/models/unload", json={"model": "a"}), 400, "a is not loaded")
        one_line_error(client.post("/models/unload", json={}), 400, "model must name a model")
        one_line_error(client.post("/models/unload", json={"model": "zz"}), 404, "'zz' does not exist here")


def test_a_server_of_one_model_lists_it_loaded_and_keeps_it() -> None:
    metrics = Metrics()
    backend = EngineBackend(ScriptedClient(["x"]), ServerSettings(model_id="tiny"), metrics)  # type: ignore[arg-type]
    with TestClient(build_app(backend, metrics), base_url="http://127.0.0.1:8080") as client:
        assert client.get("/v1/models").json()["data"][0]["status"] == {"value": "loaded"}
        one_line_error(client.post("/models/unload", json={"model": "tiny"}), 400, "serves one model")
        assert ask(client, "anything").json()["model"] == "tiny"  # as before: any name gets the one model
    backend.close()
