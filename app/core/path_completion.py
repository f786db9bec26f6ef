"""Tab completion of a typed path, as a shell does it, reading a bounded number of a folder's entries."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Final

from app.core.model_paths import user_path

MAX_ENTRIES_READ: Final = 20_000
"""Entries of one folder read for a completion at most: a folder of 100,000 files answers in a few hundredths of a
second instead of the time it takes to read them all (the completion then says it read only part of it)."""
MAX_SECONDS: Final = 1.0
"""Time one completion may take reading a folder (a slow network mount), whatever the count."""
SHOWN_CANDIDATES: Final = 6


@dataclass(frozen=True)
class Completion:
    """What Tab makes of a typed path: the new text, and what to say under it."""

    text: str
    """The typed text completed (unchanged when nothing or several names with no longer common start match)."""
    candidates: tuple[str, ...] = ()
    """The matching names (folders end in /), sorted; empty when exactly one matched (it was completed)."""
    note: str = ""
    """One line for the user: the matches, none, or that the folder was read only in part."""


def complete_path(text: str, suffixes: tuple[str, ...] = (), left_out: tuple[str, ...] = ()) -> Completion:
    """Complete `text` (a path as typed, `~` allowed) to the longest start shared by the names in its folder that
    begin with its last part: folders, and files ending in one of `suffixes` (every file when empty) but none of
    `left_out` (files that would be refused). One match is completed whole (a folder with a / after it). Hidden
    names only when the last part starts with a dot."""
    folder_text, _, prefix = text.rpartition("/")
    folder_text = folder_text + "/" if _ else ""
    folder = user_path(folder_text or ".")
    if folder is None:
        return Completion(text, note=f"{folder_text!r} cannot be a folder.")
    names: list[str] = []
    read_all = True
    started = time.monotonic()
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries, 1):
                if count > MAX_ENTRIES_READ or time.monotonic() - started > MAX_SECONDS:
                    read_all = False
                    break
                name = entry.name
                if not name.startswith(prefix) or (name.startswith(".") and not prefix.startswith(".")):
                    continue
                try:
                    is_folder = entry.is_dir()
                except OSError:
                    continue
                if is_folder:
                    names.append(name + "/")
                elif (not suffixes or name.lower().endswith(suffixes)) and not (
                    left_out and name.lower().endswith(left_out)
                ):
                    names.append(name)
    except OSError as error:
        return Completion(text, note=f"Cannot read {folder}: {error.strerror or error}.")
    partly = "" if read_all else f" (only the first {MAX_ENTRIES_READ:,} entries of {folder} read: type more)"
    if not names:
        what = "file or folder" if not suffixes else f"{'/'.join(suffixes)} file or folder"
        return Completion(text, note=f"No {what} here starts with {prefix!r}{partly}.")
    names.sort()
    if len(names) == 1:
        return Completion(folder_text + names[0], note=partly.strip(" ()"))
    common = os.path.commonprefix(names)
    shown = "  ".join(names[:SHOWN_CANDIDATES]) + ("  …" if len(names) > SHOWN_CANDIDATES else "")
    return Completion(folder_text + common, tuple(names), f"{len(names)} matches{partly}: {shown}")
