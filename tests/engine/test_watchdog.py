"""The engine's watchdog: Esc, an API client's disconnect and Ctrl+C end a reply within about a second even while the
worker is stuck in one native call, and the engine comes back as it was (engine_ext/watchdog.py).

The worker's test switch LLMTUI_TEST_FAULT=hang-sample blocks it in a C call (libc's sleep) that never reads the
pipe, the first time it samples a reply's token: what llama.cpp's grammar sampler did for minutes on the pattern
`^((a{0,50}){0,50}){0,50}$`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from app.core.config import SamplingSettings
from app.tui.app import LlmtuiApp
from engine_ext.client import EngineClient
from engine_ext.engine_status import FAULT_ENV
from engine_ext.params import GREEDY, ContextParams, ModelParams
from engine_ext.protocol import Crashed, Event, Finished, Generate, TokenChunk
from engine_ext.watchdog import CANCEL_GRACE_S
from tests.serve_process import free_port
from tests.waits import wait_for, wait_until

ROOT = Path(__file__).resolve().parents[2]
SMALL_CTX = ContextParams(n_ctx=512, n_threads=2)
STOP_S = 3.0  # "about a second", with room for a loaded 2-core machine


def _until_end(client: EngineClient, timeout_s: float) -> tuple[Event, float]:
    """The generation's last event (Finished or Crashed) and when it came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        event = client.next_event(0.05)
        if isinstance(event, Finished | Crashed):
            return event, time.monotonic()
    raise AssertionError(f"the generation did not end within {timeout_s} s")


def _stuck(client: EngineClient, model: Path) -> int:
    """A worker started with the hang fault, the model loaded, a reply sent and stuck in its first sampling."""
    client.start()
    client.load(model, ModelParams(), SMALL_CTX)
    request_id = client.new_request_id()
    client.send(Generate(request_id=request_id, prompt="hello", sampling=GREEDY, max_tokens=8))
    wait_for(lambda: "hanging at sample" in client.log_path.read_text(), "the worker to hang", timeout_s=60)
    return request_id


def test_a_cancel_the_worker_cannot_read_ends_it_within_a_second(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang-sample")
    with EngineClient(tmp_path / "engine.log") as client:
        request_id = _stuck(client, tiny_models["llama"])
        pid = client.pid
        time.sleep(0.5)  # nobody cancels: the worker stays stuck (no step limit here)
        assert client.alive
        cancelled_at = time.monotonic()
        client.cancel(request_id)
        event, ended_at = _until_end(client, 30)
        assert isinstance(event, Crashed) and event.phase == "sample"
        assert event.stopped == "the engine did not stop within 1 s (stuck in sampling)"
        assert event.description == event.stopped and "\n" not in event.stopped
        assert CANCEL_GRACE_S <= ended_at - cancelled_at < STOP_S, ended_at - cancelled_at
        # A fresh worker serves the same model (the fault switched off for it).
        monkeypatch.delenv(FAULT_ENV)
        client.start()
        assert client.pid != pid
        client.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
        finished = list(client.generate(Generate(request_id=0, prompt="hello", sampling=GREEDY, max_tokens=4)))[-1]
        assert isinstance(finished, Finished) and finished.stats.generated_tokens > 0


def test_a_cancel_the_worker_reads_is_not_the_watchdogs(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=4096, n_threads=2))
        request = Generate(request_id=1, prompt="go on", sampling=GREEDY, max_tokens=-1, ignore_eos=True)
        events: list[Event] = []
        for event in client.generate(request):
            if isinstance(event, TokenChunk) and not any(isinstance(e, TokenChunk) for e in events):
                client.cancel(1)  # at the first tokens: the worker reads it between two decode steps
            events.append(event)
        assert isinstance(events[-1], Finished) and events[-1].stop_reason == "cancelled"
        time.sleep(CANCEL_GRACE_S * 2)  # the watchdog had its chance
        assert client.alive and client.crashed is None


