"""The app's API server controller's folder read (app/tui/controllers/server.py): bounded, and a missing folder is
none."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.server.metrics import MAX_AGENT_CHARS, short_agent
from app.tui.controllers import server


def test_the_steering_folder_listing_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.core.paths.steering_dir", lambda: tmp_path)
    monkeypatch.setattr(server, "MAX_VECTORS", 5)
    for i in range(12):
        (tmp_path / f"v{i:02d}.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a vector")
    found = server.steering_vectors()
    assert len(found) == 5 and all(path.endswith(".gguf") for path in found.values())
    monkeypatch.setattr("app.core.paths.steering_dir", lambda: tmp_path / "missing")
    assert server.steering_vectors() == {}


@pytest.mark.parametrize(
    ("user_agent", "shown"),
    [
        ("claude-cli/2.1.197 (external, cli)", "claude-cli"),
        ("codex_cli_rs/0.171.0 (Ubuntu 24.4.0; x86_64) xterm-256color", "codex_cli_rs"),
        ("opencode/1.18.33 ai-sdk/provider-utils/3.0.1", "opencode"),
        ("OpenAI/Python 1.109.1", "OpenAI/Python"),
        ("curl/8.5.0", "curl"),
        ("\x1b[31mred\x1b[0m/1.0", "31mred0m"),  # no escape sequence reaches the stats bar
        ("a" * 500, "a" * MAX_AGENT_CHARS),
        ("", ""),
        (None, ""),
    ],
)
def test_the_stats_bar_names_a_client_by_its_user_agents_first_product(user_agent: str | None, shown: str) -> None:
    assert short_agent(user_agent) == shown
