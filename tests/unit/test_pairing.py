"""llama.cpp's file rules (common/download.cpp) ported to models_catalog.pairing, over several repo layouts."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from models_catalog.pairing import (
    SplitInfo,
    draft_kind_for,
    find_best_model,
    find_best_sibling,
    is_model_file,
    local_draft_sidecar,
    plan_download,
    quant_bits,
    split_files,
    split_info,
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("Qwen3-8B-Q4_K_M.gguf", SplitInfo("Qwen3-8B-Q4_K_M", "Q4_K_M", 1, 1)),
        ("model.Q8_0.gguf", SplitInfo("model.Q8_0", "Q8_0", 1, 1)),
        ("model-q4_k_m.gguf", SplitInfo("model-q4_k_m", "Q4_K_M", 1, 1)),  # case-insensitive, upper-cased
        ("Qwen3.5-9B-UD-Q4_K_XL.gguf", SplitInfo("Qwen3.5-9B-UD-Q4_K_XL", "Q4_K_XL", 1, 1)),
        ("BF16/M-BF16-00002-of-00003.gguf", SplitInfo("BF16/M-BF16", "BF16", 2, 3)),
        ("noquant.gguf", SplitInfo("noquant", "", 1, 1)),
        ("README.md", SplitInfo()),
    ],
)
def test_split_info_and_tags_as_llama_cpp(path: str, expected: SplitInfo) -> None:
    assert split_info(path) == expected


def test_quant_bits_is_the_first_number_of_the_tag() -> None:
    assert [quant_bits(f"m-{t}.gguf") for t in ("Q4_K_M", "F16", "BF16", "NVFP4", "IQ2_XXS", "Q8_0")] == [
        4,
        16,
        16,
        4,
        2,
        8,
    ]
    assert quant_bits("m.gguf") == 0


def test_companion_files_are_not_models() -> None:
    for name in (
        "mmproj-M-F16.gguf",
        "M.imatrix.gguf",
        "mtp-M-Q8_0.gguf",
        "eagle3-M.gguf",
        "dflash-M.gguf",
        "dspark-M.gguf",
        "notes.txt",
    ):
        assert not is_model_file(name), name
    assert is_model_file("dir/M-Q4_K_M.gguf")
    assert is_model_file("mtp-heads/M-Q4_K_M.gguf")  # only the basename counts


FLAT = [
    "M-Q2_K.gguf",
    "M-Q4_K_M.gguf",
    "M-Q8_0.gguf",
    "M.imatrix.gguf",
    "mmproj-M-F16.gguf",
    "mtp-M-Q4_K_M.gguf",
    "mtp-M-Q8_0.gguf",
    "README.md",
]


def test_flat_layout_picks_the_exact_tag_sidecar() -> None:
    plan = plan_download("o/M", "Q4_K_M", FLAT, ["mtp", "mmproj"])
    assert plan is not None
    assert plan.primary == "M-Q4_K_M.gguf" and plan.model_files == ("M-Q4_K_M.gguf",)
    assert plan.sidecars == {"mtp": "mtp-M-Q4_K_M.gguf", "mmproj": "mmproj-M-F16.gguf"}


def test_without_a_tag_q4_k_m_then_q8_0_then_the_first_model() -> None:
    assert find_best_model(FLAT, "") == "M-Q4_K_M.gguf"
    assert find_best_model(["a-Q8_0.gguf", "b-Q5_K_M.gguf"], "") == "a-Q8_0.gguf"
    assert find_best_model(["mtp-x-Q4_K_M.gguf", "b-Q5_K_M.gguf", "c-Q6_K.gguf"], "") == "b-Q5_K_M.gguf"
    assert find_best_model(FLAT, "Q6_K") is None  # an explicit tag never falls back


UNSLOTH = [
    "BF16/M-BF16-00001-of-00002.gguf",
    "BF16/M-BF16-00002-of-00002.gguf",
    "M-UD-Q4_K_XL.gguf",
    "Q8_0/M-Q8_0-00001-of-00003.gguf",
    "Q8_0/M-Q8_0-00002-of-00003.gguf",
    "Q8_0/M-Q8_0-00003-of-00003.gguf",
    "Q8_0/mtp-M-Q8_0.gguf",
    "mtp-M-BF16.gguf",
    "mtp-M-Q4_K_XL.gguf",
    "other/mtp-M-Q8_0.gguf",
]


def test_split_shards_in_quant_folders_and_the_deepest_sidecar() -> None:
    plan = plan_download("o/M", "Q8_0", UNSLOTH, ["mtp"])
    assert plan is not None
    assert plan.primary == "Q8_0/M-Q8_0-00001-of-00003.gguf"
    assert plan.model_files == tuple(f"Q8_0/M-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert plan.sidecars["mtp"] == "Q8_0/mtp-M-Q8_0.gguf"  # same folder beats the root
    # BF16 lives in its own folder: only root sidecars qualify (other/ and Q8_0/ are not its ancestors)
    bf16 = plan_download("o/M", "BF16", UNSLOTH, ["mtp"])
    assert bf16 is not None and bf16.sidecars["mtp"] == "mtp-M-BF16.gguf"
    ud = plan_download("o/M", "UD-Q4_K_XL", UNSLOTH, ["mtp"])
    assert ud is not None and ud.primary == "M-UD-Q4_K_XL.gguf" and ud.sidecars["mtp"] == "mtp-M-Q4_K_XL.gguf"


def test_a_second_shard_is_never_the_primary() -> None:
    files = ["M-Q4_K_M-00002-of-00002.gguf", "M-Q4_K_M-00001-of-00002.gguf"]
    assert find_best_model(files, "Q4_K_M") == "M-Q4_K_M-00001-of-00002.gguf"
    assert split_files(files, "M-Q4_K_M-00001-of-00002.gguf") == files


def test_without_an_exact_tag_the_closest_bits_win() -> None:
    files = ["M-Q6_K.gguf", "mtp-M-F16.gguf", "mtp-M-Q8_0.gguf", "mtp-M-Q2_K.gguf"]
    assert find_best_sibling(files, "M-Q6_K.gguf", "mtp-", "Q6_K") == "mtp-M-Q8_0.gguf"  # |8-6| beats |2-6| and |16-6|
    assert find_best_sibling(files, "M-Q6_K.gguf", "mtp-") == "mtp-M-Q8_0.gguf"  # bits from the model's tag
    # ties keep the first in listing order
    assert find_best_sibling(["mtp-a-Q4_0.gguf", "mtp-b-Q4_1.gguf"], "M-Q4_K_M.gguf", "mtp-") == "mtp-a-Q4_0.gguf"


def test_exact_tag_needs_dash_tag_dot() -> None:
    files = ["mtp-M-Q4_K_M-extra.gguf", "mtp-M-Q4_K_M.gguf"]
    assert find_best_sibling(files, "M-Q4_K_M.gguf", "mtp-", "q4_k_m") == "mtp-M-Q4_K_M.gguf"


@pytest.mark.parametrize(
    ("kind", "keyword_file"),
    [("dflash", "dflash-M-Q8_0.gguf"), ("dspark", "dspark-M.gguf"), ("eagle3", "eagle3-M-BF16.gguf")],
)
def test_draft_kinds_by_keyword(kind: str, keyword_file: str) -> None:
    files = ["M-Q4_K_M.gguf", keyword_file, "mtp-M-Q4_K_M.gguf"]
    plan = plan_download("o/M", "Q4_K_M", files, [kind])
    assert plan is not None and plan.sidecars == {kind: keyword_file}


def test_missing_sidecars_are_reported_and_a_sidecar_alone_is_a_plan() -> None:
    plan = plan_download("o/M", "Q4_K_M", ["M-Q4_K_M.gguf"], ["mtp", "dflash"])
    assert plan is not None and plan.sidecars == {} and plan.missing_sidecars == ("mtp", "dflash")
    alone = plan_download("o/D", "Q8_0", ["mtp-D-Q8_0.gguf"], ["mtp"])
    assert alone is not None and alone.primary is None and alone.sidecars == {"mtp": "mtp-D-Q8_0.gguf"}
    assert plan_download("o/M", "Q4_K_M", ["README.md"], []) is None
    with pytest.raises(ValueError, match="unknown sidecar kind"):
        plan_download("o/M", "", FLAT, ["medusa"])


def test_draft_type_order_and_local_folder_rule() -> None:
    assert draft_kind_for({"eagle3": "a", "dflash": "b", "mtp": "c"}) == "mtp"
    assert draft_kind_for({"eagle3": "a", "dflash": "b"}) == "dflash"
    assert draft_kind_for({"dflash": "a", "dspark": "b"}) == "dspark"
    assert draft_kind_for({}) is None
    # preset.cpp: basename *starts with* mtp-/dspark-/dflash-; the first found wins
    assert local_draft_sidecar(["M.gguf", "x-mtp-M.gguf", "dspark-M.gguf", "mtp-M.gguf"]) == "dspark-M.gguf"
    assert local_draft_sidecar(["M.gguf", "eagle3-M.gguf"]) is None


# ----- differential check against llama.cpp's own code ---------------------------------------------------

HARNESS = Path(__file__).parents[1] / "llama_download_rules.cpp"
DIRS = ["", "", "Q4_K_M/", "BF16/", "sub/", "sub/deeper/", "mtp-dir/"]
STEMS = ["M", "Model-7B", "mtp-M", "dflash-M", "dspark-M", "eagle3-M", "mmproj-M", "M.imatrix", "x-mtp-M"]
TAGS = ["Q4_K_M", "Q8_0", "F16", "BF16", "IQ2_XXS", "UD-Q4_K_XL", "q4_k_m", "NVFP4", "Q6_K", ""]


def _random_case(rng: random.Random) -> tuple[str, str, str, list[str]]:
    files: list[str] = []
    for _ in range(rng.randint(1, 9)):
        stem, tag = rng.choice(STEMS), rng.choice(TAGS)
        name = rng.choice(DIRS) + stem + (rng.choice("-.") + tag if tag else "")
        if rng.random() < 0.2:
            n = rng.randint(2, 3)
            files += [f"{name}-{i:05d}-of-{n:05d}.gguf" for i in rng.sample(range(1, n + 1), n)]
        else:
            files.append(name + rng.choice([".gguf"] * 5 + [".bin"]))
    model = rng.choice([*files, ""])
    keyword = rng.choice(["mtp-", "dflash-", "dspark-", "eagle3-", "mmproj"])
    return rng.choice(TAGS[:-1] + ["", ""]).replace("UD-", ""), keyword, model, files


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_same_choices_as_llama_cpp_on_random_repos(tmp_path: Path) -> None:
    exe = tmp_path / "rules"
    subprocess.run(["g++", "-std=c++17", "-O0", "-w", "-o", str(exe), str(HARNESS)], check=True, timeout=300)
    rng = random.Random(42)
    cases = [_random_case(rng) for _ in range(500)]
    stdin = "".join(
        f"{tag}\t{kw}\t{model}\n" + "".join(f + "\n" for f in files) + "\n" for tag, kw, model, files in cases
    )
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True, timeout=60).stdout
    lines = out.split("\n")[:-1]
    assert len(lines) == len(cases)
    for (tag, kw, model, files), line in zip(cases, lines, strict=True):
        want_model, want_sibling, want_shards = line.split("\t")
        got_model = find_best_model(files, tag) or ""
        got_sibling = find_best_sibling(files, model, kw, tag) or ""
        got_shards = "|".join(split_files(files, got_model)) if got_model else ""
        assert (got_model, got_sibling, got_shards) == (want_model, want_sibling, want_shards), (tag, kw, model, files)
