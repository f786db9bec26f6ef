"""A coding agent's loop against `llmtui serve`: what a session of Claude Code, Codex or OpenCode costs per turn.

    .venv/bin/python scripts/bench_agents.py [-m starter] [-c 32768] [-t 2] [--system-tokens 20000] [--turns 10]

- the loop: a system prompt of about --system-tokens tokens with tools, --turns turns through /v1/messages (each
  turn the conversation so far, a new user message, and Claude Code's billing line with a new nonce, as it sends
  it): per turn the prompt tokens, those read from the cache and those evaluated, and the turn's time (its prompt
  read and a reply of at most 16 tokens); the prefix read from the cache on turns 2 and later (goal ≥ 99%) and
  their time against turn 1's;
- decode speed: the same greedy request through /v1/chat/completions, /v1/messages and /v1/responses, streamed,
  tokens after the first over the time from the first to the last, in alternating rounds: each ÷ chat
  completions' (goal ≥ 0.97).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "repository module function class test build commit branch merge review file folder path import return value "
    "error message config option flag server client request response token model context cache prompt tool call"
).split()
TOOL_NAMES = ("Read", "Write", "Edit", "Bash", "Grep", "Glob", "WebFetch", "TodoWrite", "Task", "NotebookEdit")
DECODE_PROMPT = "Write a long story about a lighthouse keeper and the sea."


def system_text(n_words: int) -> str:
    """Instructions of about `n_words` words (a fixed pseudo-random text: the same prefix every turn)."""
    lines, word = [], 7
    for i in range(0, n_words, 12):
        sentence = []
        for _ in range(12):
            word = (word * 1103515245 + 12345) % (2**31)
            sentence.append(WORDS[word % len(WORDS)])
        lines.append(f"{i // 12 + 1}. " + " ".join(sentence).capitalize() + ".")
    return "You are a coding agent. Follow these rules.\n" + "\n".join(lines)


def tools() -> list[dict[str, object]]:
    return [
        {
            "name": name,
            "description": f"The {name} tool: " + " ".join(WORDS[i % len(WORDS)] for i in range(40)),
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "an absolute path"},
                    "text": {"type": "string", "description": "what to write or look for"},
                    "limit": {"type": "integer", "description": "at most this many lines"},
                },
                "required": ["path"],
            },
        }
        for name in TOOL_NAMES
    ]


def billing_system(text: str) -> list[dict[str, str]]:
    nonce = secrets.token_hex(3)
    billing = f"x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch={nonce};"
    return [{"type": "text", "text": billing}, {"type": "text", "text": text}]


def sse(response: httpx.Response) -> Iterator[tuple[float, dict[str, Any]]]:
    """(arrival time, data) of each server-sent event."""
    for line in response.iter_lines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            yield time.perf_counter(), json.loads(line[6:])


def streamed(http: httpx.Client, url: str, body: dict[str, object]) -> tuple[list[float], dict[str, Any], str]:
    """Times of the events that carried some of the reply (text, thinking or a tool call), the last event with
    usage, and the reply's text."""
    times: list[float] = []
    usage: dict[str, Any] = {}
    text: list[str] = []
    with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url}: {response.status_code} {response.read().decode()[:300]}")
        for at, event in sse(response):
            piece, made = "", False  # the text it adds; whether it carried any reply (text, thinking, a tool call)
            kind = event.get("type")
            if kind == "content_block_delta":
                delta = event["delta"]
                piece = delta.get("text", "")
                made = bool(piece or delta.get("partial_json") or delta.get("thinking"))
            elif kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
                piece = str(event.get("delta", "")) if kind == "response.output_text.delta" else ""
                made = bool(event.get("delta"))
            elif event.get("choices"):
                delta = event["choices"][0]["delta"]
                piece = delta.get("content") or ""
                made = bool(piece or delta.get("tool_calls") or delta.get("reasoning_content"))
            if made or kind in ("content_block_start", "response.output_item.added"):  # a tool call opens a block
                times.append(at)
            text.append(piece)
            for key in ("usage", "message", "response"):
                found = event.get(key)
                if isinstance(found, dict) and ("usage" in found or key == "usage"):
                    usage = found.get("usage", found)
            if kind == "message_delta":
                usage = {**usage, **event["usage"]}
    return times, usage, "".join(text)


