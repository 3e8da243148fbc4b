"""Reading a job's log across rotations (the layout _shim.py writes under a size cap), and
appending to one in that layout (the Ray executor's copy of a remote log on the head).

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

from gpucluster.executors._shim import _CappedLog


@contextlib.contextmanager
def _lock(path: Path, exclusive: bool = False) -> Iterator[None]:
    """Hold off a rotation (the shim's exclusive flock) while the segments are read."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR if exclusive else os.O_RDONLY)
    except FileNotFoundError:  # no cap (the shim makes the lock file before any output): no rotation
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _dropped(path: Path) -> int:
    try:
        return int(Path(f"{path}.dropped").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _size(path: Path | str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def read_log(path: Path, offset: int, limit: int | None = None) -> tuple[bytes, int]:
    """The log's bytes from `offset` on (at most `limit` of them), and the offset after them.

    The chunk starts at `max(offset, first byte kept)`, i.e. at the returned offset minus its
    length. Only the bytes asked for are read (a 1 GiB cap costs a seek, not a read of 1 GiB)."""
    parts: list[bytes] = []
    with _lock(path):
        base = _dropped(path)
        start = pos = max(offset, base)
        for segment in (Path(f"{path}.1"), path):
            if limit is not None and pos - start >= limit:
                break
            try:
                f = open(segment, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                continue
            with f:
                size = os.fstat(f.fileno()).st_size
                # The live file may grow while it is read: past its size is still its next bytes.
                if pos < base + size or segment == path:
                    f.seek(pos - base)
                    data = f.read(-1 if limit is None else limit - (pos - start))
                    parts.append(data)
                    pos += len(data)
                base += size
    return b"".join(parts), pos


def log_end(path: Path | str) -> int:
    """The offset just past the log's last byte: every byte it ever had, rotated ones included."""
    with _lock(Path(path)):
        return _dropped(Path(path)) + _size(f"{path}.1") + _size(path)


def append_log(path: Path, start: int, data: bytes, cap: int) -> None:
    """Append `data`, which is the log's bytes from offset `start`, rotating past `cap` (> 0) as
    the shim does (its own code), else to the plain file.

    Bytes this copy already has are skipped. A `start` past this copy's end means the source
    rotated away bytes never copied here: the copy then restarts at `start` (what it kept before
    is counted as dropped), so offsets still name the same bytes as at the source."""
    end = log_end(path)
    if start < end:
        data = data[end - start :]
    if not data:
        return
    if cap <= 0:
        with open(path, "ab") as f:
            f.write(data)
        return
    if start > end:
        Path(f"{path}.lock").touch()
        with _lock(path, exclusive=True):
            tmp = Path(f"{path}.dropped.tmp")
            tmp.write_text(str(start))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}.1")
            with open(path, "wb"):  # emptied (or made)
                pass
            os.replace(tmp, f"{path}.dropped")
    log = _CappedLog(str(path), cap)
    try:
        log.write(data)
    finally:
        log.close()
