"""UI performance benchmark: event-loop lag and keypress latency while streaming, first paint of long chats.

Runs the real app headless (Textual's test driver, 120×40) with a synthetic engine behind the real bridge:

  stream     500 tokens/s with 2,000 tokens/s bursts into a chat holding 50 earlier messages (~200,000 chars);
             event-loop lag (p50/p99/max) and keypress-to-screen latency (p50/p99/max) while streaming
  open       first paint of a 1,000-message conversation
  steady     the app process's CPU use while a reply streams at a steady 100 tok/s (and while idle): on a
             machine whose cores all run the engine, the time the UI takes from it
  decode     (--engine) decode tok/s of the starter model with the UI attached vs the engine alone

    .venv/bin/python scripts/bench_tui.py [--seconds 8] [--drafted] [--engine] [--json]

Keypress latency is timed from posting the key to the first frame drawn with the prompt showing it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOALS = {"lag_p99_ms": 17.0, "key_p99_ms": 50.0, "open_ms": 300.0, "decode_ratio": 0.99}

WORDS = (
    "the model streams tokens into a terminal while the user keeps typing and scrolling through earlier "
    "answers about kernels caches batching quantization context windows and sampling temperature"
).split()


def synthetic_markdown(rng: random.Random, n_chars: int) -> str:
    """Markdown with paragraphs, lists and fenced code, about `n_chars` long."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        kind = rng.random()
        if kind < 0.15:
            block = "```python\n" + "\n".join(f"def f{i}(x):\n    return x * {i}" for i in range(rng.randint(2, 6)))
            block += "\n```"
        elif kind < 0.3:
            block = "\n".join(f"- {' '.join(rng.choices(WORDS, k=rng.randint(4, 10)))}" for _ in range(4))
        elif kind < 0.35:
            block = f"## {' '.join(rng.choices(WORDS, k=4)).capitalize()}"
        else:
            block = " ".join(rng.choices(WORDS, k=rng.randint(30, 80))).capitalize() + "."
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {
        "n": len(values),
        "p50": round(statistics.median(ordered), 2),
        "p99": round(p99, 2),
        "max": round(ordered[-1], 2),
    }


# ----- a synthetic engine behind the real bridge ---------------------------------------------------------


