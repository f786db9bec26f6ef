"""The prompt cache's state files without a model: the format, every refusal before llama.cpp would read a byte,
the budget's eviction, and a save killed midway."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_ext import disk_cache as dc
from engine_ext.disk_cache import DiskCache, DiskCacheError, read_state_header
from engine_ext.untrusted_text import MAX_MESSAGE

PARTS = {"model": "m", "build": "b"}
TOKENS = list(range(1, 201))


def saved(cache: DiskCache, tokens: list[int], payload: bytes = b"S" * 4096, checkpoints=()) -> Path:  # type: ignore[no-untyped-def]
    cache.save(tokens, memoryview(payload), list(checkpoints))
    cache.wait()
    return cache._path_for(tuple(tokens))


def test_a_saved_state_is_found_by_its_prefix_and_read_back_whole(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", PARTS, budget=1 << 20)
    path = saved(cache, TOKENS, b"state" * 100, [(150, b"checkpoint")])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    found = cache.best([*TOKENS[:180], 999, 1000], 0, truncatable=True)
    assert found is not None and found[1] == 180
    state, checkpoints = cache.load(found[0])
    assert bytes(state) == b"state" * 100 and [(n, bytes(d)) for n, d in checkpoints] == [(150, b"checkpoint")]
    # A memory that cannot be cut back (recurrent state) restores at its checkpoint, not at 180.
    again = cache.best([*TOKENS[:180], 999], 0, truncatable=False)
    assert again is not None and again[0].path == found[0].path and again[1] == 150
    # Nothing gained over what the memory holds: no read.
    assert cache.best(TOKENS, len(TOKENS) - dc.MIN_GAIN_TOKENS + 1, truncatable=True) is None
    assert cache.take_notices() == ()


def test_another_key_never_sees_the_state(tmp_path: Path) -> None:
    saved(DiskCache(tmp_path, PARTS), TOKENS)
    other = DiskCache(tmp_path, {**PARTS, "steering": ["a vector"]})
    assert other.best(TOKENS, 0, truncatable=True) is None and other.take_notices() == ()


def _refusal(cache: DiskCache, tokens: list[int] = TOKENS) -> str:
    assert cache.best(tokens, 0, truncatable=True) is None
    notices = cache.take_notices()
    assert len(notices) == 1, notices
    line = notices[0]
    assert "\n" not in line and len(line) <= MAX_MESSAGE + len("prompt cache: ")
    assert cache.best(tokens, 0, truncatable=True) is None and cache.take_notices() == ()  # said once
    return line


def _rewrite(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


def _header_of(data: bytearray) -> tuple[dict[str, object], int]:
    magic, version, length = dc._HEAD.unpack_from(data)
    return json.loads(bytes(data[dc._HEAD.size : dc._HEAD.size + length])), length


def _set_header(data: bytearray, header: dict[str, object]) -> None:
    _old, length = _header_of(data)
    raw = json.dumps(header).encode()
    data[: dc._HEAD.size + length] = dc._HEAD.pack(dc.MAGIC, dc.VERSION, len(raw)) + raw


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("truncated", "truncated"),
        ("longer", "longer than its header says"),
        ("payload", "state's checksum does not match"),
        ("tokens", "tokens' checksum does not match"),
        ("magic", "wrong magic"),
        ("version", "format version 99"),
        ("huge-header", "has a header of"),
        ("not-json", "not JSON"),
        ("not-object", "not a JSON object"),
        ("too-many-tokens", "tokens (1 to"),
        ("bad-checkpoint", "checkpoint that is not"),
        ("foreign", "another model file, engine build or settings"),
        ("link", "symbolic link"),
        ("oversized", "over the cache's limit"),
        ("empty", "truncated (no header)"),
    ],
)
def test_a_bad_state_file_is_refused_in_one_line(tmp_path: Path, case: str, said: str) -> None:
    folder = tmp_path / "cache"
    cache = DiskCache(folder, PARTS, budget=1 << 20)
    path = saved(cache, TOKENS)
    if case == "truncated":
        _rewrite(path, lambda d: d.__delitem__(slice(-100, None)))
    elif case == "longer":
        _rewrite(path, lambda d: d.extend(b"more"))
    elif case == "payload":
        _rewrite(path, lambda d: d.__setitem__(-1, d[-1] ^ 1))
    elif case == "tokens":
        _rewrite(path, lambda d: d.__setitem__(dc._HEAD.size + _header_of(d)[1], 77))
    elif case == "magic":
        _rewrite(path, lambda d: d.__setitem__(slice(0, 8), b"GGUFGGUF"))
    elif case == "version":
        _rewrite(path, lambda d: d.__setitem__(slice(8, 12), (99).to_bytes(4, "little")))
    elif case == "huge-header":
        _rewrite(path, lambda d: d.__setitem__(slice(12, 16), (dc.MAX_HEADER + 1).to_bytes(4, "little")))
    elif case == "not-json":
        _rewrite(path, lambda d: d.__setitem__(dc._HEAD.size, ord("!")))
    elif case == "not-object":
        _rewrite(path, lambda d: _set_header(d, []))  # type: ignore[arg-type]
    elif case == "too-many-tokens":
        _rewrite(path, lambda d: _set_header(d, {**_header_of(d)[0], "n_tokens": dc.MAX_TOKENS + 1}))
    elif case == "bad-checkpoint":
        _rewrite(path, lambda d: _set_header(d, {**_header_of(d)[0], "checkpoints": [[5, 1 << 40]]}))
    elif case == "foreign":
        other = saved(DiskCache(tmp_path / "elsewhere", {**PARTS, "build": "another"}), TOKENS)
        os.replace(other, path)
    elif case == "link":
        target = tmp_path / "outside.kvstate"
        os.replace(path, target)
        path.symlink_to(target)
    elif case == "oversized":
        cache = DiskCache(folder, PARTS, budget=path.stat().st_size - 1)
    elif case == "empty":
        path.write_bytes(b"")
    if case == "payload":  # found by its header and tokens; refused when its state is read, before llama.cpp
        found = cache.best(TOKENS, 0, truncatable=True)
        assert found is not None
        with pytest.raises(DiskCacheError) as refused:
            cache.load(found[0])
        line = str(refused.value)
        assert cache.best(TOKENS, 0, truncatable=True) is None  # not read again
    else:
        line = _refusal(cache)
    assert line.startswith("prompt cache: ") and said in line and "\n" not in line, line
    assert line.endswith("the prompt is evaluated instead")


def test_a_payload_changed_after_its_header_was_read_is_refused_on_load(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, PARTS, budget=1 << 20)
    path = saved(cache, TOKENS)
    found = cache.best(TOKENS, 0, truncatable=True)
    assert found is not None
    with open(path, "r+b") as file:  # same size, a byte of the state flipped: mtime changes
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
        file.seek(-1, os.SEEK_END)
        file.write(bytes([last[0] ^ 0xFF]))
    os.utime(path, ns=(found[0].mtime_ns, found[0].mtime_ns))  # even when the mtime is put back
    with pytest.raises(DiskCacheError, match="state's checksum does not match"):
        cache.load(found[0])


def test_the_least_recently_used_state_goes_first_at_the_budget(tmp_path: Path) -> None:
    payload = b"x" * 10_000
    cache = DiskCache(tmp_path, PARTS, budget=25_000)  # two files fit, not three
    first = saved(cache, [1] * 100, payload)
    second = saved(cache, [2] * 100, payload)
    old = time.time() - 100
    os.utime(first, (old, old))
    os.utime(second, (old - 50, old - 50))
    found = cache.best([1] * 100, 0, truncatable=True)
    assert found is not None
    cache.load(found[0])  # used now: the most recent
    third = saved(cache, [3] * 100, payload)
    assert first.exists() and third.exists() and not second.exists()
    assert dc.folder_bytes(tmp_path) <= 25_000


def test_a_longer_state_of_the_same_conversation_replaces_the_shorter(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, PARTS, budget=1 << 20)
    short = saved(cache, TOKENS[:100])
    branch = saved(cache, [*TOKENS[:50], 7, 7, 7])
    longer = saved(cache, TOKENS)
    assert not short.exists() and longer.exists() and branch.exists()  # a branch keeps its own file


def test_a_state_over_the_budget_is_not_saved_and_that_is_said(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, PARTS, budget=1000)
    cache.save(TOKENS, memoryview(b"y" * 5000), [])
    cache.wait()
    assert dc.folder_bytes(tmp_path) == 0
    (notice,) = cache.take_notices()
    assert "over the cache's budget" in notice


def test_the_default_budget_is_the_smaller_of_10_gib_and_a_tenth_of_the_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    for free, budget in ((50 * 1024**3, 5 * 1024**3), (500 * 1024**3, 10 * 1024**3)):
        # the free space, fixed: other programs (the other test worker) write meanwhile
        monkeypatch.setattr(shutil, "disk_usage", lambda _path, free=free: usage(free * 2, free, free))
        assert dc.default_budget(tmp_path) == budget


def test_list_and_clear(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, PARTS)
    good = saved(cache, TOKENS)
    bad = tmp_path / "bad.kvstate"
    bad.write_bytes(b"junk")
    os.utime(bad, (time.time() - 10, time.time() - 10))
    rows = dc.list_state_files(tmp_path)
    assert [row[0] for row in rows] == [good, bad]  # the most recently used first
    assert {row[0] for row in rows} == {good, bad}
    by_path = {row[0]: row for row in rows}
    assert by_path[good][3] is not None and len(by_path[good][3].tokens) == len(TOKENS)
    assert by_path[bad][3] is None and "truncated" in by_path[bad][4]
    expected = (2, good.stat().st_size + 4)
    assert dc.clear_state_files(tmp_path) == expected
    assert dc.list_state_files(tmp_path) == []


_SLOW_SAVE = """
import sys, time
from pathlib import Path
from engine_ext.private_files import write_private_parts

