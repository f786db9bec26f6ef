"""`llmtui run|chat --remote URL`: a remote OpenAI-compatible engine from the command line, as in the chat app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import FakeServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer("replay")
    yield fake
    fake.close()


def llmtui(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_streams_a_reply_from_a_remote_server(server: FakeServer) -> None:
    result = llmtui("run", "--remote", server.url, "-p", "hi", "--temp", "0", "-n", "16", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["text"] == "Hello there!" and out["model"] == "fake-model"
    assert out["stats"]["generated_tokens"] == 5 and out["stop_reason"] == "eos"
    assert out["tokens"] == [] and out["provenance"] == []  # the local engine's object; a server says no token ids
    assert out["stats"]["timings_from"] == "server" and out["speculative"] is None
    path, _, body = server.requests[-1]
    request = json.loads(body)
    assert path == "/v1/chat/completions" and request["messages"] == [{"role": "user", "content": "hi"}]
    assert request["temperature"] == 0 and request["max_tokens"] == 16 and request["model"] == "fake-model"
    plain = llmtui("run", "--remote", server.url, "-p", "hi")
    assert plain.returncode == 0 and plain.stdout.strip() == "Hello there!"
    assert "tok/s" in plain.stderr.splitlines()[-1]


def test_chat_keeps_the_conversation_with_a_remote_server(server: FakeServer) -> None:
    result = llmtui("chat", "--remote", server.url, "--system", "be brief", stdin="hello\nand again\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Hello there!") == 2
    second = json.loads(server.requests[-1][2])["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == "Hello there!" and second[3]["content"] == "and again"


def test_a_key_from_the_environment_and_a_refusal_in_one_line() -> None:
    denied = FakeServer("401")
    try:
        result = llmtui(
            "run",
            "--remote",
            denied.url,
            "--api-key-env",
            "TEST_CLI_KEY",
            "-p",
            "hi",
            env={"TEST_CLI_KEY": "sk-cli-secret"},
        )
        assert result.returncode == 1
        assert result.stderr.startswith("llmtui: error:") and len(result.stderr.strip().splitlines()) == 1
        assert "sk-cli-secret" not in result.stderr
        assert denied.requests[0][1].get("Authorization") == "Bearer sk-cli-secret"
    finally:
        denied.close()


def test_what_needs_the_local_engine_is_refused_with_remote(server: FakeServer) -> None:
    result = llmtui("run", "--remote", server.url, "-p", "hi", "--spec-type", "ngram-simple")
    assert result.returncode == 1 and "--spec-type needs the local engine" in result.stderr
    unknown = llmtui("run", "--remote", server.url, "-m", "not-served", "-p", "hi")
    assert unknown.returncode == 1 and "does not serve 'not-served'" in unknown.stderr
