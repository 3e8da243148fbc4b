"""Reading a job's log across rotations (the layout _shim.py writes under a size cap), and
appending to one in that layout (the Ray executor's copy of a remote log on the head).

Offsets are bytes since the attempt's log began, rotated bytes included, so an offset a client
got before a rotation stays valid after it: the API never re-sends a byte nor skips one that is
still kept. An offset into the part already rotated away reads from the oldest byte kept. A log
without rotation files (no cap, or never past it) reads as the plain file it is.

A log lives in its job's own directory, which the job's user controls, while the reader is the
head (root on a shared cluster). So every file is opened without following links, without
blocking (a FIFO in a log's place must not hang a reader), must be a regular file, and must belong
to the account that owns the job's directory (`jobs/<id>`, made by the head and not replaceable by
the user): a link or a hard link to another account's file (/etc/shadow, another team's log)
reads as no log at all. A rotation lock the user holds does not hold the reader up for long.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from gpucluster.executors._shim import _CappedLog

# How long a reader waits for a rotation (a lock held by the log's writer) before reading anyway.
LOCK_WAIT_S = 2.0

_T = TypeVar("_T")


def _owner(path: Path) -> int:
    """The account whose files a log's directory may hold: the owner of its job's directory."""
    for ancestor in path.parents:
        if ancestor.parent.name == "jobs":
            with contextlib.suppress(OSError):
                return os.lstat(ancestor).st_uid
            break
    return os.geteuid()


def _open(path: Path | str, flags: int = os.O_RDONLY) -> int:
    """An fd of a regular file of the log's owner (see the module docstring); FileNotFoundError
    for anything else, which reads as a log not written yet."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise FileNotFoundError(str(path)) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != _owner(Path(path)):
        os.close(fd)
        raise FileNotFoundError(str(path))
    return fd


@contextlib.contextmanager
def _lock(path: Path, exclusive: bool = False) -> Iterator[bool]:
    """Hold off a rotation (the shim's exclusive flock) while the segments are read; says whether
    there was a lock file to hold (there is none before the log's first rotation)."""
    try:
        fd = _open(f"{path}.lock", os.O_RDWR if exclusive else os.O_RDONLY)
    except FileNotFoundError:  # never rotated (the first rotation makes the lock before it moves anything)
        yield False
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # a lock held this long is not a rotation: read without it
                time.sleep(0.005)
        yield True
    finally:
        os.close(fd)


def _consistent(path: Path, read: Callable[[], _T]) -> _T:
    """`read()` of the log's files under the readers' lock.

    A log has no lock file until its first rotation (the shim makes none at the job's start:
    issue 18), so a read that found none may have raced that rotation: if a lock file exists
    once it is done, it is read again, under the lock. (Twice at most: a lock file that cannot
    be opened, a link the user planted, reads as none, as before.)"""
    with _lock(path) as locked:
        result = read()
    if locked or not os.path.lexists(f"{path}.lock"):
        return result
    with _lock(path):
        return read()


def _dropped(path: Path) -> int:
    try:
        with os.fdopen(_open(f"{path}.dropped")) as f:
            return int(f.read(32) or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _size(path: Path | str) -> int:
    try:
        fd = _open(path)
    except FileNotFoundError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_log(path: Path, offset: int, limit: int | None = None) -> tuple[bytes, int]:
    """The log's bytes from `offset` on (at most `limit` of them), and the offset after them.

    The chunk starts at `max(offset, first byte kept)`, i.e. at the returned offset minus its
    length. Only the bytes asked for are read (a 1 GiB cap costs a seek, not a read of 1 GiB)."""
    return _consistent(path, lambda: _read_segments(path, offset, limit))


def _read_segments(path: Path, offset: int, limit: int | None) -> tuple[bytes, int]:
    parts: list[bytes] = []
    base = _dropped(path)
    start = pos = max(offset, base)
    for segment in (Path(f"{path}.1"), path):
        if limit is not None and pos - start >= limit:
            break
        try:
            f = os.fdopen(_open(segment), "rb")
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


def read_job_file(path: Path, limit: int = 65536) -> bytes | None:
    """At most `limit` bytes of a small file a job wrote next to its log (its error file), with the
    same care as a log (see the module docstring); None if there is none such."""
    try:
        fd = _open(path)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def log_end(path: Path | str) -> int:
    """The offset just past the log's last byte: every byte it ever had, rotated ones included."""
    return _consistent(Path(path), lambda: _dropped(Path(path)) + _size(f"{path}.1") + _size(path))


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
