"""Files and folders read as documents, bounded: each file (MAX_FILE_BYTES), the total (MAX_TOTAL_BYTES), the files
(MAX_FILES) and the folders' depth (MAX_DEPTH); what `.gitignore` skips is skipped, and so are binary files (a NUL
byte or text that is not UTF-8, whatever the name), FIFOs, sockets and devices (never opened for reading: a FIFO
with no writer would block), symlink loops and unreadable files, counted by reason in one line. PDFs: no PDF
reader is installed with llmtui, so they are skipped and said. HTML is read as its text."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from app.core.documents.gitignore import Rule, ignored, parse_rules

MAX_FILE_BYTES = 2 << 20  # one file: larger ones are skipped and said
MAX_TOTAL_BYTES = 64 << 20  # every file of one source together
MAX_FILES = 20_000  # files read from one source
MAX_ENTRIES = 200_000  # folder entries looked at in one source (a folder of 100,000 files is walked, then cut)
MAX_DEPTH = 32  # folders inside folders
MAX_GITIGNORE_BYTES = 256 << 10

# Names never opened: archives, images, media, models, compiled code. Any other file is read if it is text.
BINARY_SUFFIXES = frozenset(
    ".png .jpg .jpeg .gif .webp .bmp .ico .tif .tiff .mp3 .mp4 .wav .flac .ogg .mov .avi .mkv .zip .gz .tgz .bz2 .xz "
    ".zst .7z .rar .tar .jar .whl .gguf .bin .safetensors .pt .pth .onnx .npy .npz .pkl .so .dylib .dll .exe .o .a "
    ".pyc .class .woff .woff2 .ttf .otf .sqlite .db .iso .dmg .doc .docx .xls .xlsx .ppt .pptx .odt".split()
)
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
SKIPPED_FOLDERS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", ".tox", ".mypy_cache"})


@dataclass(frozen=True)
class Document:
    path: Path  # as found (under the source), absolute
    text: str
    mtime_ns: int
    size: int


@dataclass
class ReadReport:
    """What reading a source found: files read, bytes, and what was skipped by reason (one line: `summary`)."""

    files: int = 0
    bytes: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] += count

    def summary(self) -> str:
        size = f"{self.bytes / (1 << 20):.1f} MB" if self.bytes >= 1 << 20 else f"{self.bytes / 1024:.0f} KB"
        line = f"read {self.files} file{'s' if self.files != 1 else ''} ({size})"
        if self.skipped:
            line += "; skipped " + ", ".join(f"{n} {reason}" for reason, n in self.skipped.most_common())
        return line


class _HTMLText(HTMLParser):
    """The text of an HTML page: script and style dropped, blocks on lines of their own."""

    _BLOCKS = frozenset("p div br li tr h1 h2 h3 h4 h5 h6 pre section article header footer table ul ol".split())

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._hidden += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n\n" + ("#" * int(tag[1]) + " " if tag in ("h1", "h2", "h3", "h4", "h5", "h6") else ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._hidden = max(0, self._hidden - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def html_text(html: str) -> str:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def _decoded(data: bytes) -> str | None:
    """The text of `data`, or None when it is binary (a NUL byte, or not UTF-8)."""
    if b"\x00" in data[:65536]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_document(path: Path, report: ReadReport, budget: int = MAX_FILE_BYTES) -> Document | None:
    """One file's text, or None with the reason counted in `report` (never opens what is not a regular file)."""
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        report.skip("PDF (no PDF reader is installed)")
        return None
    if suffix in BINARY_SUFFIXES:
        report.skip("binary")
        return None
    try:
        st = path.stat()
    except OSError as error:
        report.skip("symlink loop" if error.errno == 40 else "unreadable")
        return None
    if not stat.S_ISREG(st.st_mode):
        report.skip("FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file")
        return None
    if st.st_size > MAX_FILE_BYTES:
        report.skip(f"over {MAX_FILE_BYTES >> 20} MiB")
        return None
    if st.st_size > budget:
        report.skip(f"past the {MAX_TOTAL_BYTES >> 20} MiB total")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                report.skip("not a regular file")
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except OSError:
        report.skip("unreadable")
        return None
    if len(data) > MAX_FILE_BYTES:
        report.skip(f"over {MAX_FILE_BYTES >> 20} MiB")
        return None
    text = _decoded(data)
    if text is None:
        report.skip("binary")
        return None
    if suffix in HTML_SUFFIXES:
        text = html_text(text)
    report.files += 1
    report.bytes += len(data)
    return Document(path, text, st.st_mtime_ns, st.st_size)


