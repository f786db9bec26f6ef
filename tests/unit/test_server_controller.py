"""The app's API server controller's folder read (app/tui/controllers/server.py): bounded, and a missing folder is
none."""

from __future__ import annotations

from pathlib import Path

import pytest

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
