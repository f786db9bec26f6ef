"""`llmtui serve --parallel 2 --spec-type draft-mtp` on the tiny qwen35 model with an MTP head (a hybrid target):
each request drafts with the head on its own MTP sequence, its answer equal to the same request without drafting,
alone or beside other requests; its own drafting figures in its timings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.serve_process import free_port, running_serve

KEY = "test-key-mtp"
PROMPTS = ("word1 word2 word3", "go")


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("serve-parallel-mtp")
    home = root / "home"
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        LLMTUI_CONFIG_DIR=str(root / "config"),
        LLMTUI_DATA_DIR=str(root / "data"),
        HF_HOME=str(root / "hf"),
        LLMTUI_ADAPTIVE_THREADS="off",
        SERVE_TEST_KEY=KEY,
    )
    port = free_port()
    args = ["-m", str(tiny_models["qwen35_mtp"]), "-t", "2", "--port", str(port), "--api-key-env", "SERVE_TEST_KEY"]
    args += ["--temp", "0", "-c", "1024", "--parallel", "2", "--spec-type", "draft-mtp", "--spec-draft-n-max", "4"]
    with running_serve(args, env, port) as base:
        yield base


def complete(base: str, prompt: str, speculative: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """A raw completion's text (32 tokens, whatever the model says) and its timings."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    if speculative is not None:
        body["speculative"] = speculative
    headers = {"Authorization": f"Bearer {KEY}"}
    reply = httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    return answer["choices"][0]["text"], answer["timings"]


def test_mtp_per_request_answers_as_plain_decoding_alone_and_together(server: str) -> None:
    plain = [complete(server, p, {"type": "none"})[0] for p in PROMPTS]
    assert all(plain) and plain[0] != plain[1]
    tokens, timings = complete(server, PROMPTS[0])
    assert tokens == plain[0]
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0 and timings["draft_n"] > 0
    assert [d["name"] for d in timings["speculative"]["drafters"]] == ["draft-mtp"]
    with ThreadPoolExecutor(3) as pool:  # two drafting requests beside a plain one
        asks = [(PROMPTS[0], None), (PROMPTS[1], {"type": "none"}), (PROMPTS[1], None)]
        together = list(pool.map(lambda a: complete(server, *a), asks))
    assert [t for t, _ in together] == [plain[0], plain[1], plain[1]]
    assert together[0][1]["draft_n"] > 0 and together[2][1]["draft_n"] > 0 and "draft_n" not in together[1][1]