def source_files(root: Path, report: ReadReport) -> Iterator[Path]:
    """The files of a source: the file itself, or a folder's files (recursively, in name order), what `.gitignore`
    and SKIPPED_FOLDERS skip left out, symlinks within the folder followed once (a loop is skipped and counted), a
    symlink out of the folder skipped and counted, as git and ripgrep leave them."""
    if not root.is_dir():
        yield root
        return
    inside = os.path.realpath(root)  # a link out of the folder is not followed (a repository's link to ~/.ssh)
    seen: set[tuple[int, int]] = set()
    entries = 0
    stack: list[tuple[Path, str, list[Rule], int]] = [(root, "", [], 0)]
    while stack:
        folder, relative, rules, depth = stack.pop()
        try:
            st = folder.stat()
        except OSError as error:
            report.skip("symlink loop" if error.errno == 40 else "unreadable folder")
            continue
        if (st.st_dev, st.st_ino) in seen:
            report.skip("symlink loop")
            continue
        seen.add((st.st_dev, st.st_ino))
        rules = rules + _gitignore(folder, relative)
        try:
            with os.scandir(folder) as scan:
                names = sorted((e.name, _is_folder(e), e.is_symlink()) for e in scan)
        except OSError:
            report.skip("unreadable folder")
            continue
        subfolders = []
        for name, is_dir, is_link in names:
            entries += 1
            if entries > MAX_ENTRIES:
                report.skip(f"past {MAX_ENTRIES} entries")
                return
            if is_link and not _within(os.path.realpath(folder / name), inside):
                report.skip("link out of the folder")
                continue
            rel = f"{relative}/{name}" if relative else name
            if is_dir and (name in SKIPPED_FOLDERS or ignored(rules, rel, True)):
                continue
            if not is_dir and (name == ".gitignore" or ignored(rules, rel, False)):
                continue
            if is_dir:
                if depth + 1 > MAX_DEPTH:
                    report.skip(f"deeper than {MAX_DEPTH} folders")
                else:
                    subfolders.append((folder / name, rel, rules, depth + 1))
            else:
                yield folder / name
        stack.extend(reversed(subfolders))


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether the entry is a folder, through symlinks; a symlink loop is not (read_document says so)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _gitignore(folder: Path, relative: str) -> list[Rule]:
    path = folder / ".gitignore"
    try:
        if not path.is_file() or path.stat().st_size > MAX_GITIGNORE_BYTES:
            return []
        return parse_rules(path.read_text(encoding="utf-8", errors="replace"), relative)
    except OSError:
        return []


def skip_the_rest(first: Path, rest: Iterator[Path], report: ReadReport, limit: int) -> None:
    """Past `limit` files: `first` and the files `rest` still walks (within MAX_ENTRIES) counted, not read."""
    report.skip(f"files past the first {limit}", 1 + sum(1 for _ in rest))


def read_source(root: Path) -> tuple[list[Document], ReadReport]:
    """Every document of a source (a file or a folder), within the limits, and the report of what was skipped."""
    report = ReadReport()
    documents: list[Document] = []
    files = source_files(root, report)
    for path in files:
        if report.files >= MAX_FILES:
            skip_the_rest(path, files, report, MAX_FILES)
            break
        document = read_document(path, report, MAX_TOTAL_BYTES - report.bytes)
        if document is not None:
            documents.append(document)
    return documents, report
