"""Where the head's database connection string comes from: never from its command line.

A password in `--database postgresql://u:PASSWORD@...` would be in the head's argv, which every
local account reads through `ps`. So a URL with a password comes from the head's environment
(`GPUCLUSTER_DATABASE_URL`, which jobs never inherit: launch/env.py) or from a file only the
head's account can read (`--database-file`); a URL without one (peer or .pgpass authentication)
may still be given as `--database`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from gpucluster.errors import GpuclusterError

ENV = "GPUCLUSTER_DATABASE_URL"


class DatabaseUrlError(ValueError, GpuclusterError):
    """The connection string cannot be used as given; the message says what to do."""


def has_password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False


def from_file(path: Path) -> str:
    """The URL in `path`, which must be the head's own and unreadable by anyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise DatabaseUrlError(f"--database-file {path}: {e.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise DatabaseUrlError(
                f"--database-file {path} is readable by other accounts (mode {stat.S_IMODE(st.st_mode):o}): "
                f"run chmod 600 {path}"
            )
        url = f.read().strip()
    if not url:
        raise DatabaseUrlError(f"--database-file {path} is empty: write the postgresql://... URL in it")
    return url


def resolve(given: str | None, file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The database URL to use, from `--database` (or its environment variable) or
    `--database-file`; None: SQLite in the data dir."""
    if file is not None:
        if given:
            raise DatabaseUrlError("give --database or --database-file, not both")
        return from_file(file)
    if given and has_password(given) and environ.get(ENV) != given:
        raise DatabaseUrlError(
            "a password in --database would be visible to every account on this machine (ps): "
            f"put the URL in a file only you can read and pass --database-file FILE, or set {ENV}"
        )
    return given or None
