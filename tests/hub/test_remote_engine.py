"""Remote engines: a real OpenAI-compatible server (llama-cpp-python's own, serving a tiny model) on 127.0.0.1,
plus stdlib HTTP servers for what it cannot show (401, JSON errors, a dropped or silent stream, llama-server's
`timings` with draft counts), through RemoteBridge and through the app with Pilot."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from app.core.app_settings_schema import CHAT_REPLY_LIMIT
from app.core.config import Config, RemoteSettings, SamplingSettings, load_config, save_config
from app.core.engine import ReplyStats
from app.core.remote_engine import RemoteChoice, draft_summary
from app.core.remote_http import list_models, request_body
from app.tui.remote_bridge import RemoteBridge
from engine_ext.params import SpeculativeParams, SteeringEntry
from engine_ext.protocol import Failed, Finished, Loaded, SpeculativeSet, TokenChunk
from tests.fakes import Collector, FakeServer
from tests.tiny_models import write_tiny_model
from tests.waits import wait_until

SERVER_N_CTX = 512
SHORT = SamplingSettings(temperature=0.0, max_tokens=8)
# Long enough to stop midway (llama_cpp.server slows down as a reply grows: 150 tokens take about a second, a reply
# that fills its context tens of seconds, which it would spend after a cancel before answering the next test).
LONG = SamplingSettings(temperature=0.0, max_tokens=150)
WAIT_S = 30.0


# ----- a real server ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """`python -m llama_cpp.server` serving the tiny llama model as "tiny"."""

    def __init__(self, model: Path, log: Path) -> None:
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model),
                "--model_alias",
                "tiny",
                "--n_ctx",
                str(SERVER_N_CTX),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("llama_cpp.server did not answer /v1/models in time")

    def wait_idle(self) -> None:
        """Until a one-token request is answered (a cancelled reply may keep the server busy until it ends)."""
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}).encode()
        request = urllib.request.Request(f"{self.url}/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log_file.close()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    folder = tmp_path_factory.mktemp("remote-server")
    model = write_tiny_model("llama", folder / "tiny-llama.gguf")
    server = LlamaServer(model, folder / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def local_remote(server: LlamaServer, **changes: Any) -> RemoteSettings:
    return replace(RemoteSettings("local", server.url), **changes)


# ----- collecting what the bridge posts ----------------------------------------------------------------------


def connected(remote: RemoteSettings, model: str = "") -> tuple[RemoteBridge, Collector]:
    collector = Collector()
    bridge = RemoteBridge(collector, remote, model, connect_timeout_s=5.0, read_timeout_s=60.0)
    bridge.connect()
    loaded = collector.wait_for((Loaded, Failed))
    assert isinstance(loaded, Loaded), getattr(loaded, "message", "")
    return bridge, collector


# ----- the real server ----------------------------------------------------------------------------------------


def test_stream_a_chat_from_a_real_server(llama_server: LlamaServer) -> None:
    bridge, collector = connected(local_remote(llama_server))
    model = bridge.describe(collector.wait_for(Loaded).info)
    assert (model.name, model.backend, model.path) == ("tiny", "remote: local", "remote:local/tiny")
    assert [m.id for m in list_models(local_remote(llama_server))] == ["tiny"]
    request_id = bridge.generate([("system", "Be brief."), ("user", "hello")], SHORT)
    finished = collector.wait_for((Finished, Failed))
    assert isinstance(finished, Finished), getattr(finished, "message", "")
    assert finished.request_id == request_id and finished.stop_reason == "max_tokens"
    arrived = collector.of(TokenChunk)
    assert arrived and all(m.request_id == request_id for m in arrived)
    assert collector.text() and sum(len(m.token_ids) for m in arrived) == finished.stats.generated_tokens
    assert collector.events.index(arrived[-1]) < collector.events.index(finished)  # text before the end
    stats = finished.stats.to_dict()
    assert stats["ttft_ms"] > 0 and stats["timings_from"] == "client" and stats["backend"] == "remote: local"
    assert 1 <= stats["generated_tokens"] <= SHORT.max_tokens
    bridge.close()


def test_cancel_mid_stream_keeps_the_partial_reply(llama_server: LlamaServer) -> None:
    """Esc stops at once: the server is frozen (SIGSTOP) after the first tokens, so only the client can end it."""
    bridge, collector = connected(local_remote(llama_server))
    request_id = bridge.generate([("user", "write a long story")], LONG)
    collector.wait_for(TokenChunk)
    os.kill(llama_server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        bridge.cancel(request_id)
        finished = collector.wait_for((Finished, Failed), timeout=5.0)
        assert time.monotonic() - started < 2.0
    finally:
        os.kill(llama_server.process.pid, signal.SIGCONT)
    assert isinstance(finished, Finished) and finished.stop_reason == "cancelled"
    assert collector.text() and finished.stats.generated_tokens >= 1
    llama_server.wait_idle()


def test_a_prompt_longer_than_the_server_context_fails_clearly(llama_server: LlamaServer) -> None:
    bridge, collector = connected(local_remote(llama_server))
    bridge.generate([("user", "hello " * (SERVER_N_CTX + 100))], SHORT)
    failed = collector.wait_for((Failed, Finished))
    assert isinstance(failed, Failed)
    assert "local closed the stream without a reply" in failed.message and "\n" not in failed.message


def test_an_unknown_model_is_refused_when_connecting(llama_server: LlamaServer) -> None:
    collector = Collector()
    RemoteBridge(collector, local_remote(llama_server), "no-such-model").connect()
    failed = collector.wait_for((Failed, Loaded))
    assert isinstance(failed, Failed) and collector.answers[collector.events.index(failed)] == "load"
    assert failed.message == "local does not serve 'no-such-model'; it serves tiny"


def test_connection_refused() -> None:
    remote = RemoteSettings("gone", f"http://127.0.0.1:{free_port()}/v1")
    collector = Collector()
    bridge = RemoteBridge(collector, remote, "any")
    bridge.connect()
    failed = collector.wait_for(Failed, answers="load")
    assert "connection refused (is the server running?)" in failed.message
    bridge.generate([("user", "hi")], SHORT)
    assert "connection refused" in collector.wait_for(Failed, answers="").message


# ----- stdlib servers: what a real server cannot be made to do ---------------------------------------------


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    servers: list[FakeServer] = []

    def start(behaviour: str, models: tuple[str, ...] = ("fake-model",)) -> FakeServer:
        servers.append(FakeServer(behaviour, models))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_llama_server_timings_and_reasoning_are_used(fake_server: Callable[..., FakeServer]) -> None:
    server = fake_server("replay")
    bridge, collector = connected(RemoteSettings("box", server.url))
    assert bridge.client.n_ctx == 2048
    bridge.generate([("user", "hi")], SamplingSettings())
    finished = collector.wait_for(Finished)
    assert collector.text() == "Hello there!"
    assert "".join(m.reasoning for m in collector.of(TokenChunk)) == "The user says hi. Answer briefly."
    stats = finished.stats.to_dict()
    assert finished.stop_reason == "eos" and stats["timings_from"] == "server"
    assert (stats["generated_tokens"], stats["decode_tps"], stats["decode_ms"]) == (5, 125.0, 40.0)
    assert (stats["prompt_tokens"], stats["prompt_tokens_cached"], stats["prompt_tps"]) == (14, 3, 880.0)
    assert (stats["draft_n"], stats["draft_n_accepted"], stats["draft_acceptance"]) == (8, 6, 0.75)
    assert (stats["n_ctx"], stats["n_ctx_used"]) == (2048, 19)
    assert draft_summary(stats) == "75% 6/8" and draft_summary({"generated_tokens": 3}) is None


def test_a_remote_server_is_told_the_output_format_in_the_system_message(
    fake_server: Callable[..., FakeServer], tmp_path: Path
) -> None:
    """Issue 49: the schema goes with response_format, and the model is told it (OpenAI's json_object mode wants
    JSON named in the messages too)."""
    schema = tmp_path / "pick.json"
    schema.write_text('{"type": "object", "required": ["ok"]}')
    server = fake_server("replay")
    bridge, collector = connected(RemoteSettings("box", server.url))
    bridge.generate(
        [("system", "Be brief."), ("user", "hi")],
        SamplingSettings(output_format="json_schema", output_file=str(schema)),
    )
    collector.wait_for(Finished)
    sent = json.loads(server.requests[-1][2])
    assert sent["response_format"]["json_schema"]["schema"] == {"type": "object", "required": ["ok"]}
    system, user = sent["messages"]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\nReply with JSON only")
    assert system["content"].endswith('{"type":"object","required":["ok"]}') and user["content"] == "hi"


def test_a_401_names_the_key_without_showing_it(
    fake_server: Callable[..., FakeServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = fake_server("401")
    monkeypatch.setenv("TEST_REMOTE_KEY", "sk-secret-from-env")
    remote = RemoteSettings("box", server.url, api_key_env="TEST_REMOTE_KEY", api_key="sk-secret-in-file")
    collector = Collector()
    bridge = RemoteBridge(collector, remote, "fake-model")
    bridge.connect()
    failed = collector.wait_for(Failed, answers="load")
    assert failed.message == (
        "box answered 401 Unauthorized: Invalid API key (check the API key: $TEST_REMOTE_KEY (set))"
    )
    assert server.requests[0][1]["Authorization"] == "Bearer sk-secret-from-env"  # the variable wins
    bridge.generate([("user", "hi")], SHORT)
    assert "401" in collector.wait_for(Failed, answers="").message
    assert "sk-secret" not in repr(remote) and "sk-secret" not in remote.masked_key()


def test_a_json_error_body_becomes_one_line(fake_server: Callable[..., FakeServer]) -> None:
    bridge, collector = connected(RemoteSettings("box", fake_server("500").url))
    bridge.generate([("user", "hi")], SHORT)
    failed = collector.wait_for(Failed)
    assert failed.message == "box answered 500 Internal Server Error: CUDA out of memory"
    assert not collector.of(TokenChunk)


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("drop", "box closed the stream before the reply finished; the partial reply is kept"),
        ("error-event", "box stopped with an error: the model crashed"),
    ],
)
def test_a_broken_stream_fails_and_keeps_the_partial_reply(
    fake_server: Callable[..., FakeServer], behaviour: str, message: str
) -> None:
    bridge, collector = connected(RemoteSettings("box", fake_server(behaviour).url))
    request_id = bridge.generate([("user", "hi")], SHORT)
    failed = collector.wait_for(Failed)
    assert (failed.request_id, failed.message) == (request_id, message)
    assert collector.text() in ("Partial reply", "Half")
    assert collector.events.index(collector.of(TokenChunk)[-1]) < collector.events.index(failed)


def test_cancel_while_the_server_is_silent(fake_server: Callable[..., FakeServer]) -> None:
    server = fake_server("stall")
    bridge, collector = connected(RemoteSettings("box", server.url))
    request_id = bridge.generate([("user", "hi")], SHORT)
    collector.wait_for(TokenChunk)
    collector.wait_for(ReplyStats)
    bridge.cancel(request_id)
    finished = collector.wait_for(Finished, timeout=2.0)
    assert finished.stop_reason == "cancelled" and collector.text() == "Thinking"
    assert server.disconnected.wait(5.0)


def test_what_a_remote_cannot_do_is_refused_clearly(fake_server: Callable[..., FakeServer]) -> None:
    bridge, collector = connected(RemoteSettings("box", fake_server("replay").url))
    bridge.set_speculative(SpeculativeParams())
    assert collector.wait_for(SpeculativeSet).drafters == ()
    bridge.set_speculative(SpeculativeParams(types=("ngram-simple",)))
    bridge.set_steering((SteeringEntry("/v/happy.gguf", 0.5),))
    bridge.set_steering(())
    bridge.make_vector("prompts.json", "out.gguf")
    failures = collector.of(Failed)
    assert [a for a in collector.answers if a] == ["speculative", "steering", "vector"]
    assert len(failures) == 3 and all("remote server" in f.message for f in failures)
    assert bridge.pid is None


def test_request_body_maps_sampling_and_continue() -> None:
    body = request_body(
        "m",
        [("user", "hi"), ("assistant", "Once")],
        SamplingSettings(temperature=0.3, top_k=0, min_p=0.1, repeat_penalty=1.1, max_tokens=50, seed=7),
        continue_reply=True,
    )
    assert body["model"] == "m" and body["stream"] is True and body["messages"][-1]["role"] == "assistant"
    assert (body["temperature"], body["min_p"], body["max_tokens"], body["seed"]) == (0.3, 0.1, 50, 7)
    assert body["repeat_penalty"] == body["repetition_penalty"] == 1.1 and "top_k" not in body
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    plain = request_body("m", [("user", "hi")], SamplingSettings(), continue_reply=False)
    assert plain["max_tokens"] == CHAT_REPLY_LIMIT  # the chat's default reply limit reaches a remote engine too
    assert "seed" not in plain and "continue_final_message" not in plain
    unlimited = request_body("m", [("user", "hi")], SamplingSettings(max_tokens=-1), continue_reply=False)
    assert "max_tokens" not in unlimited


# ----- the app ----------------------------------------------------------------------------------------------


async def pick_remote_in_switcher(pilot: Pilot[None], remote_name: str) -> None:
    """ctrl+l, wait for the remote's models, filter to them, Enter; until the remote model is ready."""
    from app.tui.modals.model_switcher import ModelSwitcherModal

    app = pilot.app
    await pilot.press("ctrl+l")
    switcher = app.screen
    assert isinstance(switcher, ModelSwitcherModal)
    await wait_until(pilot, lambda: remote_name in switcher.remote_models)
    switcher.query_one("#model-filter").value = f"remote: {remote_name}"  # type: ignore[attr-defined]
    await pilot.pause()
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.engine_state == "ready" and app.model is not None)  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_app_chats_with_a_real_remote_engine_and_stops_a_reply(llama_server: LlamaServer) -> None:
    from app.tui.app import LlmtuiApp

    save_config(Config(remotes=(local_remote(llama_server),), last_model="remote:local/no-longer-served"))
    app = LlmtuiApp(default_sampling=SHORT)  # starts on the remote used last: no local engine at all
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "error")  # that model is gone: pick another
        chat = app.chat
        assert chat is not None and app.model is None
        await pick_remote_in_switcher(pilot, "local")
        assert isinstance(app.bridge, RemoteBridge) and app.model is not None and app.bridge.pid is None
        assert (app.model.name, app.model.backend) == ("tiny", "remote: local")
        assert "tiny · remote: local · ready" in str(chat.header.render())
        chat.prompt.focus()
        chat.prompt.load_text("hello remote")
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.replies.replies_started == 1)
        await wait_until(pilot, lambda: chat.generation is None and app.engine_state == "ready")
        assert chat.conversation_id is not None
        user, reply = app.store.tree.active_path(chat.conversation_id)
        assert (user.content, reply.role, reply.state, reply.model) == ("hello remote", "assistant", "complete", "tiny")
        assert reply.content and reply.stats["backend"] == "remote: local"
        assert chat.transcript.views()[-1].message.content == reply.content
        assert load_config().last_model == "remote:local/tiny"  # the next start uses it again
        # Esc stops a long reply (the server frozen, so only the client can end it); the text so far is kept.
        app.default_sampling = LONG
        await pilot.press("ctrl+n")
        chat.prompt.focus()
        chat.prompt.load_text("a long one")
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.generation is not None and chat.generation.recorder.tokens > 0)
        os.kill(llama_server.process.pid, signal.SIGSTOP)
        try:
            await pilot.press("escape")
            await wait_until(pilot, lambda: chat.generation is None, timeout_s=5.0)
        finally:
            os.kill(llama_server.process.pid, signal.SIGCONT)
        stopped = app.store.tree.active_path(chat.conversation_id)[-1]
        assert (stopped.state, stopped.stats["stop_reason"]) == ("stopped", "cancelled") and stopped.content
        assert app.engine_state == "ready"
    llama_server.wait_idle()


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_switching_from_the_local_engine_to_a_remote_one_and_back(llama_server: LlamaServer) -> None:
    from app.tui.app import LlmtuiApp

    save_config(Config(remotes=(local_remote(llama_server),)))
    local_model = llama_server.model  # the same tiny file, loaded by the local engine
    app = LlmtuiApp(str(local_model), default_sampling=SHORT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready")
        worker = app.bridge.pid
        assert worker is not None
        await pick_remote_in_switcher(pilot, "local")
        assert isinstance(app.bridge, RemoteBridge) and app.model is not None and app.model.name == "tiny"
        await wait_until(pilot, lambda: not Path(f"/proc/{worker}").exists(), timeout_s=15)  # its memory is freed
        # Back to the local engine: a fresh worker loads the file.
        app.open_model(local_model)
        await wait_until(pilot, lambda: app.engine_state == "ready" and app.model is not None)
        assert not isinstance(app.bridge, RemoteBridge) and app.model is not None
        assert app.model.path == str(local_model) and not app.model.backend.startswith("remote")
    assert load_config().last_model == str(local_model)


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_app_starts_with_the_remote_model_used_last() -> None:
    from app.tui.app import LlmtuiApp

    remote = RemoteSettings("gpu-box", "http://127.0.0.1:9/v1")
    save_config(Config(remotes=(remote,), last_model="remote:gpu-box/qwen3-8b"))
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.bridge, RemoteBridge) and app.bridge.remote == remote
        assert (app.model_path, app.bridge.model, app.chat is not None) == ("remote:gpu-box/qwen3-8b", "qwen3-8b", True)
    # An endpoint no longer configured falls back to a local model.
    save_config(Config(last_model="remote:gone/qwen3-8b"))
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not isinstance(app.bridge, RemoteBridge)
        assert app.model_path is None or not app.model_path.startswith("remote:")


