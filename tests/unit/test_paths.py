"""Where llmtui keeps things: env overrides, and the assets folder found from a checkout or a wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.core import paths


def test_env_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMTUI_CONFIG_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("LLMTUI_DATA_DIR", str(tmp_path / "d"))
    assert paths.config_dir() == tmp_path / "c"
    assert paths.data_dir() == tmp_path / "d"
    assert paths.log_dir() == tmp_path / "d" / "logs"


def test_assets_dir_holds_the_stylesheets() -> None:
    assert (paths.assets_dir() / "__init__.py").is_file()


def test_wheel_ships_every_subpackage_and_the_assets(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    import zipfile

    wheel = next(tmp_path.glob("llmtui-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    folders = {n.rsplit("/", 1)[0] for n in names if "/" in n}
    for package in ("app", "engine_ext", "models_catalog", "llmtui_assets"):
        assert package in folders
    on_disk = {str(p.parent.relative_to(root)) for p in root.glob("app/*/__init__.py")}
    assert on_disk <= folders
    assert "llmtui_assets/__init__.py" in names
