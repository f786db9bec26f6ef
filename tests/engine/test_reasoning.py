"""Reasoning under the user's control on a tiny model with a thinking template: the budget forces the end of thinking
after exactly N thinking tokens and the model answers, "stop thinking now" forces it at the next token, forced tokens
are marked, and greedy output with speculation equals greedy output without it, budget included."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine_ext.client import EngineClient
from engine_ext.generate import Session
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams
from engine_ext.protocol import FORCED, ChatMessage, Event, Failed, Finished, Generate, PromptEvaluated, TokenChunk
from tests.engine.test_cli import llmtui
from tests.engine.test_parallel import Run, open_session
from tests.engine.test_speculative import session_for
from tests.tiny_models import write_tiny_model

# Qwen3-style: the generation prompt opens <think> unless enable_thinking is false (then it closes it at once), and an
# assistant turn's reasoning_content is written before its answer.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content is defined %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)
THINKING_END = "\n</think>\n\n"
LONG_THINKER = "why not"  # a prompt this model (greedy) does not end its thinking on within 1000 tokens
PROMPTS = ("think about it", "why is the sky blue? why? why?", "abc abc abc abc")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(
        "qwen3", tmp_path_factory.mktemp("thinker") / "thinker.gguf", chat_template=THINKING_TEMPLATE
    )


def ask(prompt: str, n: int = 40, **reasoning: object) -> Generate:
    return Generate(
        1,
        (ChatMessage("user", prompt),),
        sampling=GREEDY,
        max_tokens=n,
        ignore_eos=True,
        **reasoning,  # type: ignore[arg-type]
    )


def run(session: Session, request: Generate, on_chunk: object = None) -> tuple[list[int], list[str], str, str]:
    chunks: list[TokenChunk] = []

    def emit(event: Event) -> None:
        if isinstance(event, TokenChunk):
            chunks.append(event)
            if callable(on_chunk):
                on_chunk(session, chunks)

    session.generate(request, emit, lambda: False)
    ids = [t for c in chunks for t in c.token_ids]
    sources = [s for c in chunks for s in c.provenance]
    return ids, sources, "".join(c.reasoning for c in chunks), "".join(c.text for c in chunks)


def complete_at(session: Session, ids: list[int], n: int) -> int:
    """Tokens up to the first complete UTF-8 character at or after the n-th (the budget waits for one)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i, token in enumerate(ids):
        decoder.decode(session.model.token_piece(token))
        if i + 1 >= n and not decoder.getstate()[0]:
            return i + 1
    raise AssertionError("the reply never completed a character")


@pytest.mark.parametrize("budget", [1, 5, 12])
def test_the_budget_forces_the_end_of_thinking_after_n_tokens_and_the_model_answers(thinker: Path, budget: int) -> None:
    with session_for(thinker) as session:
        free_ids, _, free_reasoning, _ = run(session, ask(PROMPTS[0]))
        assert b"</think>" not in b"".join(
            map(session.model.token_piece, free_ids)
        )  # this model thinks on unless told (can fail)
        ids, sources, reasoning, answer = run(session, ask(PROMPTS[0], reasoning_budget=budget))
        forced = session.model.tokenize(THINKING_END, add_special=False, parse_special=True)
    n_thinking = complete_at(session, free_ids, budget)
    assert ids[:n_thinking] == free_ids[:n_thinking] and sources[:n_thinking] == ["target"] * n_thinking
    assert ids[n_thinking : n_thinking + len(forced)] == forced
    assert sources[n_thinking : n_thinking + len(forced)] == [FORCED] * len(forced)
    assert set(sources[n_thinking + len(forced) :]) == {"target"} and len(ids) == 40  # then the model answers
    assert reasoning and free_reasoning.startswith(reasoning.rstrip("\n")) and answer.strip()


def test_the_thinking_tokens_and_time_are_in_the_replys_stats(thinker: Path) -> None:
    with session_for(thinker) as session:
        budgeted = session.generate(ask(PROMPTS[2], reasoning_budget=7), lambda e: None, lambda: False)
        raw = session.generate(Generate(1, prompt="<think>", max_tokens=8), lambda e: None, lambda: False)
    assert budgeted.stats.reasoning_tokens == 7 and budgeted.stats.reasoning_ms > 0
    assert budgeted.stats.to_dict()["reasoning_tokens"] == 7
    assert raw.stats.reasoning_tokens == 0  # a raw prompt has no thinking block


