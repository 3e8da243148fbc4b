"""Run times the replay has learned so far, for `ordering.runtime_model: gittins` (issue 25).

Why: the Gittins ordering (core/gittins.py) ranks a queued job by the run times of finished
jobs like it. On the head those come from its store (head/runtime_model.py); here they come
from the jobs that finished so far in the replay, fed to the same predictor
(core/runtime_predict.py) with the same shapes the start-estimate probe uses
(sim/estimate_error.py), as the head's store would feed it: a job's shape when it ends, its last
attempt's run seconds. Never the trace's own run times of jobs not yet finished: the ordering
would otherwise be an oracle.

Cost: nothing unless the policy asks for it (the engine makes none). Jobs in the system are
grouped by shape (`_Kind`), so a shape is looked up once, not once per job. A finished run
changes only the similarity keys that name its team or its user (every key names one or the
other), so when the snapshot next asks, only the shapes of those teams and users are looked up
again, and only the jobs of a shape whose distribution changed get a new entry. (Rebuilding
the whole map after every finish was a fifth of a replay's time on Philly.) A kind keeps where
its keys are looked up (`RuntimePredictor.lookups`): building them again at each look-up was
most of its cost (whole Philly under `las-gittins`: ~4 -> ~2.8 CPU-s). The map handed out logs
its writes (core/rank_book.py's `Logged`), so the kept Gittins ranks learn whose distribution
changed without comparing every queued job's.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpucluster.core.rank_book import Logged
from gpucluster.core.runtime_predict import (
    FinishedRun,
    JobShape,
    Lookups,
    RunDistribution,
    RuntimePredictor,
    workload_of,
)
from gpucluster.sim.workload import TraceJob


def trace_shape(trace: TraceJob, model: str, only_model: str) -> JobShape:
    """What the predictor knows of a trace job: its GPU model when it ran (`model`), else its
    one allowed model, else the cluster's only one ("" with several)."""
    if not model:
        model = trace.gpu_types[0] if len(trace.gpu_types) == 1 else only_model
    return JobShape(trace.user, trace.team, workload_of(trace.name), trace.gpus, model, trace.time_limit)


class _Kind:
    """The jobs in the system of one shape, where its distribution is looked up, and the
    distribution they were last given."""

    __slots__ = ("dist", "jobs", "lookups", "shape")

    def __init__(self, shape: JobShape, lookups: Lookups, dist: RunDistribution | None) -> None:
        self.shape = shape
        self.lookups = lookups
        self.dist = dist
        self.jobs: set[int] = set()


class LearnedRuntimes:
    """Fed by the engine: arrivals, finished runs, and the jobs that left; read per snapshot."""

    def __init__(self, models: set[str], predictor: RuntimePredictor | None = None) -> None:
        self.predictor = predictor or RuntimePredictor()
        self._only_model = next(iter(models)) if len(models) == 1 else ""
        self._kinds: dict[JobShape, _Kind] = {}
        self._kind_of: dict[int, _Kind] = {}  # job in the system -> its kind
        self._by_team: dict[str, set[_Kind]] = {}
        self._by_user: dict[str, set[_Kind]] = {}
        # What the snapshot carries; its log tells core/rank_book.py whose distribution changed.
        self._dists: Logged[RunDistribution] = Logged()
        self._dirty_teams: set[str] = set()  # learned a run since the last `distributions`
        self._dirty_users: set[str] = set()

    def arrived(self, trace: TraceJob) -> None:
        shape = trace_shape(trace, "", self._only_model)
        kind = self._kinds.get(shape)
        if kind is None:
            lookups = self.predictor.lookups(shape)
            kind = self._kinds[shape] = _Kind(shape, lookups, self.predictor.distribution_from(lookups))
            self._by_team.setdefault(shape.team, set()).add(kind)
            if shape.user:
                self._by_user.setdefault(shape.user, set()).add(kind)
        kind.jobs.add(trace.job_id)
        self._kind_of[trace.job_id] = kind
        if kind.dist is not None:
            self._dists[trace.job_id] = kind.dist

    def finished(self, trace: TraceJob, run_s: float, model: str) -> None:
        """A run that tells how long such work takes (it ended, or was stopped at its limit)."""
        shape = trace_shape(trace, model, self._only_model)
        self.predictor.add(FinishedRun(shape, run_s))
        self._dirty_teams.add(shape.team)
        if shape.user:
            self._dirty_users.add(shape.user)

    def left(self, job_id: int) -> None:
        kind = self._kind_of.pop(job_id, None)
        if kind is None:
            return
        kind.jobs.discard(job_id)
        self._dists.pop(job_id, None)
        if not kind.jobs:  # no job of it in the system: forgotten (looked up again if one comes)
            del self._kinds[kind.shape]
            self._by_team[kind.shape.team].discard(kind)
            if kind.shape.user:
                self._by_user[kind.shape.user].discard(kind)

    def distributions(self) -> Mapping[int, RunDistribution]:
        """Job id -> the run times of finished jobs like it, for every job in the system with such
        history (the core reads queued jobs' only: `Snapshot.runtime_dist`)."""
        if self._dirty_teams or self._dirty_users:
            touched: set[_Kind] = set()
            for team in self._dirty_teams:
                touched |= self._by_team.get(team, set())
            for user in self._dirty_users:
                touched |= self._by_user.get(user, set())
            self._dirty_teams.clear()
            self._dirty_users.clear()
            for kind in touched:
                d = self.predictor.distribution_from(kind.lookups)
                if d is kind.dist:
                    continue
                kind.dist = d
                if d is None:
                    for job_id in kind.jobs:
                        self._dists.pop(job_id, None)
                else:
                    self._dists.update(dict.fromkeys(kind.jobs, d))
        return self._dists
