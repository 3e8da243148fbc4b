"""`gpucluster submit --dry-run` (issue 24): where and when a job would start, nothing queued.

Why here and not in the loop: the answer is the loop's own last view (the admitted snapshot
it planned on) with the job added, planned by the same `decide` and estimated by the same
replay with the same learned run times; nothing is written. It runs on an API thread, so it
never touches the loop's kept indexes (the snapshot's capacity and queue indexes are dropped:
`decide` builds its own) nor the runtime model's store watermark (it reuses the run times of
the last refresh and predicts only the new job).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING

from gpucluster.core.estimate import estimate_starts
from gpucluster.core.scheduler import decide
from gpucluster.core.types import Plan, Priority
from gpucluster.models import DryRunOut, ExpectedRun, JobSpec, SliceOut
from gpucluster.store.store import request_from, request_json
from gpucluster.waits_text import sentence, to_json

if TYPE_CHECKING:
    from gpucluster.head.loop import Head

PROBE_ID = 2**62  # the job that is not there: an id no store hands out


def through(plan: Plan, job_id: int) -> Plan:
    """`plan` with its waits only up to `job_id`'s (included), for an estimate of that job
    alone. Why: the replay (core/estimate.py) gives each waiting job its estimate in the plan's
    order, from the reservations of those before it only, so the jobs after it change nothing
    of its own; at 10,000 nodes and 100,000 queued the replay went on over the other ~80,000
    (~0.65 CPU-s a dry run; ~0.4 to stop at a probe placed ~5,000th in line)."""
    waiting = plan.waiting
    if job_id not in waiting:
        return plan
    return replace(plan, waiting=dict(islice(waiting.items(), list(waiting).index(job_id) + 1)))


def dry_run(head: Head, spec: JobSpec, owner: str | None, instead_of: int | None = None) -> DryRunOut:
    """`instead_of`: a queued job the answer is for as if it were `spec` (`why --what-if`): it
    is taken out of the queue first, so it does not wait behind itself."""
    snap = head.last_snapshot
    now = head.clock()
    policy = head.planning_policy
    if snap is None:
        return DryRunOut(starts_now=False, reason="the head has not planned yet; try again in a second")
    request = request_from(
        PROBE_ID,
        spec.gpu_count,
        int(Priority.parse(spec.priority)),
        now,
        spec.team,
        request_json(spec),
        queued_at=now,
        not_before=spec.begin if spec.begin is not None and spec.begin > now else None,
        user=owner or "",
    )
    queued = tuple(q for q in snap.queued if q.job_id != instead_of)
    probe = replace(snap, queued=(*queued, request), capacity=None, queue_index=None)
    plan = decide(probe, policy, now)
    p = head.runtime.predict(
        owner,
        spec.team,
        spec.name or "",
        spec.command,
        spec.gpu_count,
        spec.gpu_types,
        float(spec.time_limit) if spec.time_limit is not None else None,
        policy,
    )
    expected = ExpectedRun(
        seconds=p.run_s, low_s=p.low_s, high_s=p.high_s, samples=p.samples, basis=p.basis, sentence=p.sentence()
    )
    started = next((s for s in plan.starts if s.job_id == PROBE_ID), None)
    if started is not None:
        slices = [
            SliceOut(node=x.node, gpu_indices=list(x.gpu_indices), share=x.share) for x in started.allocation.slices
        ]
        return DryRunOut(starts_now=True, estimated_start=now, allocation=slices, expected_run=expected, reason="")
    wait = plan.waiting.get(PROBE_ID)
    runs = dict(head.estimates.last_runs)
    runs[PROBE_ID] = p.run_s
    est = estimate_starts(
        probe, policy, now, through(plan, PROBE_ID), head.estimates.limit, head.estimates.last_latency, runs
    ).get(PROBE_ID)
    start = est.start if est is not None and est.exact else None
    interval = head.estimates.calibration.interval(now, start) if start is not None else None
    return DryRunOut(
        starts_now=False,
        estimated_start=start,
        start_low=interval.low if interval else None,
        start_high=interval.high if interval else None,
        expected_run=expected,
        reason=sentence(wait) if wait is not None else "",
        wait_reason=wait.reason.value if wait is not None else None,
        wait=to_json(wait) if wait is not None else None,
    )
