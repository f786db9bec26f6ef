"""Hostile input to the tools (app/tools/): read_file under a folder that another thread keeps swapping for a link
never reads outside it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from app.tools.box import ToolError
from app.tools.builtin import read_file_tool, read_under

RACE_SECONDS = 2.0


def test_read_file_never_leaves_its_folder_while_a_folder_is_swapped_for_a_link(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "note.txt").write_text("inside")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "note.txt").write_text("outside")
    parked = tmp_path / "parked"
    stop = threading.Event()
    swaps = 0

    def swap() -> None:  # the folder `sub`, then a link named `sub` to the secret folder, and back, until stopped
        nonlocal swaps
        while not stop.is_set():
            os.rename(root / "sub", parked)
            os.symlink(outside, root / "sub")
            os.unlink(root / "sub")
            os.rename(parked, root / "sub")
            swaps += 1

    tool = read_file_tool(root)
    assert tool.run is not None
    swapper = threading.Thread(target=swap, daemon=True)
    counts = {"inside": 0, "refused": 0}
    swapper.start()
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline:
            try:
                text = tool.run({"path": "sub/note.txt"}, 1.0)
            except ToolError:
                counts["refused"] += 1
                continue
            assert text == "inside", "read_file read a file outside its folder"
            counts["inside"] += 1
    finally:
        stop.set()
        swapper.join(timeout=10)
    assert not swapper.is_alive() and swaps > 10
    assert counts["inside"] > 0, counts


def test_read_file_refuses_links_dotdot_and_absolute_paths_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (root / "inner").symlink_to(root / "sub")  # even a link that stays inside is not followed
    (root / "dangling").symlink_to(tmp_path / "none")
    resolved = root.resolve()
    assert read_under(resolved, "./sub//a.txt") == "hello"
    for relative, words in [
        ("inner/a.txt", r"goes through a link \(inner\)"),
        ("dangling", r"goes through a link \(dangling\)"),
        ("sub/../sub/a.txt", r"\.\. leaves it"),
        ("/etc/passwd", "outside the folder"),
        ("sub/a.txt/x", "a.txt is not a folder"),
        (".", "not a regular file"),
    ]:
        with pytest.raises(ToolError, match=words) as refused:
            read_under(resolved, relative)
        assert "\n" not in str(refused.value)


def test_a_folder_replaced_after_read_file_was_set_up_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_text("hello")
    tool = read_file_tool(root)
    assert tool.run is not None and tool.run({"path": "a.txt"}, 1.0) == "hello"
    root.rename(tmp_path / "old")
    root.mkdir()
    (root / "a.txt").write_text("another")
    with pytest.raises(ToolError, match="was replaced since read_file was set up"):
        tool.run({"path": "a.txt"}, 1.0)


def test_without_dir_fd_the_file_opened_must_be_the_one_found_under_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.tools.builtin as builtin

    monkeypatch.setattr(builtin, "_WALKS_BY_FD", False)
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("secret")
    (root / "out").symlink_to(tmp_path / "secret.txt")
    resolved = root.resolve()
    assert read_under(resolved, "sub/a.txt") == "hello"
    with pytest.raises(ToolError, match="outside the folder"):
        read_under(resolved, "out")
