"""The executor interface: a handful of methods, so local processes, Ray and a fake are swappable.

A handle (`Handle`) is a JSON-able dict: the head stores it with the job, so after a head restart the
executor can find, poll and signal a process it did not start in this life.

An attempt is one process, or several (`LaunchSpec.processes`: one per GPU, or one launcher per
node), which the handle describes together: signals and cleanup reach all of them, and
`poll_ranks` tells how each one is doing, so the head can stop the others when one fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

from gpucluster.errors import GpuclusterError

if TYPE_CHECKING:
    from gpucluster.executors.podman import ContainerSpec


class Handle(TypedDict, total=False):
    """What an executor returns from `launch` and takes back everywhere else: JSON as it is stored
    with the job (store `launch`), so every field is optional and old rows load as they are
    (`as_handle`). Which fields an executor fills:

    - local, one process: pid, pgid, start_ticks (the keeper's identity), run_dir, and where used
      cgroup, container, marker; recovered from shim.json also job_pgid;
    - local, several: ranks (one such handle per process, with its rank), expected, run_dir, marker;
    - Ray: ray (per node: its agent's local handle and where it runs), run_dir, and for several
      processes ranks ([{rank}]), expected, marker;
    - fake: job_id, attempt, and ranks ([{rank}]) for several.
    """

    run_dir: str
    pid: int
    pgid: int
    start_ticks: int | None
    job_pgid: int
    cgroup: dict[str, str]
    container: str
    marker: str
    rank: int
    ranks: list[Handle]
    expected: int
    ray: list[dict[str, Any]]
    job_id: int
    attempt: int


def as_handle(stored: Mapping[str, Any]) -> Handle:
    """A handle read back from JSON (the store, a run dir's records): the fields it has, unchecked,
    as before handles were typed, so rows written by any earlier head still load."""
    return cast(Handle, dict(stored))


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a multi-process attempt: a rank (per-GPU mode) or a node's launcher."""

    argv: list[str]
    env: dict[str, str]
    run_dir: Path  # this process's own records, inside the attempt's run_dir
    log_path: Path


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    argv: list[str]
    env: dict[str, str]
    workdir: str
    run_dir: Path  # per-attempt directory: the executor's own records (pid, exit code)
    log_path: Path
    # Several processes, in rank order: they replace the one process of argv/env/log_path.
    processes: tuple[ProcessSpec, ...] = ()
    # "NAME=VALUE" that every process of the attempt has in its environment and no other
    # process has: finds those that left their process group (torchrun starts its workers in
    # sessions of their own) so a kill or a cleanup still reaches them.
    marker: str | None = None
    # The Unix account to run every process as (a root head runs jobs as their submitters);
    # None: the head's own. The shim's keeper stays the head's, to record exit codes in the run
    # dir, which is the head's alone; everything else is done as this account (see _shim.py).
    user: str | None = None
    # The job's own directory (its logs and checkpoints): made for `user` (0700, owned by it) by
    # the executor on the first attempt; everything inside is made by the job's processes.
    job_dir: Path | None = None
    # Run every process in this container image (executors/podman.py); None: bare processes.
    container: ContainerSpec | None = None
    # An interactive session (one process only): the command runs on a PTY, served on a unix
    # socket in run_dir for the head to relay (executors/_session.py).
    session: bool = False


@dataclass(frozen=True)
class Running:
    pass


@dataclass(frozen=True)
class Exited:
    exit_code: int  # shell convention: 128 + N when killed by signal N
    signal: int | None = None
    error: str | None = None  # why the command never started (a workdir it may not enter, ...)
    # What the process and everything it started used, from its cgroup; None: no cgroup there.
    cpu_s: float | None = None
    memory_peak_bytes: int | None = None
    # No restart can help (an image that cannot be pulled): the job fails with `error`.
    final: bool = False
    pull_s: float | None = None  # a container job's image pull, when it had to pull
    # Whether a stop (SIGTERM, ...) had reached the process before its command ended, as the
    # shim saw it; None: not known (a record from before the shim said so, a shim killed itself).
    # A stop sent just as the command ended by itself finds nothing to stop: the lifecycle then
    # treats the job as finished before the stop reached it.
    stopped: bool | None = None


@dataclass(frozen=True)
class Lost:
    reason: str


Status = Running | Exited | Lost


def combined(statuses: list[Status]) -> Status:
    """One status for several processes: running while any runs, else the first failure, else 0."""
    if any(isinstance(s, Running) for s in statuses):
        return Running()
    for s in statuses:
        if isinstance(s, Lost) or (isinstance(s, Exited) and s.exit_code != 0):
            return s
    return statuses[0] if statuses else Lost("no processes")


class LaunchError(RuntimeError, GpuclusterError):
    """The job could not be started at all (missing workdir, unknown program)."""


class Executor(Protocol):
    def launch(self, spec: LaunchSpec) -> Handle:
        """Start the job's process; return once it exists."""

    def recover(self, run_dir: Path) -> Handle | None:
        """The handle of an attempt whose launch the head did not live to record, if it started."""

    def poll(self, handle: Handle) -> Status:
        """Whether the process runs, exited (with its code), or is gone without a trace."""

    def poll_ranks(self, handle: Handle) -> list[Status]:
        """The status of each process of the attempt, in rank order (one for a single process).

        A multi-process handle recovered after a head crash may hold fewer processes than were
        meant to start (`handle["expected"]`); the missing ones are reported Lost.
        """

    def signal(self, handle: Handle, signum: int) -> None:
        """Deliver `signum` to every process of the job (its cgroup, else its process group; every
        rank's, for several); a job already gone is not an error."""

    def cleanup(self, handle: Handle) -> None:
        """Kill whatever is left of a finished job (background children) and free what it held
        (its cgroups)."""


def expected_processes(handle: Handle) -> int:
    """How many processes the attempt of `handle` was meant to run."""
    return int(handle.get("expected", len(handle["ranks"]))) if "ranks" in handle else 1


def complete(handle: Handle) -> bool:
    """Whether every process of the attempt started (a recovered handle may lack some)."""
    return "ranks" not in handle or len(handle["ranks"]) >= expected_processes(handle)
