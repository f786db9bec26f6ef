"""Hub search and repo listing through huggingface_hub against the local Hub: quants, shards, sidecars, gating."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_catalog import download, hub
from models_catalog.errors import GatedRepoError, OfflineError, RepoNotFound
from tests.hub_server import GOOD_TOKEN, HubServer


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


@pytest.fixture
def hub_repos(hub_server: HubServer) -> HubServer:
    hub_server.add_repo(
        "unsloth/Tiny-GGUF",
        {
            "README.md": b"---\nlicense: apache-2.0\n---\n# Tiny\nA tiny model.\n",
            "Tiny-Q4_K_M.gguf": blob(4000),
            "Tiny-Q8_0.gguf": blob(8000),
            "BF16/Tiny-BF16-00001-of-00002.gguf": blob(9000),
            "BF16/Tiny-BF16-00002-of-00002.gguf": blob(7000),
            "mtp-Tiny-Q8_0.gguf": blob(500),
            "mmproj-Tiny-F16.gguf": blob(300),
            "Tiny.imatrix.gguf": blob(100),
        },
        downloads=500,
        likes=5,
        last_modified="2026-03-01T00:00:00.000Z",
    )
    hub_server.add_repo(
        "bartowski/Tiny-GGUF",
        {"Tiny-Q4_K_M.gguf": blob(4100)},
        downloads=900,
        likes=1,
        last_modified="2026-01-01T00:00:00.000Z",
    )
    hub_server.add_repo(
        "someone/Other-GGUF",
        {"Other-Q4_0.gguf": blob(100)},
        downloads=10,
        likes=50,
        last_modified="2026-05-01T00:00:00.000Z",
    )
    hub_server.add_repo("someone/Tiny-safetensors", {"model.safetensors": blob(10)}, tags=("transformers",))
    hub_server.add_repo("meta/Gated-GGUF", {"Gated-Q4_K_M.gguf": blob(1000)}, gated=True)
    return hub_server


def test_search_by_text_author_and_sort(hub_repos: HubServer) -> None:
    hits = hub.search("tiny")
    assert [h.repo_id for h in hits] == ["bartowski/Tiny-GGUF", "unsloth/Tiny-GGUF"]  # GGUF only, by downloads
    assert [h.repo_id for h in hub.search("", sort="likes", limit=2)] == ["someone/Other-GGUF", "unsloth/Tiny-GGUF"]
    assert [h.repo_id for h in hub.search("", sort="updated", limit=1)] == ["someone/Other-GGUF"]
    assert [h.repo_id for h in hub.search("tiny", author="unsloth")] == ["unsloth/Tiny-GGUF"]
    top = hub.search("tiny", author="unsloth")[0]
    assert top.downloads == 500 and top.likes == 5 and top.last_modified and top.last_modified.startswith("2026-03")
    assert [h.repo_id for h in hub.search("gated")] == ["meta/Gated-GGUF"] and hub.search("gated")[0].gated


def test_listing_groups_quants_shards_and_sidecars(hub_repos: HubServer) -> None:
    listing = hub.list_repo("unsloth/Tiny-GGUF")
    assert listing.commit == hub_repos.repos["unsloth/Tiny-GGUF"].commit
    groups = {g.tag: g for g in listing.quant_groups()}
    assert sorted(groups) == ["BF16", "Q4_K_M", "Q8_0"]
    bf16 = groups["BF16"]
    assert bf16.primary == "BF16/Tiny-BF16-00001-of-00002.gguf" and bf16.n_shards == 2 and bf16.size == 16000
    assert groups["Q8_0"].sidecars == {"mtp": "mtp-Tiny-Q8_0.gguf", "mmproj": "mmproj-Tiny-F16.gguf"}
    assert groups["Q4_K_M"].sidecars["mtp"] == "mtp-Tiny-Q8_0.gguf"  # the only one; closest bits
    assert [g.tag for g in listing.quant_groups()] == ["Q4_K_M", "Q8_0", "BF16"]  # smallest first
    sidecars = listing.sidecar_files()
    assert {k: [f.path for f in v] for k, v in sidecars.items()} == {
        "mtp": ["mtp-Tiny-Q8_0.gguf"],
        "mmproj": ["mmproj-Tiny-F16.gguf"],
    }
    q4 = listing.file("Tiny-Q4_K_M.gguf")
    assert q4.size == 4000 and q4.sha256 and q4.oid == q4.sha256
    assert q4.url.endswith(f"/unsloth/Tiny-GGUF/resolve/{listing.commit}/Tiny-Q4_K_M.gguf")
    readme = listing.file("README.md")
    assert readme.sha256 is None and len(readme.oid) == 40  # a plain git file: verified by its blob id
    assert hub.pick_files(listing, "BF16", ["mtp"]) is not None


def test_model_card_and_missing_repos(hub_repos: HubServer) -> None:
    assert "A tiny model." in hub.model_card("unsloth/Tiny-GGUF")
    assert hub.model_card("bartowski/Tiny-GGUF") == ""
    with pytest.raises(RepoNotFound, match="no such model"):
        hub.list_repo("nobody/Nothing-GGUF")
    with pytest.raises(RepoNotFound):
        hub.list_repo("not a repo")


def test_gated_repos_explain_hf_token(hub_repos: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = hub.list_repo("meta/Gated-GGUF")  # metadata is public, as on the Hub
    assert listing.gated
    file = listing.file("Gated-Q4_K_M.gguf")
    with pytest.raises(GatedRepoError, match="HF_TOKEN"):
        download.fetch(file)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(GatedRepoError, match="accepted"):
        download.fetch(file)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert download.fetch(file).read_bytes() == blob(1000)


def test_cached_listing_serves_offline(hub_repos: HubServer, hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = hub.list_repo("unsloth/Tiny-GGUF")
    download.fetch(listing.file("Tiny-Q8_0.gguf"))
    download.fetch(listing.file("mtp-Tiny-Q8_0.gguf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = hub.listing("unsloth/Tiny-GGUF")
    assert cached.from_cache and cached.commit == listing.commit
    assert cached.paths == ["Tiny-Q8_0.gguf", "mtp-Tiny-Q8_0.gguf"]
    assert cached.file("Tiny-Q8_0.gguf").sha256 == listing.file("Tiny-Q8_0.gguf").sha256
    with pytest.raises(OfflineError):
        hub.listing("bartowski/Tiny-GGUF")