def test_a_step_past_the_limit_ends_the_worker(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang-sample")
    with EngineClient(tmp_path / "engine.log") as client:
        client.step_limit_s = 1.0
        _stuck(client, tiny_models["llama"])
        event, _ = _until_end(client, 30)
        assert isinstance(event, Crashed)
        assert event.stopped == "one step of the reply (sampling) ran past the 1 s step limit"


def test_closing_a_stuck_worker_is_quick(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang-sample")
    client = EngineClient(tmp_path / "engine.log")
    _stuck(client, tiny_models["llama"])
    t0 = time.monotonic()
    client.close()  # quitting the app, Ctrl+C on `run`: not the 5 s a worker that reads the pipe is given
    assert time.monotonic() - t0 < STOP_S


# ----- the commands ----------------------------------------------------------------------------------------


def _command(args: list[str], **popen: object) -> subprocess.Popen[str]:
    env = dict(os.environ)  # the test's own folders (tests/conftest.py)
    env[FAULT_ENV] = "hang-sample"
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, text=True, **popen
    )


def test_ctrl_c_ends_run_while_the_engine_is_stuck(tiny_models: dict[str, Path]) -> None:
    process = _command(
        ["run", "-m", str(tiny_models["llama"]), "-p", "hello", "-n", "8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log = Path(os.environ["LLMTUI_DATA_DIR"]) / "logs" / "engine.log"
    try:
        wait_for(lambda: log.is_file() and "hanging at sample" in log.read_text(), "the worker to hang", timeout_s=90)
        t0 = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130
        assert time.monotonic() - t0 < STOP_S
        assert process.stderr is not None and "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_ctrl_c_in_chat_stops_a_stuck_reply_and_the_chat_goes_on(tiny_models: dict[str, Path]) -> None:
    process = _command(
        ["chat", "-m", str(tiny_models["llama"]), "-n", "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    log = Path(os.environ["LLMTUI_DATA_DIR"]) / "logs" / "engine.log"
    try:
        assert process.stdin is not None
        process.stdin.write("hello\n")
        process.stdin.flush()
        wait_for(lambda: log.is_file() and "hanging at sample" in log.read_text(), "the worker to hang", timeout_s=90)
        process.send_signal(signal.SIGINT)
        wait_for(lambda: log.read_text().count("llmtui engine worker pid") == 2, "the restart", timeout_s=30)
        process.stdin.close()  # Ctrl-D: the chat ends as usual
        assert process.wait(60) == 0
        err = process.stderr.read() if process.stderr else ""
        assert "llmtui: the engine did not stop within 1 s (stuck in sampling); restarted" in err
        assert "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_serve_a_disconnect_and_ctrl_c_end_a_stuck_reply_and_a_step_limit_bounds_it(
    tiny_models: dict[str, Path],
) -> None:
    port = free_port()
    process = _command(
        ["serve", "-m", str(tiny_models["llama"]), "-t", "2", "--port", str(port), "--step-limit", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    log = Path(os.environ["LLMTUI_DATA_DIR"]) / "logs" / "engine.log"

    def starts() -> int:
        return log.read_text().count("llmtui engine worker pid") if log.is_file() else 0

    def healthy() -> bool:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    body = {"prompt": "hello", "max_tokens": 8, "stream": True}
    try:
        wait_for(healthy, "llmtui serve to answer /health", timeout_s=120, interval_s=0.2)
        # Nobody cancels: the step limit ends the worker and the request hears why; the engine is restarted.
        t0 = time.monotonic()
        answer = httpx.post(f"{base}/v1/completions", json={**body, "stream": False}, timeout=60)
        assert answer.status_code == 500 and "ran past the 4 s step limit" in answer.text
        assert time.monotonic() - t0 < 4 + STOP_S + 2
        wait_for(lambda: starts() == 2 and healthy(), "the restarted engine", timeout_s=60)
        # A client that disconnects: the stuck worker is ended within about a second (not after the step limit).
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as stream:
            wait_for(lambda: log.read_text().count("hanging at sample") == 2, "the worker to hang", timeout_s=30)
            gone_at = time.monotonic()
            stream.close()
        wait_for(lambda: starts() == 3, "the engine restarted after the disconnect", timeout_s=30, interval_s=0.05)
        assert time.monotonic() - gone_at < 4, "ended by the step limit, not the disconnect"
        wait_for(healthy, "the restarted engine to answer", timeout_s=60)
        # Ctrl+C while a reply is stuck: the server exits at once.
        streaming = threading.Thread(
            target=lambda: httpx.post(f"{base}/v1/completions", json=body, timeout=60), daemon=True
        )
        streaming.start()
        wait_for(lambda: log.read_text().count("hanging at sample") == 3, "the worker to hang", timeout_s=30)
        t0 = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.wait(30)
        assert time.monotonic() - t0 < STOP_S + 1
        assert process.stderr is not None and "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


# ----- the app ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_escape_in_the_app_stops_a_stuck_reply_and_the_engine_comes_back(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang-sample")
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=8))
    notified: list[str] = []  # every toast, kept: a toast expires while a slow machine restarts the engine
    notify = app.notify

    def recording_notify(message: str, *args: object, **kwargs: object) -> None:
        notified.append(str(message))
        notify(message, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app, "notify", recording_notify)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the model to load", timeout_s=90)
        chat = app.chat
        assert chat is not None
        pid = app.bridge.pid
        log = Path(os.environ["LLMTUI_DATA_DIR"]) / "logs" / "engine.log"
        chat.prompt.focus()
        chat.prompt.load_text("this reply gets stuck")
        await pilot.press("enter")
        await wait_until(pilot, lambda: "hanging at sample" in log.read_text(), "the worker to hang", timeout_s=60)
        monkeypatch.delenv(FAULT_ENV)  # the restarted worker does not hang
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_until(pilot, lambda: chat.generation is None, "the reply to end", timeout_s=30)
        assert time.monotonic() - t0 < STOP_S + 1
        stopped = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert stopped.state == "stopped" and stopped.stats["stop_reason"] == "cancelled"
        await wait_until(
            pilot, lambda: app.engine_state == "ready" and app.bridge.pid != pid, "the restarted engine", timeout_s=90
        )
        assert any("did not stop within 1 s (stuck in sampling); restarted" in message for message in notified)
        # The conversation goes on, on the same model.
        chat.prompt.load_text("and now")
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.replies.replies_started > 1 and chat.generation is None, "the next reply")
        path = app.store.tree.active_path(chat.conversation_id or 0)
        assert [m.role for m in path] == ["user", "assistant", "user", "assistant"] and path[-1].state == "complete"
