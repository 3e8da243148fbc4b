"""How an attempt's processes ended, as data for the lifecycle and as words for the job's events.

Split out of head/loop.py: the loop applies core/lifecycle.py's answer; this module reads the
executor's statuses (which process failed first, the exit codes, what the attempt used) and says
them ("rank 2 killed by SIGKILL", "exit code 0 on all 4 ranks"), and works out the work an
interrupted attempt lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from gpucluster.core.lifecycle import Exit
from gpucluster.executors.base import Exited, Lost, Status
from gpucluster.launch.ranks import REQUEUE_EXIT_CODE, AttemptOutcome, attempt_outcome
from gpucluster.store import JobRecord


def unit_of(job: JobRecord) -> str:
    """What one process of a distributed job is: a rank, or a node's launcher."""
    return "node" if job.spec.launcher else "rank"


def work_lost(job: JobRecord, now: float, checkpoint_at: float | None = None) -> float | None:
    """Seconds of work an interrupted attempt lost: from its last checkpoint (or its start, if it
    made none since) to the interruption. A checkpoint written after the head asked the job to
    stop (preemption, requeue) saved everything: nothing is lost.

    The last checkpoint is the newer of the job's own report and `checkpoint_at` (what the head
    sees in the job's checkpoint directory): reports come at most every 10 s, the files do not lie.
    """
    if job.started_at is None:
        return None
    known = [t for t in (job.last_checkpoint_at, checkpoint_at) if t is not None]
    ckpt = max(known) if known else None
    asked = job.stop_requested_at if job.stop_reason not in (None, "failure") else None
    if ckpt is not None and asked is not None and ckpt >= asked:
        return 0.0
    # A failure is noticed when its first process dies; the others are killed only after.
    interrupted = job.stop_requested_at if job.stop_reason == "failure" and job.stop_requested_at else now
    since = max(job.started_at, ckpt) if ckpt is not None else job.started_at
    return max(0.0, interrupted - since)


def newest_entry(directory: Path) -> float | None:
    """When the newest complete entry of a checkpoint directory was written (names starting with
    '.' are writes in progress, by gpucluster.train's convention and most others')."""
    newest = None
    try:
        with os.scandir(directory) as it:
            for e in it:
                if not e.name.startswith("."):
                    with contextlib.suppress(OSError):
                        t = e.stat(follow_symlinks=False).st_mtime
                        newest = t if newest is None else max(newest, t)
    except OSError:
        return None
    return newest


def resources_used(statuses: list[Status]) -> dict[str, Any]:
    """What an attempt's processes used, from their cgroups: CPU seconds and peak memory, summed;
    and the longest image pull of a container job; None where none of them was measured."""
    cpu = [s.cpu_s for s in statuses if isinstance(s, Exited) and s.cpu_s is not None]
    memory = [s.memory_peak_bytes for s in statuses if isinstance(s, Exited) and s.memory_peak_bytes is not None]
    pulls = [s.pull_s for s in statuses if isinstance(s, Exited) and s.pull_s is not None]
    return {
        "cpu_s": sum(cpu) if cpu else None,
        "memory_peak_bytes": sum(memory) if memory else None,
        "pull_s": max(pulls) if pulls else None,
    }


def exit_of(codes: tuple[int | None, ...], first_bad: Status | None, final: bool = False) -> Exit:
    """How an attempt's processes ended, for the lifecycle: a failed one dooms it (for good when
    `final`: an executor said no restart would help); else all 0 is a success and 0s with
    REQUEUE_EXIT_CODE a requeue the job asked for (launch/ranks.py)."""
    if first_bad is not None:
        return Exit.FATAL if final else Exit.FAILURE
    outcome = attempt_outcome([c or 0 for c in codes])
    if outcome is AttemptOutcome.SUCCEEDED:
        return Exit.SUCCESS
    return Exit.REQUEUE if outcome is AttemptOutcome.REQUEUE else Exit.FAILURE


def stop_reached(term_sent: bool, statuses: list[Status]) -> bool:
    """Whether the head's stop reached the attempt before it ended: the lifecycle's `signalled`.

    The head sent SIGTERM (`term_sent`) and not every process says it ended before a stop reached
    it. A SIGTERM sent just as the command ended by itself (the head still saw it running) lands
    in an empty process group: every process's record then says `stopped` False, and the job
    finished first. A status that does not say (an old record, a lost process) keeps the head's
    intent, as before the shim reported it."""
    if not term_sent:
        return False
    return not statuses or not all(isinstance(s, Exited) and s.stopped is False for s in statuses)


def is_failure(s: Status) -> bool:
    """A process that ended in a way that dooms its attempt (a rank's 0 or 79 does not)."""
    return isinstance(s, Lost) or (isinstance(s, Exited) and s.exit_code not in (0, REQUEUE_EXIT_CODE))


def how_ended(s: Status) -> str:
    if isinstance(s, Lost):
        return f"lost: {s.reason}"
    if isinstance(s, Exited):
        if s.error:
            return s.error  # "cannot enter the workdir ...", "cannot start ..."
        return f"killed by {signal.Signals(s.signal).name}" if s.signal else f"exit code {s.exit_code}"
    return "running"


def describe_end(statuses: list[Status], unit: str = "rank") -> str:
    """How a multi-process attempt ended: 'exit code 0 on all 4 ranks', 'rank 2 killed by SIGKILL'."""
    bad = [(r, s) for r, s in enumerate(statuses) if is_failure(s)]
    if bad:
        return f"{unit} {bad[0][0]} {how_ended(bad[0][1])}"
    hows = {how_ended(s) for s in statuses}
    if len(statuses) == 1:
        return hows.pop()
    if len(hows) == 1:
        return f"{hows.pop()} on all {len(statuses)} {unit}s"
    return ", ".join(f"{unit} {r} {how_ended(s)}" for r, s in enumerate(statuses))


def codes_text(codes: tuple[int | None, ...], unit: str = "rank") -> str:
    known = [c for c in codes if c is not None]
    if not known:
        return ""
    if len(codes) == 1:
        return f"exit code {known[0]}"
    if len(set(codes)) == 1:
        return f"exit code {known[0]} on all {len(codes)} {unit}s"
    return "exit codes " + ", ".join("lost" if c is None else str(c) for c in codes)


def describe_allocation(allocation: object) -> str:
    slices = getattr(allocation, "slices", ())
    return "; ".join(f"{s.node} GPUs {','.join(map(str, s.gpu_indices))}" for s in slices)
