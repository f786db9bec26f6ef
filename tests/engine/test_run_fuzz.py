"""`run` on hostile metadata: what passes the loader's checks and then aborts llama.cpp is refused up front.

scripts/fuzz_run.py found these classes by loading seeded metadata mutants of real models in the worker; each
test below builds one mutant of its class and checks that validate_main_model refuses it with a one-line message
naming the key and the rule. A seeded sample then goes through the real worker: every case is refused by
validation, or loads and decodes, or fails cleanly (a load error) — a worker crash only for the class listed in
KNOWN_CRASHES, never a hang, never an exception in the test process. Draft files (a draft-simple model, an mtp-
sidecar, DFlash/DSpark/EAGLE3 drafts) go through the same rules when they load (Model calls validate_loadable):
one mutant per class that aborted llama.cpp as --spec-draft-model, and a seeded sample run as drafts in the worker.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from engine_ext.gguf import GGUFError, validate_loadable, validate_main_model
from scripts.fuzz_run import (
    DRAFT_PAIRS,
    KV,
    Model,
    Runner,
    TensorInfo,
    del_kv,
    draft_mutants,
    load_model,
    mutants,
    set_kv,
    write_mutant,
)

MAX_MESSAGE = 300
U32, I32, F32, STR, ARR = 4, 5, 6, 8, 9  # GGUFValueType
MAIN_KINDS = ("llama", "qwen3", "qwen35", "qwen35_mtp", "qwen3next", "nemotron_h_moe", "nemotron_h_moe_mtp")

# Worker crashes validation does not catch, matched on the crash signature (see scripts/fuzz_run.py):
# a 1-D weight (norm, bias) stored as F16 where the graph adds or multiplies it with F32 activations: the CPU
# backend's binary ops have no f32 x f16 kernel (ggml-cpu/binary-ops.cpp:135) while GPU backends do, and older
# converters wrote such files; which tensor meets which op is decided by each architecture's graph.
KNOWN_CRASHES = ("binary_op: unsupported types",)


@pytest.fixture(scope="module")
def parsed(tiny_models: dict[str, Path]) -> dict[str, Model]:
    return {kind: load_model(kind, tiny_models[kind]) for kind in (*MAIN_KINDS, *DRAFT_PAIRS)}


def _mutant(
    m: Model,
    tmp_path: Path,
    edits: list[KV] = (),
    drop: tuple[str, ...] = (),  # type: ignore[assignment]
    tensors: list[TensorInfo] | None = None,
) -> Path:
    kvs = list(m.kvs)
    for key in drop:
        kvs = del_kv(kvs, key)
    for edit in edits:
        kvs = set_kv(kvs, edit)
    return write_mutant(m, kvs, m.tensors if tensors is None else tensors, tmp_path / f"{m.name}-mutant.gguf")


def _refused(path: Path) -> str:
    with pytest.raises(GGUFError) as exc:
        validate_main_model(path)
    message = str(exc.value)
    assert "\n" not in message and len(message) <= MAX_MESSAGE, message
    return message


def _tokens(m: Model) -> list[str]:
    return list(m.get("tokenizer.ggml.tokens"))


# one mutant per crash class: (model, edits, expected words in the message, the assert it avoids)
CLASSES: dict[str, tuple[str, list[KV], str]] = {
    # llama-model.cpp:1328 GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)
    "block_count 0": ("llama", [("llama.block_count", U32, -1, 0)], "llama.block_count is 0 (must be 1 to 512)"),
    "block_count 1000": ("qwen3", [("qwen3.block_count", U32, -1, 1000)], "qwen3.block_count is 1000 (must be 1 to"),
    # llama-model.cpp:1330 GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all)
    "nextn above block_count": (
        "qwen35_mtp",
        [("qwen35.nextn_predict_layers", U32, -1, 16)],
        "qwen35.nextn_predict_layers is 16 (must be 0 to",
    ),
    # llama-model.cpp:1364 GGML_ASSERT(n_expert_used_max > 0)
    "experts without used count": (
        "llama",
        [("llama.expert_count", U32, -1, 4)],
        "llama.expert_count is 4 but expert_used_count is 0 or missing",
    ),
    # llama-model.cpp:1362 GGML_ASSERT(n_expert_used_max <= hparams.n_expert)
    "used above expert_count": (
        "nemotron_h_moe",
        [("nemotron_h_moe.expert_count", U32, -1, 0)],
        "nemotron_h_moe.expert_used_count 3 exceeds expert_count 0",
    ),
    # ggml-cpu/ops.cpp:4132 GGML_ASSERT(eps >= 0.0f) in rms_norm
    "negative rms epsilon": (
        "nemotron_h_moe",
        [("nemotron_h_moe.attention.layer_norm_rms_epsilon", F32, -1, -1.0)],
        "nemotron_h_moe.attention.layer_norm_rms_epsilon is -1.0 (must be >= 0)",
    ),
    "NaN rms epsilon": (
        "llama",
        [("llama.attention.layer_norm_rms_epsilon", F32, -1, float("nan"))],
        "llama.attention.layer_norm_rms_epsilon is nan (must be >= 0)",
    ),
    # llama-model.cpp:1420 GGML_ASSERT(hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
    "unknown rope scaling": (
        "qwen3",
        [("qwen3.rope.scaling.type", STR, -1, "bogus")],
        "qwen3.rope.scaling.type 'bogus' is unknown (one of none, linear, yarn, longrope)",
    ),
    # models/qwen3.cpp:57 GGML_ASSERT(n_embd_head == n_rot)
    "rope dims not the head size": (
        "qwen3",
        [("qwen3.rope.dimension_count", U32, -1, 8)],
        "qwen3.rope.dimension_count 8 must equal the head size 16 for qwen3",
    ),
    # ggml-cpu/ops.cpp:6356 GGML_ASSERT(n_dims % 2 == 0)
    "odd rope dims": (
        "qwen35",
        [("qwen35.rope.dimension_count", U32, -1, 15)],
        "qwen35.rope.dimension_count 15 must be even, 2 to the head size",
    ),
    # ggml-cpu/ops.cpp:6355 GGML_ASSERT(n_dims <= ne0)
    "rope dims above the head": (
        "qwen35_mtp",
        [("qwen35.rope.dimension_count", U32, -1, 256)],
        "qwen35.rope.dimension_count 256 must be even, 2 to the head size",
    ),
    # rope over 0 dimensions: the decode never returns (ggml_graph_compute spins)
    "zero rope dims": (
        "qwen3next",
        [("qwen3next.rope.dimension_count", U32, -1, 0)],
        "qwen3next.rope.dimension_count 0 must be even, 2 to the head size",
    ),
    # ggml.c:4014 GGML_ASSERT(a->ne[0] == b->ne[0]) in ggml_set_rows (the KV cache of that layer)
    "per-layer kv heads above heads": (
        "llama",
        [("llama.attention.head_count_kv", ARR, U32, [2, 8])],
        "llama.attention.head_count_kv is 8 at layer 1 but blk.1.attn_k.weight has 32",
    ),
    # grouped-query attention (ggml_mul_mat's broadcast of K/V over the heads)
    "kv heads not dividing heads": (
        "llama",
        [("llama.attention.head_count_kv", U32, -1, 3)],
        "llama.attention.head_count_kv 3 must divide head_count 4",
    ),
    "per-layer kv heads against K": (
        "qwen3next",
        [("qwen3next.attention.head_count_kv", ARR, U32, [2, 0, 2, 2])],
        "qwen3next.attention.head_count_kv is 0 at layer 1 but blk.1.attn_k.weight has",
    ),
    # ggml-cpu/ops.cpp:6232 GGML_ASSERT(sect_dims <= ne0) in ggml_mrope_cache_init
    "rope sections above the head": (
        "qwen35_mtp",
        [("qwen35.rope.dimension_sections", ARR, I32, [8, 4, 8, 16])],
        "qwen35.rope.dimension_sections [8, 4, 8, 16] add up to more than the head size",
    ),
    # models/qwen35.cpp:21 (i + 1) % full_attn_interval: SIGFPE
    "zero attention interval": (
        "qwen35",
        [("qwen35.full_attention_interval", U32, -1, 0)],
        "qwen35.full_attention_interval is 0 (must be at least 1)",
    ),
    # llama-vocab.cpp:3422 GGML_ASSERT(tokenizer && "Tokenizer not initialized. ...") on the first tokenize
    "no tokenizer": (
        "qwen35_mtp",
        [("tokenizer.ggml.model", STR, -1, "none")],
        "tokenizer.ggml.model is 'none': the model has no tokenizer to chat with",
    ),
    # llama-vocab.cpp:4014 token_to_id.at() throws std::out_of_range through the C API: terminate, SIGABRT
    "SentencePiece without byte tokens": (
        "llama",
        [("tokenizer.ggml.model", STR, -1, "llama")],
        "tokenizer.ggml.model is 'llama' (SentencePiece) but the vocabulary has no byte token for",
    ),
    # models/nemotron-h.cpp:115 n_ff(i) / n_expert_used(i): SIGFPE on a layer turned MoE with no experts routed
    "MoE layer routing no expert": (
        "nemotron_h_moe",
        [("nemotron_h_moe.feed_forward_length", ARR, U32, [0, 17, 64, 0, 64])],
        "nemotron_h_moe.feed_forward_length is 17 at layer 1 (an MoE layer) but",
    ),
    # ggml.c:2645 GGML_ASSERT(a->ne[d] == b->ne[d]) in ggml_concat (models/qwen35.cpp:346 head_v_dim = d_inner / ...)
    "GDN inner size": (
        "qwen35",
        [("qwen35.ssm.inner_size", U32, -1, 7)],
        "qwen35.ssm.inner_size 7 must equal ssm.state_size × ssm.time_step_rank",
    ),
    # ggml-backend.cpp:2527 GGML_ASSERT((uintptr_t)ptr % TENSOR_ALIGNMENT == 0 && "buffer pointer must be aligned")
    "alignment below 32": ("qwen3", [("general.alignment", U32, -1, 8)], "not a multiple of 32 (general.alignment"),
}


@pytest.mark.parametrize("case", sorted(CLASSES))
def test_crash_class_is_refused(parsed: dict[str, Model], tmp_path: Path, case: str) -> None:
    model, edits, expected = CLASSES[case]
    path = _mutant(parsed[model], tmp_path, edits)
    message = _refused(path)
    assert expected in message, message
    assert "llama.cpp would" in message


def test_duplicate_token_is_refused(parsed: dict[str, Model], tmp_path: Path) -> None:
    """llama-vocab.cpp:2544 GGML_ASSERT(id_to_token.size() == token_to_id.size())."""
    m = parsed["qwen3"]
    tokens = _tokens(m)
    tokens[300 % len(tokens)] = tokens[5]
    message = _refused(_mutant(m, tmp_path, [("tokenizer.ggml.tokens", ARR, STR, tokens)]))
    assert f"tokenizer.ggml.tokens has {tokens[5]!r} twice (ids 5 and {300 % len(tokens)})" in message


def test_empty_tokens_are_renamed_not_duplicates(parsed: dict[str, Model], tmp_path: Path) -> None:
    """llama.cpp renames an empty token to [EMPTY_<id>], so two empty tokens are no duplicate."""
    m = parsed["llama"]
    tokens = _tokens(m)
    tokens[10] = tokens[11] = ""
    validate_main_model(_mutant(m, tmp_path, [("tokenizer.ggml.tokens", ARR, STR, tokens)]))


def test_integer_weight_is_refused(parsed: dict[str, Model], tmp_path: Path) -> None:
    """An I32 weight: the CPU binary ops abort (binary-ops.cpp:135) or the matmul segfaults."""
    m = parsed["llama"]
    tensors = [
        TensorInfo(t.name, list(t.shape), 26 if t.name == "blk.1.attn_v.weight" else t.type_id, t.offset)
        for t in m.tensors
    ]
    message = _refused(_mutant(m, tmp_path, tensors=tensors))
    assert "tensor 'blk.1.attn_v.weight' has the integer type I32" in message


def test_per_layer_values_a_graph_ignores_still_load(parsed: dict[str, Model], tmp_path: Path) -> None:
    """Found by the fuzz: a per-layer head count llama's graph never reads (it uses layer 0's), and a KV head
    count on a recurrent layer, load and decode in llama.cpp, so they are not refused."""
    m = parsed["llama"]
    validate_main_model(_mutant(m, tmp_path, [("llama.attention.head_count", ARR, U32, [4, 9])]))
    m = parsed["qwen35_mtp"]  # layer 2 is a gated delta net layer: no KV cache, no K projection
    validate_main_model(_mutant(m, tmp_path, [("qwen35.attention.head_count_kv", ARR, U32, [2, 2, 3, 2, 2])]))


def test_rope_keys_a_graph_does_not_use_still_load(parsed: dict[str, Model], tmp_path: Path) -> None:
    """Found by the fuzz: Nemotron-H has no rope (any rope.dimension_count loads), and rope sections whose int32
    sum wraps negative pass llama.cpp's sect_dims <= ne0 assert: neither is refused."""
    m = parsed["nemotron_h_moe"]
    for n_rot in (0, 15, 1000):
        validate_main_model(_mutant(m, tmp_path, [("nemotron_h_moe.rope.dimension_count", U32, -1, n_rot)]))
    m = parsed["qwen35_mtp"]
    validate_main_model(_mutant(m, tmp_path, [("qwen35.rope.dimension_sections", ARR, I32, [2**31 - 1, 2, 4, 0])]))


