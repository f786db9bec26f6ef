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


def test_the_engine_the_tests_run_carries_every_patch() -> None:
    """Both README set-ups build the engine with patches/llama.cpp applied; an engine without one is not ours."""
    built = engine_build()
    wanted = tuple(sorted(p.name for p in PATCHES.glob("*.patch")))
    assert built.recorded, "the engine has no build record: set it up with scripts/setup.sh test"
    assert built.patches == wanted, f"the engine carries {built.patches}, patches/llama.cpp has {wanted}"


def test_doctor_tells_an_amx_user_whose_engine_lacks_the_amx_patch(tmp_path: Path) -> None:
    from engine_ext.doctor import AMX_PATCH, amx_advice, cpu_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\n")
    flags = cpu_flags(cpuinfo)
    assert "amx_tile" in flags and cpu_flags(tmp_path / "missing") == frozenset()
    (line,) = amx_advice(flags, EngineBuild(recorded=False))
    assert line.startswith("this CPU has AMX and this engine lacks patch 0003") and "scripts/setup.sh" in line
    assert amx_advice(flags, EngineBuild(recorded=True, patches=(AMX_PATCH,))) == []
    assert amx_advice(frozenset({"avx2"}), EngineBuild(recorded=False)) == []


def _amx_source() -> Path | None:
    """The patched llama.cpp tree scripts/build_engine.sh extracted (build/engine-*/…/vendor/llama.cpp)."""
    root = PATCHES.parents[1] / "build"
    found = sorted(root.glob("engine-*/llama_cpp_python-*/vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp"))
    return found[0] if found else None


def test_amx_tile_config_is_stored_before_ldtilecfg(tmp_path: Path) -> None:
    """Patch 0003, checked where it matters on any x86 machine: compiled for a CPU with AMX by this machine's
    compiler, the stores that fill the tile configuration's colsb and rows come before `ldtilecfg` (without the
    patch, GCC 12 dropped them and the instruction loaded stale stack bytes)."""
    import platform
    import shutil
    import subprocess

    source, compiler = _amx_source(), shutil.which("g++")
    if platform.machine() not in ("x86_64", "AMD64") or compiler is None or source is None:
        pytest.skip("needs an x86-64 machine with g++ and the patched tree scripts/setup.sh extracts under build/")
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump (binutils) to read the generated code")
    tree = source.parents[4]
    obj = tmp_path / "mmq.o"
    flags = ["-std=c++17", "-O3", "-march=sapphirerapids", "-fPIC", "-DGGML_USE_CPU_REPACK", "-c"]
    includes = [f"-I{tree / 'ggml/include'}", f"-I{tree / 'ggml/src'}", f"-I{tree / 'ggml/src/ggml-cpu'}"]
    subprocess.run([compiler, *flags, *includes, str(source), "-o", str(obj)], check=True, timeout=240)
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True).stdout
    lines = asm.splitlines()
    at = next(i for i, line in enumerate(lines) if "ldtilecfg" in line)
    base = int(re.search(r"ldtilecfg\s+0x([0-9a-f]+)\(%rsp\)", lines[at]).group(1), 16)  # type: ignore[union-attr]
    stored = set()
    for line in lines[max(0, at - 40) : at]:
        match = re.search(r"mov\S*\s+\S+,0x([0-9a-f]+)\(%rsp\)", line)
        if match:
            stored.add(int(match.group(1), 16) - base)
    # tile_config_t: palette_id at 0, colsb[16] (uint16) at 16..47, rows[16] at 48..63.
    assert any(16 <= offset < 48 for offset in stored), f"no colsb store before ldtilecfg: {sorted(stored)}"
    assert any(48 <= offset < 64 for offset in stored), f"no rows store before ldtilecfg: {sorted(stored)}"
