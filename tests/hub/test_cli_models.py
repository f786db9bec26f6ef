"""`llmtui models ...` run as a user runs it, against the local Hub: search, info, pull with a sidecar, rm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.model_paths import ModelNotFound, resolve_model
from tests.hub_server import HubServer

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/Tiny-Qwen35-GGUF"


def llmtui(*args: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        LLMTUI_DATA_DIR=str(tmp / "data"),
        LLMTUI_CONFIG_DIR=str(tmp / "config"),
        LLMTUI_RAM_BYTES=str(8 << 30),
        LLMTUI_VRAM_BYTES="0",
    )
    return subprocess.run(
        [sys.executable, "-m", "app", "models", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def tiny_hub(hub_server: HubServer, tiny_models: dict[str, Path]) -> HubServer:
    hub_server.add_repo(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": tiny_models["qwen35_mtp"],
            "Tiny-Q8_0.gguf": tiny_models["qwen35"],
            "mtp-Tiny-Q8_0.gguf": tiny_models["qwen35_mtp_sidecar"],
            "README.md": b"# Tiny Qwen3.5\n",
        },
        downloads=42,
    )
    hub_server.add_repo("meta/Gated-GGUF", {"Gated-Q4_K_M.gguf": tiny_models["llama"]}, gated=True)
    return hub_server


def test_a_new_user_searches_inspects_pulls_lists_and_deletes(
    tiny_hub: HubServer, hf_env: Path, tmp_path: Path
) -> None:
    found = llmtui("search", "tiny", "--json", tmp=tmp_path)
    assert found.returncode == 0, found.stderr
    assert [r["repo_id"] for r in json.loads(found.stdout)["hub"]] == [REPO]

    info = llmtui("info", REPO, "--json", tmp=tmp_path)
    assert info.returncode == 0, info.stderr
    out = json.loads(info.stdout)
    assert {q["tag"] for q in out["quants"]} == {"Q4_K_M", "Q8_0"}
    assert out["fit"]["architecture"] == "qwen35"
    assert {q["verdict"] for q in out["fit"]["quants"]} == {"fits"} and out["fit"]["recommended"]
    text = llmtui("info", REPO + ":Q8_0", "--card", tmp=tmp_path)
    assert text.returncode == 0 and "recommended: llmtui models pull" in text.stdout and "# Tiny Qwen3.5" in text.stdout

    pulled = llmtui("pull", f"{REPO}:Q8_0", "--with", "mtp", "--json", tmp=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    result = json.loads(pulled.stdout)
    model = Path(result["model_path"])
    assert model.name == "Tiny-Q8_0.gguf" and model.is_file()
    assert Path(result["sidecars"]["mtp"]).name == "mtp-Tiny-Q8_0.gguf"
    assert str(model).startswith(str(hf_env))

    # the model is now a MODEL for `llmtui run`, as org/repo:QUANT
    assert resolve_model(f"{REPO}:Q8_0") == model
    assert resolve_model(REPO) == model  # no tag: llama.cpp's Q4_K_M, Q8_0, first-file order
    with pytest.raises(ModelNotFound, match="pull"):
        resolve_model(f"{REPO}:Q2_K")
    with pytest.raises(ModelNotFound, match="not downloaded"):
        resolve_model("org/Never-GGUF")

    listed = llmtui("list", "--json", tmp=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [entry] = [e for e in json.loads(listed.stdout) if e["source"] != "starter"]  # the bundled starter, listed too
    assert entry["name"] == f"{REPO}:Q8_0" and entry["architecture"] == "qwen35" and "mtp" in entry["sidecars"]

    size = model.stat().st_size + Path(result["sidecars"]["mtp"]).stat().st_size
    refused = llmtui("rm", f"{REPO}:Q8_0", tmp=tmp_path)  # no tty, no --yes
    assert refused.returncode == 1 and "--yes" in refused.stderr and model.exists()
    removed = llmtui("rm", f"{REPO}:Q8_0", "--yes", "--json", tmp=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout) == {"deleted": [f"{REPO}:Q8_0"], "freed": size}
    assert not model.exists()
    assert [e for e in json.loads(llmtui("list", "--json", tmp=tmp_path).stdout) if e["source"] != "starter"] == []


def test_errors_are_one_line_with_what_to_do(tiny_hub: HubServer, hf_env: Path, tmp_path: Path) -> None:
    gated = llmtui("pull", "meta/Gated-GGUF:Q4_K_M", tmp=tmp_path)
    assert gated.returncode == 1 and "HF_TOKEN" in gated.stderr and "Traceback" not in gated.stderr
    missing = llmtui("pull", f"{REPO}:Q3_K_S", tmp=tmp_path)
    assert missing.returncode == 1 and "available: Q4_K_M, Q8_0" in missing.stderr
    nosidecar = llmtui("pull", f"{REPO}:Q8_0", "--with", "dflash", tmp=tmp_path)
    assert nosidecar.returncode == 1 and "dflash-" in nosidecar.stderr
    unknown = llmtui("info", "no-such-catalog-id", tmp=tmp_path)
    assert unknown.returncode == 1 and "catalog id" in unknown.stderr


def test_catalog_search_works_offline(hf_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = llmtui("search", "nemotron", "--catalog", tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "nemotron-3-super-120b-a12b" in result.stdout and "nemotron-3-puzzle-75b-a9b" in result.stdout
    online_only = llmtui("search", "nemotron", tmp=tmp_path)
    assert online_only.returncode == 1 and "HF_HUB_OFFLINE" in online_only.stderr