def agent_loop(http: httpx.Client, base: str, model: str, n_words: int, turns: int) -> list[tuple[int, int, float]]:
    """Per turn: (prompt tokens, read from the cache, the turn's time in ms: its prompt read and a 16-token reply)."""
    text = system_text(n_words)
    messages: list[dict[str, object]] = []
    rows = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": f"Step {turn}: look at file {turn}.py and say what to change."})
        body = {
            "model": model,
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "system": billing_system(text),
            "tools": tools(),
            "messages": messages,
        }
        sent = time.perf_counter()
        _, usage, reply = streamed(http, f"{base}/v1/messages", body)
        # The whole turn, its reply at most 16 tokens: with tools, a small model's reply in llama.cpp's generic
        # format is JSON held back until it parses, so the first token shows no earlier than the end.
        took_ms = (time.perf_counter() - sent) * 1000
        cached, fresh = int(usage.get("cache_read_input_tokens", 0)), int(usage.get("input_tokens", 0))
        rows.append((cached + fresh, cached, took_ms))
        messages.append({"role": "assistant", "content": reply or "(nothing)"})
    return rows


def decode_round(http: httpx.Client, base: str, model: str, n_gen: int) -> dict[str, float]:
    """Decode tok/s of the same greedy request through each route, as the client sees it."""
    ask = [{"role": "user", "content": DECODE_PROMPT}]
    routes: dict[str, tuple[str, dict[str, object]]] = {
        "chat": (
            "/v1/chat/completions",
            {"messages": ask, "max_tokens": n_gen, "stream_options": {"include_usage": True}},
        ),
        "messages": ("/v1/messages", {"messages": ask, "max_tokens": n_gen}),
        "responses": ("/v1/responses", {"input": DECODE_PROMPT, "max_output_tokens": n_gen}),
    }
    out = {}
    for name, (path, extra) in routes.items():
        times, usage, _ = streamed(http, base + path, {"model": model, "temperature": 0, "stream": True, **extra})
        tokens = int(usage.get("output_tokens") or usage.get("completion_tokens") or 0)
        out[name] = (tokens - 1) / (times[-1] - times[0]) if len(times) > 1 and tokens > 1 else float("nan")
    return out


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "app",
        "serve",
        "-m",
        args.model,
        "-c",
        str(args.ctx_size),
        "-t",
        str(args.threads),
    ]
    server = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=ROOT,
        env=dict(os.environ, LLMTUI_ADAPTIVE_THREADS="off"),
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit("llmtui serve did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="starter")
    parser.add_argument("-c", "--ctx-size", type=int, default=32768)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--system-tokens", type=int, default=20000, help="about this many tokens of system prompt")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("-n", "--n-gen", type=int, default=128, help="tokens per decode-speed request")
    parser.add_argument("-r", "--rounds", type=int, default=3, help="decode-speed rounds")
    args = parser.parse_args()
    server, base = start_server(args)
    try:
        http = httpx.Client(timeout=1800)
        model = http.get(f"{base}/v1/models").json()["data"][0]["id"]
        # Words to tokens for this model's tokenizer: one count, then the text sized to the target.
        probe = {"model": model, "system": system_text(1000), "messages": [{"role": "user", "content": "hi"}]}
        per_word = http.post(f"{base}/v1/messages/count_tokens", json=probe).json()["input_tokens"] / 1000
        n_words = int(args.system_tokens / per_word)
        rows = agent_loop(http, base, model, n_words, args.turns)
        rounds = [decode_round(http, base, model, args.n_gen) for _ in range(args.rounds)]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    print(f"model {args.model}, context {args.ctx_size}, {args.threads} threads; /v1/messages, billing line per turn")
    print(f"{'turn':>4}{'prompt':>9}{'cached':>9}{'evaluated':>11}{'cached %':>10}{'turn ms':>10}")
    for turn, (prompt, cached, took_ms) in enumerate(rows, 1):
        print(f"{turn:4}{prompt:9}{cached:9}{prompt - cached:11}{100 * cached / prompt:10.2f}{took_ms:10.0f}")
    later = rows[1:]
    if later:
        worst = min(cached / prompt for prompt, cached, _ in later)
        ratio = statistics.median(took for *_, took in later) / rows[0][2]
        print(f"turns 2-{len(rows)}: at least {100 * worst:.2f}% of the prompt read from the cache (goal ≥ 99%)")
        print(f"turns 2-{len(rows)}: median time of a turn (prompt and a 16-token reply) ÷ turn 1's: {ratio:.3f}")
    chat = statistics.median(r["chat"] for r in rounds)
    print(f"decode, {args.n_gen} tokens, median of {args.rounds} rounds (tok/s as the client sees it, ÷ chat):")
    for name in ("chat", "messages", "responses"):
        speed = statistics.median(r[name] for r in rounds)
        print(f"  {name:10}{speed:8.1f}{speed / chat:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