def _engine_sdist() -> Path:
    """The sdist the engine was built from: scripts/build_engine.sh downloads it into build/engine-src/ of the checkout
    it runs in and keeps it. That is this checkout, or (a git worktree, or a test run with another checkout's venv) the
    checkout the running venv sits in (``.venv`` at its root, as scripts/setup.sh makes it)."""
    import sys
    from importlib.metadata import version

    name = f"llama_cpp_python-{version('llama-cpp-python')}.tar.gz"
    checkouts = (Path(__file__).resolve().parents[2], Path(sys.prefix).resolve().parent)
    candidates = [checkout / "build" / "engine-src" / name for checkout in checkouts]
    return next((path for path in candidates if path.is_file()), candidates[0])


VOCAB_MEMBER = "/vendor/llama.cpp/models/ggml-vocab-"
MAX_VOCAB_BYTES = 64 << 20  # the largest, gemma-4's, is 16 MB


@pytest.fixture(scope="module")
def real_vocabularies(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """llama.cpp's own vocabulary files (models/ggml-vocab-*.gguf), taken from the engine's sdist into a temporary
    folder."""
    import tarfile

    sdist = _engine_sdist()
    if not sdist.is_file():
        pytest.skip(
            f"no engine sdist at {sdist} (scripts/build_engine.sh downloads it there when it builds the engine)"
        )
    folder = tmp_path_factory.mktemp("ggml-vocab")
    paths = []
    with tarfile.open(sdist) as archive:
        for member in archive:
            name = member.name.rsplit("/", 1)[-1]
            if VOCAB_MEMBER in member.name and name.endswith(".gguf") and member.isfile():
                assert member.size <= MAX_VOCAB_BYTES, (member.name, member.size)
                source = archive.extractfile(member)
                assert source is not None, member.name
                (folder / name).write_bytes(source.read())
                paths.append(folder / name)
    return sorted(paths)


def test_real_vocabularies_pass_the_tokenizer_rules(real_vocabularies: list[Path]) -> None:
    """llama.cpp's own vocabulary files (SentencePiece, BPE, WordPiece, UGM, 256k-token ones) break no rule."""
    assert len(real_vocabularies) >= 10, real_vocabularies
    for path in real_vocabularies:
        t0 = time.perf_counter()
        validate_loadable(path)  # the header read, then every rule
        assert time.perf_counter() - t0 < 2.0, path.name


def test_special_token_ids_out_of_range_still_load(parsed: dict[str, Model], tmp_path: Path) -> None:
    """llama.cpp ignores an out-of-range special token id (llama-vocab.cpp 'bad special token'): not refused."""
    m = parsed["llama"]
    n = len(_tokens(m))
    validate_main_model(
        _mutant(
            m,
            tmp_path,
            [("tokenizer.ggml.eos_token_id", U32, -1, n + 70000), ("tokenizer.ggml.bos_token_id", U32, -1, 2**32 - 1)],
        )
    )


def test_valid_models_are_not_refused(tiny_models: dict[str, Path]) -> None:
    from app.core.model_paths import starter_model_path

    for kind in MAIN_KINDS:
        validate_main_model(tiny_models[kind])
    starter = starter_model_path()
    if starter is not None:
        t0 = time.perf_counter()
        validate_main_model(starter)
        assert time.perf_counter() - t0 < 2.0


# ----- a seeded sample through the real worker ---------------------------------------------------------------

SEED = 2103
N_SAMPLE = 40


def _check_outcomes(outcomes: list[tuple[str, Any]]) -> None:
    for what, out in outcomes:
        assert out.kind != "hang", f"{what}: {out.detail}"
        if out.kind == "refused":
            assert "\n" not in out.detail and len(out.detail) <= MAX_MESSAGE, f"{what}: {out.detail!r}"
        elif out.kind == "crash":
            assert any(k in out.detail for k in KNOWN_CRASHES), f"{what}: an uncaught worker crash: {out.detail}"
        else:
            assert out.kind in ("ok", "load_failed", "decode_failed"), f"{what}: {out.kind} {out.detail}"


def _run_sample(parsed: dict[str, Model], tmp_path: Path, seed: int, n: int) -> list[tuple[str, Any]]:
    runner = Runner(tmp_path / "engine.log", load_timeout=60.0, gen_timeout=30.0, n_ctx=256)
    outcomes = []
    try:
        for i, name, what, kvs, tensors in mutants({k: parsed[k] for k in MAIN_KINDS}, seed, n):
            path = write_mutant(parsed[name], kvs, tensors, tmp_path / f"mutant{i}.gguf")
            outcomes.append((f"#{i} {name} [{what}]", runner.run(path)))
            path.unlink()
    finally:
        runner.close()
    return outcomes


def test_seeded_mutants_in_the_worker(
    parsed: dict[str, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # an abort ends the worker at once (no gdb attaching)
    outcomes = _run_sample(parsed, tmp_path, SEED, N_SAMPLE)
    assert len(outcomes) == N_SAMPLE
    kinds = {out.kind for _, out in outcomes}
    assert "refused" in kinds and "ok" in kinds, kinds
    _check_outcomes(outcomes)


@pytest.mark.slow
def test_many_seeded_mutants_in_the_worker(
    parsed: dict[str, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")
    _check_outcomes(_run_sample(parsed, tmp_path, 21, 300))


# ----- draft files: the same rules, on the path that loads them (issue 32) -------------------------------------

# one mutant per kind of draft that aborted llama.cpp as --spec-draft-model while the same file as -m was refused:
# (draft kind, edits, expected words in the message)
DRAFT_CLASSES: dict[str, tuple[str, list[KV], str]] = {
    # llama-model.cpp:1328 GGML_ASSERT(hparams.n_layer_all > 0 ...), a draft-simple model
    "draft-simple block_count 0": ("qwen3", [("qwen3.block_count", U32, -1, 0)], "qwen3.block_count is 0 (must be 1"),
    # llama-model.cpp:1330 GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all), an mtp- sidecar
    "sidecar nextn 65535": (
        "qwen35_mtp_sidecar",
        [("qwen35.nextn_predict_layers", U32, -1, 65535)],
        "qwen35.nextn_predict_layers is 65535 (must be 0 to",
    ),
    "sidecar nextn 100": (
        "qwen35_mtp_sidecar",
        [("qwen35.nextn_predict_layers", U32, -1, 100)],
        "qwen35.nextn_predict_layers is 100 (must be 0 to",
    ),
    # ggml-cpu/ops.cpp:6355 GGML_ASSERT(n_dims <= ne0)
    "sidecar rope dims 65535": (
        "qwen35_mtp_sidecar",
        [("qwen35.rope.dimension_count", U32, -1, 65535)],
        "qwen35.rope.dimension_count 65535 must be even, 2 to the head size",
    ),
    # ggml-cpu/ops.cpp:6232 GGML_ASSERT(sect_dims <= ne0)
    "sidecar rope section 99": (
        "qwen35_mtp_sidecar",
        [("qwen35.rope.dimension_sections", ARR, I32, [4, 99, 0, 0])],
        "qwen35.rope.dimension_sections [4, 99, 0, 0] add up to more than the head size",
    ),
    "DFlash block_count 0": ("dflash", [("dflash.block_count", U32, -1, 0)], "dflash.block_count is 0 (must be 1"),
    "DSpark block_count 0": ("dspark", [("dflash.block_count", U32, -1, 0)], "dflash.block_count is 0 (must be 1"),
    "EAGLE3 block_count 0": ("eagle3", [("eagle3.block_count", U32, -1, 0)], "eagle3.block_count is 0 (must be 1"),
    # models/dflash.cpp:314 GGML_ASSERT(block_size > 0); past 64 positions the head overflows the graph (ggml.c:1814)
    "DSpark block_size 0": ("dspark", [("dflash.block_size", U32, -1, 0)], "dflash.block_size is 0 in a DSpark draft"),
    "DSpark block_size 4096": (
        "dspark",
        [("dflash.block_size", U32, -1, 4096)],
        "dflash.block_size is 4096 in a DSpark draft (must be 1 to 64)",
    ),
    "DSpark without block_size": ("dspark", [], "dflash.block_size is missing in a DSpark draft"),
    # ggml-cpu/ops.cpp:6237 (i0 / 2) % sect_dims: SIGFPE when the int32 sum of the sections wraps to 0
    "DSpark rope sections adding up to 0": (
        "dspark",
        [("dflash.rope.dimension_sections", ARR, I32, [2**31 - 1, 0, 2**31 - 1, 2])],
        "add up to 0 as int32",
    ),
    "sidecar rope sections all 0": (
        "qwen35_mtp_sidecar",
        [("qwen35.rope.dimension_sections", ARR, I32, [0, 0, 0, 0])],
        "qwen35.rope.dimension_sections [0, 0, 0, 0] add up to 0 as int32",
    ),
}
_DRAFT_DROPS = {"DSpark without block_size": ("dflash.block_size",)}


def _draft_mutant(parsed: dict[str, Model], tmp_path: Path, case: str) -> tuple[Path, str]:
    kind, edits, expected = DRAFT_CLASSES[case]
    path = _mutant(parsed[kind], tmp_path, edits, _DRAFT_DROPS.get(case, ()))
    if kind == "qwen35_mtp_sidecar":  # a sidecar is known by its mtp- name
        path = path.rename(path.with_name("mtp-" + path.name))
    return path, expected


@pytest.mark.parametrize("case", sorted(DRAFT_CLASSES))
def test_draft_crash_class_is_refused(parsed: dict[str, Model], tmp_path: Path, case: str) -> None:
    path, expected = _draft_mutant(parsed, tmp_path, case)
    with pytest.raises(GGUFError) as exc:
        validate_loadable(path)
    message = str(exc.value)
    assert expected in message and "llama.cpp would" in message, message
    assert "\n" not in message and len(message) <= MAX_MESSAGE, message


def test_valid_drafts_are_not_refused(tiny_models: dict[str, Path]) -> None:
    for kind in DRAFT_PAIRS:
        validate_loadable(tiny_models[kind])


def test_draft_crash_classes_in_the_worker(
    parsed: dict[str, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each class as --spec-draft-model of its target in the real worker: refused in one line, the worker alive."""
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")
    runner = Runner(tmp_path / "engine.log", load_timeout=60.0, gen_timeout=30.0, n_ctx=256)
    try:
        for case in sorted(DRAFT_CLASSES):
            path, expected = _draft_mutant(parsed, tmp_path, case)
            target, spec_type = DRAFT_PAIRS[DRAFT_CLASSES[case][0]]
            out = runner.run_draft(parsed[target].path, path, spec_type)
            assert out.kind == "refused" and expected in out.detail, f"{case}: {out.kind} {out.detail}"
            assert "\n" not in out.detail and len(out.detail) <= MAX_MESSAGE, out.detail
        good = runner.run_draft(parsed["llama"].path, parsed["dflash"].path, "draft-dflash")
        assert good.kind == "ok", good.detail
    finally:
        runner.close()


DRAFT_SEED = 3201
N_DRAFT_SAMPLE = 40


def _run_draft_sample(parsed: dict[str, Model], tmp_path: Path, seed: int, n: int) -> list[tuple[str, Any]]:
    runner = Runner(tmp_path / "engine.log", load_timeout=60.0, gen_timeout=30.0, n_ctx=256)
    outcomes = []
    try:
        for i, name, what, kvs, tensors in draft_mutants(parsed, seed, n):
            prefix = "mtp-" if name == "qwen35_mtp_sidecar" else ""
            path = write_mutant(parsed[name], kvs, tensors, tmp_path / f"{prefix}draft{i}.gguf")
            target, spec_type = DRAFT_PAIRS[name]
            outcomes.append((f"#{i} {name} [{what}]", runner.run_draft(parsed[target].path, path, spec_type)))
            path.unlink()
    finally:
        runner.close()
    return outcomes


def _check_draft_outcomes(outcomes: list[tuple[str, Any]]) -> None:
    for what, out in outcomes:
        assert out.kind in ("refused", "ok", "draft_load_failed", "decode_failed"), f"{what}: {out.kind} {out.detail}"
        if out.kind == "refused":
            assert "\n" not in out.detail and len(out.detail) <= MAX_MESSAGE, f"{what}: {out.detail!r}"


def test_seeded_draft_mutants_in_the_worker(
    parsed: dict[str, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutated draft files as --spec-draft-model: refused, loaded and drafting, or a clean load error; never a
    worker crash or a hang (a sample; scripts/fuzz_run.py --drafts runs more)."""
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")
    outcomes = _run_draft_sample(parsed, tmp_path, DRAFT_SEED, N_DRAFT_SAMPLE)
    assert len(outcomes) == N_DRAFT_SAMPLE
    kinds = {out.kind for _, out in outcomes}
    assert "refused" in kinds and "ok" in kinds, kinds
    _check_draft_outcomes(outcomes)


@pytest.mark.slow
def test_many_seeded_draft_mutants_in_the_worker(
    parsed: dict[str, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")
    _check_draft_outcomes(_run_draft_sample(parsed, tmp_path, 21, 300))


# ----- long runs of one kind of character through the tokenizer (issue 32) -------------------------------------


def test_split_long_runs_keeps_the_text_and_special_tokens() -> None:
    from engine_ext.model import split_long_runs

    for text in ("", "short text", "a " * 5000, "<" * 2048):
        assert split_long_runs(text, 2048) == [text]  # nothing to cut: tokenised whole, as before
    specials = ("<|im_end|>", "<|im_start|>")
    for before in range(2030, 2050):  # a special token's text across every cut position near the first cut
        text = "x" * 100 + " " + "<" * before + "<|im_end|>" + "<" * 9000 + " tail"
        pieces = split_long_runs(text, 2048, specials)
        assert "".join(pieces) == text
        assert sum(p.count("<|im_end|>") for p in pieces) == 1
        assert all(len(run) <= 2048 for p in pieces for run in p.split())


def _tokenizer_cases(seed: int, n: int) -> list[tuple[str, str]]:
    """Runs of punctuation, digits, CJK punctuation, symbols, whitespace or special-token text, 2,000 to 300,000
    characters, alone or inside ordinary text."""
    rng = random.Random(seed)
    units = ["<", "1", "<>", "。", "!?", "$", "\n", " ", "\t", "<|im_end|>", "é", "😀", "a", "==", "ab1", "<|im"]
    cases = []
    for _ in range(n):
        unit = rng.choice(units)
        length = rng.choice([2_000, 2_049, 30_000, 100_000, 300_000])
        run = unit * max(1, length // len(unit))
        text = run if rng.random() < 0.5 else f"Say this back: {run} thanks"
        cases.append((f"{unit!r} × {len(run) // len(unit)}", text))
    return cases


def test_long_runs_do_not_crash_the_worker(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A 100,000-character run of '<' from a prompt file or a template crashed the worker (SIGSEGV in llama.cpp's
    BPE pre-tokenizer regex). Seeded runs, raw and through the chat template, on the tiny llama: each generation
    ends (a reply, or a clean 'too long for the context' failure), the worker never crashes."""
    from engine_ext.client import EngineClient
    from engine_ext.params import ContextParams
    from engine_ext.protocol import ChatMessage, Crashed, Failed, Finished, Generate

    cases = _tokenizer_cases(3202, 24) + [("'<' × 100000 (the issue's)", "<" * 100_000)]
    with EngineClient(tmp_path / "engine.log", start_timeout_s=60.0) as client:
        client.start()
        client.load(tiny_models["llama"], context=ContextParams(n_ctx=512, n_threads=2))
        worst = 0.0
        for i, (what, text) in enumerate(cases):
            chat = i % 2 == 1
            request = Generate(
                request_id=client.new_request_id(),
                messages=(ChatMessage("user", text),) if chat else (),
                prompt=None if chat else text,
                max_tokens=2,
            )
            t0 = time.monotonic()
            client.send(request)
            deadline = t0 + 60.0
            event = None
            while time.monotonic() < deadline:
                event = client.next_event(timeout=1.0)
                if (
                    isinstance(event, Finished | Crashed)
                    or isinstance(event, Failed)
                    and event.request_id
                    in (
                        request.request_id,
                        None,
                    )
                ):
                    break
            worst = max(worst, time.monotonic() - t0)
            label = f"{what}{' (chat)' if chat else ''}"
            assert not isinstance(event, Crashed), f"{label}: the worker crashed: {event}"
            assert isinstance(event, Finished | Failed), f"{label}: no end within 60 s"
            if isinstance(event, Failed):
                assert "\n" not in event.message and len(event.message) <= MAX_MESSAGE, event.message
        print(f"\nlong runs: {len(cases)} cases, 0 crashes, worst {worst:.2f} s")
