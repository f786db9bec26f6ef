"""One catalogue of speculative types (engine_ext/spec_catalog.py): the engine, the CLI, the TUI and the README
read it, and the CLI and the TUI load the target the same way for every type."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.cli import build_parser
from app.cli.engine_args import model_params, target_load_plan
from app.core.config import SpeculativeSettings
from app.core.speculation_facts import DRAFT_KIND_TYPES, KIND_TYPES, TYPE_HELP, load_options, supported_types
from engine_ext.params import SPEC_TYPES, SpeculativeParams
from engine_ext.spec_catalog import CATALOGUE, MODEL_DRAFTER_TYPES, NGRAM_TYPES, markdown_table
from engine_ext.speculative import factory
from models_catalog.drafts import DRAFT_TYPE_KINDS

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("llama", "qwen35", "qwen35_mtp", "qwen3next", "nemotron_h_moe_mtp")
DRAFTS = (None, "llama", "qwen35_mtp_sidecar", "dflash", "eagle3")


def _cli_args(spec_type: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "-p", "hi", "--spec-type", spec_type, "--spec-draft-n-max", "6"])


@pytest.mark.parametrize("target", TARGETS)
def test_the_cli_and_the_tui_load_every_type_the_same_way(tiny_models: dict[str, Path], target: str) -> None:
    model = tiny_models[target]
    seen: set[tuple[bool, int]] = set()
    for spec in CATALOGUE:
        for draft in DRAFTS:
            draft_model = str(tiny_models[draft]) if draft else None
            args = _cli_args(spec.name)
            cli_spec = SpeculativeParams(types=(spec.name,), draft_model=draft_model, n_max=6)
            cli = (model_params(args, cli_spec, model).load_mtp, target_load_plan(cli_spec, model).n_rs_seq)
            tui = load_options(
                str(model),
                SpeculativeSettings(enabled=True, spec_type=spec.name, draft_model=draft_model or "", n_max=6),
            )
            assert cli == tui, (spec.name, draft)
            seen.add(cli)
    # Off: nothing extra, both ways.
    assert load_options(str(model), SpeculativeSettings(enabled=False)) == (False, 0)
    assert model_params(_cli_args("auto"), None, model).load_mtp is False
    # The rule is not trivially constant: what each target gets.
    expected = {
        "llama": {(False, 0)},  # no heads, no recurrent state
        "qwen35": {(False, 0), (False, 6)},  # rolls back for model drafters
        "qwen35_mtp": {(False, 0), (False, 6), (True, 6)},  # and loads its heads for draft-mtp/auto
        "qwen3next": {(False, 0)},  # hybrid, but restores checkpoints instead (not a rollback architecture)
        "nemotron_h_moe_mtp": {(False, 0), (False, 6), (True, 6)},
    }[target]
    assert seen == expected


def test_load_rules_for_a_model_with_heads(tiny_models: dict[str, Path]) -> None:
    mtp = tiny_models["qwen35_mtp"]
    sidecar = str(tiny_models["qwen35_mtp_sidecar"])

    def plan(types: tuple[str, ...], draft: str | None = None) -> tuple[bool, int]:
        p = target_load_plan(SpeculativeParams(types=types, draft_model=draft, n_max=6), mtp)
        return p.load_mtp, p.n_rs_seq

    assert plan(("ngram-mod",)) == (False, 0)
    assert plan(("draft-mtp",)) == (True, 6)
    assert plan(("draft-mtp",), sidecar) == (False, 6)  # the sidecar drafts: the target's heads are not loaded
    assert plan(("auto",)) == (True, 6)
    assert plan(("ngram-mod", "draft-mtp")) == (True, 6)  # a chain: the CLI takes several types
    assert plan(("draft-simple",), str(tiny_models["qwen35"])) == (False, 6)


def test_every_reader_shares_the_catalogue() -> None:
    names = tuple(t.name for t in CATALOGUE)
    assert SPEC_TYPES == names
    assert set(TYPE_HELP) == set(names)
    assert factory.NGRAM_TYPES == NGRAM_TYPES == tuple(n for n in names if n.startswith("ngram-"))
    assert set(MODEL_DRAFTER_TYPES) == {n for n in names if n.startswith("draft-")}
    # Draft files: each kind and each metadata type maps to a type of the catalogue, both ways round.
    assert set(KIND_TYPES.values()) == set(MODEL_DRAFTER_TYPES)
    for draft_type, kind in DRAFT_TYPE_KINDS.items():
        assert DRAFT_KIND_TYPES[draft_type] == KIND_TYPES[kind]
    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    for name in names:
        assert name in help_text


def test_the_readme_carries_the_catalogue_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme, (
        "README's speculative types table: regenerate it with `python -m engine_ext.spec_catalog`"
    )


def test_the_tui_offers_types_by_the_catalogue(tiny_models: dict[str, Path]) -> None:
    llama = str(tiny_models["llama"])
    offered = dict(supported_types(llama, ""))
    assert list(offered) == ["auto", *NGRAM_TYPES]
    assert all(offered[t] == TYPE_HELP[t] for t in offered)
    for draft, spec_type in (("dflash", "draft-dflash"), ("eagle3", "draft-eagle3"), ("llama", "draft-simple")):
        types = dict(supported_types(llama, str(tiny_models[draft])))
        assert spec_type in types and types[spec_type].startswith(TYPE_HELP[spec_type]), (draft, types)
