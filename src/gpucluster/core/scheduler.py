"""`decide(snapshot, policy, now) -> Plan`: the one scheduling decision, live and simulated.

For each queued job, in the order of `queueing.TeamQueues` (aged, priority class, fair share,
age): filter the GPU models it accepts, check its team's quota, and place it (best fit, fewest
nodes, topology) without taking GPUs reserved for a job ahead of it unless it would end before
that job's reserved start (EASY backfill). A job that cannot start may preempt cheaper jobs
(`preempt`); otherwise the first such job per GPU model gets a reservation (`backfill`) and every
other waits with a named reason. The plan is only a proposal: the head commits it.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping

from gpucluster.core.backfill import EndTimes, Reservation, reserve
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.preempt import CostKey, choose_victims
from gpucluster.core.queueing import TeamQueues
from gpucluster.core.quota import QuotaBook
from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Plan, Preemption, RunningJob, Start, Wait

DEFAULT_POLICY = Policy()


def decide(snapshot: Snapshot, policy: Policy | None = None, now: float = 0.0) -> Plan:
    return _Cycle(snapshot, policy or DEFAULT_POLICY, now).run()


def _fmt_time(t: float) -> str:
    return _time.strftime("%Y-%m-%d %H:%M", _time.localtime(t))


class _Cycle:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: float) -> None:
        self.s = snapshot
        self.policy = policy
        self.now = now
        self.cap = Capacity(snapshot.nodes, snapshot.running)
        self.quotas = QuotaBook(policy, snapshot.running, self.cap.gpus)
        self.reservations: dict[str, Reservation] = {}
        self.starts: list[Start] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[int, Wait] = {}
        self.stopping = [j for j in snapshot.running if j.stopping]
        self._candidates: list[RunningJob] | None = None
        self._ends: EndTimes | None = None
        self._fair_ratio: dict[str, float] = {}

    def run(self) -> Plan:
        queues = TeamQueues(self.s.queued, self.policy, self.s.usage, self.now)
        while (job := queues.pop()) is not None:
            started = self._consider(job)
            queues.done(job, started)
        return Plan(starts=tuple(self.starts), preemptions=tuple(self.preemptions), waiting=self.waiting)

    # ---- one job ----------------------------------------------------------------------------

    def _consider(self, job: JobRequest) -> bool:
        models = self.cap.acceptable_models(job)
        fits_ever = [m for m in models if self.cap.could_ever_fit(job, m)]
        if not fits_ever:
            self._wait(job, WaitReason.NO_FIT, self._no_fit_message(job))
            return False
        refusal: str | None = None
        blocked_by: Reservation | None = None
        for model in fits_ever:
            why = self.quotas.refusal(job.team, model, job.gpus, self.cap.free_count(model))
            if why is not None:
                refusal = refusal or why
                continue
            res = self.reservations.get(model)
            exclude: frozenset[str] = frozenset()
            if res is not None and not self._ends_before(job, res):
                if not self.policy.backfill:
                    blocked_by = blocked_by or res
                    continue
                exclude = res.nodes
            allocation = self.cap.place(job, model, exclude)
            if allocation is not None:
                self._start(job, allocation)
                return True
            # The reservation is the obstacle only if the job would fit without it.
            if exclude and blocked_by is None and self.cap.place(job, model) is not None:
                blocked_by = res
        if refusal is not None and blocked_by is None and not self._any_model_free_for(job, fits_ever):
            refusal = None  # the real obstacle is that the GPUs are busy, not the quota
        if refusal is not None:
            self._wait(job, WaitReason.QUOTA, refusal)
            return False
        if self._try_preempt(job, fits_ever):
            return False
        self._reserve_or_wait(job, fits_ever, blocked_by)
        return False

    def _ends_before(self, job: JobRequest, res: Reservation) -> bool:
        limit = job.time_limit_s or self.policy.default_time_limit_s
        return self.now + limit <= res.shadow

    def _any_model_free_for(self, job: JobRequest, models: list[str]) -> bool:
        return any(self.cap.free_count(m) >= job.gpus for m in models)

    def _start(self, job: JobRequest, allocation: Allocation) -> None:
        self.cap.take(allocation)
        self.quotas.add(job.team, allocation)
        self.starts.append(Start(job.job_id, allocation))
        if self._ends is not None:
            self._add_end(job.job_id, allocation, self.now + (job.time_limit_s or self.policy.default_time_limit_s))

    # ---- preemption -------------------------------------------------------------------------

    def _try_preempt(self, job: JobRequest, models: list[str]) -> bool:
        pre = self.policy.preemption
        if not pre.enabled or job.fractional:
            return False
        for model in models:
            reclaim = pre.reclaim_quota and self.quotas.within_quota(job.team, model, job.gpus)
            candidates = [
                v
                for v in self._victim_pool()
                if self.cap.model_of(v.allocation) == model
                and (
                    (self.policy.priorities and v.priority < job.priority)
                    or (reclaim and v.team != job.team and self.quotas.borrowing(v.team, model))
                )
            ]
            if not candidates and not self.stopping:
                continue
            choice = choose_victims(job, model, self.cap, candidates, self.stopping, self._victim_cost)
            if choice is None:
                continue
            if not choice.victims:
                if not candidates and not any(self.cap.model_of(j.allocation) == model for j in self.stopping):
                    continue
                self._wait(job, WaitReason.PREEMPTING, f"waiting for stopping jobs to release {model} GPUs")
            else:
                names = ", ".join(str(v.job_id) for v in choice.victims)
                self._wait(job, WaitReason.PREEMPTING, f"preempting job(s) {names} to free {job.gpus:g} {model} GPUs")
                for v in choice.victims:
                    why = (
                        f"preempted by job {job.job_id} ({job.priority.label} priority)"
                        if self.policy.priorities and v.priority < job.priority
                        else f"preempted: team {job.team} reclaims its guaranteed {model} GPUs"
                    )
                    self.preemptions.append(Preemption(v.job_id, job.job_id, why))
                    self.quotas.remove(v.team, v.allocation)
                assert self._candidates is not None
                gone = {v.job_id for v in choice.victims}
                self._candidates = [c for c in self._candidates if c.job_id not in gone]
                self.stopping = [*self.stopping, *choice.victims]
            nodes = frozenset({choice.node}) if choice.node else frozenset(self.cap.node_models)
            self.reservations.setdefault(model, Reservation(job.job_id, model, self.now + pre.grace_period_s, nodes))
            return True
        return False

    def _victim_pool(self) -> list[RunningJob]:
        if self._candidates is None:
            pre = self.policy.preemption
            self._candidates = [
                j
                for j in self.s.running
                if not j.stopping
                and self.policy.preemptible(j.priority)
                and self.now - j.started_at >= pre.min_runtime_s
                and all(s.share >= 1 for s in j.allocation.slices)
            ]
        return self._candidates

    def _victim_cost(self, v: RunningJob) -> CostKey:
        lost = self.now - (v.last_checkpoint_at if v.last_checkpoint_at is not None else v.started_at)
        return (int(v.priority), -self._over_share(v.team), lost, -v.started_at)

    def _over_share(self, team: str) -> float:
        if team not in self._fair_ratio:
            self._fair_ratio[team] = self.s.usage.get(team, 0.0) / max(self.policy.share(team), 1e-9)
        return self._fair_ratio[team]

    # ---- waiting ----------------------------------------------------------------------------

    def _reserve_or_wait(self, job: JobRequest, models: list[str], blocked_by: Reservation | None) -> None:
        if blocked_by is not None:
            self._wait(
                job,
                WaitReason.BEHIND_RESERVATION,
                f"would delay job {blocked_by.job_id}, first in line for {blocked_by.model} GPUs "
                f"(its estimated start: {_fmt_time(blocked_by.shadow)})",
            )
            return
        if not job.fractional:
            for model in models:
                if model in self.reservations:
                    continue
                res = reserve(job, model, self.cap, self._end_times(), self.now)
                if res is not None:
                    self.reservations[model] = res
                    self._wait(
                        job,
                        WaitReason.RESERVED,
                        f"first in line: {job.gpus:g} {model} GPUs on {', '.join(sorted(res.nodes)[:3])}"
                        f"{'...' if len(res.nodes) > 3 else ''} are held for it from {_fmt_time(res.shadow)}",
                        res.shadow,
                    )
                    return
        model = models[0]
        most = max((len(v) for v in self.cap.free[model].values()), default=0)
        where = "on one node" if not job.fractional and int(job.gpus) <= self.cap.node_size[model] else "in all"
        self._wait(
            job,
            WaitReason.RESOURCES,
            f"needs {job.gpus:g} free {model} GPU(s) {where}; {self.cap.free_count(model)} free now "
            f"(at most {most} on one node)",
        )

    def _no_fit_message(self, job: JobRequest) -> str:
        kinds = ", ".join(job.gpu_types) if job.gpu_types else "any model"
        sizes = ", ".join(
            f"{m}: {n} per node, {self.cap.total[m]} in all" for m, n in sorted(self.cap.node_size.items())
        )
        return f"no set of nodes can host {job.gpus:g} GPUs of {kinds} as asked ({sizes or 'no GPUs'})"

    def _wait(self, job: JobRequest, reason: WaitReason, message: str, estimated: float | None = None) -> None:
        self.waiting[job.job_id] = Wait(reason, message, estimated)

    # ---- expected ends ----------------------------------------------------------------------

    def _end_times(self) -> EndTimes:
        if self._ends is None:
            self._ends = EndTimes()
            grace = self.policy.preemption.grace_period_s
            for j in self.s.running:
                end = (
                    self.now + grace
                    if j.stopping
                    else j.started_at + (j.time_limit_s or self.policy.default_time_limit_s)
                )
                self._add_end(j.job_id, j.allocation, max(end, self.now))
            for st in self.starts:
                self._add_end(st.job_id, st.allocation, self.now + self.policy.default_time_limit_s)
        return self._ends

    def _add_end(self, job_id: int, allocation: Allocation, end: float) -> None:
        assert self._ends is not None
        for s in allocation.slices:
            if s.share < 1:
                continue
            model = self.cap.gpus[(s.node, s.gpu_indices[0])].model
            self._ends.add(model, s.node, end, len(s.gpu_indices))


def usage_now(usage: Mapping[str, float]) -> dict[str, float]:
    return dict(usage)
