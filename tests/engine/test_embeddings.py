"""Embeddings and rerank scores from the engine (engine_ext/embedding.py) on the tiny embedder and reranker, and
`llmtui serve`'s POST /v1/embeddings (the official `openai` client) and /v1/rerank."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from engine_ext.client import EngineClient, EngineFailure
from tests.engine.test_cli import ROOT
from tests.engine.test_serve_limits import hermetic_env
from tests.serve_process import free_port, running_serve
from tests.tiny_models import write_tiny_embedder

TEXTS = ["the cat sat on the mat", "a quarterly report on grain prices", "the cat sat on the mat", "x"]
DOCS = ["cats sleep most of the day", "the bank raised its rates", "grain prices fell", "cats and dogs"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("embedders")
    return {
        "embed": write_tiny_embedder(folder / "tiny-embedder.gguf"),
        "rank": write_tiny_embedder(folder / "tiny-reranker.gguf", rerank=True),
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    with EngineClient(tmp_path_factory.mktemp("embed-log") / "engine.log") as client:
        client.start()
        yield client


def cosine(a: tuple[float, ...] | list[float], b: tuple[float, ...] | list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_pooled_embeddings_are_unit_vectors_and_a_text_gets_the_same_vector_alone_or_in_a_batch(
    engine: EngineClient, models: dict[str, Path]
) -> None:
    engine.load(models["embed"])
    batch = engine.embed(TEXTS)
    assert batch.pooling == "mean" and len(batch.vectors) == 4 and all(len(v) == 64 for v in batch.vectors)
    assert all(abs(math.hypot(*v) - 1.0) < 1e-4 for v in batch.vectors)
    assert batch.vectors[0] == batch.vectors[2] and cosine(batch.vectors[0], batch.vectors[1]) < 0.999
    for text, vector in zip(TEXTS, batch.vectors, strict=True):
        assert cosine(engine.embed([text]).vectors[0], vector) > 0.9999
    raw = engine.embed(TEXTS[:1], normalize=False).vectors[0]
    assert abs(math.hypot(*raw) - 1.0) > 1e-3 and cosine(raw, batch.vectors[0]) > 0.9999
    with pytest.raises(EngineFailure, match="does not rerank"):
        engine.embed(DOCS, query="cats")
    with pytest.raises(EngineFailure, match="input 0 has .* tokens; this model embeds at most"):
        engine.embed(["word " * 9000])
    assert engine.embed(["still serving"]).n_tokens > 0


def test_a_reranker_scores_each_document_the_same_alone_or_in_a_batch_and_refuses_to_embed(
    engine: EngineClient, models: dict[str, Path]
) -> None:
    engine.load(models["rank"])
    scores = [v[0] for v in engine.embed(DOCS, query="what do cats do").vectors]
    assert engine.embed(DOCS, query="what do cats do").pooling == "rank"
    assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) == len(scores)
    alone = [engine.embed([doc], query="what do cats do").vectors[0][0] for doc in DOCS]
    assert alone == pytest.approx(scores, abs=1e-4)  # a batch sums in another order: close, not equal
    assert engine.embed(DOCS[:1], query="another question").vectors[0][0] != pytest.approx(scores[0], abs=1e-6)
    with pytest.raises(EngineFailure, match="reranker"):
        engine.embed(DOCS)


def test_serve_answers_the_openai_sdk_embeddings_and_rerank_in_llama_servers_shape(
    models: dict[str, Path], engine: EngineClient, tmp_path: Path
) -> None:
    engine.load(models["embed"])
    expected = engine.embed(TEXTS).vectors
    engine.load(models["rank"])
    expected_scores = [v[0] for v in engine.embed(DOCS, query="cats").vectors]
    env = hermetic_env(tmp_path)
    port = free_port()
    with running_serve(["-m", str(models["embed"]), "--port", str(port)], env, port) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        answer = client.embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64
        assert [d.index for d in answer.data] == [0, 1, 2, 3] and answer.usage.prompt_tokens > 0
        for got, want in zip(answer.data, expected, strict=True):
            assert got.embedding == pytest.approx(list(want), abs=1e-6)
        floats = client.embeddings.create(model="tiny", input="the cat sat on the mat", encoding_format="float")
        assert floats.data[0].embedding == pytest.approx(list(expected[0]), abs=1e-6)
        with pytest.raises(openai.BadRequestError, match="input must be a string"):
            client.embeddings.create(model="tiny", input=[])
        refused = httpx.post(f"{base}/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=30)
        assert refused.status_code == 501 and "reranker" in refused.json()["error"]["message"]
    port = free_port()
    with running_serve(["-m", str(models["rank"]), "--port", str(port)], env, port) as base:
        body = {"query": "cats", "documents": DOCS, "top_n": 3, "return_text": True}
        ranked = httpx.post(f"{base}/v1/rerank", json=body, timeout=30).json()
        order = sorted(range(len(DOCS)), key=lambda i: -expected_scores[i])[:3]
        assert [r["index"] for r in ranked["results"]] == order
        assert [r["text"] for r in ranked["results"]] == [DOCS[i] for i in order]
        assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx(
            [expected_scores[i] for i in order], abs=1e-5
        )
        refused = httpx.post(f"{base}/v1/embeddings", json={"input": "x"}, timeout=30)
        assert refused.status_code == 501


def test_serve_without_m_embeds_and_reranks_with_the_model_each_request_names(
    models: dict[str, Path], engine: EngineClient, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """`llmtui serve` (every local model, the router): an embedding model embeds and a reranker reranks by itself,
    a chat model embeds with --embeddings; each route answers for the model the request names."""
    engine.load(models["embed"])
    expected = engine.embed(TEXTS[:2]).vectors
    folder = tmp_path / "models"
    folder.mkdir()
    for name, source in (("embedder", models["embed"]), ("reranker", models["rank"]), ("chat", tiny_models["llama"])):
        (folder / f"tiny-{name}.gguf").symlink_to(source)
    env = hermetic_env(tmp_path)
    refused = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--models-dir", str(folder), "--embeddings", "--parallel", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "--parallel 1" in refused.stderr and refused.stderr.count("\n") == 1
    port = free_port()
    with running_serve(["--models-dir", str(folder), "--embeddings", "--port", str(port)], env, port) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
        answer = client.embeddings.create(model="tiny-embedder.gguf", input=TEXTS[:2])
        assert answer.model.startswith("tiny-embedder")
        for got, want in zip(answer.data, expected, strict=True):
            assert got.embedding == pytest.approx(list(want), abs=1e-6)
        chat = client.embeddings.create(model="tiny-chat.gguf", input="the cat sat on the mat", encoding_format="float")
        assert len(chat.data[0].embedding) == 64
        body = {"model": "tiny-reranker.gguf", "query": "cats", "documents": DOCS, "top_n": 2}
        ranked = httpx.post(f"{base}/v1/rerank", json=body, timeout=120)
        assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2
        wrong = httpx.post(f"{base}/v1/rerank", json={**body, "model": "tiny-embedder.gguf"}, timeout=120)
        assert wrong.status_code == 501 and "reranker" in wrong.json()["error"]["message"]
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="no-such-model", input="x")
