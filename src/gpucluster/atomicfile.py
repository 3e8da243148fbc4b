"""Durable, all-or-nothing file replacement: the package's one writer of a file that a crash
must not tear (a checkpoint, the client config with its tokens, the executors' job records).

A file is written under a temporary name in the same directory, fsynced, renamed over its final
name (atomic on POSIX within one file system), and then the directory is fsynced so the rename
itself survives a power loss. A reader therefore sees either the previous file or the complete
new one, never a torn one; a crash leaves at most a `.tmp-*` file behind, which is never loaded
and is removed by the next writer (a checkpoint's) or left, private, beside the file.

Standard library only and no gpucluster imports: the job shim runs under ``python -I -S`` and
loads this file by path (executors/_shim.py `_load_sibling`), as it does cgroups.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (for a checkpoint made of many files)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def tmp_path_for(final: Path, tag: str | None = None) -> Path:
    """A temporary sibling of `final`; unique per writer unless `tag` makes it shared on purpose."""
    return final.parent / f"{TMP_PREFIX}{final.name}-{tag or os.urandom(16).hex()}"


def atomic_write(
    final: str | os.PathLike[str],
    write: Callable[[BinaryIO], object],
    *,
    mode: int = 0o666,
    crash_hook: Callable[[Path], None] | None = None,
    durable: bool = True,
) -> None:
    """Write `final` through `write(fileobj)`, all or nothing.

    `mode` is the new file's permission bits before the umask (0o600: only its owner may read
    it, from its first byte, since the temporary file is made with them). The temporary name is
    new (O_EXCL), so a link planted there is never followed.
    `durable=False` skips both fsyncs: still whole or absent to every reader while the machine
    is up, but not kept through a power loss. For records that mean nothing after a reboot (a
    running process's pid), where the fsyncs were most of a job start's file work (issue 18).
    `crash_hook`, for tests only, is called with the temporary path after the data was written
    and before the rename; a hook that kills the process simulates a crash mid-save.
    """
    path = Path(final)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if crash_hook is not None:
            crash_hook(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_bytes(final: str | os.PathLike[str], data: bytes, *, mode: int = 0o666, durable: bool = True) -> None:
    """`atomic_write` of bytes already in memory."""
    atomic_write(final, lambda f: f.write(data), mode=mode, durable=durable)


def atomic_rename_dir(tmp: Path, final: Path) -> None:
    """Publish a fully written directory `tmp` as `final` (which must not exist)."""
    fsync_tree(tmp)
    os.rename(tmp, final)
    fsync_dir(final.parent)
