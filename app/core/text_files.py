"""A user's text file read whole and bounded (a prompt, a grammar, a schema, a tool list): a regular file, or a pipe,
FIFO or device within time limits; one-line ValueErrors. Used by the command line and by the app's engine threads."""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

MAX_TEXT_FILE_BYTES = 8 << 20  # a prompt file: far beyond any context (2^24 tokens are not read from a file)

# A prompt from a pipe or a FIFO (`-f /dev/stdin`) is read with these bounds: nothing new for this long, or not at
# its end after the total, is a one-line refusal instead of a wait without end.
STREAM_IDLE_S = 10.0
STREAM_TOTAL_S = 120.0


def read_text_file(path: Path, limit: int = MAX_TEXT_FILE_BYTES, idle_s: float = STREAM_IDLE_S) -> str:
    """A user's text file, read whole: ValueError (one line) when it is not a file, a pipe or a terminal, too large,
    or not valid UTF-8. Opened without blocking: a FIFO with no writer has nothing to read and is refused at once,
    and a pipe or a device is read within STREAM_IDLE_S / STREAM_TOTAL_S (a folder, a socket: refused)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            data = _read_regular(fd, limit)
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            data = _read_stream(fd, path, limit, idle_s, "a FIFO" if stat.S_ISFIFO(mode) else "a device")
        else:
            kind = "a folder" if stat.S_ISDIR(mode) else "a socket or a block device"
            raise ValueError(f"{path} is {kind}, not a text file; give a text file (or the text with -p)")
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit // (1 << 20)} MiB, the limit for a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start})"
        ) from None


def _read_regular(fd: int, limit: int) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _read_stream(fd: int, path: Path, limit: int, idle_s: float, kind: str) -> bytes:
    """Up to ``limit`` + 1 bytes of a pipe, FIFO or device opened non-blocking, until its end, within the bounds."""
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + STREAM_TOTAL_S
    while size <= limit:
        try:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
        except BlockingIOError:  # a writer is there and has sent nothing yet
            wait = min(idle_s, deadline - time.monotonic())
            if wait <= 0:
                raise ValueError(f"{path} ({kind}) did not end within {STREAM_TOTAL_S:g} s; give a text file") from None
            if not select.select([fd], [], [], wait)[0]:
                raise ValueError(
                    f"{path} ({kind}) sent nothing for {wait:g} s; give a text file (or the text with -p)"
                ) from None
            continue
        if not chunk:  # its end; at once for a FIFO that no writer has opened
            break
        chunks.append(chunk)
        size += len(chunk)
    if not chunks:
        why = " (no writer)" if kind == "a FIFO" else ""
        raise ValueError(f"{path} is {kind} with nothing to read{why}; give a text file (or the text with -p)")
    return b"".join(chunks)
