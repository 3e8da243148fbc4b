"""The order jobs are considered in: aged jobs, then priority class, then fair share, then age.

Each team has its own FIFO queue; within a priority class the next job comes from the team
furthest below its fair share (decayed usage divided by its entitled share). A job started in
this cycle charges its team at once, so one cycle interleaves teams instead of handing every
free GPU to whichever team was lowest when the cycle began.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from gpucluster.core.policy import Policy
from gpucluster.core.types import JobRequest

# How much a start charges its team, in GPU-seconds per GPU, when the job has no time limit.
CHARGE_HORIZON_S = 3600.0


class TeamQueues:
    def __init__(
        self,
        queued: Iterable[JobRequest],
        policy: Policy,
        usage: Mapping[str, float],
        now: float,
        guaranteed: Callable[[JobRequest], bool] = lambda _: False,
    ) -> None:
        """`guaranteed`: jobs that fit within their team's guaranteed quota go before any
        borrower, so a guarantee is met in the cycle its demand appears."""
        self.policy = policy
        self.usage = dict(usage)
        aged: list[JobRequest] = []
        self.held: list[JobRequest] = []  # not to be considered yet (`not_before` in the future)
        levels: dict[int, dict[str, deque[JobRequest]]] = {}
        for job in sorted(queued, key=lambda j: (j.submitted_at, j.job_id)):
            if job.not_before is not None and job.not_before > now:
                self.held.append(job)
                continue
            entered = job.queued_at if job.queued_at is not None else job.submitted_at
            if now - entered >= policy.starvation_age_s:
                aged.append(job)
                continue
            # Guaranteed demand first (quota is reclaimed from borrowers whatever their class),
            # then priority class within each.
            level = (10 if guaranteed(job) else 0) + (int(job.priority) if policy.priorities else 0)
            levels.setdefault(level, {}).setdefault(job.team, deque()).append(job)
        self._aged = deque(aged)
        self._levels = [levels[k] for k in sorted(levels, reverse=True)]
        self._heap: list[tuple[float, float, int, str]] = []
        self._level = -1
        self._shares: dict[str, float] = {}
        self._popped_team: str | None = None
        self._next_level()

    def _key(self, team: str) -> float:
        if not self.policy.fair_share:
            return 0.0
        share = self._shares.get(team)
        if share is None:
            share = self._shares[team] = max(self.policy.share(team), 1e-9)
        return self.usage.get(team, 0.0) / share

    def _push(self, team: str) -> None:
        q = self._levels[self._level][team]
        if q:
            head = q[0]
            heapq.heappush(self._heap, (self._key(team), head.submitted_at, head.job_id, team))

    def _next_level(self) -> bool:
        while self._level + 1 < len(self._levels):
            self._level += 1
            for team in self._levels[self._level]:
                self._push(team)
            if self._heap:
                return True
        return False

    def pop(self) -> JobRequest | None:
        """The next job to consider; call `done` with it before the next `pop`."""
        self._popped_team = None
        if self._aged:
            return self._aged.popleft()
        while not self._heap:
            if not self._next_level():
                return None
        _, _, _, team = heapq.heappop(self._heap)
        self._popped_team = team
        return self._levels[self._level][team].popleft()

    def done(self, job: JobRequest, started: bool) -> None:
        """Put the job's team back in line, charged for the job if it started."""
        if started:
            limit = job.time_limit_s or CHARGE_HORIZON_S
            self.usage[job.team] = self.usage.get(job.team, 0.0) + job.gpus * min(limit, CHARGE_HORIZON_S)
        if self._popped_team is not None:
            self._push(self._popped_team)
