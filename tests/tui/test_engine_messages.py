"""One engine interface, one event vocabulary (issue 43, items 2 and 3): the engines post the engine protocol's events
in one EngineMessage; a newer progress figure replaces an unhandled older one, token chunks never; an event of an
engine switched away from is not taken for the one in use; what an engine cannot do is declared, not probed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from app.core.config import RemoteSettings
from app.core.engine import Engine, ReplyStats
from app.tui.app import LlmtuiApp
from app.tui.bridge import EngineBridge
from app.tui.messages import EngineMessage
from app.tui.remote_bridge import RemoteBridge
from app.tui.streaming import TokenBatches, chunk_draft_spans
from engine_ext.client import EngineClient
from engine_ext.protocol import Failed, Loaded, LoadProgress, TokenChunk
from tests.fakes import Collector, scripted_model_info
from tests.waits import wait_until


def _remote() -> RemoteBridge:
    return RemoteBridge(Collector(), RemoteSettings("box", "http://127.0.0.1:9/v1"), "m")


def test_a_newer_progress_figure_replaces_an_older_one_of_the_same_engine_and_tokens_never() -> None:
    engine, other = _remote(), _remote()

    def replaced(old: Any, new: Any, new_engine: Engine | None = None) -> bool:
        return EngineMessage(old, engine).can_replace(EngineMessage(new, new_engine or engine))

    assert replaced(LoadProgress(0.2), LoadProgress(0.5))
    assert not replaced(LoadProgress(0.2), LoadProgress(0.5), other)  # another engine's load
    assert replaced(ReplyStats(1, 3, 1.0, 5.0), ReplyStats(1, 9, 2.0, 5.0))
    assert not replaced(ReplyStats(1, 3, 1.0, 5.0), ReplyStats(2, 9, 2.0, 5.0))  # another reply's figures
    chunk = TokenChunk(1, "a", "", (1,), ("target",), (1,))
    assert not replaced(chunk, chunk) and not replaced(LoadProgress(0.2), chunk)


def test_token_batches_merge_chunks_into_one_with_the_tokens_provenance_and_text_ends() -> None:
    batches = TokenBatches()
    batches.add(TokenChunk(3, "Hello ", "", (1, 2), ("target", "ngram-mod"), (2, 6)), 0.0)
    batches.add(TokenChunk(3, "", "hmm", (3,), ("target",), (0,)), 0.0)
    batches.add(TokenChunk(3, "world", "", (4, 5), ("ngram-mod", "ngram-mod")), 0.0)  # no text ends: an older engine
    batches.add(TokenChunk(4, "other", "", (9,), ("target",), (5,)), 0.0)
    three, four = batches.take(1.0)
    assert (three.request_id, three.text, three.reasoning, three.token_ids) == (
        3,
        "Hello world",
        "hmm",
        (1, 2, 3, 4, 5),
    )
    assert three.text_ends == (2, 6, 6, 11, 11) and chunk_draft_spans(three) == [(2, 11, "ngram-mod")]
    assert (four.request_id, four.text) == (4, "other") and batches.take(2.0) == []


class _NoClient:
    pid = None

    def close(self, timeout_s: float = 5.0) -> None:
        pass


def test_capabilities_are_declared_by_each_engine(tmp_path: Path) -> None:
    local = EngineBridge(
        Collector(), tmp_path / "engine.log", client_factory=lambda path: cast(EngineClient, _NoClient())
    )
    remote = _remote()
    assert local.capabilities.loads_files and local.capabilities.tools and local.capabilities.steering
    assert not any(vars(remote.capabilities).values())
    assert local.shared_engine() is local and remote.shared_engine() is None
    assert remote.end_thinking(1) is False and local.end_thinking(1) is True
    local.close()


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_a_load_of_an_engine_switched_away_from_is_not_taken_for_the_one_in_use() -> None:
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        old = app.bridge
        remote = _remote()
        app.models.replace_bridge(remote)
        app.post_message(EngineMessage(Loaded(scripted_model_info(description="late")), old))
        app.post_message(EngineMessage(Failed(None, "OSError", "late failure"), old, "load"))
        await pilot.pause()
        assert app.model is None and app.engine_state != "error"
        info = replace(scripted_model_info(), path=remote.model_path, description="m", architecture="remote")
        app.post_message(EngineMessage(Loaded(info), remote))
        await wait_until(pilot, lambda: app.model is not None, "the remote model taken")
        assert app.model is not None and (app.model.name, app.model.architecture) == ("m", "remote")
