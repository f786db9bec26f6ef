"""Seeded GGUF mutation fuzzing of inspection: inspect_gguf + estimate_memory + describe on hostile headers.

Every mutant must either be described or refused with a GGUFError whose message is one line of at most 300
characters, within 2 s and 64 MB (tracemalloc peak) per file. The loop runs in a child process under an
address-space limit, so a mutant that allocates gigabytes fails the test instead of the machine.

Run by hand for figures: ``python tests/unit/test_gguf_fuzz.py [seed] [n]`` (uses freshly written tiny models).
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader, GGUFValueType

SEED = 21
N_MUTANTS = 1200
MAX_SECONDS = 2.0
MAX_TRACED = 64 << 20
MAX_MESSAGE = 300

_VT = GGUFValueType
_SCALAR_FMT = {
    _VT.UINT8: "<B",
    _VT.INT8: "<b",
    _VT.UINT16: "<H",
    _VT.INT16: "<h",
    _VT.UINT32: "<I",
    _VT.INT32: "<i",
    _VT.FLOAT32: "<f",
    _VT.BOOL: "<?",
    _VT.UINT64: "<Q",
    _VT.INT64: "<q",
    _VT.FLOAT64: "<d",
}

# metadata keys worth attacking ("{a}." = the architecture prefix)
_KEYS = [
    "{a}.block_count",
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.feed_forward_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.expert_count",
    "{a}.expert_used_count",
    "{a}.expert_feed_forward_length",
    "{a}.nextn_predict_layers",
    "{a}.attention.sliding_window",
    "{a}.attention.sliding_window_pattern",
    "{a}.full_attention_interval",
    "{a}.attention.recurrent_layers",
    "{a}.ssm.conv_kernel",
    "{a}.ssm.inner_size",
    "{a}.ssm.state_size",
    "{a}.ssm.group_count",
    "{a}.target_layers",
    "{a}.target_hidden_size",
    "{a}.block_size",
    "{a}.leading_dense_block_count",
    "{a}.interleave_moe_layer_step",
    "{a}.vocab_size",
    "{a}.selector_top_k",
    "split.count",
    "split.no",
    "split.tensors.count",
    "general.architecture",
    "general.file_type",
    "general.alignment",
    "tokenizer.ggml.tokens",
]
_INTS = [0, -1, 1, 2, 7, 512, 513, 1024, 1025, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**31)]

KV = tuple[str, int, int, Any]  # key, value type, array element type (or -1), value


class _Model:
    """A tiny model taken apart: metadata entries, raw tensor infos, and where its data starts and ends."""

    def __init__(self, path: Path) -> None:
        reader = GGUFReader(path)
        self.path = path
        self.size = path.stat().st_size
        self.kvs: list[KV] = []
        for field in reader.fields.values():
            if field.name.startswith("GGUF."):
                continue
            vtype = int(field.types[0])
            sub = int(field.types[1]) if vtype == int(_VT.ARRAY) else -1
            value = field.contents()
            self.kvs.append((field.name, vtype, sub, value))
        self.arch = next(v for k, _, _, v in self.kvs if k == "general.architecture")
        self.n_tensors = len(reader.tensors)
        last = reader.tensors[-1].field
        start = reader.tensors[0].field.offset
        end = last.offset + sum(int(p.nbytes) for p in last.parts)
        self.tensor_infos = path.read_bytes()[start:end]
        self.data_size = self.size - int(reader.data_offset)
        self.header_end = int(reader.data_offset)


def _str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any) -> bytes:
    if vtype == int(_VT.STRING):
        return _str(value if isinstance(value, str | bytes) else str(value))
    fmt = _SCALAR_FMT[_VT(vtype)]
    try:
        return struct.pack(fmt, value)
    except struct.error:
        return struct.pack(fmt, 0)


def _encode(kvs: list[KV]) -> bytes:
    out = bytearray()
    for key, vtype, sub, value in kvs:
        out += _str(key) + struct.pack("<I", vtype)
        if vtype == int(_VT.ARRAY):
            out += struct.pack("<IQ", sub, len(value))
            for v in value:
                out += _value(sub, v)
        else:
            out += _value(vtype, value)
    return bytes(out)


def _assemble(m: _Model, kvs: list[KV], alignment: int = 32) -> tuple[bytes, int]:
    """The header bytes (padded to the alignment) and the data size that follows them."""
    head = b"GGUF" + struct.pack("<IQQ", 3, m.n_tensors, len(kvs)) + _encode(kvs) + m.tensor_infos
    head += b"\0" * (-len(head) % alignment)
    return head, m.data_size


def _int_kv(key: str, value: int, rng: random.Random) -> KV:
    if value < 0:
        vtype = rng.choice([_VT.INT32, _VT.INT64]) if value >= -(2**31) else _VT.INT64
    elif value < 2**32:
        vtype = rng.choice([_VT.UINT32, _VT.INT32, _VT.UINT64]) if value < 2**31 else _VT.UINT32
    else:
        vtype = _VT.UINT64
    return key, int(vtype), -1, value


def _edit(m: _Model, rng: random.Random) -> tuple[list[KV], str]:
    kvs = list(m.kvs)
    what = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        key = rng.choice(_KEYS).format(a=m.arch)
        style = rng.random()
        if style < 0.5:
            new = _int_kv(key, rng.choice(_INTS), rng)
        elif style < 0.6:
            new = (key, int(_VT.STRING), -1, rng.choice(["12", "", "x" * 5000, "[1, 2]"]))
        elif style < 0.65:
            new = (key, int(_VT.FLOAT32), -1, rng.choice([1.5, -1.0, float("nan"), float("inf")]))
        elif style < 0.7:
            new = (key, int(_VT.BOOL), -1, rng.random() < 0.5)
        elif style < 0.9:
            n = rng.choice([0, 1, 3, 4, 6, 511, 512, 513, 5000, 20000])
            v = rng.choice(_INTS)
            sub = _VT.UINT64 if v >= 2**32 else (_VT.INT64 if v < -(2**31) else _VT.INT32)
            values = [rng.choice([v, rng.randrange(0, 8)]) for _ in range(n)]
            if v >= 2**31:
                sub = _VT.UINT64 if v >= 2**32 else _VT.UINT32
                values = [abs(x) for x in values]
            new = (key, int(_VT.ARRAY), int(sub), values)
        else:
            n = rng.choice([0, 1, 5, 600])
            new = (key, int(_VT.ARRAY), int(_VT.STRING), [rng.choice(["a", "12", ""]) for _ in range(n)])
        kvs = [kv for kv in kvs if kv[0] != new[0]]
        if rng.random() < 0.15:
            what.append(f"del {key}")
        else:
            kvs.insert(rng.randrange(len(kvs) + 1), new)
            what.append(f"{key}={str(new[3])[:20]}")
    return kvs, "; ".join(what)


def mutants(models: dict[str, Path], seed: int, n: int) -> list[tuple[str, str, str, bytes, int]]:
    """``n`` deterministic mutants as (kind, model, what, header bytes, zero bytes to append)."""
    rng = random.Random(seed)
    parsed = {name: _Model(p) for name, p in sorted(models.items())}
    out = []
    for _ in range(n):
        name = rng.choice(sorted(parsed))
        m = parsed[name]
        kind = rng.choices(["edit", "flip", "truncate"], weights=[6, 3, 1])[0]
        if kind == "edit":
            kvs, what = _edit(m, rng)
            head, tail = _assemble(m, kvs)
        else:
            raw = bytearray(m.path.read_bytes()[: m.header_end])
            tail = m.size - m.header_end
            if kind == "flip":
                positions = [rng.randrange(len(raw)) for _ in range(rng.choice([1, 2, 4, 8]))]
                for pos in positions:
                    raw[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
                what = f"bytes at {positions[:4]}"
            else:
                cut = rng.randrange(m.size)
                if cut < len(raw):
                    raw, tail = raw[:cut], 0
                else:
                    tail = cut - len(raw)
                what = f"cut at {cut}"
            head = bytes(raw)
        out.append((kind, name, what, bytes(head), tail))
    return out


_DRAFT_KINDS = ("qwen35_mtp_sidecar", "dflash", "dspark", "eagle3")


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def run_fuzz(models: dict[str, Path], seed: int, n: int, workdir: Path) -> dict[str, Any]:
    """Inspect every mutant; return counts and every failure (exception, long message, slow, memory)."""
    from engine_ext.gguf import GGUFError, describe, estimate_memory, inspect_gguf, validate_loadable

    signal.signal(signal.SIGALRM, _alarm)
    per_kind: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    loader_refused: Counter[bool] = Counter()  # by the loader's rules after inspection passed: drafts, the others
    failures: list[str] = []
    worst_time, worst_mem = 0.0, 0
    for i, (kind, name, what, head, tail) in enumerate(mutants(models, seed, n)):
        per_kind[kind] += 1
        path = workdir / f"m{i}-00001-of-00002.gguf"
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(len(head) + tail)  # sparse: the weights are never read
        tracemalloc.start()
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, 3 * MAX_SECONDS)
        label = f"#{i} {kind} {name} ({what})"
        try:
            info = inspect_gguf(path)
            estimate = estimate_memory(info, info.context_length or 4096)
            describe(info, estimate)
            json.dumps({**info.to_dict(), "memory_estimate": estimate.to_dict()})  # as `llmtui info --json`
            try:  # the loader's rules, which every file llama.cpp loads (a model or a draft) goes through
                validate_loadable(path)
            except GGUFError as exc:
                loader_refused[name in _DRAFT_KINDS] += 1
                msg = str(exc)
                if "\n" in msg or len(msg) > MAX_MESSAGE:
                    failures.append(f"{label}: loader message of {len(msg)} chars: {msg[:120]!r}")
        except GGUFError as exc:
            refused[kind] += 1
            msg = str(exc)
            if "\n" in msg or len(msg) > MAX_MESSAGE:
                failures.append(f"{label}: message of {len(msg)} chars: {msg[:120]!r}")
        except _Timeout:
            failures.append(f"{label}: still running after {3 * MAX_SECONDS} s")
        except BaseException as exc:  # noqa: BLE001 - the point is to catch everything
            failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:120]}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            elapsed = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            path.unlink()
        worst_time, worst_mem = max(worst_time, elapsed), max(worst_mem, peak)
        if elapsed > MAX_SECONDS:
            failures.append(f"{label}: took {elapsed:.2f} s")
        if peak > MAX_TRACED:
            failures.append(f"{label}: traced peak {peak >> 20} MiB")
    return {
        "per_kind": dict(per_kind),
        "refused": dict(refused),
        "loader_refused": {"drafts": loader_refused[True], "models": loader_refused[False]},
        "failures": failures,
        "worst_seconds": round(worst_time, 3),
        "worst_traced_bytes": worst_mem,
    }


def _child(argv: list[str]) -> None:
    """python tests/unit/test_gguf_fuzz.py --child SEED N MODELS_JSON: run the loop under a 2 GiB address-space cap."""
    seed, n, models = int(argv[0]), int(argv[1]), {k: Path(v) for k, v in json.loads(argv[2]).items()}
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import engine_ext.gguf  # noqa: F401 - import numpy and gguf before the cap

    limit = 2 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with tempfile.TemporaryDirectory() as tmp:
        result = run_fuzz(models, seed, n, Path(tmp))
    print(json.dumps(result))


def test_gguf_inspection_fuzz(tiny_models: dict[str, Path]) -> None:
    models = {k: str(v) for k, v in tiny_models.items()}
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(SEED), str(N_MUTANTS), json.dumps(models)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(result["per_kind"].values()) == N_MUTANTS
    assert min(result["per_kind"].values()) >= 50, result["per_kind"]
    assert sum(result["refused"].values()) > 0
    assert result["loader_refused"]["drafts"] > 0, result["loader_refused"]
    assert result["failures"] == [], "\n".join(result["failures"][:40])


def test_mutants_are_deterministic(tiny_models: dict[str, Path]) -> None:
    some = {k: tiny_models[k] for k in ("llama", "nemotron_h_moe")}
    assert mutants(some, 5, 30) == mutants(some, 5, 30)


def _write_edited(model: Path, out: Path, edits: list[KV]) -> Path:
    m = _Model(model)
    keys = {e[0] for e in edits}
    head, tail = _assemble(m, [kv for kv in m.kvs if kv[0] not in keys] + edits)
    with open(out, "wb") as f:
        f.write(head)
        f.truncate(len(head) + tail)
    return out


_U32, _I32, _U64, _STR, _ARR = (int(t) for t in (_VT.UINT32, _VT.INT32, _VT.UINT64, _VT.STRING, _VT.ARRAY))


@pytest.mark.parametrize(
    ("model", "edit", "message"),
    [
        ("llama", ("llama.context_length", _I32, -1, -5), "llama.context_length is -5 (must be 0 to 2147483647)"),
        ("llama", ("llama.block_count", _U32, -1, 2**32 - 1), "llama.block_count is 4294967295 (must be 0 to 512)"),
        ("llama", ("llama.block_count", _U64, -1, 2**63), "llama.block_count is 9223372036854775808"),
        ("dflash", ("dflash.target_layers", _STR, -1, "1,2"), "dflash.target_layers must be an array"),
        ("llama", ("split.count", _U64, -1, 2**32), "split.count is 4294967296 (must be 0 to 99999)"),
        ("qwen35_mtp", ("qwen35.nextn_predict_layers", _I32, -1, -1), "qwen35.nextn_predict_layers is -1"),
        ("llama", ("llama.embedding_length", _STR, -1, "64"), "llama.embedding_length must be an integer but is a"),
        ("llama", ("llama.attention.head_count", _ARR, _U32, [4] * 600), "has 600 entries but block_count is"),
        ("nemotron_h_moe", ("nemotron_h_moe.expert_count", _U32, -1, 2), "expert_used_count 3 exceeds expert_count 2"),
        ("nemotron_h_moe", ("nemotron_h_moe.expert_count", _U32, -1, 4096), "expert_count is 4096 (must be 0 to 1024)"),
    ],
)
def test_hostile_metadata_refused(
    tiny_models: dict[str, Path], tmp_path: Path, model: str, edit: KV, message: str
) -> None:
    from engine_ext.gguf import GGUFValidationError, inspect_gguf

    path = _write_edited(tiny_models[model], tmp_path / "m.gguf", [edit])
    with pytest.raises(GGUFValidationError) as exc:
        inspect_gguf(path)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value) and len(str(exc.value)) <= MAX_MESSAGE


def test_split_count_must_match_the_name(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from engine_ext.gguf import GGUFValidationError, inspect_gguf

    path = _write_edited(tiny_models["llama"], tmp_path / "m-00001-of-00002.gguf", [("split.count", _U32, -1, 99999)])
    with pytest.raises(GGUFValidationError, match="split.count says 99999 shards but the file name says 2"):
        inspect_gguf(path)


def test_messages_are_one_short_line(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from engine_ext.gguf import GGUFError, validate_gguf

    deep = tmp_path.joinpath(*["a" * 50] * 8)
    deep.mkdir(parents=True)
    key = "x\n" * 200_000  # a 400 KB key with newlines, then a bad value type
    raw = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str(key) + struct.pack("<I", 99) + b"\0" * 8
    (deep / "bad.gguf").write_bytes(raw)
    for target in (deep / "bad.gguf", deep / "missing.gguf", deep):
        with pytest.raises(GGUFError) as exc:
            validate_gguf(target)
        text = str(exc.value)
        assert "\n" not in text and len(text) <= MAX_MESSAGE, text[:400]
        assert text.startswith("…") and "; " in text  # the path keeps its end, the hint survives


def test_big_strings_are_not_read(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A 4 MiB string value is skipped, not read; a 100 KiB key is refused before it is read."""
    from engine_ext.gguf import GGUFValidationError, inspect_gguf

    big = ("general.description", _STR, -1, "x" * (4 << 20))
    path = _write_edited(tiny_models["llama"], tmp_path / "big.gguf", [big])
    tracemalloc.start()
    info = inspect_gguf(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info.architecture == "llama"
    assert peak < 2 << 20, peak
    path = _write_edited(tiny_models["llama"], tmp_path / "key.gguf", [("k" * 100_000, _U32, -1, 1)])
    with pytest.raises(GGUFValidationError, match="the key of metadata entry .* is 100000 bytes long"):
        inspect_gguf(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.tiny_models import write_all

        with tempfile.TemporaryDirectory() as tmp_models, tempfile.TemporaryDirectory() as tmp:
            seed = int(sys.argv[1]) if len(sys.argv) > 1 else SEED
            n = int(sys.argv[2]) if len(sys.argv) > 2 else N_MUTANTS
            import engine_ext.gguf  # noqa: F401

            limit = 2 << 30
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            t0 = time.perf_counter()
            out = run_fuzz(write_all(Path(tmp_models)), seed, n, Path(tmp))
            out["total_seconds"] = round(time.perf_counter() - t0, 1)
            out["n_failures"] = len(out["failures"])
            kinds: Counter[str] = Counter(f.split(": ")[1].split(":")[0][:40] for f in out["failures"])
            out["failure_kinds"] = dict(kinds.most_common(20))
            out["failures"] = out["failures"][:60]
            print(json.dumps(out, indent=1))
