"""Engine tests through the worker process and client, on tiny random-weight models."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.params import GREEDY, ContextParams, ModelParams
from engine_ext.protocol import ChatMessage, Crashed, Event, Failed, Finished, Generate, TokenChunk
from tests.tiny_models import write_tiny_model

LOADABLE_KINDS = ("llama", "qwen3", "qwen35", "qwen35_mtp", "qwen3next", "nemotron_h_moe", "nemotron_h_moe_mtp")
SMALL_CTX = ContextParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    log = tmp_path_factory.mktemp("engine-log") / "engine.log"
    client = EngineClient(log)
    client.start()
    yield client
    client.close()


def run_to_end(client: EngineClient, request: Generate) -> tuple[str, str, list[int], Finished]:
    text, reasoning, ids = [], [], []
    for event in client.generate(request):
        if isinstance(event, TokenChunk):
            text.append(event.text)
            reasoning.append(event.reasoning)
            ids.extend(event.token_ids)
        elif isinstance(event, Finished):
            return "".join(text), "".join(reasoning), ids, event
        elif isinstance(event, Failed):
            raise EngineFailure(event)
        elif isinstance(event, Crashed):
            raise EngineCrashedError(event)
    raise AssertionError("generation ended without Finished")


def chat(client: EngineClient, *messages: tuple[str, str], max_tokens: int = 16) -> Generate:
    return Generate(
        request_id=client.new_request_id(),
        messages=tuple(ChatMessage(r, c) for r, c in messages),
        sampling=GREEDY,
        max_tokens=max_tokens,
    )


@pytest.mark.parametrize("kind", LOADABLE_KINDS)
def test_tiny_model_generates_deterministically(engine: EngineClient, tiny_models: dict[str, Path], kind: str) -> None:
    info = engine.load(tiny_models[kind], ModelParams(load_mtp=kind.endswith("_mtp")), SMALL_CTX)
    assert info.n_ctx == 512
    request = Generate(request_id=0, prompt="Hello there, tiny model", sampling=GREEDY, max_tokens=12, ignore_eos=True)
    _, _, first, done = run_to_end(engine, request)
    assert len(first) == 12 and done.stop_reason == "max_tokens"
    # Same prompt again (served from the prompt cache) and after a reload (fresh context): same tokens.
    _, _, again, _ = run_to_end(engine, request)
    engine.load(tiny_models[kind], ModelParams(load_mtp=kind.endswith("_mtp")), SMALL_CTX)
    _, _, reloaded, done = run_to_end(engine, request)
    assert first == again == reloaded
    assert done.stats.prompt_tokens_cached == 0


@pytest.mark.parametrize("kind", ["llama", "qwen35", "qwen3next", "nemotron_h_moe"])
def test_second_turn_evaluates_only_new_tokens(engine: EngineClient, tiny_models: dict[str, Path], kind: str) -> None:
    engine.load(tiny_models[kind], ModelParams(), SMALL_CTX)
    first_turn = (("system", "You are terse."), ("user", "Say something."))
    reply, _, _, first = run_to_end(engine, chat(engine, *first_turn))
    second = (*first_turn, ("assistant", reply), ("user", "And again."))
    _, _, _, done = run_to_end(engine, chat(engine, *second))
    stats = done.stats
    assert stats.prompt_tokens > first.stats.prompt_tokens
    assert stats.prompt_tokens_cached >= first.stats.prompt_tokens
    # Only the tail after the previous turn (end of reply, the new user message, the generation prompt).
    assert stats.prompt_tokens_evaluated <= stats.prompt_tokens - first.stats.prompt_tokens + 2
    # Regenerate the same turn: one token evaluated (a checkpoint sits just before the last prompt token).
    _, _, _, regen = run_to_end(engine, chat(engine, *second))
    assert regen.stats.prompt_tokens_evaluated == 1


def test_edit_earlier_message_reuses_checkpoint_on_hybrid(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    engine.load(tiny_models["qwen35"], ModelParams(), SMALL_CTX)
    base = (("system", "A long enough system prompt that we want to keep cached."), ("user", "First question"))
    reply, _, _, first = run_to_end(engine, chat(engine, *base))
    run_to_end(engine, chat(engine, *base, ("assistant", reply), ("user", "Second question")))
    # Edit the second question: the state at the end of the first reply is restored, not the whole prompt.
    _, _, _, edited = run_to_end(engine, chat(engine, *base, ("assistant", reply), ("user", "Other question")))
    assert edited.stats.prompt_tokens_cached >= first.stats.prompt_tokens


def test_cancel_stops_within_one_step(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    engine.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
    request = Generate(
        request_id=engine.new_request_id(), prompt="Go on forever", sampling=GREEDY, max_tokens=-1, ignore_eos=True
    )
    seen = 0
    cancelled_at: int | None = None
    finished: Finished | None = None
    for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            seen += len(event.token_ids)
            if cancelled_at is None:
                engine.cancel(request.request_id)
                cancelled_at = seen
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None and finished.stop_reason == "cancelled"
    assert cancelled_at is not None
    # Tokens already in flight when the cancel was sent, plus at most one more decode step.
    assert finished.stats.generated_tokens < 400


def test_context_full_stops_cleanly(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=64, n_batch=64, n_threads=2))
        request = Generate(request_id=1, prompt="fill it up", sampling=GREEDY, max_tokens=-1, ignore_eos=True)
        _, _, ids, done = run_to_end(client, request)
        assert done.stop_reason == "context_full"
        assert done.stats.n_ctx_used == done.stats.n_ctx  # llama.cpp rounds small contexts up to 256
        assert any("context is full" in n for n in done.notices)


def test_long_conversation_drops_oldest_turns_keeps_system(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    engine.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=256, n_batch=256, n_threads=2))
    turns: list[tuple[str, str]] = [("system", "SYSTEM PROMPT STAYS")]
    for i in range(12):
        turns += [("user", f"question number {i} " + "x" * 30), ("assistant", f"answer {i} " + "y" * 30)]
    turns.append(("user", "final question"))
    _, _, _, done = run_to_end(engine, chat(engine, *turns, max_tokens=8))
    assert done.stats.dropped_messages > 0
    assert done.stats.prompt_tokens <= 256
    assert any("dropped" in n for n in done.notices)


def test_prompt_longer_than_context_is_refused(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    info = engine.load(tiny_models["llama"], ModelParams(), ContextParams(n_ctx=256, n_batch=256, n_threads=2))
    request = Generate(request_id=engine.new_request_id(), prompt="z" * 2000, sampling=GREEDY, max_tokens=4)
    events = list(engine.generate(request))
    assert isinstance(events[-1], Failed)
    assert f"context holds {info.n_ctx}" in events[-1].message
    # The worker is still serving.
    _, _, ids, _ = run_to_end(
        engine, Generate(request_id=engine.new_request_id(), prompt="ok", sampling=GREEDY, max_tokens=2)
    )


def test_streamed_text_is_valid_utf8_and_matches_tokens(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    # Random weights over a byte-level vocabulary emit arbitrary bytes, including split multi-byte characters.
    engine.load(tiny_models["qwen3"], ModelParams(), SMALL_CTX)
    request = Generate(
        request_id=engine.new_request_id(), prompt="héllo ✓ 😀", sampling=GREEDY, max_tokens=64, ignore_eos=True
    )
    chunks: list[str] = []
    for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            chunks.append(event.text)
            event.text.encode("utf-8")  # never a lone surrogate or broken character
    assert "".join(chunks)


def test_worker_killed_mid_generation_reports_crash_and_restarts(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    client = EngineClient(tmp_path / "engine.log")
    client.start()
    try:
        client.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
        request = Generate(request_id=1, prompt="long", sampling=GREEDY, max_tokens=-1, ignore_eos=True)
        events: list[Event] = []
        for event in client.generate(request):
            events.append(event)
            if isinstance(event, TokenChunk) and sum(isinstance(e, TokenChunk) for e in events) == 1:
                assert client.pid is not None
                os.kill(client.pid, signal.SIGKILL)
        crashed = events[-1]
        assert isinstance(crashed, Crashed)
        assert crashed.exit_code == -signal.SIGKILL
        assert "SIGKILL" in crashed.description
        assert "llama" in crashed.log_tail  # llama.cpp's own log lines from the loaded model
        assert not client.alive
        client.start()
        client.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
        _, _, ids, _ = run_to_end(
            client, Generate(request_id=2, prompt="again", sampling=GREEDY, max_tokens=3, ignore_eos=True)
        )
        assert len(ids) == 3
    finally:
        client.close()


def test_native_abort_becomes_crash_event(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    # SIGABRT is what GGML_ABORT raises; the worker dies, the client stays up.
    client = EngineClient(tmp_path / "engine.log")
    client.start()
    try:
        assert client.pid is not None
        os.kill(client.pid, signal.SIGABRT)
        with pytest.raises(EngineCrashedError) as info:
            client.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
        assert "SIGABRT" in str(info.value)
    finally:
        client.close()


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "empty"),
        (b"this is not a model at all, just text" * 10, "not a GGUF"),
    ],
)
def test_garbage_files_are_refused_clearly(engine: EngineClient, tmp_path: Path, content: bytes, expected: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(EngineFailure) as info:
        engine.load(bad, ModelParams(), SMALL_CTX)
    assert str(bad) in str(info.value) or bad.name in str(info.value)
    assert expected.lower() in str(info.value).lower()


def test_truncated_model_is_refused_clearly(engine: EngineClient, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    data = tiny_models["llama"].read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(EngineFailure) as info:
        engine.load(truncated, ModelParams(), SMALL_CTX)
    assert "truncated" in str(info.value).lower()
    # The worker survives and loads a good model afterwards.
    engine.load(tiny_models["llama"], ModelParams(), SMALL_CTX)


def test_missing_file_is_refused(engine: EngineClient, tmp_path: Path) -> None:
    with pytest.raises(EngineFailure, match="not found"):
        engine.load(tmp_path / "nope.gguf", ModelParams(), SMALL_CTX)


def test_bad_context_settings_are_refused(engine: EngineClient, tiny_models: dict[str, Path]) -> None:
    with pytest.raises(EngineFailure, match="KV cache type"):
        engine.load(tiny_models["llama"], ModelParams(), ContextParams(type_k="q9_9"))


def test_sandbox_escape_template_is_refused_not_executed(engine: EngineClient, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    payload = (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}"
        "{{ cycler.__init__.__globals__.os.system('touch " + str(canary) + "') }}"
    )
    evil = write_tiny_model("llama", tmp_path / "evil.gguf", chat_template=payload)
    engine.load(evil, ModelParams(), SMALL_CTX)
    events = list(engine.generate(chat(engine, ("user", "hi"))))
    failed = events[-1]
    assert isinstance(failed, Failed) and failed.error == "ChatTemplateError"
    assert "refused" in failed.message.lower()
    assert not canary.exists()


def test_model_without_template_uses_chatml(engine: EngineClient, tmp_path: Path) -> None:
    bare = write_tiny_model("llama", tmp_path / "bare.gguf", chat_template=None)
    info = engine.load(bare, ModelParams(), SMALL_CTX)
    assert not info.has_chat_template
    _, _, ids, done = run_to_end(engine, chat(engine, ("user", "hi")))
    assert done.stats.prompt_tokens > 5 and ids


def test_reasoning_streams_apart_from_answer(engine: EngineClient, tmp_path: Path) -> None:
    # A Qwen3-style template that opens the reasoning block in the generation prompt.
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    thinker = write_tiny_model("qwen3", tmp_path / "thinker.gguf", chat_template=template)
    engine.load(thinker, ModelParams(), SMALL_CTX)
    request = Generate(
        request_id=engine.new_request_id(),
        messages=(ChatMessage("user", "think"),),
        sampling=GREEDY,
        max_tokens=24,
        ignore_eos=True,
    )
    text, reasoning, ids, _ = run_to_end(engine, request)
    assert reasoning  # the reply starts inside <think>
    assert "<think>" not in text + reasoning and "</think>" not in text + reasoning


def test_engine_log_keeps_info_warnings_and_errors_not_debug(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp's log goes to the engine log by its real levels (llama-cpp-python 0.3.36 maps them by an old enum:
    every debug line in, every error out)."""
    log = tmp_path / "engine.log"
    with EngineClient(log) as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), SMALL_CTX)
    text = log.read_text()
    assert "llama_model_loader: loaded meta data" in text  # INFO
    assert "llama_graph_n_input_tensors" not in text and "reserving full memory module" not in text  # DEBUG


def test_llama_log_callback_filters_by_ggml_level(capsys: pytest.CaptureFixture[str]) -> None:
    from engine_ext import bindings

    bindings.log_llama_to_stderr(bindings.GGML_LOG_LEVEL_INFO)
    try:
        callback = bindings._log_callbacks[0]
        for level, text in [
            (1, b"debug "),
            (5, b"debug-cont\n"),
            (2, b"info "),
            (5, b"info-cont\n"),
            (3, b"warn\n"),
            (4, b"error\n"),
            (1, b"debug2\n"),
        ]:
            callback(level, text, None)
        assert capsys.readouterr().err == "info info-cont\nwarn\nerror\n"
    finally:
        bindings.log_llama_to_stderr(bindings.GGML_LOG_LEVEL_WARN)  # as the test session has it (conftest)
