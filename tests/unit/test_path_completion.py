"""Tab completion of typed paths (the steering panel's add-file prompt): shell-like, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core import path_completion
from app.core.path_completion import complete_path


def test_one_match_is_completed_whole_and_a_folder_gets_its_slash(tmp_path: Path) -> None:
    (tmp_path / "happy-sad.gguf").write_bytes(b"")
    (tmp_path / "happy.txt").write_bytes(b"")
    (tmp_path / "sub").mkdir()
    assert complete_path(f"{tmp_path}/ha", (".gguf",)).text == f"{tmp_path}/happy-sad.gguf"
    assert complete_path(f"{tmp_path}/s", (".gguf",)).text == f"{tmp_path}/sub/"
    everything = complete_path(f"{tmp_path}/ha")  # no suffixes: every file
    assert everything.text == f"{tmp_path}/happy" and everything.candidates == ("happy-sad.gguf", "happy.txt")
    assert everything.note == "2 matches: happy-sad.gguf  happy.txt"


def test_several_matches_complete_their_common_start_and_are_listed(tmp_path: Path) -> None:
    for name in ("calm-a.gguf", "calm-b.gguf", ".calm-hidden.gguf"):
        (tmp_path / name).write_bytes(b"")
    completion = complete_path(f"{tmp_path}/c", (".gguf",))
    assert completion.text == f"{tmp_path}/calm-"
    assert completion.candidates == ("calm-a.gguf", "calm-b.gguf")  # hidden names only after a typed dot
    assert complete_path(f"{tmp_path}/.c", (".gguf",)).text == f"{tmp_path}/.calm-hidden.gguf"


def test_no_match_and_an_unreadable_folder_say_so_and_keep_the_text(tmp_path: Path) -> None:
    none = complete_path(f"{tmp_path}/zz", (".gguf",))
    assert none.text == f"{tmp_path}/zz" and none.note == "No .gguf file or folder here starts with 'zz'."
    missing = complete_path(f"{tmp_path}/nowhere/x")
    assert missing.text == f"{tmp_path}/nowhere/x" and missing.note.startswith("Cannot read")
    assert complete_path("a\0b/x").note.endswith("cannot be a folder.")


def test_home_is_expanded_for_reading_and_kept_in_the_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "vectors").mkdir()
    assert complete_path("~/vec").text == "~/vectors/"


def test_a_huge_folder_is_read_only_in_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of 100,000 files must not hang the prompt: at most MAX_ENTRIES_READ entries are read (here 50 of
    120), and the note says so."""
    monkeypatch.setattr(path_completion, "MAX_ENTRIES_READ", 50)
    for n in range(120):
        (tmp_path / f"v{n:03d}.gguf").write_bytes(b"")
    completion = complete_path(f"{tmp_path}/v", (".gguf",))
    assert len(completion.candidates) == 50
    assert "only the first 50 entries" in completion.note and "type more" in completion.note
