"""A busy machine is named in the stats bar: other programs' CPU use (a fake sampler here, never the test
machine's real load), the thread count, the 80×24 fitting, the bridge's sampling, and a reply streamed through
the app."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, cast

import pytest
from rich.style import Style
from textual.app import App, ComposeResult
from textual.message import Message

from app.core.engine import ReplyStats
from app.tui.bridge import CPU_SAMPLE_S, EngineBridge
from app.tui.messages import EngineMessage
from app.tui.streaming import ReplyInFlight
from app.tui.widgets.status import StatsBar
from engine_ext.client import EngineClient
from engine_ext.cpu import CpuContention, CpuLoad
from engine_ext.protocol import (
    Finished,
    Generate,
    GenerationStats,
    Loaded,
    LoadModel,
    ModelInfo,
    PromptEvaluated,
    ThreadsChanged,
    TokenChunk,
)
from tests.fakes import ScriptedEngine, scripted_app, scripted_model_info
from tests.waits import wait_until

pytestmark = pytest.mark.anyio

BUSY = CpuLoad(1.4, 2, 2)  # the 2-CPU machine: 2 threads, others take 1.4 CPUs
IDLE = CpuLoad(0.1, 2, 2)
REPLY_STATS = {
    "decode_tps": 0.6,
    "ttft_ms": 6012.0,
    "prompt_tokens": 31,
    "generated_tokens": 8,
    "n_ctx": 4096,
    "n_ctx_used": 2048,
}


class FakeSampler:
    """Stands in for CpuContention: hands out `loads` in turn (the last one again once they run out)."""

    def __init__(self, *loads: CpuLoad | None) -> None:
        self.loads = list(loads)
        self.pids: list[tuple[int, ...]] = []

    def sample(self, pids: Iterable[int]) -> CpuLoad | None:
        self.pids.append(tuple(pids))
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


def as_sampler(fake: FakeSampler) -> Callable[[], CpuContention | None]:
    return lambda: cast(CpuContention, fake)


# ----- the stats bar -----


class StatsHost(App[None]):
    def compose(self) -> ComposeResult:
        yield StatsBar()


class Drawn(NamedTuple):
    line: str
    tooltip: str | None
    busy_styles: list[Style]  # the styles the 'busy' note is drawn in
    warning: Style  # the stats bar's warning style


async def drawn_bar(width: int, cpu: CpuLoad | None) -> Drawn:
    app = StatsHost()
    async with app.run_test(size=(width, 3)) as pilot:
        bar = app.query_one(StatsBar)
        bar.set_stats(REPLY_STATS)
        bar.engine_state, bar.backend = "generating", "CPU"
        bar.cpu = cpu
        await pilot.pause()
        strip = bar.render_line(0)
        styles = [segment.style or Style() for segment in strip if "busy" in segment.text]
        tooltip = None if bar.tooltip is None else str(bar.tooltip)
        return Drawn(strip.text, tooltip, styles, bar.get_component_rich_style("stats-bar--busy", partial=True))


async def test_a_busy_machine_is_named_with_the_thread_count() -> None:
    line, tooltip, styles, warning = await drawn_bar(140, BUSY)
    assert "busy: others use 1.4 of 2 CPUs · 2 threads" in line
    assert line.index("ctx") < line.index("busy") < line.index("generating")  # after the numbers it explains
    assert tooltip is not None and "1.4 of the 2 CPUs" in tooltip
    assert "fewer threads" in tooltip and "-t" in tooltip and "F3" in tooltip
    # Drawn in the warning style (bold, the theme's warning colour).
    assert warning.bold and warning.color is not None
    assert styles and all(style.bold and style.color == warning.color for style in styles)


@pytest.mark.parametrize("cpu", [None, IDLE, CpuLoad(0.6, 2, 1), CpuLoad(20.0, 64, 8)])
async def test_a_machine_that_is_not_busy_shows_nothing_new(cpu: CpuLoad | None) -> None:
    for width in (140, 84, 56):
        drawn = await drawn_bar(width, cpu)
        unmeasured = await drawn_bar(width, None)
        assert drawn.line == unmeasured.line and "busy" not in drawn.line and "thread" not in drawn.line
        assert drawn.tooltip is None


@pytest.mark.parametrize(
    ("width", "parts"),
    [
        (
            120,
            (
                "0.6 tok/s  TTFT 6012 ms  prompt 31  reply 8  ctx █████░░░░░ 2.0k/4.1k  "
                "busy: others use 1.4 of 2 CPUs · 2 threads",
            ),
        ),
        (100, ("0.6 tok/s  TTFT 6012 ms  prompt 31  reply 8  ctx █████░░░░░ 2.0k/4.1k  busy 1.4/2 CPUs · 2 threads",)),
        (90, ("0.6 tok/s TTFT 6012ms prompt 31 reply 8 ctx ██░░ 2.0k/4.1k busy 1.4/2 CPUs · 2 threads",)),
        (80, ("0.6 tok/s TTFT 6012ms ctx ██░░ 2.0k/4.1k busy 1.4/2 CPUs · 2 threads",)),  # the note before the counts
        (56, ("0.6 tok/s ctx ██░░ 2.0k/4.1k busy 1.4/2 · 2 threads",)),  # 80×24 less the sidebar
    ],
)
async def test_the_busy_note_fits_and_the_context_stays_in_view(width: int, parts: tuple[str, ...]) -> None:
    line = (await drawn_bar(width, BUSY)).line
    assert "…" not in line and len(line.rstrip()) <= width
    for part in parts:
        assert part in line


async def test_one_thread_and_unknown_threads() -> None:
    line = (await drawn_bar(140, CpuLoad(1.8, 2, 1))).line
    assert "busy: others use 1.8 of 2 CPUs · 1 thread" in line and "1 threads" not in line
    line = (await drawn_bar(140, CpuLoad(1.5, 2))).line  # threads not known: as many as CPUs
    assert "busy: others use 1.5 of 2 CPUs · 2 threads" in line


async def test_threads_taken_away_by_a_busy_machine_are_shown_with_the_default() -> None:
    # The engine went from 2 threads to 1 while others use one CPU: no longer crowded by the busy rule, but the
    # note stays, with the count in use and the default it goes back to.
    adapted = CpuLoad(1.0, 2, 1, max_threads=2)
    assert not adapted.busy() and adapted.adapted()
    line, tooltip, _, _ = await drawn_bar(140, adapted)
    assert "busy: others use 1.0 of 2 CPUs · 1 of 2 threads" in line
    assert tooltip is not None and "decodes on 1 of its 2 threads" in tooltip and "-t" in tooltip
    assert "busy 1.0/2 · 1/2 threads" in (await drawn_bar(56, adapted)).line
    back = CpuLoad(0.1, 2, 2, max_threads=2)  # the CPUs are free again: the default, and no note
    assert "busy" not in (await drawn_bar(140, back)).line


# ----- the bridge: sampling while a reply streams -----


class Target:
    def __init__(self) -> None:
        self.posted: list[Message] = []

    def post_message(self, message: Message) -> bool:
        self.posted.append(message)
        return True


class PidClient:
    pid = 4242

    def close(self, timeout_s: float = 5.0) -> None:
        pass


def stats_bridge(tmp_path: Path, sampler: FakeSampler | None) -> tuple[EngineBridge, Target]:
    target = Target()
    bridge = EngineBridge(
        target,
        tmp_path / "engine.log",
        client_factory=lambda path: cast(EngineClient, PidClient()),
        cpu_sampler=as_sampler(sampler) if sampler is not None else lambda: None,
    )
    return bridge, target


def test_the_bridge_samples_once_a_second_per_reply_with_the_engines_threads(tmp_path: Path) -> None:
    sampler = FakeSampler(CpuLoad(0.9, 2), CpuLoad(1.4, 2), CpuLoad(0.2, 2), CpuLoad(1.0, 2))
    bridge, target = stats_bridge(tmp_path, sampler)
    bridge._dispatch(Loaded(scripted_model_info(n_threads=2, description="m")))
    generation = ReplyInFlight(1, 100.0, first_token_at=100.5, n_tokens=5)

    def posted_cpu(now: float, reply: ReplyInFlight = generation) -> CpuLoad | None:
        bridge._post_stats(reply, now)
        last = target.posted[-1]
        assert isinstance(last, EngineMessage) and isinstance(last.event, ReplyStats)
        assert last.event.request_id == reply.request_id
        return last.event.cpu

    assert posted_cpu(101.0) is None  # the reply's first sample is a baseline (the time before was not its)
    assert posted_cpu(101.5) is None and len(sampler.pids) == 1  # not a second yet: not sampled again
    assert posted_cpu(101.0 + CPU_SAMPLE_S) == CpuLoad(1.4, 2, 2, 2)  # with the engine's threads (and its default)
    assert posted_cpu(101.5 + CPU_SAMPLE_S) == CpuLoad(1.4, 2, 2, 2)  # the last reading in between
    assert posted_cpu(102.0 + CPU_SAMPLE_S) == CpuLoad(0.2, 2, 2, 2)
    # The engine took a thread away: the next readings carry the count in use beside the default.
    bridge._dispatch(ThreadsChanged(1, 1, 1.4, 2))
    assert posted_cpu(103.0 + CPU_SAMPLE_S) == CpuLoad(1.0, 2, 1, 2)
    assert sampler.pids[0] == (os.getpid(), PidClient.pid)  # this process and the engine are "ours"
    # The next reply starts from a baseline again, whatever the last one measured.
    assert posted_cpu(110.0, ReplyInFlight(2, 109.0)) is None
    assert posted_cpu(111.0, ReplyInFlight(2, 109.0)) == CpuLoad(1.0, 2, 1, 2)


def test_a_bridge_without_a_sampler_measures_nothing(tmp_path: Path) -> None:
    bridge, target = stats_bridge(tmp_path, None)
    generation = ReplyInFlight(1, 100.0, first_token_at=100.5, n_tokens=5)
    for now in (101.0, 102.5, 104.0):
        bridge._post_stats(generation, now)
    assert all(isinstance(m, EngineMessage) and isinstance(m.event, ReplyStats) for m in target.posted)
    assert all(m.event.cpu is None for m in target.posted if isinstance(m, EngineMessage))


# ----- through the app: a reply streamed by a scripted engine -----


class WordEngine(ScriptedEngine):
    """Loads with 2 threads; a reply streams a token every 50 ms until `stop` (at most 30 s)."""

    def model_info(self, request: LoadModel) -> ModelInfo:
        return scripted_model_info(n_threads=2, description="m")

    def stream(self, request: Generate) -> None:
        request_id = request.request_id
        self.events.put(PromptEvaluated(request_id, 12, 0, 4096))
        n = 0
        deadline = time.monotonic() + 30
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.events.put(TokenChunk(request_id, "word ", "", (n,), ("target",), (5,)))
            n += 1
            time.sleep(0.05)
        stats = GenerationStats(12, 0, 12, 10.0, n, 50.0 * n, 60.0, 4096, 12 + n)
        self.events.put(Finished(request_id, "cancelled", stats))


@pytest.mark.parametrize(("load", "busy"), [(BUSY, True), (IDLE, False)])
async def test_a_reply_on_a_busy_machine_says_so_in_the_stats_bar(
    load: CpuLoad,
    busy: bool,
    lone_llama: Path,
) -> None:
    sampler = FakeSampler(load)
    app = scripted_app(lone_llama, WordEngine, cpu_sampler=as_sampler(sampler))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the scripted engine to load")
        chat = app.chat
        assert chat is not None
        await chat.replies.send("why is this slow?")
        await wait_until(pilot, lambda: chat.stats.cpu is not None, "a CPU sample while the reply streams")
        line = chat.stats.render_line(0).text
        assert "ctx" in line and "…" not in line  # at 80×24 the context readout stays in view
        assert ("busy 1.4/2" in line and "2 threads" in line) is busy
        assert busy or "busy" not in line and "thread" not in line
        engine = app.bridge._client
        assert isinstance(engine, WordEngine)
        engine.stop.set()
        await wait_until(pilot, lambda: chat.generation is None, "the reply to finish")
        await pilot.pause()
        # The note stays with the finished reply it explains.
        assert ("busy 1.4/2" in chat.stats.render_line(0).text) is busy
        assert len(sampler.pids) >= 2


def test_the_app_samples_the_machine_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tests/conftest.py turns the sampler off for every test; outside the tests the bridge measures for real."""
    import app.tui.bridge

    monkeypatch.setattr(app.tui.bridge, "CpuContention", CpuContention)
    bridge = app.tui.bridge.EngineBridge(
        type("Target", (), {"post_message": lambda self, m: True})(), tmp_path / "engine.log"
    )
    try:
        assert isinstance(bridge._cpu, CpuContention)
    finally:
        bridge.close()
