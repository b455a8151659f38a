"""Lines of a kernel log as they arrive: ``/dev/kmsg`` (one record per read) or a file that
grows (a saved log, a simulator's), read from a thread so that a slow reader never holds the
event loop.

Both start at the end by default: what the kernel printed before the watcher started was
read by the exporter and the detector long ago (and ``/dev/kmsg`` replays the whole ring
buffer since boot). A line longer than ``MAX_LINE_BYTES`` is cut there: the Xid part of a
driver line is at its start.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

MAX_LINE_BYTES = 4096
POLL_SECONDS = 0.05
"""How often a growing file is looked at (a device wakes the reader itself)."""


def kmsg_line(record: bytes) -> str:
    """``/dev/kmsg``'s ``PRIO,SEQ,USEC,FLAGS;message`` (continuation lines after it start
    with a space and are dropped) as ``dmesg`` prints it: ``[  SECONDS] message``."""
    text = record.decode("utf-8", errors="replace").split("\n", 1)[0]
    head, sep, message = text.partition(";")
    if not sep:
        return text
    fields = head.split(",")
    try:
        seconds = int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return message
    return f"[{seconds:12.6f}] {message}"


def follow(path: Path, emit: Callable[[str], None], stop: threading.Event, *,
           from_start: bool = False, opened: threading.Event | None = None) -> None:
    """Call ``emit`` with each new line of ``path`` until ``stop`` is set (``opened`` is set
    once the log is open and positioned). Raises OSError when ``path`` cannot be opened at
    all (the caller reports it)."""
    opened = opened or threading.Event()
    if stat.S_ISCHR(os.stat(path).st_mode):
        _follow_device(path, emit, stop, from_start=from_start, opened=opened)
    else:
        _follow_file(path, emit, stop, from_start=from_start, opened=opened)


def _follow_device(path: Path, emit: Callable[[str], None], stop: threading.Event, *,
                   from_start: bool, opened: threading.Event) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not from_start:
            os.lseek(fd, 0, os.SEEK_END)
        opened.set()
        while not stop.is_set():
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                select.select([fd], [], [], 0.5)
                continue
            except OSError as err:
                if err.errno == errno.EPIPE:  # the ring buffer overwrote unread records
                    continue
                raise
            if record:
                emit(kmsg_line(record[:MAX_LINE_BYTES]))
    finally:
        os.close(fd)


def _follow_file(path: Path, emit: Callable[[str], None], stop: threading.Event, *,
                 from_start: bool, opened: threading.Event) -> None:
    f = path.open("rb")
    try:
        ino = os.fstat(f.fileno()).st_ino
        if not from_start:
            f.seek(0, os.SEEK_END)
        opened.set()
        partial = b""
        while not stop.is_set():
            chunk = f.readline(MAX_LINE_BYTES + 1)
            if chunk:
                if chunk.endswith(b"\n") or len(partial) + len(chunk) > MAX_LINE_BYTES:
                    line = (partial + chunk)[:MAX_LINE_BYTES]
                    partial = b""
                    if not chunk.endswith(b"\n"):
                        _skip_rest_of_line(f)
                    emit(line.rstrip(b"\r\n").decode("utf-8", errors="replace"))
                else:
                    partial += chunk  # the writer has not finished the line yet
                continue
            time.sleep(POLL_SECONDS)
            # Rotated (another file at the path) or truncated: read the new one from its start.
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if now.st_ino != ino or now.st_size < f.tell():
                    f.close()
                    f = path.open("rb")
                    ino, partial = os.fstat(f.fileno()).st_ino, b""
    finally:
        f.close()


def _skip_rest_of_line(f: BinaryIO) -> None:
    while True:
        rest = f.readline(MAX_LINE_BYTES)
        if not rest or rest.endswith(b"\n"):
            return
