"""The curated catalog: the bundled data file is well-formed, quant tiers, search, errors, refresh from the Hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_catalog.catalog import (
    DRAFT_KINDS,
    MTP_KINDS,
    bundled_catalog_path,
    load_catalog,
    parse_catalog,
    refresh_entry,
)
from models_catalog.errors import CatalogError
from tests.hub_server import HubServer

GIB = 1 << 30
FAMILIES = {"Qwen3.5", "Qwen3.6", "Qwen3-Next", "Nemotron 3", "Gemma 4", "gpt-oss", "DeepSeek V4", "GLM"}


def test_bundled_catalog_is_complete_and_well_formed() -> None:
    catalog = load_catalog()
    assert bundled_catalog_path().is_file()
    assert len(catalog) >= 15
    assert FAMILIES <= {e.family for e in catalog}
    assert any(e.starter for e in catalog)
    names = {e.name for e in catalog}
    assert {"NVIDIA Nemotron 3 Super 120B-A12B", "NVIDIA Nemotron 3 Puzzle 75B-A9B", "DeepSeek V4 Flash"} <= names
    for e in catalog:
        assert e.repos and all(r.count("/") == 1 for r in e.repos)
        assert 0 < e.active_params_b <= e.total_params_b
        assert e.mtp in MTP_KINDS and set(e.drafts) <= set(DRAFT_KINDS)
        assert e.context_length > 0 and e.license and e.architecture
        assert e.quants and e.quants[0][0] == 0, f"{e.id}: needs a quant for the smallest machines"
        assert isinstance(e.verified, bool)
    assert any(e.is_moe for e in catalog) and any(not e.is_moe for e in catalog)


def test_quant_tiers_search_and_lookup() -> None:
    catalog = load_catalog()
    e = catalog.get("qwen3.5-9b")
    assert e is not None
    assert e.recommended_quant(4 * GIB) == "Q3_K_M"
    assert e.recommended_quant(8 * GIB) == "Q4_K_M"
    assert e.recommended_quant(64 * GIB) == "Q8_0"
    assert "DFLASH" in e.capabilities() and "MTP" in e.capabilities()
    assert [x.id for x in catalog.search("qwen3-next thinking")] == ["qwen3-next-80b-a3b-thinking"]
    assert catalog.for_repo("UNSLOTH/qwen3.5-9b-gguf") is e
    assert catalog.get("nope") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[model]]\nid = 'x'\n", "model #1 \\(x\\): missing `repos`"),
        ("[[model]\n", "not valid TOML"),
        ("model = 3\n", "array of tables"),
    ],
)
def test_malformed_catalogs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_catalog(text, "bad.toml")


GOOD = """
[[model]]
id = "tiny"
name = "Tiny"
family = "Tiny"
repos = ["org/Tiny-GGUF"]
params_b = [1, 1]
architecture = "llama"
context_length = 1024
license = "mit"
mtp = "none"
quants = { "0" = "Q4_K_M" }
"""


def test_field_checks(tmp_path: Path) -> None:
    assert parse_catalog(GOOD)[0].verified is False
    with pytest.raises(CatalogError, match="mtp"):
        parse_catalog(GOOD.replace('mtp = "none"', 'mtp = "maybe"'))
    with pytest.raises(CatalogError, match="drafts"):
        parse_catalog(GOOD + 'drafts = { medusa = "a/b" }\n')
    with pytest.raises(CatalogError, match="params_b"):
        parse_catalog(GOOD.replace("params_b = [1, 1]", "params_b = [1]"))
    with pytest.raises(CatalogError, match="unique"):
        path = tmp_path / "c.toml"
        path.write_text(GOOD + GOOD)
        load_catalog(path)


def test_refresh_confirms_an_entry_from_its_remote_header(
    hub_server: HubServer, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    hub_server.add_repo("org/Tiny-GGUF", {"Tiny-Q4_K_M.gguf": tiny_models["qwen35_mtp"]})
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    overlay = tmp_path / "overlay.json"
    catalog = load_catalog(path, overlay_path=overlay)
    entry = catalog.get("tiny")
    assert entry is not None
    fresh = refresh_entry(entry)
    assert fresh.verified and fresh.refreshed
    assert fresh.architecture == "qwen35" and fresh.mtp == "in-model"
    catalog.replace_entry(fresh)
    catalog.save_overlay()
    again = load_catalog(path, overlay_path=overlay).get("tiny")
    assert again is not None and again.architecture == "qwen35" and again.verified and again.refreshed


@pytest.mark.parametrize("value", ["x", None, -5, 2**62, True, 3.5, [1]])
def test_a_damaged_overlay_count_keeps_the_catalogs_value(tmp_path: Path, value: object) -> None:
    import json

    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    overlay = tmp_path / "overlay.json"
    entry = load_catalog(path).get("tiny")
    assert entry is not None
    overlay.write_text(json.dumps({"tiny": {"context_length": value, "architecture": "qwen35"}}))
    again = load_catalog(path, overlay_path=overlay).get("tiny")
    assert again is not None and again.context_length == entry.context_length and again.architecture == "qwen35"


def test_use_marks_the_embedding_model_and_the_reranker_which_are_never_the_starter() -> None:
    catalog = load_catalog()
    embed, rerank = catalog.first_of_use("embed"), catalog.first_of_use("rerank")
    assert embed is not None and embed.id == "embeddinggemma-300m" and embed.use_name == "embedding model"
    # llama.cpp's --embd-gemma-default names this repo and file (common/arg.cpp)
    assert embed.repo == "ggml-org/embeddinggemma-300M-qat-q4_0-GGUF" and embed.quants == ((0, "Q4_0"),)
    assert rerank is not None and rerank.repo == "gpustack/bge-reranker-v2-m3-GGUF" and rerank.use_name == "reranker"
    chat = catalog.chat_models()
    assert embed not in chat and rerank not in chat and len(chat) == len(catalog) - 2
    assert all(e.use == "chat" for e in chat) and [e for e in catalog if e.starter] == [e for e in chat if e.starter]
    assert [e.id for e in catalog.search("embedding")] == ["embeddinggemma-300m"]
    assert embed.to_dict()["use"] == "embed"


def test_use_is_checked_like_the_other_fields() -> None:
    assert parse_catalog(GOOD)[0].use == "chat"
    assert parse_catalog(GOOD + 'use = "rerank"\n')[0].for_chat is False
    with pytest.raises(CatalogError, match="`use` must be one of chat, embed, rerank"):
        parse_catalog(GOOD + 'use = "vision"\n')
    with pytest.raises(CatalogError, match="`use` must be one of"):
        parse_catalog(GOOD + "use = 3\n")
    with pytest.raises(CatalogError, match="`starter` is for a chat model"):
        parse_catalog(GOOD + 'use = "embed"\nstarter = true\n')