class SyntheticClient:
    """Stands in for EngineClient: loads instantly and streams a token schedule from a thread."""

    def __init__(
        self, log_path: Path, *, seconds: float, base_rate: float, burst_rate: float, drafted: bool = False
    ) -> None:
        from engine_ext.protocol import Hello

        self.log_path = log_path
        self.drafted = drafted
        self.seconds = seconds
        self.base_rate = base_rate
        self.burst_rate = burst_rate
        self.events: queue.Queue[Any] = queue.Queue()
        self.hello = Hello(1, os.getpid(), "synthetic", "")
        self.pid: int | None = os.getpid()
        self.cancelled = threading.Event()
        self.sent_tokens = 0

    def start(self) -> Any:
        return self.hello

    def close(self, timeout_s: float = 5.0) -> None:
        self.cancelled.set()

    def wait_handles(self) -> list[object]:
        return []  # nothing to wait on: the bridge polls next_event

    def next_event(self, timeout: float | None = None) -> Any:
        try:
            return self.events.get(timeout=timeout) if timeout else self.events.get_nowait()
        except queue.Empty:
            return None

    def send(self, request: Any) -> None:
        from engine_ext.protocol import Cancel, Generate, Loaded, LoadModel, ModelInfo

        if isinstance(request, LoadModel):
            info = ModelInfo(
                request.path, "llama", "synthetic", 1, 1, 32768, 32768, 1, 1, 0, 1, False, False, True, 1, "CPU", 1.0
            )
            self.events.put(Loaded(info))
        elif isinstance(request, Generate):
            threading.Thread(target=self._stream, args=(request.request_id,), daemon=True).start()
        elif isinstance(request, Cancel):
            self.cancelled.set()

    def _stream(self, request_id: int) -> None:
        if self.base_rate == self.burst_rate:
            self._stream_steady(request_id)
            return
        from engine_ext.protocol import Finished, GenerationStats, TokenChunk

        rng = random.Random(7)
        text = synthetic_markdown(rng, int(self.seconds * self.burst_rate * 5))
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        start = time.perf_counter()
        sent = 0
        while not self.cancelled.is_set():
            elapsed = time.perf_counter() - start
            if elapsed >= self.seconds or sent >= len(pieces):
                break
            # 500 tok/s, with a 0.5 s burst at 2,000 tok/s in every 2 s.
            due = 0.0
            whole, part = divmod(elapsed, 2.0)
            due = whole * (1.5 * self.base_rate + 0.5 * self.burst_rate)
            due += part * self.base_rate if part < 1.5 else 1.5 * self.base_rate + (part - 1.5) * self.burst_rate
            while sent < int(due) and sent < len(pieces):
                # With `drafted`, tokens come in runs of 4 target-sampled, 4 accepted from an n-gram drafter.
                source = "ngram-mod" if self.drafted and (sent // 4) % 2 else "target"
                piece = pieces[sent]
                self.events.put(TokenChunk(request_id, piece, "", (sent,), (source,), (len(piece),)))
                sent += 1
            time.sleep(0.0005)
        self.sent_tokens = sent
        elapsed_ms = (time.perf_counter() - start) * 1000
        stats = GenerationStats(100, 0, 100, 1.0, sent, elapsed_ms, 5.0, 32768, 100 + sent)
        self.events.put(Finished(request_id, "cancelled" if self.cancelled.is_set() else "max_tokens", stats))

    def _stream_steady(self, request_id: int) -> None:
        """A token every 1/base_rate s, sent in chunks as the worker sends them (CHUNK_INTERVAL_S apart)."""
        from engine_ext.protocol import Finished, GenerationStats, TokenChunk
        from engine_ext.token_stream import CHUNK_INTERVAL_S

        text = synthetic_markdown(random.Random(7), int(self.seconds * self.base_rate * 5))
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        start = time.perf_counter()
        sent, last_chunk = 0, 0.0
        held: list[str] = []

        def send_held() -> None:
            n = len(held)
            self.events.put(
                TokenChunk(request_id, "".join(held), "", tuple(range(sent - n, sent)), ("target",) * n, ())
            )
            held.clear()

        while sent < len(pieces) and time.perf_counter() - start < self.seconds and not self.cancelled.is_set():
            time.sleep(1 / self.base_rate)
            held.append(pieces[sent])
            sent += 1
            now = time.perf_counter()
            if now - last_chunk >= CHUNK_INTERVAL_S:
                send_held()
                last_chunk = now
        if held:
            send_held()
        self.sent_tokens = sent
        stats = GenerationStats(100, 0, 100, 1.0, sent, (time.perf_counter() - start) * 1000, 5.0, 32768, 100 + sent)
        self.events.put(Finished(request_id, "cancelled" if self.cancelled.is_set() else "max_tokens", stats))


def seed_history(n_messages: int, chars: int, rng: random.Random) -> int:
    """A conversation of `n_messages` (alternating user/assistant, about `chars` in all) in the store; its id."""
    from app.core.store import open_default_store

    store = open_default_store()
    conversation = store.conversations.create_conversation(f"{n_messages} messages")
    per_reply = max(50, 2 * chars // max(1, n_messages) - 60)
    for index in range(n_messages // 2):
        user = store.tree.add_user_message(conversation.id, f"Question {index}: " + " ".join(rng.choices(WORDS, k=8)))
        reply = store.tree.begin_assistant_message(conversation.id, user.id, "synthetic")
        store.tree.finish_assistant_message(reply, synthetic_markdown(rng, per_reply), "", "complete", {}, 10)
    store.close()
    return conversation.id


# ----- measurements ---------------------------------------------------------------------------------------


class FrameClock:
    """Records when the app produces a frame (App._display is called once the compositor rendered it), and what
    `shown()` (e.g. the prompt's text) was when it did, so a keypress is timed to the first frame that shows it."""

    def __init__(self, app: Any, shown: Any = None) -> None:
        self.frames: list[float] = []
        self.shown: list[object] = []
        original = app._display

        def display(screen: Any, renderable: Any) -> None:
            original(screen, renderable)
            if renderable is not None:
                self.frames.append(time.perf_counter())
                self.shown.append(shown() if shown is not None else None)

        app._display = display

    async def first_frame_showing(self, moment: float, changed: Any, timeout: float = 5.0) -> float | None:
        """The first frame at or after `moment` drawn once `changed(shown)` held (None: none within `timeout`)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            for index in range(len(self.frames) - 1, -1, -1):
                if self.frames[index] < moment:
                    break
            else:
                index = -1
            for frame, shown in zip(self.frames[index + 1 :], self.shown[index + 1 :], strict=True):
                if changed(shown):
                    return frame
            await asyncio.sleep(0.0005)
        return None

    async def next_frame_after(self, moment: float, timeout: float = 5.0) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            for frame in reversed(self.frames):
                if frame >= moment:
                    return frame
            await asyncio.sleep(0.0005)
        return deadline


async def lag_probe(samples: list[float], stop: asyncio.Event, interval: float = 0.005) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(interval)
        samples.append((time.perf_counter() - before - interval) * 1000)


async def bench_stream(seconds: float, base_rate: float, burst_rate: float, *, drafted: bool = False) -> dict[str, Any]:
    from textual import events

    from app.core.config import SamplingSettings
    from app.tui.app import LlmtuiApp
    from app.tui.bridge import EngineBridge

    conversation_id = seed_history(50, 200_000, random.Random(1))
    client_box: list[SyntheticClient] = []

    def factory(log_path: Path) -> Any:
        client = SyntheticClient(log_path, seconds=seconds, base_rate=base_rate, burst_rate=burst_rate, drafted=drafted)
        client_box.append(client)
        return client

    app = LlmtuiApp("starter", default_sampling=SamplingSettings())
    app.bridge = EngineBridge(
        app,
        Path(tempfile.gettempdir()) / "bench.log",
        client_factory=factory,
        backlog=lambda: app._message_queue.qsize(),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        while app.engine_state != "ready":
            await pilot.pause(0.01)
        chat = app.chat
        assert chat is not None
        if chat.conversation_id != conversation_id:
            await chat.conversations.open_conversation(conversation_id)
        if drafted:
            chat.transcript.set_colour_drafts(True)
        await pilot.pause(0.3)
        clock = FrameClock(app, shown=lambda: chat.prompt.text)
        lags: list[float] = []
        keys: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(lag_probe(lags, stop))
        profiler = None
        if os.environ.get("BENCH_PROFILE"):
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        chat.prompt.load_text("Stream a long answer")
        chat.prompt.focus()
        started = chat.replies.replies_started
        cpu_start = time.thread_time()  # the UI thread (the event loop) only: not the bridge or the feed
        await chat.replies.send("Stream a long answer please")
        assert chat.replies.replies_started > started
        t_start = time.perf_counter()
        typed = 0
        missed = 0
        while chat.generation is not None:
            await asyncio.sleep(0.1)
            if time.perf_counter() - t_start > seconds + 5:
                break
            # A keypress into the prompt, timed until the first frame drawn with the new text (which can come
            # before this task sees the text change, so frames are matched by what they showed).
            character = "abcdefghij"[typed % 10]
            typed += 1
            before = chat.prompt.text
            moment = time.perf_counter()
            app.post_message(events.Key(character, character))
            frame = await clock.first_frame_showing(moment, lambda shown, before=before: shown != before)
            if frame is not None:
                keys.append((frame - moment) * 1000)
            else:
                missed += 1  # no frame showed it within 5 s; not a latency sample
        ui_cpu_s = time.thread_time() - cpu_start
        streamed_s = time.perf_counter() - t_start
        stop.set()
        await probe
        if profiler is not None:
            import pstats

            profiler.disable()
            with open(os.environ["BENCH_PROFILE"], "w") as out:
                pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("BENCH_SORT", "cumtime")).print_stats(70)
        sent = client_box[-1].sent_tokens if client_box else 0
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        return {
            "tokens": sent,
            "reply_chars": len(reply.content),
            "earlier_chars": sum(len(m.content) for m in app.store.tree.active_path(chat.conversation_id or 0)[:-2]),
            "lag_ms": percentiles(lags),
            "keypress_ms": percentiles(keys),
            "keypress_without_frame": missed,
            "ui_thread_cpu_fraction": round(ui_cpu_s / streamed_s, 3),
            "frames": len(clock.frames),
        }


async def bench_steady(seconds: float, rate: float) -> dict[str, Any]:
    """The app's CPU use while a reply streams at a steady `rate`, chunked as the worker sends it, into the chat
    with 50 earlier messages, and while idle: the event loop's thread and the bridge's reader thread (the synthetic
    feed's own thread is left out). On a machine whose cores all run the engine, this is the time the UI takes
    from the engine's threads."""
    from app.core.config import SamplingSettings
    from app.tui.app import LlmtuiApp
    from app.tui.bridge import EngineBridge

    conversation_id = seed_history(50, 200_000, random.Random(1))

    def thread_cpu_s(thread: threading.Thread | None) -> float:
        if thread is None or thread.ident is None or not thread.is_alive():
            return 0.0
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))

    app = LlmtuiApp("starter", default_sampling=SamplingSettings())
    bridge = EngineBridge(
        app,
        Path(tempfile.gettempdir()) / "bench.log",
        client_factory=lambda log_path: SyntheticClient(  # type: ignore[arg-type, return-value]
            log_path, seconds=seconds, base_rate=rate, burst_rate=rate
        ),
        backlog=lambda: app._message_queue.qsize(),
    )
    app.bridge = bridge
    async with app.run_test(size=(120, 40)):
        while app.engine_state != "ready":
            await asyncio.sleep(0.01)
        chat = app.chat
        assert chat is not None
        await chat.conversations.open_conversation(conversation_id)
        await asyncio.sleep(0.5)
        reader = bridge._thread

        def sample() -> tuple[float, float, float]:
            return time.thread_time(), thread_cpu_s(reader), time.perf_counter()

        loop0, reader0, wall0 = sample()
        await asyncio.sleep(min(seconds, 3.0))
        loop1, reader1, wall1 = sample()
        idle = (loop1 - loop0 + reader1 - reader0) / (wall1 - wall0)
        await chat.replies.send("Stream a steady answer")
        # The middle of the stream: not the reply's start (mounting it) or end (storing and drawing it whole).
        await asyncio.sleep(1.0)  # not Pilot.pause: it walks every widget, work a real session doesn't do
        loop1, reader1, wall1 = sample()
        await asyncio.sleep(max(1.0, seconds - 2.0))
        loop2, reader2, wall2 = sample()
        while chat.generation is not None:
            await asyncio.sleep(0.05)
    wall = wall2 - wall1
    return {
        "rate": rate,
        "event_loop_cpu_fraction": round((loop2 - loop1) / wall, 3),
        "bridge_cpu_fraction": round((reader2 - reader1) / wall, 3),
        "cpu_fraction_streaming": round((loop2 - loop1 + reader2 - reader1) / wall, 3),
        "cpu_fraction_idle": round(idle, 3),
    }


async def bench_open(n_messages: int) -> dict[str, Any]:
    from app.tui.app import LlmtuiApp

    conversation_id = seed_history(n_messages, n_messages * 1200, random.Random(2))
    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while not app.started:  # the settings and the history are read in a thread
            await pilot.pause(0.01)
        await pilot.pause(0.2)
        chat = app.chat
        assert chat is not None
        await chat.conversations.open_conversation(None)
        await pilot.pause(0.2)
        clock = FrameClock(app)
        results = []
        for _ in range(3):
            moment = time.perf_counter()
            await chat.conversations.open_conversation(conversation_id)
            frame = await clock.next_frame_after(time.perf_counter())
            results.append((frame - moment) * 1000)
            await chat.conversations.open_conversation(None)
            await pilot.pause(0.2)
        return {
            "messages": n_messages,
            "first_paint_ms": [round(r, 1) for r in results],
            "first_paint_ms_median": round(statistics.median(results), 1),
        }


def bench_decode(n_tokens: int, repetitions: int, threads: int = 0) -> dict[str, Any]:
    """Decode tok/s of the starter model: the engine alone (an EngineClient of its own) vs the same generation
    through the app (bridge + UI, headless), in tightly alternating pairs inside one app session.

    This machine's speed drifts by 20-30 % over tens of seconds (other tenants of the host), far more than the
    effect measured, so each UI run is paired with the engine-alone run just before it and the pair's ratio is
    what counts (median over the pairs). The engine alone runs while the app's event loop is blocked, so the idle
    UI takes nothing from it; each UI run starts a new conversation, so both see the same prompt. Both decode
    greedily with EOS ignored and report GenerationStats.decode_tps (tokens after the first / time from the first
    to the last token)."""
    from dataclasses import replace

    from app.core.config import Config, EngineSettings, SamplingSettings, save_config
    from app.core.model_paths import starter_model_path
    from app.tui.app import LlmtuiApp
    from app.tui.bridge import EngineBridge
    from engine_ext.client import EngineClient
    from engine_ext.protocol import ChatMessage, Finished, Generate

    model = starter_model_path()
    if model is None:
        return {"skipped": "the starter model is not installed"}
    prompt = "Write a long story about a lighthouse keeper."
    sampling = SamplingSettings(temperature=0.0, max_tokens=n_tokens)
    engine = EngineSettings(n_threads=threads)  # 0: the default (every CPU)
    headless: list[float] = []
    attached: list[float] = []
    tokens: list[int] = []

    def engine_alone(client: EngineClient) -> float:
        request = Generate(
            0, (ChatMessage("user", prompt),), sampling=sampling.sampling_params(), max_tokens=n_tokens, ignore_eos=True
        )
        finished = [e for e in client.generate(request) if isinstance(e, Finished)][0]
        tokens.append(finished.stats.generated_tokens)
        return finished.stats.decode_tps

    async def pairs() -> None:
        save_config(Config(engine=engine))  # the app reads its engine settings from config.toml
        app = LlmtuiApp(str(model), default_sampling=sampling)
        with EngineClient(Path(tempfile.gettempdir()) / "bench-engine.log") as client:
            client.start()
            client.load(str(model), engine.model_params(), engine.context_params())
            async with app.run_test(size=(120, 40)):
                while app.engine_state != "ready":
                    await asyncio.sleep(0.05)
                bridge = cast(EngineBridge, app.bridge)  # the app starts with the local engine
                do_generate = bridge._do_generate  # the same request as the engine alone gets: EOS ignored
                bridge._do_generate = lambda request: do_generate(replace(request, ignore_eos=True))  # type: ignore
                chat = app.chat
                assert chat is not None
                for _ in range(repetitions + 1):  # the first pair warms both engines up and is not counted
                    alone = engine_alone(client)  # blocks the event loop: the app does nothing meanwhile
                    await chat.conversations.open_conversation(None)
                    await asyncio.sleep(0.3)
                    await chat.replies.send(prompt)
                    while chat.generation is not None:
                        await asyncio.sleep(0.05)  # not Pilot.pause: it walks every widget, unlike a real session
                    tokens.append(int(chat.stats.generated_tokens or 0))
                    headless.append(alone)
                    attached.append(float(chat.stats.decode_tps or 0.0))

    asyncio.run(pairs())
    headless, attached, tokens = headless[1:], attached[1:], tokens[2:]
    ratios = [ui / alone for ui, alone in zip(attached, headless, strict=True) if alone]
    return {
        "tokens": n_tokens,
        "generated": tokens,
        "engine_alone_tps": [round(v, 1) for v in headless],
        "with_ui_tps": [round(v, 1) for v in attached],
        "pair_ratios": [round(r, 3) for r in ratios],
        "median_pair_ratio": round(statistics.median(ratios), 3) if ratios else 0.0,
        "ratio_of_medians": round(statistics.median(attached) / statistics.median(headless), 3) if headless else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of the synthetic stream")
    parser.add_argument("--rate", type=float, default=500.0, help="base tokens per second")
    parser.add_argument("--burst", type=float, default=2000.0, help="burst tokens per second")
    parser.add_argument("--messages", type=int, default=1000, help="messages in the conversation to open")
    parser.add_argument(
        "--drafted",
        action="store_true",
        help="half the synthetic tokens come from a drafter, with draft colouring on (F7)",
    )
    parser.add_argument("--engine", action="store_true", help="also compare decode speed with the starter model")
    parser.add_argument(
        "--steady-rate",
        type=float,
        default=100.0,
        help="tokens per second of the steady stream whose CPU use is measured",
    )
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument(
        "--decode-threads",
        type=int,
        default=0,
        help="engine threads for --engine (0: every CPU; fewer leaves the UI a core of its own)",
    )
    parser.add_argument("--repetitions", type=int, default=10, help="engine-alone / with-UI pairs for --engine")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name, run in (
        ("stream", lambda: bench_stream(args.seconds, args.rate, args.burst, drafted=args.drafted)),
        ("open", lambda: bench_open(args.messages)),
        ("steady", lambda: bench_steady(6.0, args.steady_rate)),
    ):
        with tempfile.TemporaryDirectory() as folder:
            os.environ["LLMTUI_DATA_DIR"] = str(Path(folder) / "data")
            os.environ["LLMTUI_CONFIG_DIR"] = str(Path(folder) / "config")
            results[name] = asyncio.run(run())
    if args.engine:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["LLMTUI_DATA_DIR"] = str(Path(folder) / "data")
            os.environ["LLMTUI_CONFIG_DIR"] = str(Path(folder) / "config")
            results["decode"] = bench_decode(args.decode_tokens, args.repetitions, args.decode_threads)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    stream = results["stream"]
    print(
        f"stream: {stream['tokens']} tokens ({args.rate:.0f} tok/s, {args.burst:.0f} tok/s bursts) into a chat "
        f"with {stream['earlier_chars']} earlier characters"
    )
    lag, key = stream["lag_ms"], stream["keypress_ms"]
    print(
        f"  event-loop lag  p50 {lag['p50']:6.2f} ms  p99 {lag['p99']:6.2f} ms  max {lag['max']:6.2f} ms"
        f"   (goal p99 ≤ {GOALS['lag_p99_ms']:.0f} ms)"
    )
    print(
        f"  keypress→frame  p50 {key['p50']:6.2f} ms  p99 {key['p99']:6.2f} ms  max {key['max']:6.2f} ms"
        f"   (goal p99 ≤ {GOALS['key_p99_ms']:.0f} ms, n={key['n']})"
    )
    print(f"  UI thread CPU   {stream['ui_thread_cpu_fraction'] * 100:.0f}% of one core while streaming")
    opened = results["open"]
    print(
        f"open: {opened['messages']} messages, first paint {opened['first_paint_ms_median']} ms "
        f"(runs {opened['first_paint_ms']}; goal ≤ {GOALS['open_ms']:.0f} ms)"
    )
    steady = results["steady"]
    print(
        f"steady: the UI uses {steady['cpu_fraction_streaming'] * 100:.1f}% of one core while a reply streams at "
        f"{steady['rate']:.0f} tok/s (event loop {steady['event_loop_cpu_fraction'] * 100:.1f}%, bridge "
        f"{steady['bridge_cpu_fraction'] * 100:.1f}%; idle {steady['cpu_fraction_idle'] * 100:.1f}%)"
    )
    if "decode" in results:
        decode = results["decode"]
        if "skipped" in decode:
            print(f"decode: skipped ({decode['skipped']})")
        else:
            print(
                f"decode: {decode['tokens']} tokens, engine alone {decode['engine_alone_tps']} tok/s, with the UI "
                f"{decode['with_ui_tps']} tok/s: median ratio of the pairs {decode['median_pair_ratio']} "
                f"(ratio of medians {decode['ratio_of_medians']})"
                f"   (goal ≥ {GOALS['decode_ratio']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
