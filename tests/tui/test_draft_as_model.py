"""A draft (mtp- sidecar, DFlash/DSpark, EAGLE3) opened as the model to chat with is refused with the fix, not
loaded into llama.cpp (where an mtp- sidecar segfaulted the worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.config import SamplingSettings
from app.tui.app import LlmtuiApp
from engine_ext.gguf import GGUFError, validate_main_model
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
DRAFTS = ("qwen35_mtp_sidecar", "dflash", "dspark", "eagle3")


@pytest.mark.parametrize("kind", DRAFTS)
def test_a_draft_is_refused_as_the_main_model(tiny_models: dict[str, Path], kind: str) -> None:
    with pytest.raises(GGUFError) as refused:
        validate_main_model(tiny_models[kind])
    message = str(refused.value)
    assert "not a model to chat with" in message and "open the model it belongs to" in message
    assert "\n" not in message and len(message) <= 300 + len(str(tiny_models[kind]))


@pytest.mark.parametrize("kind", ["llama", "qwen35", "qwen35_mtp", "nemotron_h_moe_mtp", "qwen3next"])
def test_models_with_their_own_heads_still_open(tiny_models: dict[str, Path], kind: str) -> None:
    validate_main_model(tiny_models[kind])


def test_run_on_a_sidecar_says_what_to_open(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    result = subprocess.run(
        [sys.executable, "-m", "app", "run", "-m", str(tiny_models["qwen35_mtp_sidecar"]), "-p", "hi", "-n", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("llmtui: error:") and "mtp- sidecar" in result.stderr
    assert "SIGSEGV" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_app_shows_why_a_draft_does_not_load(tiny_models: dict[str, Path]) -> None:
    app = LlmtuiApp(str(tiny_models["dflash"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=4))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "error", "the load to fail", 60)
        await wait_until(
            pilot,
            lambda: any("not a model to chat with" in str(n.message) for n in app._notifications),
            "the reason in a notification",
        )
        assert app.bridge.pid is not None  # the engine did not crash