def test_the_budget_message_is_forced_before_the_end_of_thinking(thinker: Path) -> None:
    with session_for(thinker) as session:
        ids, sources, reasoning, _ = run(
            session, ask(PROMPTS[1], reasoning_budget=3, reasoning_budget_message=" Done.")
        )
        forced = session.model.tokenize(" Done." + THINKING_END, add_special=False, parse_special=True)
    start = sources.index(FORCED)
    assert ids[start : start + len(forced)] == forced and sources.count(FORCED) == len(forced)
    assert reasoning.endswith(" Done.\n")


def test_a_budget_of_zero_closes_thinking_in_the_prompt_or_forces_it_at_once(thinker: Path) -> None:
    with session_for(thinker) as session:
        plan = session.plan(ask(PROMPTS[0], reasoning_budget=0))
        assert plan.text is not None and plan.text.endswith("<think>\n\n</think>\n\n") and not plan.opens_reasoning
        ids, sources, reasoning, answer = run(session, ask(PROMPTS[0], reasoning_budget=0, enable_thinking=True))
        forced = session.model.tokenize(THINKING_END, add_special=False, parse_special=True)
    assert ids[: len(forced)] == forced and sources[: len(forced)] == [FORCED] * len(forced)
    assert not reasoning.strip() and answer.strip()


def test_stop_thinking_now_forces_the_end_at_the_next_token(thinker: Path) -> None:
    asked: list[int] = []

    def stop_after_first(session: Session, chunks: list[TokenChunk]) -> None:
        n = sum(len(c.token_ids) for c in chunks)
        if not asked:
            asked.append(n)
            assert session.end_thinking()

    with session_for(thinker) as session:
        ids, sources, _, answer = run(session, ask(PROMPTS[2]), on_chunk=stop_after_first)
        forced = session.model.tokenize(THINKING_END, add_special=False, parse_special=True)
    start = sources.index(FORCED)
    assert start == asked[0] == 1  # the very next token (the first token is streamed at once)
    assert ids[start : start + len(forced)] == forced and answer.strip()


def test_stop_thinking_now_while_the_prompt_is_read_forces_the_end_from_the_first_token(thinker: Path) -> None:
    chunks: list[TokenChunk] = []
    with session_for(thinker) as session:

        def emit(event: Event) -> None:
            if isinstance(event, PromptEvaluated):  # the prompt is in, no token sampled yet
                assert session.end_thinking()
            elif isinstance(event, TokenChunk):
                chunks.append(event)

        session.generate(ask(LONG_THINKER), emit, lambda: False)
        forced = session.model.tokenize(THINKING_END, add_special=False, parse_special=True)
    sources = [s for c in chunks for s in c.provenance]
    assert sources[: len(forced)] == [FORCED] * len(forced) and FORCED not in sources[len(forced) :]
    assert not "".join(c.reasoning for c in chunks).strip() and "".join(c.text for c in chunks).strip()


@pytest.mark.parametrize("drafter", ["ngram-simple", "draft-simple"])
def test_speculation_is_lossless_with_a_budget(thinker: Path, tiny_models: dict[str, Path], drafter: str) -> None:
    spec = SpeculativeParams(types=(drafter,), draft_model=str(tiny_models["qwen3"]), n_max=8)
    requests = [ask(p, 48, reasoning_budget=b) for p in PROMPTS for b in (0, 2, 9, -1)]
    requests.append(ask(PROMPTS[2], 48, reasoning_budget=0, enable_thinking=True))
    with session_for(thinker) as session:
        plain = [run(session, r)[:2] for r in requests]
    with session_for(thinker, spec=spec) as session:
        for request, (want_ids, want_sources) in zip(requests, plain, strict=True):
            ids, sources, _, _ = run(session, request)
            assert ids == want_ids, f"speculative output diverged for {request.reasoning_budget}"
            assert [s == FORCED for s in sources] == [s == FORCED for s in want_sources]
    assert any(FORCED in s for _, s in plain)


