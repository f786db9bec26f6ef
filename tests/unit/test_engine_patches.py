"""The engine's patch set (patches/llama.cpp) and the build record `llmtui doctor` reports as "engine patches"."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from engine_ext.doctor import BUILD_RECORD, EngineBuild, engine_build

PATCHES = Path(__file__).resolve().parents[2] / "patches" / "llama.cpp"


def test_every_patch_is_numbered_and_says_why() -> None:
    patches = sorted(PATCHES.glob("*.patch"))
    assert patches, "patches/llama.cpp has no patch"
    for patch in patches:
        assert re.fullmatch(r"\d{4}-[a-z0-9-]+\.patch", patch.name), patch.name
        text = patch.read_text(encoding="utf-8")
        header = text.split("\n--- a/", 1)[0]
        assert "\n--- a/" in text and "+++ b/" in text, f"{patch.name}: not a unified diff against a/ b/"
        assert "Why:" in header and len(header.split()) > 20, f"{patch.name}: its header must say why"


def record(tmp_path: Path, data: object) -> Path:
    (tmp_path / BUILD_RECORD).write_text(json.dumps(data), encoding="utf-8")
    return tmp_path


def test_engine_build_reads_the_record(tmp_path: Path) -> None:
    data = {
        "backend": "vulkan",
        "cmake_args": "-DGGML_VULKAN=on",
        "llama_cpp_python": "0.3.36",
        "patches": [{"name": "0001-a.patch", "sha256": "00"}, {"name": "0002-b.patch", "sha256": "11"}],
    }
    assert engine_build(record(tmp_path, data)) == EngineBuild(
        recorded=True, backend="vulkan", cmake_args="-DGGML_VULKAN=on", patches=("0001-a.patch", "0002-b.patch")
    )


@pytest.mark.parametrize("bad", ["{", "[1, 2]", json.dumps({"patches": [{"sha": 1}]}), json.dumps({"patches": 3})])
def test_a_bad_or_missing_record_reads_as_none(tmp_path: Path, bad: str) -> None:
    assert engine_build(tmp_path) == EngineBuild(recorded=False)
    (tmp_path / BUILD_RECORD).write_text(bad, encoding="utf-8")
    assert engine_build(tmp_path) == EngineBuild(recorded=False)


def test_doctor_prints_the_engine_patches(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.doctor import cmd_doctor

    built = EngineBuild(recorded=True, backend="vulkan", cmake_args="-DGGML_VULKAN=on", patches=("0001-a.patch",))
    monkeypatch.setattr("engine_ext.doctor.engine_build", lambda: built)
    assert cmd_doctor(argparse.Namespace(json=False)) == 0
    assert "engine patches: 0001-a.patch  (built by scripts/build_engine.sh: vulkan (-DGGML_VULKAN=on))" in (
        capsys.readouterr().out
    )
    monkeypatch.setattr("engine_ext.doctor.engine_build", lambda: EngineBuild(recorded=False))
    assert cmd_doctor(argparse.Namespace(json=True)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine_patches"] == [] and report["engine_build"] == ""
    assert cmd_doctor(argparse.Namespace(json=False)) == 0
    assert "engine patches: none (a plain pip build" in capsys.readouterr().out


def test_doctor_tells_a_lavapipe_user_whose_engine_lacks_the_reorder_patch() -> None:
    from engine_ext.doctor import LAVAPIPE_PATCH, Device, lavapipe_advice

    lavapipe = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "GPU", 2 << 30, 2 << 30)
    gpu = Device("Vulkan1", "NVIDIA GeForce RTX 4090", "GPU", 24 << 30, 24 << 30)
    plain = EngineBuild(recorded=False)
    (line,) = lavapipe_advice([lavapipe, gpu], plain)
    assert line.startswith("Vulkan0 is Mesa's lavapipe and this engine lacks patch 0002")
    assert "scripts/build_engine.sh vulkan" in line and "GGML_VK_DISABLE_GRAPH_OPTIMIZE=1" in line
    assert lavapipe_advice([gpu], plain) == []
    patched = EngineBuild(recorded=True, backend="vulkan", patches=("0001-a.patch", LAVAPIPE_PATCH))
    assert lavapipe_advice([lavapipe], patched) == []
    assert (PATCHES / LAVAPIPE_PATCH).is_file()  # the name doctor looks for is the patch's
