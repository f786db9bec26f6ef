"""`llmtui serve --parallel 2 --spec-type draft-eagle3` (and draft-dspark) on the tiny llama and its tiny draft: each
request drafts on its own draft sequence, its answer equal to the same request without drafting, alone or beside other
requests, with its own acceptance figures in its timings; MTP is still refused with 400, saying what is allowed."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.engine.test_serve_limits import hermetic_env
from tests.serve_process import free_port, running_serve

PLAIN = {"speculative": {"type": "none"}}
PROMPTS = ("word1 word2 word3", "a b c d e f g")


@pytest.fixture(scope="module", params=[("draft-eagle3", "eagle3"), ("draft-dspark", "dspark")])
def server(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(the server's base URL, its --spec-type)."""
    spec_type, kind = request.param
    root = tmp_path_factory.mktemp("serve-parallel-layer")
    port = free_port()
    args = ["-m", str(tiny_models["llama"]), "-t", "1", "-c", "512", "--temp", "0", "--port", str(port)]
    args += ["--parallel", "2", "--spec-type", spec_type, "--spec-draft-model", str(tiny_models[kind])]
    args += ["--spec-draft-n-max", "3"]
    with running_serve(args, hermetic_env(root), port) as base:
        yield base, spec_type


def complete(base: str, prompt: str, extra: dict[str, Any] | None = None) -> tuple[list[str], dict[str, Any]]:
    """The completion's text (its choices) and timings; the server's draft-eagle3 unless `extra` says otherwise."""
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, **(extra or {})}
    answer = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    return [c["text"] for c in reply["choices"]], reply.get("timings", {})


def test_each_request_drafts_and_answers_as_plain_decoding_alone_and_together(server: tuple[str, str]) -> None:
    server, spec_type = server
    plain = [complete(server, p, PLAIN)[0] for p in PROMPTS]
    text, timings = complete(server, PROMPTS[0])
    assert text == plain[0]
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0 and timings["draft_n"] > 0
    assert [d["name"] for d in timings["speculative"]["drafters"]] == [spec_type]
    asks = [(PROMPTS[0], None), (PROMPTS[1], PLAIN), (PROMPTS[1], None)]
    with ThreadPoolExecutor(3) as pool:  # two drafted requests and a plain one at once
        together = list(pool.map(lambda ask: complete(server, *ask), asks))
    assert [t for t, _ in together] == [plain[0], plain[1], plain[1]]
    assert together[0][1]["draft_n"] > 0 and together[2][1]["draft_n"] > 0 and "draft_n" not in together[1][1]


def test_a_type_the_server_lacks_is_its_rule_not_parallels(server: tuple[str, str]) -> None:
    """auto (or another model drafter) per request needs it loaded at the start, as with --parallel 1: the 400 says
    that, nothing about --parallel."""
    server, _ = server
    body = {"prompt": PROMPTS[0], "max_tokens": 4, "speculative": {"type": "auto"}}
    answer = httpx.post(f"{server}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400 and "needs its draft loaded when the server starts" in answer.text
    assert "--parallel" not in answer.text
