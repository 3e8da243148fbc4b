"""Run times the replay has learned so far, for `ordering.runtime_model: gittins` (issue 25).

Why: the Gittins ordering (core/gittins.py) ranks a queued job by the run times of finished
jobs like it. On the head those come from its store (head/runtime_model.py); here they come
from the jobs that finished so far in the replay, fed to the same predictor
(core/runtime_predict.py) with the same shapes the start-estimate probe uses
(sim/estimate_error.py), as the head's store would feed it: a job's shape when it ends, its last
attempt's run seconds. Never the trace's own run times of jobs not yet finished: the ordering
would otherwise be an oracle.

Cost: nothing unless the policy asks for it (the engine makes none). The queued jobs are kept
by shape in core/learned_kinds.py, the head's way too: a finished run looks up again only the
shapes of its team and user, and the map handed out logs its writes (core/rank_book.py's
`Logged`), so the kept Gittins ranks learn whose distribution changed without comparing every
queued job's. Only the queued, as the head keeps them (head/runtime_model.py): a job leaves the
map when it starts and comes back when requeued. Why: the core ranks queued jobs alone, and the
running jobs' entries, rewritten at each new distribution of their kind and read back from the
log only to be passed over, were ~2% of whole Philly under `las-gittins`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpucluster.core.learned_kinds import LearnedKinds
from gpucluster.core.runtime_predict import FinishedRun, JobShape, RunDistribution, RuntimePredictor, workload_of
from gpucluster.sim.workload import TraceJob


def trace_shape(trace: TraceJob, model: str, only_model: str) -> JobShape:
    """What the predictor knows of a trace job: its GPU model when it ran (`model`), else its
    one allowed model, else the cluster's only one ("" with several)."""
    if not model:
        model = trace.gpu_types[0] if len(trace.gpu_types) == 1 else only_model
    return JobShape(trace.user, trace.team, workload_of(trace.name), trace.gpus, model, trace.time_limit)


class LearnedRuntimes:
    """Fed by the engine: the jobs that enter and leave the queue, and finished runs; read per snapshot."""

    def __init__(self, models: set[str], predictor: RuntimePredictor | None = None) -> None:
        self.predictor = predictor or RuntimePredictor()
        self._only_model = next(iter(models)) if len(models) == 1 else ""
        self._kinds = LearnedKinds(self.predictor)  # the head keeps its queued jobs' the same way
        # Job id -> (its trace, its shape when queued) while the job is in the system: a job's
        # shape is made once, not at each queueing and again at its end (`trace_shape` built
        # twice per job was ~1% of whole Philly under `las-gittins`).
        self._shapes: dict[int, tuple[TraceJob, JobShape]] = {}

    def _queued_shape(self, trace: TraceJob) -> JobShape:
        kept = self._shapes.get(trace.job_id)
        if kept is not None and kept[0] is trace:
            return kept[1]
        shape = trace_shape(trace, "", self._only_model)
        self._shapes[trace.job_id] = (trace, shape)
        return shape

    def arrived(self, trace: TraceJob) -> None:
        """`trace` entered the queue (it arrived, or was requeued)."""
        self._kinds.arrived(trace.job_id, self._queued_shape(trace))

    def finished(self, trace: TraceJob, run_s: float, model: str) -> None:
        """A run that tells how long such work takes (it ended, or was stopped at its limit)."""
        shape = self._queued_shape(trace)
        if model and shape.model != model:  # it ran on another model than its queued shape names
            shape = trace_shape(trace, model, self._only_model)
        self.predictor.add(FinishedRun(shape, run_s))
        self._kinds.learned(shape)

    def left(self, job_id: int) -> None:
        """The job left the queue (it started)."""
        self._kinds.left(job_id)

    def gone(self, job_id: int) -> None:
        """The job left the system (it ended for good, or was cancelled)."""
        self._kinds.left(job_id)
        self._shapes.pop(job_id, None)

    def distributions(self, now: float = 0.0, every_s: float = 0.0) -> Mapping[int, RunDistribution]:
        """Job id -> the run times of finished jobs like it, for every queued job with such history
        (`Snapshot.runtime_dist`), the finished runs taken in at most every `every_s` of replay
        time (`ordering.relearn_every_s`, as the head takes them: core/learned_kinds.py)."""
        return self._kinds.distributions(now, every_s)

    def waiting(self, job_id: int) -> bool:
        """Whether the queued job's distribution may lag the predictor until the next relearn."""
        return self._kinds.waiting(job_id)
