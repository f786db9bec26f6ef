"""Draft models found on disk for a target: sidecars beside it, paired draft repos, same-vocabulary models; and the
draft the app's speculative settings use by default."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.core.config import SpeculativeSettings
from app.core.speculation_facts import effective_settings, supported_types
from models_catalog.catalog import Catalog, CatalogEntry
from models_catalog.drafts import DraftCandidate, draft_candidates, missing_drafts
from models_catalog.library import LocalModel


def _local(path: Path, repo_id: str | None = None) -> LocalModel:
    return LocalModel(path.name, path, "test", repo_id, "", (path,), path.stat().st_size)


def _kinds(candidates: list[DraftCandidate]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.path.name, c.where) for c in candidates]


def test_sidecars_beside_the_model_in_llama_cpp_order_and_only_those_that_fit(tiny_models: dict[str, Path]) -> None:
    beside = "beside the model"
    # The tiny llama's folder holds its DFlash, DSpark and EAGLE3 drafts and a qwen35 MTP sidecar: the MTP head is
    # another architecture's, so it is not offered; the rest come in llama.cpp's order (mtp > dspark > dflash > eagle3).
    assert _kinds(draft_candidates(tiny_models["llama"])) == [
        ("dspark", "dspark-tiny-llama.gguf", beside),
        ("dflash", "dflash-tiny-llama.gguf", beside),
        ("eagle3", "eagle3-tiny-llama.gguf", beside),
    ]
    assert _kinds(draft_candidates(tiny_models["qwen35"]))[0] == ("mtp", "mtp-tiny-qwen35.gguf", beside)


def test_nothing_for_a_model_alone_or_an_unreadable_one(lone_llama: Path, tmp_path: Path) -> None:
    assert draft_candidates(lone_llama) == []
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00 not a header")
    shutil.copyfile(lone_llama.parent / lone_llama.name, tmp_path / "dflash-broken.gguf")  # a "draft" that is a model
    (tmp_path / "mtp-garbage.gguf").write_bytes(b"nonsense")
    assert draft_candidates(broken) == []
    model = tmp_path / "model.gguf"
    shutil.copyfile(lone_llama, model)
    # dflash-broken.gguf is named like a DFlash draft but its header says it is a plain model; mtp-garbage is no GGUF.
    assert draft_candidates(model) == []


def test_paired_draft_repo_in_the_cache_and_smaller_models_with_the_same_vocabulary(
    tiny_models: dict[str, Path], lone_llama: Path, tmp_path: Path
) -> None:
    draft_dir = tmp_path / "draft-repo"
    draft_dir.mkdir()
    draft = draft_dir / "Tiny-DFlash-Q8_0.gguf"  # a paired repo's file needs no sidecar name
    shutil.copyfile(tiny_models["dflash"], draft)
    entry = CatalogEntry(
        "tiny",
        "Tiny",
        "tiny",
        ("org/tiny",),
        True,
        0.1,
        0.1,
        "llama",
        2048,
        "mit",
        "",
        False,
        False,
        drafts={"dflash": "org/tiny-dflash"},
    )
    catalog = Catalog([entry])
    models = [
        _local(lone_llama, "org/tiny"),
        _local(draft, "org/tiny-dflash"),
        _local(tiny_models["qwen3"]),
        _local(tiny_models["qwen35"]),
    ]
    found = draft_candidates(lone_llama, models, catalog)
    assert ("dflash", draft.name, "paired draft repo org/tiny-dflash") in _kinds(found)
    # What the catalog pairs with the model and is not downloaded: here nothing (the DFlash draft is in the cache).
    assert missing_drafts(lone_llama, models, catalog, found) == []
    mtp_and_more = CatalogEntry(
        "tiny",
        "Tiny",
        "tiny",
        ("org/tiny",),
        True,
        0.1,
        0.1,
        "llama",
        2048,
        "mit",
        "sidecar",
        False,
        False,
        drafts={"dflash2": "org/tiny-dflash", "dspark": "org/tiny-dspark"},
    )
    assert missing_drafts(lone_llama, models, Catalog([mtp_and_more]), found) == [
        ("mtp", "org/tiny"),
        ("dspark", "org/tiny-dspark"),
    ]
    assert missing_drafts(lone_llama, [], Catalog([mtp_and_more]), found) == []  # not a cache model: unknown repo
    # With nothing beside the model, auto drafts with the paired draft (never with a plain smaller model).
    sidecars = [c for c in found if c.kind != "model"]
    chosen = effective_settings(str(lone_llama), SpeculativeSettings(enabled=True), sidecars)
    assert chosen.draft_model == str(draft)
    # draft-simple candidates: smaller models with the same tokenizer, smallest first; never the target itself.
    simple = [c for c in found if c.kind == "model"]
    assert all(c.where == "same vocabulary" and c.path != lone_llama for c in simple)
    assert [c.size for c in simple] == sorted(c.size for c in simple)
    assert all(c.size < lone_llama.stat().st_size for c in simple)
    # Without the library, only what lies beside the model.
    assert draft_candidates(lone_llama, [], catalog) == []


def test_effective_settings_fill_the_draft_from_the_sidecars(tiny_models: dict[str, Path]) -> None:
    llama, qwen35, heads = (str(tiny_models[k]) for k in ("llama", "qwen35", "qwen35_mtp"))
    auto = SpeculativeSettings(enabled=True)
    for model, expected in ((llama, "dspark-tiny-llama.gguf"), (qwen35, "mtp-tiny-qwen35.gguf")):
        sidecars = draft_candidates(Path(model))
        assert Path(effective_settings(model, auto, sidecars).draft_model).name == expected
    # A fixed type takes its own kind's sidecar; a type with none, or n-grams, take nothing.
    sidecars = draft_candidates(Path(llama))
    dflash = SpeculativeSettings(enabled=True, spec_type="draft-dflash")
    assert Path(effective_settings(llama, dflash, sidecars).draft_model).name == "dflash-tiny-llama.gguf"
    for spec_type in ("ngram-mod", "draft-mtp", "draft-simple"):
        settings = SpeculativeSettings(enabled=True, spec_type=spec_type)
        assert effective_settings(llama, settings, sidecars) == settings
    # A model with its own MTP heads drafts with them under auto; a draft file the user named always wins.
    assert effective_settings(heads, auto, draft_candidates(Path(heads))) == auto
    named = SpeculativeSettings(enabled=True, draft_model=str(tiny_models["eagle3"]))
    assert effective_settings(llama, named, sidecars) == named
    # The panel lists the sidecars' types (with their files) while no draft file is named.
    listed = dict(supported_types(llama, "", sidecars))
    assert {"draft-dspark", "draft-dflash", "draft-eagle3"} <= set(listed)
    assert "dflash-tiny-llama.gguf" in listed["draft-dflash"]
    assert "draft-dspark" not in dict(supported_types(llama, str(tiny_models["eagle3"]), sidecars))
