"""Hostile control-vector files: read_control_vector refuses each with one ControlVectorError line, fast, small.

The header goes through engine_ext.gguf's bounded reader and the tensor infos are checked before any direction is read,
so a file that claims huge counts, lengths, shapes or layer numbers costs neither time nor memory. Also: a chat
template longer than read_chat_template's cap is refused, not read.
"""

from __future__ import annotations

import math
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
    from engine_ext.gguf import GGUFValidationError, read_chat_template
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


# ----- values that cannot steer, and layer names in other digits (issue 32) -----------------------------------

# Layer numbers written with digits other than ASCII 0-9: int() reads most of them (Arabic-Indic, Devanagari,
# fullwidth, mathematical bold), str.isdigit() also superscripts; llama.cpp's std::stoi reads none of them.
_FOREIGN_DIGITS = ["١", "۲", "३", "１", "𝟙", "²", "1١", "٣٢", "৭", "߁", "๑"]
# Values per direction: finite ones far beyond any hidden state, non-finite ones, and ones that steer.
_BAD_VALUES = [3.4e38, -3.4e38, 1e30, 1e20, 2e4, float("inf"), float("nan")]
_GOOD_VALUES = [0.0, 1e-3, 0.5, 4.0, 100.0, -250.0]


def _steers(data: np.ndarray) -> bool:
    """The rule, computed apart: every value finite and an L2 norm of at most 1e5."""
    values = [float(x) for x in data]
    return all(math.isfinite(x) for x in values) and math.sqrt(sum(x * x for x in values)) <= 1e5


def steering_mutants(seed: int, n: int) -> list[tuple[str, dict[str, np.ndarray], bool]]:
    """``n`` seeded control vectors as (what, tensors, should be read): a direction of huge or non-finite values
    (every value or a few), a constant one on either side of the norm limit, a layer named in other digits."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.choice(["values", "some values", "edge", "digits"])
        tensors = {f"direction.{il}": np.full(N_EMBD, 0.1, np.float32) for il in (1, 2)}
        good = True
        if kind == "values":
            value = rng.choice(_BAD_VALUES + _GOOD_VALUES)
            tensors[f"direction.{rng.choice([1, 2])}"] = np.full(N_EMBD, value, np.float32)
            what = f"every value {value}"
        elif kind == "some values":
            value, count = rng.choice(_BAD_VALUES), rng.choice([1, 3, 40])
            tensors["direction.2"][rng.sample(range(N_EMBD), count)] = value
            what = f"{count} values {value}"
        elif kind == "edge":  # a constant direction's norm is |v| × 8: 12,500 is the limit
            value = rng.choice([12_000.0, 12_499.0, 12_501.0, 13_000.0]) * rng.choice([1, -1])
            tensors["direction.1"] = np.full(N_EMBD, value, np.float32)
            what = f"every value {value}"
        else:
            digit = rng.choice(_FOREIGN_DIGITS)
            tensors[f"direction.{digit}"] = np.full(N_EMBD, 0.1, np.float32)
            what = f"direction.{digit}"
            good = False
        good = good and all(_steers(t) for t in tensors.values())
        out.append((what, tensors, good))
    return out


def test_seeded_vectors_that_cannot_steer_are_refused(tmp_path: Path) -> None:
    """Every vector of huge or non-finite values, and every layer name in non-ASCII digits, is refused in one line;
    the others are read. Figures: cases, refused, worst time."""
    failures: list[str] = []
    refused = 0
    worst = 0.0
    cases = steering_mutants(SEED, 120)
    for i, (what, tensors, good) in enumerate(cases):
        path = _writer_file(tmp_path / f"s{i}.gguf", tensors)
        t0 = time.perf_counter()
        outcome = _check(path, f"#{i} ({what})", failures)
        worst = max(worst, time.perf_counter() - t0)
        refused += outcome == "refused"
        if outcome != ("read" if good else "refused"):
            failures.append(f"#{i} ({what}): {outcome}, expected {'read' if good else 'refused'}")
        path.unlink()
    assert failures == [], "\n".join(failures[:30])
    assert 0 < refused < len(cases)
    print(f"\nsteering values and digits: {len(cases)} cases, {refused} refused, 0 crashes, worst {worst:.3f} s")


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"direction.1": np.full(N_EMBD, 3.4e38, np.float32)}, "direction.1 has a norm of 2.72e+39, above 100000"),
        ({"direction.1": np.full(N_EMBD, 2e4, np.float32)}, "direction.1 has a norm of 1.6e+05, above 100000"),
        ({"direction.1": np.full(N_EMBD, np.nan, np.float32)}, "direction.1 contains NaN or infinite values"),
        ({"direction.١": np.ones(N_EMBD, np.float32)}, "is not direction.<layer>"),
        ({"direction.１２": np.ones(N_EMBD, np.float32)}, "is not direction.<layer>"),
    ],
)
def test_vectors_that_cannot_steer_say_why(tmp_path: Path, tensors: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ControlVectorError) as exc:
        read_control_vector(_writer_file(tmp_path / "v.gguf", tensors))
    assert message in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value) and len(str(exc.value)) <= MAX_MESSAGE


def test_a_mix_scaled_beyond_any_hidden_state_is_refused(tmp_path: Path) -> None:
    """Strength × layer weight × direction is checked after scaling, as llama.cpp would add it."""
    from types import SimpleNamespace

    from engine_ext.params import SteeringEntry
    from engine_ext.steering.mixer import SteeringMixer

    path = _writer_file(tmp_path / "v.gguf", {"direction.1": np.full(N_EMBD, 20.0, np.float32)})  # norm 160
    model = SimpleNamespace(n_embd=N_EMBD, n_layer=4, architecture="llama", path=tmp_path / "m.gguf")
    mixer = SteeringMixer(model, None)  # type: ignore[arg-type]  # compose reads no context
    data, start, end = mixer.compose([SteeringEntry(str(path), 500.0)])  # norm 8e4: within the rule
    assert (start, end) == (1, 3) and np.isfinite(data).all()
    for entry in (SteeringEntry(str(path), -1000.0), SteeringEntry(str(path), 1.0, layer_weights=(1e30,))):
        with pytest.raises(ControlVectorError) as exc:
            mixer.compose([entry])
        assert "the steering mix at layer 1 " in str(exc.value) and len(str(exc.value)) <= MAX_MESSAGE


def test_only_ascii_digits_are_numbers() -> None:
    """The one rule for numbers in text from files and servers: tensor layers, RPC ports, HTTP headers."""
    from engine_ext.params import ascii_digits
    from models_catalog.transport import retry_after

    assert ascii_digits("0") and ascii_digits("0123456789")
    for text in ["", "١", "1١", "²", "１", "𝟙", "-1", "+1", " 1", "1.0", "1_0"]:
        assert not ascii_digits(text), text
    assert retry_after("²") is None and retry_after("١٠") is None and retry_after("7") == 7.0  # int("²") raised