def test_remote_choice_path() -> None:
    choice = RemoteChoice(RemoteSettings("gpu", "http://h:1/v1"), "qwen/Qwen3-8B")
    assert choice.path == "remote:gpu/qwen/Qwen3-8B"


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_app_shows_reasoning_and_the_servers_draft_acceptance(fake_server: Callable[..., FakeServer]) -> None:
    from app.tui.app import LlmtuiApp

    server = fake_server("replay")
    save_config(Config(remotes=(RemoteSettings("box", server.url),), last_model="remote:box/fake-model"))
    app = LlmtuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready")
        chat = app.chat
        assert chat is not None and app.model is not None and app.model.backend == "remote: box"
        assert chat.stats.n_ctx == 2048
        chat.prompt.load_text("hi")
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.replies.replies_started == 1 and chat.generation is None)
        assert chat.conversation_id is not None
        reply = app.store.tree.active_path(chat.conversation_id)[-1]
        assert (reply.content, reply.reasoning, reply.state) == (
            "Hello there!",
            "The user says hi. Answer briefly.",
            "complete",
        )
        assert chat.stats.extras["draft"] == "75% 6/8" and chat.stats.decode_tps == 125.0
        assert "draft 75% 6/8" in str(chat.stats.render()) and "remote: box" in str(chat.header.render())
        sent = json.loads(server.requests[-1][2])
        assert sent["model"] == "fake-model" and sent["messages"][-1] == {"role": "user", "content": "hi"}


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_endpoint_dialog_tests_the_connection(fake_server: Callable[..., FakeServer]) -> None:
    from textual.widgets import Input, Label

    from app.tui.app import LlmtuiApp
    from app.tui.modals.remote_endpoint import RemoteEndpointModal

    good, refusing = fake_server("replay"), fake_server("401")
    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        results: list[RemoteSettings | None] = []
        dialog = RemoteEndpointModal(None, {"taken"})
        app.push_screen(dialog, results.append)
        await pilot.pause()
        status = dialog.query_one("#remote-status", Label)
        dialog.query_one("#remote-name", Input).value = "taken"
        dialog.query_one("#remote-base-url", Input).value = good.url
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert "another remote engine is already named 'taken'" in str(status.render())
        dialog.query_one("#remote-name", Input).value = "box"
        dialog.query_one("#remote-model", Input).value = "fake-model"
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: "OK" in str(status.render()), timeout_s=10)
        assert str(status.render()) == "OK: 1 model (fake-model)" and not status.has_class("error")
        dialog.query_one("#remote-base-url", Input).value = refusing.url
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: "401" in str(status.render()), timeout_s=10)
        assert status.has_class("error")
        await pilot.press("ctrl+s")
        await pilot.pause()
    assert results == [RemoteSettings("box", refusing.url, model="fake-model")]