@pytest.fixture(scope="module")
def engine(thinker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path_factory.mktemp("engine-log") / "engine.log")
    client.start()
    client.load(str(thinker), ModelParams(), ContextParams(n_ctx=4096, n_threads=2))
    yield client
    client.close()


def test_end_thinking_through_the_worker_ends_it_and_the_reply_answers(engine: EngineClient) -> None:
    # A reply that thinks on for 1000 tokens unless told: it still thinks when the request arrives (a step is far
    # shorter than a thousand), and it is cancelled as soon as its answer starts.
    request = Generate(
        engine.new_request_id(), (ChatMessage("user", LONG_THINKER),), sampling=GREEDY, max_tokens=1000, ignore_eos=True
    )
    sources: list[str] = []
    answer = ""
    for event in engine.generate(request):
        if isinstance(event, TokenChunk):
            if not sources:
                engine.end_thinking(request.request_id)
            sources.extend(event.provenance)
            answer += event.text
            if answer.strip():
                engine.cancel(request.request_id)
        elif isinstance(event, Finished):
            break
    else:
        raise AssertionError("the reply did not finish")
    assert event.stop_reason == "cancelled" and FORCED in sources and answer.strip()


def test_run_takes_the_reasoning_flags(thinker: Path, tmp_path: Path) -> None:
    flags = ("--temp", "0", "-n", "24", "-t", "2", "--json", "-c", "512")
    budget = ("--reasoning-budget", "4", "--reasoning-budget-message", " ok", "--reasoning-effort", "low")
    result = llmtui("run", "-m", str(thinker), "-p", "hi", *flags, *budget, data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    provenance = json.loads(result.stdout)["provenance"]
    assert FORCED in provenance and provenance.index(FORCED) >= 4
    bad = llmtui("run", "-m", str(thinker), "-p", "hi", "--reasoning-budget", "-2", data_dir=tmp_path)
    assert bad.returncode != 0 and "--reasoning-budget" in bad.stderr


def test_the_parallel_path_serves_a_budget_and_effort(thinker: Path) -> None:
    with open_session(thinker, n_seq=2) as session:
        run = Run(session)
        run.submit(ask(PROMPTS[0], 6, reasoning_budget=4))
        run.submit(replace(ask(PROMPTS[0], 6, reasoning_effort="low"), request_id=2))
        run.drain()
    assert not [e for e in run.events if isinstance(e, Failed)]
    assert run.finished(1).stats.reasoning_tokens == 4 and run.finished(2).stop_reason == "max_tokens"


PICK = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})


@pytest.mark.parametrize("drafter", [None, "ngram-simple", "draft-simple"])
def test_a_schema_applies_after_thinking_and_speculation_stays_lossless(
    thinker: Path, tiny_models: dict[str, Path], drafter: str | None
) -> None:
    """The grammar is lazy for a reply that starts thinking: free thoughts, then (at the forced end) JSON."""
    spec = (
        None if drafter is None else SpeculativeParams(types=(drafter,), draft_model=str(tiny_models["qwen3"]), n_max=8)
    )
    request = ask(PROMPTS[0], 80, reasoning_budget=6, json_schema=PICK)
    request = replace(request, ignore_eos=False)
    with session_for(thinker) as session:
        want = run(session, request)
    with session_for(thinker, spec=spec) as session:
        ids, sources, reasoning, answer = run(session, request)
    assert ids == want[0] and reasoning.strip() and "{" not in reasoning[:8]  # thought freely, not in JSON
    assert isinstance(json.loads(answer)["ok"], bool) and FORCED in sources


def test_an_answer_held_to_a_schema_after_thinking_cannot_run_away_in_blank_lines(thinker: Path) -> None:
    """Issue 49: with the chat's format instruction in the system message, this model wrote blank lines after its
    forced end of thinking until the reply limit (the lazy grammar let the answer start with any whitespace)."""
    from app.core.output_format import format_instruction

    request = replace(ask("pick 0", 80, reasoning_budget=5, json_schema=PICK), ignore_eos=False)
    told = ChatMessage("system", format_instruction("json_schema", PICK))
    with session_for(thinker) as session:
        ids, _, reasoning, answer = run(session, replace(request, messages=(told, *request.messages)))
    assert len(ids) < 80 and reasoning and isinstance(json.loads(answer)["ok"], bool)
