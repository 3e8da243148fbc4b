"""Interactive sessions, the head's side: the policy's session class at submit, and the way to a
running session's socket (executors/_session.py) for the API's relays and for idle reclaim.

A session is a job (kind `session`): queued, placed, isolated, accounted and cancelled as any
job. What differs is only how its process is reached: its command runs on a PTY that the job
side serves on RUN_DIR/session.sock, in the head's own run dir, so only the head connects, and
users reach it only through the head's authenticated WebSocket routes (api/session_routes.py).
"""

from __future__ import annotations

import math
import socket
from typing import Any

from gpucluster.core.policy import InteractivePolicy
from gpucluster.core.states import JobState
from gpucluster.durations import format_duration
from gpucluster.errors import GpuclusterError
from gpucluster.executors import _session
from gpucluster.head.service import Rejected
from gpucluster.models import JobSpec
from gpucluster.store import JobRecord


class NotReachable(RuntimeError, GpuclusterError):
    """The job is no session, or not running, or its server cannot be reached (yet)."""


class Starting(NotReachable):
    """The session is running but its launch is not recorded yet: the head commits RUNNING
    before it launches (head/loop.py), so this lasts moments; a caller may wait it out."""


def apply_class(spec: JobSpec, policy: InteractivePolicy, held_gpus: float) -> JobSpec:
    """The spec as the session class makes it: its priority and time limit; refused (422) when
    it would take its owner's sessions past max_gpus_per_user or asks for more time than allowed."""
    update: dict[str, Any] = {}
    if policy.max_gpus_per_user is not None and held_gpus + spec.gpu_count > policy.max_gpus_per_user + 1e-9:
        raise Rejected(
            "gpus",
            f"your sessions would hold {held_gpus + spec.gpu_count:g} GPUs; the policy allows "
            f"{policy.max_gpus_per_user:g} per user in sessions (you hold {held_gpus:g}): end one "
            "(`gpucluster jobs`, `gpucluster cancel`) or submit a batch job",
        )
    if policy.time_limit_s is not None:
        if spec.time_limit is None:
            update["time_limit"] = policy.time_limit_s
        elif float(spec.time_limit) > policy.time_limit_s:
            raise Rejected(
                "time_limit",
                f"sessions may run at most {format_duration(policy.time_limit_s)} "
                f"(asked for {format_duration(float(spec.time_limit))}); submit a batch job for longer work",
            )
    if policy.priority is not None:
        update["priority"] = policy.priority
    return spec.model_copy(update=update) if update else spec


def run_dir_of(record: JobRecord) -> str:
    """The running session's run dir, where its socket is; NotReachable when there is none."""
    if record.spec.kind != "session":
        raise NotReachable(f"job {record.id} is a batch job, not a session; read its output with `gpucluster logs`")
    if record.state is not JobState.RUNNING:
        raise NotReachable(f"job {record.id} is {record.state.value}, not running")
    launch = record.launch or {}
    run_dir = launch.get("run_dir")
    if not run_dir or "ranks" in launch:
        raise Starting(f"job {record.id} is starting; try again in a moment")
    return str(run_dir)


def connect(record: JobRecord, hello: dict[str, Any], timeout: float = 5.0) -> tuple[socket.socket, dict[str, Any]]:
    """A connection to the session's server after `hello`, and its answer; NotReachable if none."""
    run_dir = run_dir_of(record)
    try:
        return _session.dial(run_dir, hello, timeout)
    except OSError as e:
        raise NotReachable(f"job {record.id}'s session is not reachable yet ({e}); try again in a moment") from e


def quiet_s(run_dir: str) -> float | None:
    """Seconds since the session's user last did something (executors/_session.py's `status`);
    None when the session cannot be asked."""
    try:
        sock, answer = _session.dial(run_dir, {"op": "status"}, timeout=2.0)
    except OSError:
        return None
    sock.close()
    quiet = answer.get("quiet_s")
    return float(quiet) if isinstance(quiet, int | float) and math.isfinite(quiet) else None


def notify(run_dir: str, text: str) -> bool:
    """Show `text` in the session's terminal (and transcript, and the next attach's replay)."""
    try:
        sock, answer = _session.dial(run_dir, {"op": "notice", "text": text}, timeout=2.0)
    except OSError:
        return False
    sock.close()
    return bool(answer.get("ok"))
