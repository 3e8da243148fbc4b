"""The executor interface: a handful of methods, so local processes, Ray and a fake are swappable.

A handle is a plain JSON-able dict: the head stores it with the job, so after a head restart the
executor can find, poll and signal a process it did not start in this life.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Handle = dict[str, Any]


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    workdir: str
    run_dir: Path  # per-attempt directory: the executor's own records (pid, exit code)
    log_path: Path


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Exited:
    exit_code: int  # shell convention: 128 + N when killed by signal N
    signal: int | None = None


@dataclass(frozen=True)
class Lost:
    reason: str


Status = Running | Exited | Lost


class LaunchError(RuntimeError):
    """The job could not be started at all (missing workdir, unknown program)."""


class Executor(Protocol):
    def launch(self, spec: LaunchSpec) -> Handle:
        """Start the job's process; return once it exists."""

    def recover(self, run_dir: Path) -> Handle | None:
        """The handle of an attempt whose launch the head did not live to record, if it started."""

    def poll(self, handle: Handle) -> Status:
        """Whether the process runs, exited (with its code), or is gone without a trace."""

    def signal(self, handle: Handle, signum: int) -> None:
        """Deliver `signum` to the job's whole process group; a vanished group is not an error."""

    def cleanup(self, handle: Handle) -> None:
        """Kill whatever is left of a finished job's process group (background children)."""
