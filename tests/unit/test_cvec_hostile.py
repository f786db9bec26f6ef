"""Hostile control-vector files: read_control_vector refuses each with one ControlVectorError line, fast, small.

The header goes through gguf_info's bounded reader and the tensor infos are checked before any direction is read,
so a file that claims huge counts, lengths, shapes or layer numbers costs neither time nor memory. Also: a chat
template longer than read_chat_template's cap is refused, not read.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from engine_ext.steering.cvec_file import (
    ControlVector,
    ControlVectorError,
    read_control_vector,
    write_control_vector,
)

N_EMBD = 64
SEED = 2104
N_MUTANTS = 200
MAX_SECONDS = 2.0
MAX_TRACED = 64 << 20
MAX_MESSAGE = 300
_HUGE = [0, 1, 5, 63, 64, 65, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1]


def _vector_file(path: Path) -> Path:
    rng = np.random.default_rng(0)
    vector = ControlVector(
        {il: rng.normal(size=N_EMBD).astype(np.float32) for il in (1, 2, 3)},
        "llama",
        {"llmtui.method": "pca", "llmtui.prompt_set": "happy-sad"},
    )
    return write_control_vector(vector, path)


def _header_end(raw: bytes) -> int:
    """Where the tensor data starts (the directions are the last 3 * N_EMBD * 4 bytes)."""
    return len(raw) - 3 * N_EMBD * 4


def mutants(raw: bytes, seed: int, n: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    head_end = _header_end(raw)
    out = []
    for _ in range(n):
        data = bytearray(raw)
        kind = rng.choice(["flip", "smash64", "smash32", "truncate", "grow"])
        if kind == "flip":
            positions = [rng.randrange(head_end) for _ in range(rng.choice([1, 2, 4, 8]))]
            for pos in positions:
                data[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
            what = f"bytes at {positions[:4]}"
        elif kind in ("smash64", "smash32"):
            size = 8 if kind == "smash64" else 4
            pos = rng.randrange(4, head_end - size)
            value = rng.choice(_HUGE) % (1 << (8 * size))
            data[pos : pos + size] = value.to_bytes(size, "little")
            what = f"{kind} {value} at {pos}"
        elif kind == "truncate":
            cut = rng.randrange(len(raw))
            data = data[:cut]
            what = f"cut at {cut}"
        else:
            data += b"\0" * rng.choice([1, 31, 4096])
            what = "bytes appended"
        out.append((what, bytes(data)))
    return out


def _check(path: Path, label: str, failures: list[str]) -> str:
    tracemalloc.start()
    t0 = time.perf_counter()
    outcome = "read"
    try:
        read_control_vector(path, n_embd=N_EMBD, n_layer=8)
    except ControlVectorError as exc:
        outcome = "refused"
        message = str(exc)
        if "\n" in message or len(message) > MAX_MESSAGE:
            failures.append(f"{label}: message of {len(message)} chars: {message[:120]!r}")
    except Exception as exc:  # noqa: BLE001 - anything else is the failure this test looks for
        outcome = "error"
        failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:160]}")
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if elapsed > MAX_SECONDS:
        failures.append(f"{label}: took {elapsed:.2f} s")
    if peak > MAX_TRACED:
        failures.append(f"{label}: traced peak {peak >> 20} MiB")
    return outcome


def test_seeded_hostile_control_vectors(tmp_path: Path) -> None:
    raw = _vector_file(tmp_path / "good.gguf").read_bytes()
    failures: list[str] = []
    outcomes = []
    for i, (what, data) in enumerate(mutants(raw, SEED, N_MUTANTS)):
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(data)
        outcomes.append(_check(path, f"#{i} ({what})", failures))
        path.unlink()
    assert failures == [], "\n".join(failures[:30])
    assert outcomes.count("refused") > N_MUTANTS // 4, outcomes.count("refused")


def test_mutants_are_deterministic(tmp_path: Path) -> None:
    raw = _vector_file(tmp_path / "good.gguf").read_bytes()
    assert mutants(raw, 3, 20) == mutants(raw, 3, 20)


def _writer_file(path: Path, tensors: dict[str, np.ndarray], extra: dict[str, list[str]] | None = None) -> Path:
    writer = GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_int32("controlvector.layer_count", 3)
    for key, values in (extra or {}).items():
        writer.add_array(key, values)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"direction.100000": np.ones(N_EMBD, np.float32)}, "names layer 100000, above llama.cpp's 512 layers"),
        ({"direction.1_0": np.ones(N_EMBD, np.float32)}, "is not direction.<layer>"),
        ({"direction.+1": np.ones(N_EMBD, np.float32)}, "is not direction.<layer>"),
        ({"direction.1": np.ones(N_EMBD, np.float32), "direction.2": np.ones(8, np.float32)}, "a different size"),
        ({"direction.1": np.ones(N_EMBD, np.int32)}, "is I32, llama.cpp needs F32"),
    ],
)
def test_bad_directions_are_refused(tmp_path: Path, tensors: dict[str, np.ndarray], message: str) -> None:
    path = _writer_file(tmp_path / "v.gguf", tensors)
    with pytest.raises(ControlVectorError, match=message.replace("+", r"\+")) as exc:
        read_control_vector(path)
    assert "\n" not in str(exc.value) and len(str(exc.value)) <= MAX_MESSAGE


def test_claimed_sizes_beyond_the_file_are_refused_without_reading(tmp_path: Path) -> None:
    """A direction whose header claims 2^40 floats, and a metadata string claiming a gigabyte: one line each."""
    raw = bytearray(_vector_file(tmp_path / "good.gguf").read_bytes())
    dim = struct.pack("<Q", N_EMBD)
    at = raw.index(b"direction.1") + len(b"direction.1") + 4  # after the name and n_dims
    assert raw[at : at + 8] == dim
    raw[at : at + 8] = struct.pack("<Q", 2**40)
    path = tmp_path / "big.gguf"
    path.write_bytes(bytes(raw))
    failures: list[str] = []
    assert _check(path, "2^40 floats", failures) == "refused" and failures == []


def test_a_big_metadata_array_is_cheap(tmp_path: Path) -> None:
    """100,000 provenance strings in one array: refused or read within the limits, never held."""
    path = _writer_file(
        tmp_path / "many.gguf", {"direction.1": np.ones(N_EMBD, np.float32)}, {"llmtui.junk": ["x"] * 100_000}
    )
    t0 = time.perf_counter()
    vector = read_control_vector(path)
    assert time.perf_counter() - t0 < MAX_SECONDS / 4  # about 0.1 s here: the strings are walked, not read
    assert vector.layers == [1] and "llmtui.junk" not in vector.metadata
    tracemalloc.start()
    read_control_vector(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_huge_chat_template_is_refused_not_read(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from engine_ext.gguf_info import GGUFValidationError, read_chat_template
    from tests.tiny_models import TINY_CHAT_TEMPLATE

    assert read_chat_template(tiny_models["llama"]) == TINY_CHAT_TEMPLATE
    writer = GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_string("tokenizer.chat_template", "{{ 'x' }}" * (300_000))  # 2.7 MB
    writer.add_string("tokenizer.chat_template.tool_use", "{{ messages }}")
    writer.add_string("general.description", "y" * (3 << 20))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    tracemalloc.start()
    with pytest.raises(GGUFValidationError, match=r"tokenizer.chat_template is 2700000 bytes long \(at most 1 MiB"):
        read_chat_template(tmp_path / "t.gguf")
    assert read_chat_template(tmp_path / "t.gguf", "tool_use") == "{{ messages }}"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 << 20, peak
