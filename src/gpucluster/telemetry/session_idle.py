"""Idle reclaim of interactive sessions: warn in the terminal, then stop (policy `interactive.idle`).

Why two signals, never one: a session's GPUs at 0% may be a person reading a notebook or
typing code, and a silent terminal may be a long compile or a training loop on the GPUs. A
session is idle only when its GPUs sit at or under the threshold (telemetry, as for batch jobs)
AND its user has done nothing through the head (no keystroke, attach, or forwarded byte; the
session server on the node keeps that clock, so a head restart does not reset it) for
`idle.after`. The user is then warned in the terminal (and the transcript, and the dashboard's
idle flag); `idle.grace` later, still idle, the session is stopped (`idle.action: stop`). Any
activity in between withdraws the warning.

The monitor (telemetry/monitor.py) calls `check` for each running session at every step; the
session's quiet time and the notices go through `probe` and `tell`, injected so that the rule
is tested without sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpucluster.core.policy import InteractivePolicy
from gpucluster.durations import format_duration
from gpucluster.head import sessions
from gpucluster.store.telemetry import Holding, JobFlag

log = logging.getLogger("gpucluster.telemetry")

SESSION = "session"
IDLE = "idle"
POLICY_STOP = "policy"

Probe = Callable[[str], float | None]  # run dir -> seconds since the user last did something
Tell = Callable[[str, str], bool]  # run dir, text -> delivered


class SessionReclaim:
    def __init__(
        self,
        policy: Callable[[], InteractivePolicy],
        request_stop: Callable[[int, str, str], bool],
        set_flag: Callable[[JobFlag], None],
        clear_flag: Callable[[int], None],
        probe: Probe = sessions.quiet_s,
        tell: Tell = sessions.notify,
    ) -> None:
        self.policy = policy
        self.request_stop = request_stop
        self.set_flag, self.clear_flag = set_flag, clear_flag
        self.probe, self.tell = probe, tell
        self.warned: dict[int, float] = {}  # job id -> when its user was warned

    def check(self, job: Holding, gpus_idle_since: float | None, now: float) -> None:
        """One running session at one telemetry step; `gpus_idle_since` is when all its GPUs
        went at or under the policy's threshold (None: they are busy, or not known)."""
        policy = self.policy()
        run_dir = (job.launch or {}).get("run_dir")
        if policy.idle_after_s is None or not run_dir or job.stop_reason is not None:
            self.forget(job.id)
            return
        quiet = self.probe(str(run_dir)) if gpus_idle_since is not None else None
        idle_for = min(now - gpus_idle_since, quiet) if gpus_idle_since is not None and quiet is not None else 0.0
        if idle_for < policy.idle_after_s:
            if self.warned.pop(job.id, None) is not None:
                self.clear_flag(job.id)
                self.tell(str(run_dir), "activity again: the session stays")
            return
        warned_at = self.warned.get(job.id)
        what = (
            f"GPUs at or under {policy.idle_threshold:g}% and no input for {format_duration(idle_for)}"
            if gpus_idle_since is not None
            else "idle"
        )
        if warned_at is None:
            self.warned[job.id] = now
            act = "stopped" if policy.idle_action == "stop" else "reported"
            message = (
                f"this session is idle ({what}); it will be {act} in {format_duration(policy.idle_grace_s)} "
                "unless it is used (a key, or traffic through a forwarded port)"
            )
            self.tell(str(run_dir), message)
            self.set_flag(JobFlag(job.id, IDLE, now - idle_for, message))
            log.info("session %s idle, warned: %s", job.id, message)
        elif now - warned_at >= policy.idle_grace_s and policy.idle_action == "stop":
            message = f"stopped: idle session ({what}), warned {format_duration(now - warned_at)} before"
            self.tell(str(run_dir), message)
            if self.request_stop(job.id, POLICY_STOP, message):
                log.warning("session %s %s", job.id, message)

    def forget(self, job_id: int) -> None:
        if self.warned.pop(job_id, None) is not None:
            self.clear_flag(job_id)

    def keep_only(self, live: set[int]) -> None:
        for job_id in [j for j in self.warned if j not in live]:
            del self.warned[job_id]