def parts():
    yield b"LLMTUIKV" + b"\\0" * 64
    print("writing", flush=True)
    time.sleep(60)
    yield b"never"

write_private_parts(Path(sys.argv[1]), parts(), durable=True)
"""


def test_a_save_killed_midway_leaves_no_file_that_is_used(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, PARTS)
    target = cache._path_for(tuple(TOKENS))
    writer = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SAVE, str(target)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(timeout=30)
    temporaries = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(temporaries) == 1 and not target.exists()
    assert cache.best(TOKENS, 0, truncatable=True) is None and cache.take_notices() == ()  # never read
    DiskCache(tmp_path, PARTS)  # the next start removes what the killed process left
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_read_state_header_bounds_the_size_before_reading(tmp_path: Path) -> None:
    path = saved(DiskCache(tmp_path, PARTS), TOKENS)
    with pytest.raises(DiskCacheError, match="over the cache's limit"):
        read_state_header(path, 100)


def test_cache_list_and_clear_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main
    from app.core.paths import prompt_cache_dir

    good = saved(DiskCache(prompt_cache_dir(), PARTS, model="tiny.gguf"), TOKENS)
    spoiled = prompt_cache_dir() / "spoiled.kvstate"
    spoiled.write_bytes(b"\x1b[31mnot ours, and long enough for a header")
    assert main(["cache", "list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["on"] is True and out["bytes"] == good.stat().st_size + spoiled.stat().st_size and out["budget"] > 0
    by_name = {Path(f["file"]).name: f for f in out["files"]}
    assert by_name[good.name]["tokens"] == len(TOKENS) and by_name[good.name]["model"] == "tiny.gguf"
    assert "wrong magic" in by_name["spoiled.kvstate"]["refused"]
    assert main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert "2 file(s)" in listed and "tiny.gguf" in listed and "\x1b" not in listed
    assert main(["cache", "clear"]) == 0
    assert "deleted 2" in capsys.readouterr().out and dc.list_state_files(prompt_cache_dir()) == []


def test_the_cache_table_in_config_toml() -> None:
    from app.core.config import CacheSettings, Config, ConfigError, config_from_toml, config_to_toml
    from app.core.paths import prompt_cache_dir

    assert Config().cache == CacheSettings(disk=True, budget_mib=0)
    off = config_from_toml("[cache]\ndisk = false\nbudget_mib = 512\n")
    assert off.cache == CacheSettings(disk=False, budget_mib=512)
    assert off.cache.disk_cache_params().folder == "" and not off.cache.disk_cache_params().enabled
    on = Config().cache.disk_cache_params()
    assert on.folder == str(prompt_cache_dir()) and on.budget_mib == 0
    assert "[cache]" in config_to_toml(off) and config_from_toml(config_to_toml(off)) == off
    with pytest.raises(ConfigError, match="budget"):
        config_from_toml("[cache]\nbudget_mib = -1\n")


def test_a_save_keeps_the_key_it_was_made_under(tmp_path: Path) -> None:
    """The steering mix changing while a save is written does not relabel the rows read under the old one."""
    cache = DiskCache(tmp_path, PARTS)
    cache.save(TOKENS, memoryview(b"s" * 100), [])
    cache.set_part("steering", ["a vector"])
    cache.wait()
    assert cache.best(TOKENS, 0, truncatable=True) is None and cache.take_notices() == ()
    assert DiskCache(tmp_path, PARTS).best(TOKENS, 0, truncatable=True) is not None


@pytest.mark.parametrize("on", [True, False])
def test_the_app_loads_models_with_the_cache_folder_unless_it_is_off(on: bool) -> None:
    from dataclasses import replace
    from typing import Any

    from app.core.config import CacheSettings
    from app.core.paths import prompt_cache_dir
    from app.tui.controllers import ModelsController, SpeculationController
    from engine_ext.params import DiskCacheParams
    from tests.unit.test_controllers import FakeHost

    loads: list[dict[str, Any]] = []

    from app.core.engine import EngineCapabilities

    class Bridge:
        capabilities = EngineCapabilities(loads_files=True)

        def load(self, path: str, engine: object, **options: Any) -> None:
            loads.append(options)

    host = FakeHost(bridge=Bridge(), model_path="/m/a.gguf")
    host.config = replace(host.config, cache=CacheSettings(disk=on, budget_mib=64))
    ModelsController(host, SpeculationController(host)).load_found("/m/a.gguf", (), ())  # type: ignore[arg-type]
    folder = str(prompt_cache_dir()) if on else ""
    assert loads[0]["disk_cache"] == DiskCacheParams(folder=folder, budget_mib=64)


def test_a_named_file_that_is_not_a_state_file_is_never_overwritten(tmp_path: Path) -> None:
    """`run --prompt-cache FILE` naming a model (or anything else) by mistake: refused on read, left as it is."""
    named = tmp_path / "model.gguf"
    named.write_bytes(b"GGUF" + b"\0" * 200)
    cache = DiskCache(tmp_path, PARTS, single_file=named)
    assert cache.best(TOKENS, 0, truncatable=True) is None
    cache.save(TOKENS, memoryview(b"s" * 100), [])
    cache.wait()
    assert named.read_bytes() == b"GGUF" + b"\0" * 200
    notices = cache.take_notices()
    assert any("wrong magic" in n for n in notices) and any("left as it is" in n for n in notices)
    fresh = tmp_path / "new.state"
    mine = DiskCache(tmp_path, PARTS, single_file=fresh)
    mine.save(TOKENS, memoryview(b"s" * 100), [])
    mine.wait()
    mine.save([*TOKENS, 5], memoryview(b"t" * 100), [])  # ours: replaced
    mine.wait()
    assert read_state_header(fresh, 1 << 20).tokens == (*TOKENS, 5)


def test_saves_queue_behind_the_one_being_written_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sequences' saves (serve --parallel): the second returns at once and is written after the first, each
    under its own key; the queue's bytes are bounded (a save past them is left out, said in one line)."""
    import threading

    release = threading.Event()
    original = DiskCache._write

    def slow(self: DiskCache, *job: object) -> None:
        release.wait(30)
        original(self, *job)  # type: ignore[arg-type]

    monkeypatch.setattr(DiskCache, "_write", slow)
    monkeypatch.setattr(dc, "MAX_QUEUED_BYTES", 10_000)
    cache = DiskCache(tmp_path, PARTS, budget=1 << 20)
    other_key = cache.key_of(["a vector"])
    t0 = time.perf_counter()
    cache.save(TOKENS, memoryview(b"A" * 4000), [])
    cache.save(TOKENS[:100], memoryview(b"B" * 4000), [], key=other_key)
    cache.save(TOKENS[:50], memoryview(b"C" * 4000), [])  # over the queue's bound: left out
    assert time.perf_counter() - t0 < 1.0 and cache.busy
    release.set()
    cache.wait()
    assert not cache.busy
    assert cache.best(TOKENS, 0, truncatable=True) is not None
    assert cache.best(TOKENS[:100], 0, truncatable=True, key=other_key) is not None
    assert cache.best(TOKENS[:100], 0, truncatable=True, key=cache.key_of(["another"])) is None
    (notice,) = cache.take_notices()
    assert "wait to be written" in notice and "\n" not in notice
