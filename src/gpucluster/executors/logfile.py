"""Reading a job's log across rotations (the layout _shim.py writes under a size cap).

Offsets are bytes since the attempt's log began, rotated bytes included, so an offset a client
got before a rotation stays valid after it: the API never re-sends a byte nor skips one that is
still kept. An offset into the part already rotated away reads from the oldest byte kept. A log
without rotation files (no cap, or never past it) reads as the plain file it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _shared_lock(path: Path) -> Iterator[None]:
    """Hold off a rotation (the shim's exclusive flock) while the segments are read."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:  # no cap (the shim makes the lock file before any output): no rotation
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def read_log(path: Path, offset: int) -> tuple[bytes, int]:
    """The log's bytes from `offset` on, and the offset after them."""
    older = Path(f"{path}.1")
    with _shared_lock(path):
        try:
            dropped = int(Path(f"{path}.dropped").read_text() or 0)
        except (FileNotFoundError, ValueError):
            dropped = 0
        first = _read(older)
        second = _read(path)
    pos = max(offset, dropped)
    data = first + second
    chunk = data[pos - dropped :]
    return chunk, pos + len(chunk)
