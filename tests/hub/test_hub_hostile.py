"""A hostile repository cannot make llmtui write outside the Hugging Face cache: file names and ids from a listing
are checked before any path is built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_catalog import hub
from models_catalog.errors import HubError
from models_catalog.hfcache import RepoCache, is_oid, safe_repo_path
from tests.hub_server import HubServer

COMMIT = "a" * 40
SHA256 = "b" * 64


@pytest.mark.parametrize("path", ["model.gguf", "sub/dir/model-Q4_K_M.gguf", "mtp-model.gguf", "a..b.gguf"])
def test_ordinary_repository_paths_are_safe(path: str) -> None:
    assert safe_repo_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "../evil.gguf",
        "a/../../evil.gguf",
        "/etc/passwd",
        "a//b.gguf",
        "./a.gguf",
        "a\\..\\b.gguf",
        "a\0b.gguf",
        "",
        "x" * 2000,
        "dir/",
    ],
)
def test_paths_that_leave_the_snapshot_are_refused(path: str, tmp_path: Path) -> None:
    assert not safe_repo_path(path)
    with pytest.raises(HubError, match="unsafe file path"):
        RepoCache(tmp_path, "org/repo").pointer(COMMIT, path)


@pytest.mark.parametrize("oid", ["../../x", "abc", SHA256.upper(), SHA256 + "0", ""])
def test_blob_ids_must_be_ids(oid: str, tmp_path: Path) -> None:
    assert not is_oid(oid)
    cache = RepoCache(tmp_path, "org/repo")
    for build in (cache.blob, cache.partial):
        with pytest.raises(HubError, match="unsafe blob id"):
            build(oid)
    with pytest.raises(HubError, match="unsafe commit"):
        cache.pointer("../" + COMMIT[3:], "model.gguf")
    assert is_oid(SHA256) and is_oid(COMMIT)


def test_a_listing_with_a_traversal_name_is_refused(hub_server: HubServer) -> None:
    hub_server.add_repo("evil/Traversal-GGUF", {"../../../outside.gguf": b"GGUF" + b"\0" * 60, "ok.gguf": b"GGUF"})
    with pytest.raises(HubError, match=r"unsafe name or id \('\.\./\.\./\.\./outside\.gguf'\)"):
        hub.list_repo("evil/Traversal-GGUF")
    hub_server.add_repo("good/Plain-GGUF", {"model-Q4_K_M.gguf": b"GGUF" + b"\0" * 60})
    assert [f.path for f in hub.list_repo("good/Plain-GGUF").files] == ["model-Q4_K_M.gguf"]
