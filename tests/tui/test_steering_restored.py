"""Steering kept from the last session (issue 49, 17): said at start, and the stats bar keeps the vector's strength
in view at 80×24 (its name cut first), where it was cut to `steer happy-sad…`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.core.config import SamplingSettings, SteeringSettings, load_config, save_config
from app.tui.app import LlmtuiApp
from tests.pilot import ready, reply_done, send
from tests.tui.test_tui_steering import synthetic_vector
from tests.waits import wait_until


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_steering_kept_from_last_time_is_said_at_start_and_its_strength_stays_in_the_stats_bar(
    tiny_models: dict[str, Path],
) -> None:
    vector = synthetic_vector("happy-sad", 64, range(1, 2))
    save_config(replace(load_config(), steering=SteeringSettings((str(vector),), (5.25,))))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=24))
    async with app.run_test(size=(80, 24)) as pilot:
        chat = await ready(pilot)
        said = "Steering from last time is on: happy-sad +5.25. F6 to change it"

        def notices() -> list[str]:
            return [str(n.message) for n in app._notifications]

        await wait_until(pilot, lambda: any(said in n for n in notices()), "the notice of the steering kept")
        await wait_until(pilot, lambda: chat.stats.extras.get("steer") == "happy-sad +5.25", "the stats bar's steer")
        await send(pilot, "hello there")
        await reply_done(pilot)
        assert chat.stats.prompt_tokens is not None  # a reply's figures beside it
        chat.stats.decode_tps, chat.stats.ttft_ms = 123.4, 2690.0  # wide figures: a narrow bar must give way
        await pilot.pause()
        line = chat.stats.render()
        assert line.cell_len <= chat.stats.size.width, line.plain  # nothing cut at the end…
        assert " +5.25" in line.plain and "steer hap" in line.plain  # …the strength in view, the name shortened
        assert sum(said in n for n in notices()) == 1
        reply = app.store.tree.active_path(chat.conversation_id or 0)[-1]
        assert reply.stats["steering"]["vectors"][0]["strength"] == 5.25  # it steered the reply
