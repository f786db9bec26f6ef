"""F10: the app serves its loaded model to other programs while you chat (app/tui/controllers/server.py), here with a
scripted engine behind the app's real bridge, spoken to by the official `openai` client."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from app.core import paths
from engine_ext.protocol import Finished, Generate, GenerationStats, TokenChunk
from tests.engine.test_serve import free_port
from tests.fakes import ScriptedEngine, scripted_app
from tests.waits import wait_until

pytestmark = pytest.mark.anyio


class EchoEngine(ScriptedEngine):
    """Answers every request with three words naming its request id's parity, then stops (eos)."""

    def stream(self, request: Generate) -> None:
        for n, word in enumerate(("served ", "by ", "llmtui")):
            self.events.put(TokenChunk(request.request_id, word, "", (n,), ("target",)))
        stats = GenerationStats(5, 0, 5, 1.0, 3, 3.0, 1.0, 4096, 8)
        self.events.put(Finished(request.request_id, "eos", stats))


def write_config(port: int, extra: str = "") -> None:
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\n{extra}')


def ask(port: int) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    return reply.choices[0].message.content or ""


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_f10_serves_the_loaded_model_and_the_stats_bar_shows_the_address(lone_llama: Path) -> None:
    port = free_port()
    write_config(port)
    app = scripted_app(lone_llama, EchoEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("f10")
        await wait_until(pilot, lambda: app.server.running, "the API server to listen")
        chat = app.chat
        assert chat is not None
        await wait_until(pilot, lambda: chat.stats.extras.get("api") == f":{port}", "the api readout")
        assert f"api :{port}" in chat.stats.render_line(0).text
        assert await asyncio.to_thread(ask, port) == "served by llmtui"
        await chat.replies.send("and the chat still works")
        await wait_until(pilot, lambda: chat.generation is None, "the chat's reply to finish")
        await pilot.press("f10")
        await wait_until(pilot, lambda: not app.server.running, "the API server to stop")
        await wait_until(pilot, lambda: "api" not in chat.stats.extras, "the api readout to go")
        assert not await asyncio.to_thread(listening, port)


async def test_f10_says_in_one_line_when_the_key_variable_is_unset_or_the_port_is_taken(
    lone_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMTUI_TEST_API_KEY", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(port, 'api_key_env = "LLMTUI_TEST_API_KEY"\n')
        app = scripted_app(lone_llama, EchoEngine)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
            await pilot.press("f10")
            await pilot.pause()
            messages = [n.message for n in app._notifications]
            assert any("LLMTUI_TEST_API_KEY is not set" in m for m in messages), messages
            assert not app.server.running and not app.server.starting
            monkeypatch.setenv("LLMTUI_TEST_API_KEY", "k")
            await pilot.press("f10")
            await wait_until(pilot, lambda: not app.server.starting, "the API server to give up")
            messages = [n.message for n in app._notifications]
            assert any(f"cannot listen on 127.0.0.1:{port}" in m for m in messages), messages
            assert not app.server.running


async def test_f10_refuses_a_non_ascii_key_and_cross_site_requests(
    lone_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F10 runs the gate `serve` runs: a key no client can send is refused at start in one line; then only this
    server's Host names and the configured origins get through, and a body must be JSON."""
    port = free_port()
    monkeypatch.setenv("LLMTUI_TEST_API_KEY", "clé")
    write_config(
        port,
        'api_key_env = "LLMTUI_TEST_API_KEY"\nallowed_hosts = "llm.lan"\ncors_origins = "http://localhost:3000"\n',
    )
    app = scripted_app(lone_llama, EchoEngine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("f10")
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert any("LLMTUI_TEST_API_KEY cannot be used: the API key holds the character U+00E9" in m for m in messages)
        assert not app.server.running and not app.server.starting
        monkeypatch.setenv("LLMTUI_TEST_API_KEY", "key")
        await pilot.press("f10")
        await wait_until(pilot, lambda: app.server.running, "the API server to listen")

        def post(headers: dict[str, str]) -> httpx.Response:
            body = b'{"messages": [{"role": "user", "content": "hi"}]}'
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            headers = {"Authorization": "Bearer key", "Content-Type": "application/json", **headers}
            return httpx.post(url, content=body, headers=headers, timeout=30)

        json_ok = {"Host": "llm.lan:8080"}
        assert (await asyncio.to_thread(post, json_ok)).status_code == 200
        page = await asyncio.to_thread(post, {"Origin": "http://localhost:3000"})
        assert page.status_code == 200 and page.headers["access-control-allow-origin"] == "http://localhost:3000"
        for headers, status, words in (
            ({"Host": "evil.example"}, 403, "F3 → API server → allowed host names"),
            ({"Origin": "https://evil.example"}, 403, "F3 → API server → CORS origins"),
            ({"Content-Type": "text/plain"}, 415, "must be JSON"),
        ):
            answer = await asyncio.to_thread(post, headers)
            assert answer.status_code == status and words in answer.json()["error"]["message"], answer.text
        await pilot.press("f10")
        await wait_until(pilot, lambda: not app.server.running, "the API server to stop")


async def test_f10_with_router_serves_every_local_model_and_the_switcher_marks_the_loaded_ones(
    lone_llama: Path,
) -> None:
    """Issue 45 item 5: `[server] router = true` makes F10 start `llmtui serve` without -m (a child process, real
    workers) instead of serving the app's own engine; ctrl+l marks the models it has loaded."""
    from app.tui.modals.model_switcher import ModelSwitcherModal

    port = free_port()
    write_config(port, f'router = true\n\n[models]\nfolders = ["{lone_llama.parent}"]\n')
    app = scripted_app(lone_llama, EchoEngine)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("f10")
        await wait_until(pilot, lambda: app.server.running, "the router to answer", timeout_s=120)
        chat = app.chat
        assert chat is not None
        await wait_until(pilot, lambda: chat.stats.extras.get("api") == f":{port} 0 loaded", "the api readout")
        body = {"model": lone_llama.stem, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        answer = await asyncio.to_thread(lambda: httpx.post(url, json=body, timeout=120))
        assert answer.status_code == 200 and answer.json()["model"] == lone_llama.stem  # a real worker, not the app's
        await wait_until(pilot, lambda: app.server.served == {lone_llama.stem}, "the router's loaded model")
        await wait_until(pilot, lambda: chat.stats.extras.get("api") == f":{port} 1 loaded", "the api readout")
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), "the switcher")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning and not switcher.describing, "the switcher's scan")
        from textual.widgets import OptionList

        options = switcher.query_one(OptionList)
        rows = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any(lone_llama.stem in row and "served" in row for row in rows), rows
        await pilot.press("escape")
        await pilot.press("f10")
        await wait_until(pilot, lambda: not app.server.running, "the router to stop")
        await wait_until(pilot, lambda: not listening(port), "the router's port to close", timeout_s=30)


def ask_as_agents(port: int) -> tuple[str, str]:
    """A Messages request as Claude Code sends it (its User-Agent) and a Responses request from the `openai` SDK."""
    import anthropic

    base = f"http://127.0.0.1:{port}"
    claude = anthropic.Anthropic(
        base_url=base,
        api_key="none",
        max_retries=0,
        timeout=30,
        default_headers={"User-Agent": "claude-cli/2.1.197 (external, cli)"},
    )
    message = claude.messages.create(model="any", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    codex = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=30)
    response = codex.responses.create(model="any", input="hi", max_output_tokens=8)
    return "".join(b.text for b in message.content if b.type == "text"), response.output_text


async def test_f10_answers_messages_and_responses_and_the_stats_bar_names_the_client(lone_llama: Path) -> None:
    port = free_port()
    write_config(port)
    app = scripted_app(lone_llama, EchoEngine)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        await pilot.press("f10")
        await wait_until(pilot, lambda: app.server.running, "the API server to listen")
        chat = app.chat
        assert chat is not None
        assert await asyncio.to_thread(ask_as_agents, port) == ("served by llmtui", "served by llmtui")
        # The last client that asked for a reply: the openai SDK's "OpenAI/Python 1.x", its version left out.
        await wait_until(
            pilot, lambda: chat.stats.extras.get("api") == f":{port} OpenAI/Python", lambda: str(chat.stats.extras)
        )
        await asyncio.to_thread(ask_with_agent, port, "claude-cli/2.1.197 (external, cli)")
        await wait_until(pilot, lambda: chat.stats.extras.get("api") == f":{port} claude-cli", "claude-cli named")
        assert f"api :{port} claude-cli" in chat.stats.render_line(0).text
        await pilot.press("f10")
        await wait_until(pilot, lambda: not app.server.running, "the API server to stop")


def ask_with_agent(port: int, agent: str) -> None:
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/messages",
        json={"model": "any", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"User-Agent": agent},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
