"""`llmtui models list` on a fresh home and with a broken settings file (issue 37, items 5 and 8), in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.paths import config_path


def test_a_broken_config_is_said_in_one_line_and_the_list_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_path()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[models\nfolders = 3\n", encoding="utf-8")
    assert main(["models", "list", "--dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("llmtui models: warning: ") and str(config) in line and "not valid TOML" in line
    assert "model folders set there are not searched" in line and len(line) <= 300
    assert "No models yet" in captured.out  # it went on

    config.write_text('[models]\nfolders = ["~/gguf"]\n', encoding="utf-8")
    assert main(["models", "list", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.strip() == "[]"
