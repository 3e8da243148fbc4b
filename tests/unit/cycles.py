"""A tiny closed-loop driver for `decide`: a fake clock, jobs that run to their time limit, preemptions
that take effect after a grace period and send the job back to the queue (same id, same age).

Just enough of the head's behaviour to ask "does every feasible job eventually run?" without a store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpucluster.core.fairshare import accrue
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.quota import QuotaBook
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Node, Plan, RunningJob


@dataclass
class Cycles:
    nodes: tuple[Node, ...]
    policy: Policy
    arrivals: list[JobRequest]  # joined the queue at their submitted_at
    now: float = 0.0
    runtime: dict[int, float] = field(default_factory=dict)  # job -> how long it runs (default: its limit)
    exit_after_term_s: float = 5.0  # a signalled job exits this long after SIGTERM (within the grace)
    queued: dict[int, JobRequest] = field(default_factory=dict)
    running: dict[int, RunningJob] = field(default_factory=dict)
    ends_at: dict[int, float] = field(default_factory=dict)
    first_start: dict[int, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)  # job -> attempts
    start_log: list[tuple[float, int]] = field(default_factory=list)  # (time, job) of every start
    preemptions: list[tuple[float, int, int]] = field(default_factory=list)  # (time, victim, for job)
    usage: dict[str, float] = field(default_factory=dict)
    # victim -> the job it was preempted for, until that job starts (as the head keeps it)
    preempted_for: dict[int, int] = field(default_factory=dict)
    plans: int = 0
    last_plan: Plan | None = None

    def __post_init__(self) -> None:
        self.arrivals = sorted(self.arrivals, key=lambda j: (j.submitted_at, j.job_id))
        self._requests = {j.job_id: j for j in self.arrivals}

    def fits(self, job: JobRequest) -> bool:
        """Could some set of nodes host the job, quotas aside."""
        cap = Capacity(self.nodes, ())
        return any(cap.could_ever_fit(job, m) for m in cap.acceptable_models(job))

    def feasible(self, job: JobRequest) -> bool:
        """Could the job run on the empty cluster: some node set hosts it and its team's quota allows it."""
        cap = Capacity(self.nodes, ())
        quotas = QuotaBook(self.policy, (), cap.gpus)
        return any(
            cap.could_ever_fit(job, m) and quotas.refusal(job.team, m, job.gpus, cap.total[m]) is None
            for m in cap.acceptable_models(job)
        )

    def limit(self, job_id: int) -> float:
        j = self._requests[job_id]
        return j.time_limit_s if j.time_limit_s is not None else self.policy.default_time_limit_s

    def _next_event(self, max_step: float) -> float:
        times = [t for t in self.ends_at.values() if t > self.now]
        times += [j.submitted_at for j in self.arrivals if j.submitted_at > self.now]
        return min([*times, self.now + max_step])

    def cycle(self) -> Plan:
        """One head cycle at `now`: arrivals, ends and exits, then decide and commit."""
        while self.arrivals and self.arrivals[0].submitted_at <= self.now:
            j = self.arrivals.pop(0)
            self.queued[j.job_id] = replace(j, queued_at=j.submitted_at)
        for job_id, end in list(self.ends_at.items()):
            if end <= self.now:
                r = self.running.pop(job_id)
                del self.ends_at[job_id]
                if r.stopping:  # preempted: back in line, same id and submit time, queued again now
                    self.queued[job_id] = replace(self._requests[job_id], queued_at=self.now)
                else:
                    self.finished[job_id] = self.now
        snap = Snapshot(
            self.nodes,
            tuple(self.running.values()),
            tuple(self.queued.values()),
            dict(self.usage),
            preempted_for=dict(self.preempted_for),
        )
        plan = decide(snap, self.policy, self.now)
        self.plans += 1
        self.last_plan = plan
        for p in plan.preemptions:
            r = self.running[p.job_id]
            assert not r.stopping, f"job {p.job_id} preempted twice"
            self.running[p.job_id] = replace(r, stopping=True)
            # the head signals it on its next cycle (a second later): it exits no sooner than that
            self.ends_at[p.job_id] = min(self.ends_at[p.job_id], self.now + max(self.exit_after_term_s, 1.0))
            self.preemptions.append((self.now, p.job_id, p.for_job))
            self.preempted_for[p.job_id] = p.for_job
        started = {s.job_id for s in plan.starts}
        self.preempted_for = {v: p for v, p in self.preempted_for.items() if p not in started}
        for s in plan.starts:
            j = self.queued.pop(s.job_id)
            self.running[j.job_id] = RunningJob(
                j.job_id, s.allocation, j.team, j.priority, self.now, j.time_limit_s, None, False, user=j.user
            )
            run_for = min(self.runtime.get(j.job_id, self.limit(j.job_id)), self.limit(j.job_id))
            self.ends_at[j.job_id] = self.now + run_for
            self.first_start.setdefault(j.job_id, self.now)
            self.start_log.append((self.now, j.job_id))
            self.starts[j.job_id] = self.starts.get(j.job_id, 0) + 1
        return plan

    def advance(self, max_step: float = 600.0) -> None:
        nxt = self._next_event(max_step)
        running = [(r.team, r.allocation.gpu_count) for r in self.running.values()]
        self.usage = accrue(self.usage, running, nxt - self.now, self.policy.fair_share_half_life_s)
        self.now = nxt

    def run(self, max_cycles: int, until: Iterable[int] | None = None, max_step: float = 600.0) -> bool:
        """Cycle until every job in `until` (default: all) has finished; False if `max_cycles` ran out."""
        want = set(until) if until is not None else set(self._requests)
        for _ in range(max_cycles):
            self.cycle()
            if want <= set(self.finished):
                return True
            self.advance(max_step)
        return False
