"""The head's run-time predictor: core/runtime_predict.py fed from the store, incrementally.

Why here and not in the core: the core model is pure and knows nothing of the store; the head
reads finished runs after a watermark (store/runs.py) at each estimate refresh (every 5 s at
most, head/estimates.py), so a finished job counts within one refresh and the store is never
scanned whole. A new head learns from the latest `INITIAL` runs. The model is in memory only:
it is rebuilt from the store after a restart, so it survives crashes the way the store does.

The API reads predictions from other threads than the loop's, hence the lock.

The queued jobs' distributions (`ordering.runtime_model: gittins`) are kept across plans by
core/learned_kinds.py, as the simulator keeps its jobs' (sim/learned.py): a queued job's shape
is made once, when its request object is first seen; a learned run looks up again only the
shapes of its team and user. The map handed to the snapshot is the same `Logged` map each plan,
so core/rank_book.py learns from its log whose distribution changed (`fresh_distributions`, the
whole look-up, is what check mode compares it with).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter, is_not

from gpucluster.core.learned_kinds import LearnedKinds
from gpucluster.core.policy import Policy
from gpucluster.core.rank_book import Logged
from gpucluster.core.runtime_predict import (
    FinishedRun,
    JobShape,
    Prediction,
    RunDistribution,
    RuntimePredictor,
    workload_of,
)
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Node
from gpucluster.store import Store
from gpucluster.store.runs import finished_runs, workloads

INITIAL = 20_000  # runs a new head learns from
BATCH = 5_000  # runs read per query when catching up
_JOB_ID = attrgetter("job_id")


class _Known:
    """The jobs whose workloads `RuntimeModel` has (`finished_runs`' `known`), less those changed
    since. Read without the lock: `forget` adds to `stale` from API threads, and a set's add and
    membership test are each atomic."""

    __slots__ = ("stale", "workloads")

    def __init__(self, workloads: dict[int, str], stale: set[int]) -> None:
        self.workloads = workloads
        self.stale = stale

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.workloads and job_id not in self.stale

    def __getitem__(self, job_id: int) -> str:
        return self.workloads[job_id]


class RuntimeModel:
    def __init__(self, store: Store, predictor: RuntimePredictor | None = None) -> None:
        self.store = store
        self.predictor = predictor or RuntimePredictor()
        self._mark: tuple[float, int] | None = None
        self._loaded = False
        self._workloads: dict[int, str] = {}  # job id -> workload, for queued and running jobs
        self._node_models: dict[str, str] = {}  # node -> its GPU model, from the last snapshot
        self._lock = threading.Lock()
        # `distributions`, kept across plans (loop thread only): the queued jobs by shape, made
        # with the cluster's only GPU model `_kinds_model`, and the request each was made from.
        self._kinds: LearnedKinds | None = None
        self._kinds_model = ""
        self._told: dict[int, JobRequest] = {}
        self._stale: set[int] = set()  # queued jobs changed (`update`: a new name) since `runs`

    def forget(self, job_id: int) -> None:
        """A queued job's spec changed (any thread): its workload is read again at the next plan."""
        with self._lock:
            self._stale.add(job_id)

    def refresh(self) -> int:
        """Learn the runs that finished since the last call; how many there were."""
        added = 0
        # The jobs it knew queued or running, whose workloads it has: a dict only ever added to
        # (`runs` replaces it, never removes from it), so a key seen here is still there below.
        known = _Known(self._workloads, self._stale)
        while True:
            rows = finished_runs(self.store, self._mark, BATCH if self._loaded else INITIAL, known)
            with self._lock:
                for r in rows:
                    model = next((self._node_models[n] for n in r.nodes if n in self._node_models), "")
                    workload = known[r.job_id] if r.command is None else workload_of(r.name, r.command)
                    shape = JobShape(r.owner, r.team, workload, r.gpus, model, r.time_limit_s)
                    self.predictor.add(FinishedRun(shape, r.run_s))
                    if self._kinds is not None:
                        self._kinds.learned(shape)
            if rows:
                self._mark = (rows[-1].ended_at, rows[-1].job_id)
            added += len(rows)
            first, self._loaded = not self._loaded, True
            if first or len(rows) < BATCH:
                return added

    def _workload(self, ids: Iterable[int]) -> None:
        missing = [i for i in ids if i not in self._workloads]
        if missing:
            for job_id, (name, command) in workloads(self.store, missing).items():
                self._workloads[job_id] = workload_of(name, command)

    def runs(self, snap: Snapshot, policy: Policy, now: float) -> dict[int, float]:
        """Expected run time of every queued and running job of `snap` (a running job's whole
        run, knowing how long it has run): what core/estimate.py plans with."""
        self._node_models = {n.name: n.gpus[0].model for n in (*snap.nodes, *snap.unavailable) if n.gpus}
        self.refresh()
        present = [q.job_id for q in snap.queued] + [r.job_id for r in snap.running]
        with self._lock:
            stale, self._stale = self._stale, set()
        keep = set(present) - stale
        self._workloads = {k: v for k, v in self._workloads.items() if k in keep}
        self._workload(present)
        models = set(self._node_models.values())
        only = next(iter(models)) if len(models) == 1 else ""
        default = policy.default_time_limit_s
        out: dict[int, float] = {}
        # Queued jobs share shapes (an array's elements, one user's runs of a workload): each
        # shape predicted once per refresh. 10,000 queued jobs of 5 shapes: 10,000 predictions
        # were half of a refresh's CPU time (bench/bench_estimate_refresh.py).
        seen: dict[JobShape, float] = {}
        with self._lock:
            for q in snap.queued:
                shape = self._queued_shape(q, only)
                run = seen.get(shape)
                if run is None:
                    run = seen[shape] = self.predictor.predict(shape, default).run_s
                out[q.job_id] = run
            for r in snap.running:
                model = self._node_models.get(r.allocation.slices[0].node, "") if r.allocation.slices else ""
                gpus = float(r.allocation.gpu_count)
                shape = JobShape(r.user, r.team, self._workloads.get(r.job_id, ""), gpus, model, r.time_limit_s)
                elapsed = max(0.0, now - r.started_at)
                out[r.job_id] = self.predictor.expected_total(shape, elapsed, default)
        return out

    def _queued_shape(self, q: JobRequest, only_model: str) -> JobShape:
        """A queued job's shape: its one allowed GPU model, else the cluster's only one."""
        model = q.gpu_types[0] if len(q.gpu_types) == 1 else only_model
        return JobShape(q.user, q.team, self._workloads.get(q.job_id, ""), q.gpus, model, q.time_limit_s)

    def distributions(
        self, queued: Sequence[JobRequest], nodes: Iterable[Node], now: float = 0.0, every_s: float = 0.0
    ) -> Logged[RunDistribution]:
        """Queued job id -> the run times of finished jobs like it, for `ordering.runtime_model:
        gittins` (core/gittins.py; `Snapshot.runtime_dist`): learned first from the runs that
        finished since the last call, and taken into the queued jobs' kinds at most every
        `every_s` of the head's clock `now` (`ordering.relearn_every_s`, core/learned_kinds.py).
        The same map every call (kept, see the module), equal to `fresh_distributions` but for
        which of two equal copies of a scaled distribution it holds, and for the kinds still
        `waiting` for the next relearn."""
        only = _only_model(nodes)
        self.refresh()
        kinds, told = self._kinds, self._told
        if kinds is None or only != self._kinds_model:  # shapes are made with the only model
            kinds = self._kinds = LearnedKinds(self.predictor)
            told = self._told = {}
            self._kinds_model = only
        # Requests not seen as these objects (new, requeued, updated), found at C speed; those
        # that left looked for only when the count says some did.
        new = list(compress(queued, map(is_not, queued, map(told.get, map(_JOB_ID, queued)))))
        told.update(zip(map(_JOB_ID, new), new, strict=True))
        if len(told) != len(queued):
            for job_id in told.keys() - set(map(_JOB_ID, queued)):
                del told[job_id]
                kinds.left(job_id)
        if new:
            self._workload(map(_JOB_ID, new))
        with self._lock:
            for q in new:
                kinds.arrived(q.job_id, self._queued_shape(q, only))
            return kinds.distributions(now, every_s)

    def fresh_distributions(self, queued: Sequence[JobRequest], nodes: Iterable[Node]) -> dict[int, RunDistribution]:
        """`distributions` looked up whole, from what was learned so far (no refresh): what check
        mode compares the kept map with. Jobs of one shape share one distribution, looked up once."""
        only = _only_model(nodes)
        self._workload(q.job_id for q in queued)
        out: dict[int, RunDistribution] = {}
        seen: dict[JobShape, RunDistribution | None] = {}
        with self._lock:
            for q in queued:
                shape = self._queued_shape(q, only)
                if shape in seen:
                    d = seen[shape]
                else:
                    d = seen[shape] = self.predictor.distribution(shape)
                if d is not None:
                    out[q.job_id] = d
        return out

    def lagging(self, queued: Sequence[JobRequest]) -> set[int]:
        """The queued jobs whose kind waits for the next relearn (`LearnedKinds.waiting`): their
        kept distribution may lag `fresh_distributions`, so check mode passes them over."""
        kinds = self._kinds
        if kinds is None:
            return set()
        return {q.job_id for q in queued if kinds.waiting(q.job_id)}

    def predict(
        self,
        owner: str | None,
        team: str,
        name: str,
        command: Iterable[str],
        gpus: float,
        gpu_types: Iterable[str],
        time_limit_s: float | None,
        policy: Policy,
        nodes: Iterable[str] = (),
    ) -> Prediction:
        """One job's prediction, for `gpucluster show` and the API (any thread)."""
        model = next((self._node_models[n] for n in nodes if n in self._node_models), "")
        types = list(gpu_types)
        if not model:
            models = set(self._node_models.values())
            model = types[0] if len(types) == 1 else (next(iter(models)) if len(models) == 1 else "")
        shape = JobShape(owner or "", team, workload_of(name, list(command)), gpus, model, time_limit_s)
        with self._lock:
            return self.predictor.predict(shape, policy.default_time_limit_s)


def _only_model(nodes: Iterable[Node]) -> str:
    """The cluster's one GPU model, or "" with several (or none)."""
    models = {n.gpus[0].model for n in nodes if n.gpus}
    return next(iter(models)) if len(models) == 1 else ""
