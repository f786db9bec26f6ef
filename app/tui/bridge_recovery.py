"""After the engine worker died (a crash, or the watchdog ending a stuck worker): the engine bridge's replies in flight
told, and the engine brought back as it was, or without CPU weight repacking, or the crash dialog."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Final, Protocol

from app.core.config import EngineSettings
from app.core.engine import EngineEvent, Recovering
from app.core.engine_share import EngineShare
from app.tui.streaming import ReplyInFlight
from engine_ext.client import EngineClient, EngineCrashedError
from engine_ext.cpu import default_threads
from engine_ext.protocol import Crashed, Failed, Finished, Generate, GenerationStats, SetSpeculative, SetSteering
from engine_ext.recovery import (
    EARLY_REPLIES,
    REQUEST_CRASH_ADVICE,
    Fallback,
    fallbacks,
    native_crash,
    request_crash,
)

KEEP_REPACK_OFF: Final = "To turn repacking off altogether: F3 → Repack weights: off (or llmtui --no-repack)."


class RecoveringBridge(Protocol):
    """What recovery uses of `app.tui.bridge.EngineBridge` (its bridge thread's state)."""

    _share: EngineShare
    _running: bool
    _loading: str | None
    _replies_since_load: int
    _generations: dict[int, ReplyInFlight]
    _control: list[str]
    _model: tuple[str, EngineSettings, bool, int] | None
    _client: EngineClient
    _sent_settings: dict[str, SetSpeculative | SetSteering]

    def _post(self, event: EngineEvent, answers: str = "") -> None: ...
    def _flush_tokens(self, *, force: bool) -> None: ...
    def _do_load(self, path: str, engine: EngineSettings, load_mtp: bool = False, n_rs_seq: int = 0) -> None: ...
    def _send_setting(self, kind: str, request: SetSpeculative | SetSteering) -> None: ...
    def _do_generate(self, request: Generate) -> None: ...


def engine_crashed(bridge: RecoveringBridge, crashed: Crashed) -> None:
    """The worker died: the replies in flight and the API requests held are told; the engine comes back as it was
    (a stopped or request-made crash), without CPU weight repacking (an early native crash), or the crash dialog
    shows what to try."""
    bridge._flush_tokens(force=True)
    bridge._share.crashed(crashed)
    for request in bridge._share.take_held():
        bridge._post(
            Failed(request.request_id, "EngineCrashed", "the engine crashed while serving an API request; try again")
        )
    bridge._running = False
    early = native_crash(crashed.exit_code) and (
        bridge._loading is not None or bridge._replies_since_load < EARLY_REPLIES
    )
    in_flight = [g for g in bridge._generations.values() if g.request is not None]
    unanswered = [kind for kind in bridge._control if kind not in ("speculative", "steering") and ":" not in kind]
    loading = bridge._loading is not None
    bridge._loading = None
    bridge._generations.clear()
    bridge._control.clear()
    if (
        bridge._model is not None
        and not loading
        and (crashed.stopped or request_crash(crashed.exit_code, crashed.phase))
    ):
        # The watchdog ended a worker stuck in a reply, or a request's grammar, text or sampler crashed it: the
        # engine comes back as it was, and the reply ends with the line that says why.
        _restart_same(bridge, crashed, in_flight)
        return
    if bridge._model is not None and early and _recover(bridge, crashed, in_flight):
        for kind in unanswered:  # a control vector being made: its dialog hears it ended
            bridge._post(
                Failed(
                    None,
                    "EngineCrashed",
                    "the engine crashed and was restarted with less CPU weight repacking; try again",
                ),
                kind,
            )
        return
    found: tuple[Fallback, ...] = ()
    if bridge._model is not None:
        engine = bridge._model[1]
        found = fallbacks(
            engine.model_params(),
            engine.context_params(),
            engine.n_threads or default_threads(),
            crashed.gpu_devices,
        )
    bridge._post(replace(crashed, fallbacks=found))


def _recover(bridge: RecoveringBridge, crashed: Crashed, in_flight: list[ReplyInFlight]) -> bool:
    """After a native crash while loading or in the first replies with CPU weights repacked (an AMX path crashed
    a Xeon so): start the worker again without repacking, reload, restore speculation and steering, and send
    again the replies in flight that had no tokens yet (one with some fails, to be continued). False when
    repacking was not on (nothing to turn off)."""
    assert bridge._model is not None
    path, engine, load_mtp, n_rs_seq = bridge._model
    notice = bridge._client.drop_crashed_repack(engine.model_params(), KEEP_REPACK_OFF)
    if notice is None:
        return False
    bridge._post(Recovering(notice))
    if not _reload(bridge):
        return True
    for generation in in_flight:
        assert generation.request is not None
        if generation.n_tokens == 0:
            bridge._do_generate(generation.request)
        else:
            bridge._post(
                Failed(
                    generation.request_id,
                    "EngineCrashed",
                    "the engine crashed while writing this reply and "
                    "was restarted with less CPU weight repacking; ctrl+g continues it",
                )
            )
    return True


def _reload(bridge: RecoveringBridge) -> bool:
    """A fresh worker with the model and the settings the last one had (speculation, steering); False when it
    died at once (the crash dialog says so)."""
    assert bridge._model is not None
    path, engine, load_mtp, n_rs_seq = bridge._model
    settings = dict(bridge._sent_settings)
    bridge._client.close()
    try:
        bridge._do_load(path, engine, load_mtp, n_rs_seq)
    except EngineCrashedError as error:
        engine_crashed(bridge, error.crashed)
        return False
    for kind in ("speculative", "steering"):
        if kind in settings:
            bridge._send_setting(kind, settings[kind])
    return True


def _restart_same(bridge: RecoveringBridge, crashed: Crashed, in_flight: list[ReplyInFlight]) -> None:
    """After the watchdog ended a stuck worker (Esc, a step past its limit) or a crash that was the request's:
    the engine restarted as it was (the conversation is the app's: intact); the replies in flight end as
    stopped, or failed, with the one line that says why."""
    if crashed.stopped:
        line = f"{crashed.stopped}; restarted"
    else:
        line = f"{crashed.description}; {REQUEST_CRASH_ADVICE}"
    bridge._post(Recovering(""))
    now = time.monotonic()
    for generation in in_flight:
        if not crashed.stopped:
            bridge._post(Failed(generation.request_id, "EngineCrashed", line))
            continue
        ttft = (generation.first_token_at or now) - generation.sent_at
        stats = GenerationStats(
            prompt_tokens=generation.prompt_tokens or 0,
            prompt_tokens_cached=0,
            prompt_tokens_evaluated=generation.prompt_tokens or 0,
            prompt_ms=ttft * 1000.0,
            generated_tokens=generation.n_tokens,
            decode_ms=(now - generation.sent_at - ttft) * 1000.0,
            ttft_ms=ttft * 1000.0,
            n_ctx=generation.n_ctx or 0,
            n_ctx_used=(generation.prompt_tokens or 0) + generation.n_tokens,
        )
        bridge._post(Finished(generation.request_id, "cancelled", stats, (line,)))
    if not in_flight:
        bridge._post(Failed(None, "EngineCrashed", line))  # said once, though no reply of the app's was running
    _reload(bridge)
