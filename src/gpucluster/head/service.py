"""What the API may ask of the head: submit, read, cancel, requeue, progress, logs, nodes.

Checks that need the cluster's inventory (does this GPU type exist, could the job ever fit)
live here, so a job that can never run is refused at submit rather than queued forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.auth import grants
from gpucluster.auth.identity import Denied, Identity
from gpucluster.core.arrays import selected
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Limit
from gpucluster.core.pools import closed_nodes, restrict
from gpucluster.core.reasons import WaitReason
from gpucluster.core.selection import unmatched_facts
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, JobRequest, Priority
from gpucluster.durations import MAX_BEGIN_AHEAD_S
from gpucluster.errors import GpuclusterError
from gpucluster.executors._shim import PHASE
from gpucluster.head.dry_run import dry_run
from gpucluster.head.inventory import with_presence
from gpucluster.head.loop import Head
from gpucluster.head.submit_batcher import SubmitBatcher
from gpucluster.head.update import (
    RUNNING_FIELDS,
    FieldError,
    changed_fields,
    describe_changes,
    may_set_running_limit,
    merged_spec,
    not_before_after,
)
from gpucluster.models import (
    Attempt,
    DryRunOut,
    ExpectedRun,
    GpuOut,
    GrantOut,
    HoldOut,
    Job,
    JobEvent,
    JobSpec,
    JobUpdate,
    LimitOut,
    LimitsOut,
    MetricSeries,
    NodeOut,
    OrderingOut,
    PipelineEdge,
    PipelineJob,
    PipelineOut,
    PolicyOut,
    PoolOut,
    Progress,
    ProgressIn,
    QueueEntry,
    QueueOut,
    SliceOut,
    TeamOut,
)
from gpucluster.store import AttemptRecord, JobRecord, QueueLimitReached
from gpucluster.store.store import request_from, request_json
from gpucluster.telemetry.view import describe_job, describe_nodes
from gpucluster.waits_text import render_stored, text
from gpucluster.waits_text import stored as stored_wait

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from gpucluster.telemetry.monitor import TelemetryMonitor

REQUEUED_BY_USER = "requeued by user"
MAX_PIPELINE_JOBS = 100  # a pipeline drawing shows at most this many steps
MAX_PIPELINE_SCAN = 5000  # newer jobs with dependencies looked at for a job's dependents


class NotFound(LookupError, GpuclusterError):
    pass


class Rejected(ValueError, GpuclusterError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Conflict(RuntimeError, GpuclusterError):
    pass


class ClusterService:
    def __init__(self, head: Head) -> None:
        self.head = head
        self.store = head.store
        self.batcher = SubmitBatcher(head.store, on_committed=head.submitted, limits=lambda: head.policy.limits)
        self._empty: tuple[object, Capacity] | None = None  # an empty cluster, for submit checks
        self.telemetry: TelemetryMonitor | None = None  # set when the head samples its GPUs
        # More /metrics series for a cluster admin's eyes only (services/metrics.py adds one).
        self.private_collectors: list[Collector] = []

    def close(self) -> None:
        self.batcher.close()

    def submit(self, spec: JobSpec, owner: str | None = None, can_see: Callable[[str], bool] | None = None) -> Job:
        spec = self.with_host_defaults(spec)
        self._check_fits(spec)
        self._check_dependencies(spec, can_see)
        if spec.array_spec is not None:
            return self._submit_array(spec, owner)
        now = self.head.clock()
        with _queue_limit():
            job_id = self.batcher.submit_wait(spec, now, owner)  # the API's group commit, woken as it is
        return self._queued(job_id, spec, now, owner)

    async def submit_async(
        self, spec: JobSpec, owner: str | None = None, can_see: Callable[[str], bool] | None = None
    ) -> Job:
        """As `submit`, for the event loop: the commit is batched by the writer thread."""
        spec = self.with_host_defaults(spec)
        self._check_fits(spec)
        if spec.array_spec is not None or _dependencies(spec):
            return await asyncio.to_thread(self.submit, spec, owner, can_see)
        now = self.head.clock()
        with _queue_limit():
            job_id = await self.batcher.submit(spec, now, owner)
        return self._queued(job_id, spec, now, owner)

    def dry_run(self, spec: JobSpec, owner: str | None, can_see: Callable[[str], bool] | None = None) -> DryRunOut:
        """Where and when `spec` would start (head/dry_run.py), refused as a submit would be."""
        self._check_fits(spec)
        self._check_dependencies(spec, can_see)
        return dry_run(self.head, spec, owner)

    def what_if(self, job_id: int, change: JobUpdate, who: Identity) -> DryRunOut:
        """When a queued job would start were it changed so (`why --what-if gpus=4`): the change
        laid over its spec and checked as `update` checks it (a class above normal needs its
        grant), then planned in its place; nothing is changed."""
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        if record.state is not JobState.QUEUED:
            raise Conflict(f"job {job_id} is {record.state.value}; a what-if is for a queued job")
        try:
            spec = merged_spec(record.spec, change)
        except FieldError as e:
            raise Rejected(e.field, e.message) from None
        if spec.priority != record.spec.priority:
            self._check_new_class(who, record.team, spec.priority)
        self._check_fits(spec)
        out = dry_run(self.head, spec, record.owner, instead_of=job_id)
        out.current_start = record.estimated_start
        return out

    def _submit_array(self, spec: JobSpec, owner: str | None) -> Job:
        """All elements in one transaction (a batch insert): 100,000 in well under a second."""
        shape = spec.array_spec
        assert shape is not None
        now = self.head.clock()
        sweep = json.dumps(spec.sweep) if spec.sweep is not None else None
        with _queue_limit():
            array_id = self.store.create_array(
                spec, shape.indices, now, owner, shape.throttle, sweep, spec.aftercorr, self.head.policy.limits
            )
        self.head.wake.set()
        job = self._queued(array_id, spec, now, owner)
        job.array_id, job.array_index = array_id, shape.indices[0]
        job.array_counts = {JobState.QUEUED.value: len(shape.indices)}
        return job

    def _check_new_class(self, who: Identity, team: str, priority: str) -> None:
        """A queued job moved to `priority` (an update, or a what-if of one): refused as a submit
        of that class would be: serving is for service replicas (422), a class above normal
        needs its grant (403)."""
        if why := grants.serving_refusal(priority):
            raise Rejected("priority", why)
        grants.check_priority(who, team, priority, self.head.policy)

    def with_host_defaults(self, spec: JobSpec) -> JobSpec:
        """`spec` with the policy's CPUs and host memory per GPU (`resources:`) where it gives
        none, written into it: what the scheduler reserves and the job's cgroup enforces is
        then what `show` says, and a later policy change moves no queued job."""
        if spec.cpus is not None and spec.mem is not None:
            return spec
        cpus, mem = self.head.policy.host.resolve(spec.gpu_count, spec.cpus, spec.mem_mb)
        if cpus == spec.cpus and mem == spec.mem_mb:
            return spec
        return spec.model_copy(update={"cpus": cpus, "mem": mem if spec.mem is None else spec.mem})

    def _check_dependencies(self, spec: JobSpec, can_see: Callable[[str], bool] | None) -> None:
        """Every dependency names a job (or array) the submitter may see: another team's job is
        answered as a missing one, so a dependency cannot probe which ids exist. A new job can
        only name jobs that exist already, so no cycle can form."""
        wanted = _dependencies(spec)
        if not wanted:
            return
        found = {r.id: r for r in self.store.list_jobs(ids=sorted({i for _, i in wanted}))}
        for field, job_id in wanted:
            record = found.get(job_id)
            if record is None or (can_see is not None and not can_see(record.team)):
                raise Rejected(field, f"no job with id {job_id}; a dependency names one of your teams' jobs")
        if spec.aftercorr is not None and self.store.array(spec.aftercorr) is None:
            raise Rejected("aftercorr", f"job {spec.aftercorr} is not an array; aftercorr pairs elements of two arrays")

    # ---- holds and arrays ---------------------------------------------------------------------

    def members(self, job_id: int, index: int | None = None) -> list[int]:
        """The jobs an operation on `job_id` acts on: the array's elements if it names an array
        (or only element `index`), else the job itself."""
        if index is not None:
            found = self.store.array_elements(job_id, index)
            if not found:
                raise NotFound(f"array {job_id} has no element {index}")
            return [i for i, _ in found]
        if self.store.array(job_id) is not None:
            return [i for i, _ in self.store.array_elements(job_id)]
        return [job_id]

    def chosen(self, job_id: int, index: int | None, states: Collection[str]) -> list[int]:
        """The jobs an operation with a state filter acts on: those of `members` whose state is
        among `states` (core/arrays.py ELEMENT_STATES), e.g. an array's queued elements only."""
        if index is not None or self.store.array(job_id) is not None:
            found = self.store.element_states(job_id, index)
            if index is not None and not found:
                raise NotFound(f"array {job_id} has no element {index}")
            return [i for i, state, held in found if selected(state, held, states)]
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        return [job_id] if selected(record.state, record.held, states) else []

    def hold(self, job_id: int, held: bool, index: int | None = None, states: Collection[str] = ()) -> HoldOut:
        """Hold (or release) a queued job, an array's queued elements, or one element; with
        `states`, only the elements in those states (`release 41 --state held` is `release 41`)."""
        if states:
            changed = self.store.set_held(self.chosen(job_id, index, states), held)
            if changed:
                self.head.queue.invalidate()
                self.head.nodes_changed()
            return HoldOut(changed=changed, count=len(changed))
        if index is None and self.store.array(job_id) is not None:
            count = self.store.set_array_held(job_id, held)  # one statement for the whole array
            if count:
                self.head.queue.invalidate()
                self.head.nodes_changed()
            return HoldOut(changed=[], count=count)
        ids = self.members(job_id, index)
        changed = self.store.set_held(ids, held)
        if changed:
            self.head.queue.invalidate()  # the cached queue has the old flag: reload it
            self.head.nodes_changed()
        elif len(ids) == 1:
            record = self.store.get_job(ids[0])
            if record is None:
                raise NotFound(f"no job with id {ids[0]}")
            if record.state is not JobState.QUEUED:
                raise Conflict(f"job {ids[0]} is {record.state.value}; only a queued job can be held or released")
        return HoldOut(changed=changed, count=len(changed))

    def pipeline(self, job_id: int, teams: Collection[str] | None) -> PipelineOut:
        """The chain through `job_id` (an element: its array): what it waits for, what waits for
        it, each step's state and expected start and end, for the dashboard's drawing. Only jobs
        of `teams` (None: all) are shown or followed: another team's step is left out."""
        root = self.store.get_job(job_id)
        if root is None:
            raise NotFound(f"no job with id {job_id}")
        start = root.array_id if root.array_id is not None else root.id
        depth = {start: 0}
        records: dict[int, JobRecord] = {start: root} if root.id == start else {}
        edges: set[tuple[int, int, str]] = set()
        truncated = False

        def load(ids: list[int]) -> None:
            missing = [i for i in ids if i not in records]
            records.update({r.id: r for r in self.store.list_jobs(ids=missing)} if missing else {})

        # What it waits for, step by step back (a spec names its targets; an array by its id).
        frontier = [start]
        while frontier:
            load(frontier)
            back: list[int] = []
            for key in frontier:
                record = records.get(key)
                if record is None or (teams is not None and record.team not in teams):
                    continue
                for kind, target in _dependencies(record.spec):
                    edges.add((target, key, kind))
                    if target not in depth:
                        if len(depth) >= MAX_PIPELINE_JOBS:
                            truncated = True
                            continue
                        depth[target] = depth[key] - 1
                        back.append(target)
            frontier = back
        # What waits for it: newer jobs whose specs name a step already found, in id order, so a
        # chain is followed in one pass.
        later = self.store.specs_with_dependencies(start, MAX_PIPELINE_SCAN)
        for dependent, spec in later:
            for kind, target in _dependencies(spec):
                if target in depth and depth[target] >= 0 and dependent != target:
                    edges.add((target, dependent, kind))
                    if dependent not in depth:
                        if len(depth) >= MAX_PIPELINE_JOBS:
                            truncated = True
                            continue
                        depth[dependent] = depth[target] + 1
        truncated = truncated or len(later) >= MAX_PIPELINE_SCAN
        load(list(depth))
        shown = {k: r for k, r in records.items() if k in depth and (teams is None or r.team in teams)}
        now = self.head.clock()
        targets = self.store.dependency_targets(
            [(k, r.array_id == k) for k, r in shown.items()], self.head.policy.default_time_limit_s, now
        )
        arrays = self.store.array_counts(k for k, r in shown.items() if r.array_id == k)
        jobs = []
        for key in sorted(shown, key=lambda k: (depth[k], k)):
            r = shown[key]
            t = targets.get((key, r.array_id == key))
            jobs.append(
                PipelineJob(
                    id=key,
                    name=r.spec.name or f"job-{key}",
                    state=t.state if t is not None else r.state,
                    depth=depth[key],
                    array_counts=arrays.get(key),
                    started_at=r.started_at,
                    ended_at=r.ended_at,
                    expected_start=t.expected_start if t is not None and not t.state.terminal else None,
                    expected_end=t.expected_end if t is not None and not t.state.terminal else None,
                )
            )
        out_edges = [PipelineEdge(source=s, target=d, kind=k) for s, d, k in sorted(edges) if s in shown and d in shown]
        return PipelineOut(jobs=jobs, edges=out_edges, truncated=truncated)

    def set_throttle(self, job_id: int, throttle: int | None) -> Job:
        if not self.store.set_throttle(job_id, throttle):
            raise Rejected("throttle", f"job {job_id} is not an array; a throttle limits an array's elements")
        self.head.nodes_changed()
        return self.job(job_id)

    def cancel_many(self, job_id: int, index: int | None = None, states: Collection[str] = ()) -> Job:
        """Cancel an array (or one element): queued elements at once in one transaction,
        running ones with SIGTERM then SIGKILL, as `cancel`. With `states`, only the jobs (an
        array's elements) in those states: `cancel 41 --state queued` leaves the running ones."""
        if states:
            for i in self.chosen(job_id, index, states):
                with contextlib.suppress(Conflict):  # it ended meanwhile: nothing left to cancel
                    self._cancel(i)
            self.head.wake.set()
            return self.job(job_id)
        ids = self.members(job_id, index)
        if len(ids) == 1:
            return self.cancel(ids[0])
        now = self.head.clock()
        if self.store.cancel_array_queued(job_id, now, "cancelled by user while queued"):
            self.head.queue.invalidate()  # reloaded next cycle: cheaper than one removal per element
        for i, state in self.store.array_elements(job_id):
            if state is JobState.RUNNING:
                self.head.request_stop(i, "cancel")
        self.head.wake.set()
        return self.job(job_id)

    def _queued(self, job_id: int, spec: JobSpec, now: float, owner: str | None = None) -> Job:
        # Built from what was just committed: a re-read would cost a third of the submit.
        return Job(
            id=job_id,
            name=spec.name or f"job-{job_id}",
            state=JobState.QUEUED,
            spec=spec,
            submitted_at=now,
            reason="submitted",
            events=[JobEvent(at=now, state=JobState.QUEUED, reason="submitted")],
            owner=owner,
            held=spec.hold,
            kind=spec.kind,
        )

    def _check_fits(self, spec: JobSpec) -> None:
        """Refuse at submit what could never run, with the core's own filters on an empty cluster."""
        policy = self.head.policy
        if spec.begin is not None and spec.begin > self.head.clock() + MAX_BEGIN_AHEAD_S:
            raise Rejected(
                "begin", f"is more than {MAX_BEGIN_AHEAD_S // 86400} days ahead; give a begin time within a year"
            )
        if not policy.allow_unknown_teams and spec.team not in policy.teams:
            raise Rejected("team", f"unknown team {spec.team!r}; the policy lists: {', '.join(sorted(policy.teams))}")
        nodes = self.store.nodes()
        if self._empty is None or self._empty[0] is not nodes:
            self._empty = (nodes, Capacity([r.node for r in nodes], ()))
        cap = self._empty[1]
        known = sorted(cap.model_memory)
        unknown = [t for t in spec.gpu_types if t not in cap.model_memory]
        if unknown and len(unknown) == len(spec.gpu_types):
            raise Rejected(
                "gpu_type", f"unknown GPU type {unknown[0]!r}; this cluster has: {', '.join(known) or 'no GPUs'}"
            )
        # An elastic job must fit at its smallest size.
        request = request_from(0, spec.min_gpus or spec.gpu_count, 0, 0.0, spec.team, request_json(spec))
        if request.cpu_only:
            _check_cpu_only_fits(request, cap)
            return
        models = cap.acceptable_models(request)
        if not cap.model_memory:
            raise Rejected(
                "gpus", "this cluster has no GPUs: only CPU-only jobs run here (--gpus 0 --cpus N / --mem SIZE)"
            )
        if not models:
            raise Rejected(
                "gpu_memory" if spec.gpu_memory is not None else "min_gpu_memory",
                "no GPU in this cluster has that much memory: "
                + ", ".join(f"{m} has {cap.model_memory[m] // 1024} GiB" for m in known),
            )
        if request.host and not any(cap.could_ever_fit(request, m) for m in models):
            bare = replace(request, cpus=0.0, mem_mb=0)
            if any(cap.could_ever_fit(bare, m) for m in models):
                raise Rejected(*_host_refusal(spec, request, cap))
        if not any(cap.could_ever_fit(request, m) for m in models):
            sizes = ", ".join(f"{m}: {cap.node_size[m]} per node, {cap.total[m]} in all" for m in models)
            raise Rejected("gpus", f"asks for {spec.gpus_label} GPUs but this cluster can never host that ({sizes})")
        if policy.pools:
            priority = Priority.parse(spec.priority)
            request = restrict(request, closed_nodes(policy.pools, [r.node for r in nodes], spec.team, priority))
        if request.selection is not None and request.selection.filters and self.head.inventory is None:
            # A Ray head's nodes come and go: there the job waits, and `why` says what it waits for.
            _check_selection(spec, request, cap, models)

    def job(self, job_id: int, reveal_env: Callable[[str | None], bool] | None = None) -> Job:
        """One job in full; its submitter's exported environment only if `reveal_env(owner)`."""
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        attempts = self.store.attempts(job_id)
        ran = sum(max(0.0, a.ended_at - a.started_at) for a in attempts if a.started_at is not None)
        reveal = reveal_env is not None and reveal_env(record.owner)
        job = to_wire(record, self.store.events(job_id), attempts, ran_s=ran, reveal_env=reveal)
        job.metrics = metric_series(self.store.job_metrics(job_id))
        if record.state is JobState.RUNNING and record.spec.image:
            phase = preparing(self.head.data_dir.run_dir(job_id, record.attempt), time.time())
            if phase is not None:
                job.reason = phase
        if record.array_id == record.id:
            job.array_counts = self.store.array_counts([record.id]).get(record.id, {})
        if record.state in (JobState.QUEUED, JobState.RUNNING):
            job.expected_run = self._expected_run(record)
            self._interval(job)
        return describe_job(job, self.head.telemetry, self.telemetry)

    def _interval(self, job: Job) -> Job:
        """A queued job's 80% start interval, from the head's last refresh (in memory,
        head/estimates.py), widened to hold the point estimate it is shown around."""
        interval = self.head.estimates.intervals.get(job.id)
        if interval is not None and job.estimated_start is not None:
            job.start_low = min(interval.low, job.estimated_start)
            job.start_high = max(interval.high, job.estimated_start)
        return job

    def _expected_run(self, record: JobRecord) -> ExpectedRun:
        """How long the job should run, from similar finished jobs (head/runtime_model.py)."""
        spec = record.spec
        p = self.head.runtime.predict(
            record.owner,
            spec.team,
            record.name,
            spec.command,
            float(spec.gpus),
            spec.gpu_types,
            float(spec.time_limit) if spec.time_limit is not None else None,
            self.head.planning_policy,
            nodes=[s.node for s in record.allocation.slices] if record.allocation else (),
        )
        return ExpectedRun(
            seconds=p.run_s, low_s=p.low_s, high_s=p.high_s, samples=p.samples, basis=p.basis, sentence=p.sentence()
        )

    def jobs(
        self,
        states: Iterable[JobState] | None,
        team: str | None,
        limit: int | None,
        teams: Iterable[str] | None = None,
        text: str | None = None,
        offset: int = 0,
        collapse: bool = False,
    ) -> list[Job]:
        """Jobs, oldest first; `teams` limits them to what the caller may see; `text`, `limit`
        and `offset` as the store's `list_jobs` (a page of the newest first); `collapse`: an
        array as one entry (its first element) with its elements counted by state."""
        records = self.store.list_jobs(
            states=states, team=team, limit=limit, teams=teams, text=text, offset=offset, collapse=collapse
        )
        ran = self.store.run_seconds(r.id for r in records if r.attempt > 1 or r.state is not JobState.RUNNING)
        out = [to_wire(r, ran_s=ran.get(r.id, 0.0)) for r in records]
        if collapse:
            counts = self.store.array_counts(r.id for r in records if r.array_id == r.id)
            for job in out:
                if job.id in counts:
                    job.array_counts = counts[job.id]
        return out

    def count_jobs(
        self,
        states: Iterable[JobState] | None,
        team: str | None,
        teams: Iterable[str] | None = None,
        text: str | None = None,
        collapse: bool = False,
    ) -> int:
        return self.store.count_matching_jobs(states=states, team=team, teams=teams, text=text, collapse=collapse)

    def cancel(self, job_id: int) -> Job:
        self._cancel(job_id)
        return self.job(job_id)

    def _cancel(self, job_id: int) -> None:
        now = self.head.clock()
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        if record.state in (JobState.QUEUED, JobState.PREEMPTED):
            if not self.store.transition(
                job_id,
                JobState.CANCELLED,
                now,
                "cancelled by user while queued",
                expect=[JobState.QUEUED, JobState.PREEMPTED],
            ):
                self._cancel(job_id)  # it started meanwhile: stop it as a running job
                return
            self.head.queue.remove(job_id, cancelled=True)  # a change: the jobs behind it move up
        elif record.state is JobState.RUNNING:
            if record.stop_reason != "cancel":
                self.head.request_stop(job_id, "cancel")
        else:
            raise Conflict(f"job {job_id} already ended ({record.state.value})")

    def requeue_many(self, job_id: int, index: int | None = None, states: Collection[str] = ()) -> Job:
        """Requeue a job, one element (`index`), or an array's running elements (those of
        `states` only, if given: a requeue applies to running jobs, so `--state queued` picks
        none). A single job or element that is not running is refused (409), as `requeue`."""
        if states:
            ids = self.chosen(job_id, index, states)
        elif index is not None or self.store.array(job_id) is not None:
            ids = self.members(job_id, index)
        else:
            return self.requeue(job_id)
        if index is not None and not states:
            return self.requeue(ids[0])
        for i, state in self._states(ids):
            if state is JobState.RUNNING:
                with contextlib.suppress(Conflict):  # it ended or began to stop meanwhile
                    self._requeue(i)
        return self.job(job_id)

    def _states(self, ids: list[int]) -> list[tuple[int, JobState]]:
        return [(r.id, r.state) for r in self.store.list_jobs(ids=ids)] if ids else []

    def requeue(self, job_id: int) -> Job:
        """Checkpoint-and-requeue a running job: the preemption path, asked for by a user."""
        self._requeue(job_id)
        return self.job(job_id)

    def _requeue(self, job_id: int) -> None:
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        if record.state is not JobState.RUNNING:
            raise Conflict(f"job {job_id} is {record.state.value}; only a running job can be requeued")
        if record.stop_reason != "preempt" and not self.head.request_stop(job_id, "preempt", REQUEUED_BY_USER):
            fresh = self.store.get_job(job_id)
            if fresh is None or fresh.state is not JobState.RUNNING:
                raise Conflict(f"job {job_id} ended meanwhile")
            if fresh.stop_reason != "preempt":
                raise Conflict(f"job {job_id} is already stopping ({fresh.stop_reason})")

    # ---- update (gpucluster update) -----------------------------------------------------------

    def update(self, job_id: int, change: JobUpdate, who: Identity, index: int | None = None) -> tuple[Job, list[str]]:
        """Change a queued job (an array: each queued element, or element `index`), or a running
        job's time limit; returns the job and what changed ('priority normal -> high').

        Each change is checked as a submit is (the merged spec validated whole, the priority's
        grant, the cluster's inventory) and committed with its event in one transaction that
        applies only if the job is still in the state it was checked in. Against the loop's
        starts it is atomic: both hold `head.start_lock`, and a start whose job changed since
        its plan is dropped (`Head._start`), so a job either starts as it was planned or is
        updated before it starts; an update that finds it started is refused (409)."""
        ids = self.members(job_id, index)
        if len(ids) > 1:  # an array: its queued elements; the others are left as they are
            changes: list[str] = []
            queued = 0
            for member in ids:
                record = self.store.get_job(member)
                if record is not None and record.state is JobState.QUEUED:
                    queued += 1
                    with contextlib.suppress(Conflict):
                        changes = self._update_one(record, change, who) or changes
            if not queued:
                raise Conflict(f"array {job_id} has no queued element; only queued elements can change")
            return self.job(job_id), changes
        record = self.store.get_job(ids[0])
        if record is None:
            raise NotFound(f"no job with id {ids[0]}")
        return self.job(ids[0]), self._update_one(record, change, who)

    def _update_one(self, record: JobRecord, change: JobUpdate, who: Identity) -> list[str]:
        fields = changed_fields(change)
        try:
            spec = merged_spec(record.spec, change)
        except FieldError as e:
            raise Rejected(e.field, e.message) from None
        session_class = self.head.policy.interactive
        if spec.interactive:  # a session keeps to its class, as at submit (its priority, limits)
            from gpucluster.head import sessions  # here: it imports this module's errors

            held = self.store.session_gpus(record.owner) - record.spec.gpu_count if record.owner else 0.0
            spec = sessions.apply_class(spec, session_class, max(0.0, held))
        if record.state is JobState.RUNNING:
            if set(fields) - RUNNING_FIELDS:
                others = ", ".join(sorted(set(fields) - RUNNING_FIELDS))
                raise Conflict(f"job {record.id} is running; only its time limit can change (not {others})")
            refused = may_set_running_limit(record.spec, spec, who.cluster_admin)
            if refused is not None:
                raise Denied(refused)
        elif record.state is not JobState.QUEUED:
            raise Conflict(
                f"job {record.id} is {record.state.value}; only a queued job (or a running job's time limit) can change"
            )
        else:
            class_priority = spec.interactive and session_class.priority is not None
            if "priority" in fields and spec.priority != record.spec.priority and not class_priority:
                self._check_new_class(who, record.team, spec.priority)
            self._check_fits(spec)
        said = describe_changes(record.spec, spec, fields)
        if not said:
            return []
        now = self.head.clock()
        not_before = not_before_after(record.spec, spec, record.not_before, now)
        reason = f"{', '.join(said)} by {who.user}"
        with self.head.start_lock:
            ok = self.store.change_spec(record.id, record.state, spec, now, reason, not_before, was=record.spec)
        if not ok:
            now_is = self.store.get_job(record.id)
            if now_is is not None and now_is.state is record.state:
                raise Conflict(
                    f"job {record.id} was changed by someone else meanwhile; nothing was changed: "
                    "look at it again (`gpucluster show`) and repeat your update"
                )
            raise Conflict(f"job {record.id} is no longer {record.state.value}; nothing was changed")
        if record.state is JobState.QUEUED:
            self.head.queue.invalidate()  # the cached request is the old one: reload it
            self.head.estimates.forget()
            self.head.runtime.forget(record.id)  # its workload (name) too
        self.head.nodes_changed()  # plan again now, on the new request (or the new end)
        return said

    def progress(self, job_id: int, report: ProgressIn) -> None:
        """A running job's progress report (step, newest checkpoint)."""
        now = self.head.clock()
        if report.metrics:
            step = report.metrics_step if report.metrics_step is not None else report.step
            self.store.record_metrics(job_id, now, step, report.metrics)
        if self.store.record_progress(job_id, now, report.step, report.checkpoint_at, report.checkpoint_step):
            if self.telemetry is not None and (report.gpu_utilization is not None or report.gpu_memory_mb is not None):
                self.telemetry.report_load(job_id, report.gpu_utilization, report.gpu_memory_mb)
            return
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        raise Conflict(f"job {job_id} is {record.state.value}, not running; its report was not recorded")

    def log_path(self, job_id: int, attempt: int | None, rank: int | None = None) -> tuple[Path | None, JobRecord]:
        """The log of an attempt (default: the latest); of one rank for a distributed job (default 0)."""
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        n = attempt if attempt is not None else record.attempt
        if n < 1 or n > max(record.attempt, 0):
            if attempt is None:
                return None, record
            raise NotFound(f"job {job_id} has no attempt {attempt} (it has {record.attempt})")
        if not record.spec.distributed:
            if rank not in (None, 0):
                raise NotFound(f"job {job_id} runs one process; it has no rank {rank}")
            return self.head.data_dir.log(job_id, n), record
        path = self.head.data_dir.log(job_id, n, rank or 0)
        if rank and not path.parent.is_dir():
            ranks = len(list(self.head.data_dir.attempt_dir(job_id, n).glob("rank-*")))
            alloc = record.allocation
            if n == record.attempt and record.state == JobState.RUNNING and alloc is not None:
                # A running attempt's ranks get their directories one after another as they
                # start: count them from its allocation (one per GPU, or one launcher per node).
                per_gpu = record.spec.per_gpu
                ranks = sum(len(s.gpu_indices) for s in alloc.slices) if per_gpu else len(alloc.slices)
            if ranks and rank >= ranks:
                raise NotFound(f"job {job_id} attempt {n} has no rank {rank} (it ran ranks 0..{ranks - 1})")
        return path, record

    def rank_logs(self, job_id: int, attempt: int | None) -> tuple[list[Path], JobRecord]:
        """Every process's log of an attempt (default: the latest), rank 0 first; one for a
        single-process job. A running attempt counts its ranks from its allocation (their
        directories appear as they start), an ended one from the directories it left."""
        first, record = self.log_path(job_id, attempt, None)
        if first is None or not record.spec.distributed:
            return ([first] if first is not None else []), record
        n = attempt if attempt is not None else record.attempt
        alloc = record.allocation
        if n == record.attempt and record.state == JobState.RUNNING and alloc is not None:
            per_gpu = record.spec.per_gpu
            ranks = sum(len(s.gpu_indices) for s in alloc.slices) if per_gpu else len(alloc.slices)
        else:
            ranks = max(1, len(list(self.head.data_dir.attempt_dir(job_id, n).glob("rank-*"))))
        return [self.head.data_dir.log(job_id, n, r) for r in range(ranks)], record

    def queue(
        self, can_see: Callable[[str], bool] | None = None, limit: int | None = None, job_id: int | None = None
    ) -> QueueOut:
        """Queued jobs in the order the scheduler last considered them; newer ones after.

        Positions count every queued job; only jobs whose team `can_see` accepts are listed, and
        at most `limit` of them (or only `job_id`, to tell one job its place). Only the listed
        jobs' specs are read: with 10,000 queued a whole listing took a second of the head's CPU,
        and a page of the front is what callers show."""
        teams = self.store.queued_teams()
        order = [i for i in self.head.queue_order if i in teams]
        seen = set(order)
        order += [i for i in sorted(teams) if i not in seen]
        visible = [(n + 1, i) for n, i in enumerate(order) if can_see is None or can_see(teams[i])]
        if job_id is not None:
            shown = [(n, i) for n, i in visible if i == job_id]
        else:
            shown = visible if limit is None else visible[:limit]
        records = {r.id: r for r in self.store.list_jobs(ids=[i for _, i in shown])}
        entries = [QueueEntry(position=n, job=self._interval(to_wire(records[i]))) for n, i in shown if i in records]
        return QueueOut(entries=entries, total=len(visible))

    def policy(self, can_see: Callable[[str], bool] | None = None) -> PolicyOut:
        """The policy in force; each team's usage and running GPUs only where `can_see` accepts
        the team (None: everywhere), as what a team uses is its members' business."""
        source = self.head.policy_source
        p = source.policy
        running: dict[str, float] = {}
        for j in self.store.running_jobs():
            running[j.team] = running.get(j.team, 0.0) + j.allocation.gpu_count
        names = sorted(set(p.teams) | set(self.head.usage) | set(running))
        shares = p.shares_of(names)  # together: they sum to 100%
        return PolicyOut(
            source=str(source.path) if source.path else "built-in default",
            error=source.error,
            preemption=p.preemption.enabled,
            grace_period_s=self.head.grace_period_s,
            min_runtime_s=p.preemption.min_runtime_s,
            fair_share=p.fair_share,
            half_life_s=p.fair_share_half_life_s,
            backfill=p.backfill,
            default_time_limit_s=p.default_time_limit_s,
            cpus_per_gpu=p.host.cpus_per_gpu,
            mem_per_gpu_mb=p.host.mem_per_gpu_mb,
            ordering=OrderingOut(
                mode=p.ordering.mode,
                queues_gpu_s=list(p.ordering.queues),
                promote_after_s=p.ordering.promote_after_s,
                preempt=p.preempts_for_attained_service,
                min_slice_s=p.ordering.min_slice_s,
                restart_cost_s=p.ordering.restart_cost_s,
                runtime_model=p.ordering.runtime_model,
                relearn_every_s=p.ordering.relearn_every_s,
            ),
            starvation_age_s=p.starvation_age_s,
            teams=[
                TeamOut(
                    name=n,
                    org=p.team(n).org,
                    weight=p.team(n).weight,
                    share=shares[n],
                    quota=dict(p.team(n).quota),
                    max_borrow=p.team(n).max_borrow,
                    max_lend=p.team(n).max_lend,
                    usage_gpu_hours=self.head.usage.get(n, 0.0) / 3600 if can_see is None or can_see(n) else None,
                    running_gpus=running.get(n, 0.0) if can_see is None or can_see(n) else None,
                )
                for n in names
            ],
            pools=[
                PoolOut(
                    name=pool.name,
                    nodes=sorted(pool.nodes),
                    labels=sorted(pool.labels),
                    teams=sorted(pool.teams) if pool.teams is not None else None,
                    classes=[c.label for c in sorted(pool.classes)] if pool.classes is not None else None,
                    quotas=dict(pool.quotas),
                )
                for pool in p.pools
            ],
            priority_grants={
                c.label: GrantOut(
                    teams=sorted(g.teams), roles=sorted(g.roles), users=sorted(g.users), holders=g.describe()
                )
                for c, g in sorted(p.priority_grants.items())
            },
            mount_roots=list(p.mount_roots),
            limits=LimitsOut(
                per_user=_limit_out(p.limits.per_user),
                users={name: _limit_out(x) for name, x in sorted(p.limits.users.items())},
                per_class={c.label: _limit_out(x) for c, x in sorted(p.limits.per_class.items())},
            ),
        )

    def nodes(self) -> list[NodeOut]:
        nodes = with_presence(self._nodes(), self.head.inventory)  # up or down (Ray)
        return describe_nodes(nodes, self.head.telemetry, self.telemetry)

    def _nodes(self) -> list[NodeOut]:
        running = self.store.running_allocations()
        holder = {(s.node, i): job_id for job_id, a in running for s in a.slices for i in s.gpu_indices}
        cpus_used: dict[str, float] = {}
        mem_used: dict[str, int] = {}
        for _, a in running:
            for s in a.slices:
                cpus_used[s.node] = cpus_used.get(s.node, 0.0) + s.cpus
                mem_used[s.node] = mem_used.get(s.node, 0) + s.host_memory_mb
        return [
            NodeOut(
                name=r.node.name,
                virtual=r.virtual,
                labels=sorted(r.node.labels),
                cpus=r.node.cpus,
                memory_mb=r.node.memory_mb,
                cpus_used=round(cpus_used.get(r.node.name, 0.0), 2),
                memory_used_mb=mem_used.get(r.node.name, 0),
                gpus=[
                    GpuOut(
                        index=g.index,
                        model=g.model,
                        memory_mb=g.memory_mb,
                        uuid=g.uuid,
                        domain=g.domain,
                        job_id=holder.get((r.node.name, g.index)),
                    )
                    for g in r.node.gpus
                ],
            )
            for r in self.store.nodes()
        ]


def _check_cpu_only_fits(request: JobRequest, cap: Capacity) -> None:
    """Refuse a CPU-only job (gpus 0) that no node (of its selection) could ever hold, naming
    what the largest node has: the core's own test (`could_host_only_ever_fit`)."""
    sel = request.selection
    allowed = cap.allowed(sel) if sel is not None and sel.filters else None
    if cap.could_host_only_ever_fit(request, allowed):
        return
    why = text(WaitReason.NO_FIT, cap.cpu_only_no_fit(request, allowed is not None))
    raise Rejected("cpus" if request.cpus else "mem", f"{why}; ask for less with --cpus / --mem")


def _host_refusal(spec: JobSpec, request: JobRequest, cap: Capacity) -> tuple[str, str]:
    """(field, message) for a job whose CPUs or host memory no node could ever hold beside its
    GPUs: "cpus: asks for 64 CPUs beside 1 GPU(s) but no node has that many (the most: 16)"."""
    per_node = f" on each of {request.nodes} nodes" if request.nodes else ""
    if request.cpus:
        most, _ = cap.most_host()
        cpus, _ = cap.host_part(request, int(request.gpus) // request.nodes if request.nodes else request.gpus)
        if cpus > most + 1e-9:
            return (
                "cpus",
                f"asks for {cpus:g} CPUs{per_node} beside {spec.gpus_label} GPU(s) but no node of this cluster has "
                f"that many (the most on one node: {most:g}); ask for fewer with --cpus",
            )
    _, most_mem = cap.most_host()
    field = "mem" if request.mem_mb else "cpus"
    return (
        field,
        f"asks for {request.cpus:g} CPUs and {request.mem_mb} MiB of host memory beside {spec.gpus_label} GPU(s) "
        f"but no node of this cluster can hold that (the most memory on one node: {most_mem} MiB); "
        "ask for less with --cpus / --mem",
    )


def _check_selection(spec: JobSpec, request: JobRequest, cap: Capacity, models: list[str]) -> None:
    """Refuse a node selection that no node of this cluster can ever satisfy (Slurm's "Requested
    node configuration is not available"), naming the option and what the nodes offer."""
    sel = request.selection
    assert sel is not None
    known = sorted(cap.node_labels)
    for option, names in (("nodelist", sel.nodelist or frozenset()), ("exclude", sel.exclude)):
        unknown = sorted(names - set(known))
        if unknown:
            shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            raise Rejected(option, f"unknown node {unknown[0]!r}; this cluster has: {shown or 'no nodes'}")
    allowed = cap.allowed(sel)
    field = "constraint" if sel.constraint else "nodelist" if sel.nodelist is not None else "exclude"
    if sel.denied and not allowed and cap.allowed(replace(sel, denied=frozenset(), closed_pools=())):
        raise Rejected(
            "team",
            f"every node this job may use is in pool(s) {', '.join(sel.closed_pools)}, closed to team "
            f"{spec.team}'s {spec.priority} jobs (the policy's pools:); submit to a team or class a pool admits",
        )
    if sel.denied and not sel.nodelist and not sel.exclude and not sel.constraint:
        field = "team"
    if not allowed:
        raise Rejected(field, text(WaitReason.NO_FIT, unmatched_facts(sel, cap.node_labels)))
    if not any(cap.could_ever_fit(request, m, allowed) for m in models):
        shown = ", ".join(sorted(allowed)[:5]) + (", ..." if len(allowed) > 5 else "")
        raise Rejected(
            field, f"the nodes matching {sel.describe()} ({shown}) can never host {spec.gpus_label} GPUs as asked"
        )


def _slices(a: Allocation | None) -> list[SliceOut]:
    return [
        SliceOut(
            node=s.node,
            gpu_indices=list(s.gpu_indices),
            share=s.share,
            memory_mb=s.memory_mb,
            cpus=s.cpus,
            host_memory_mb=s.host_memory_mb,
        )
        for s in (a.slices if a else ())
    ]


def _attempts(r: JobRecord, ended: Iterable[AttemptRecord]) -> list[Attempt]:
    out = [
        Attempt(
            attempt=a.attempt,
            started_at=a.started_at,
            ended_at=a.ended_at,
            allocation=_slices(a.allocation),
            gpus=a.allocation.gpu_count if a.allocation else 0,
            outcome=a.outcome,
            reason=a.reason,
            exit_codes=list(a.exit_codes),
            work_lost_s=a.work_lost_s,
            cpu_s=a.cpu_s,
            memory_peak_bytes=a.memory_peak_bytes,
            pull_s=a.pull_s,
        )
        for a in ended
    ]
    if r.state is JobState.RUNNING and all(a.attempt != r.attempt for a in out):
        out.append(
            Attempt(
                attempt=r.attempt,
                started_at=r.started_at,
                allocation=_slices(r.allocation),
                gpus=r.allocation.gpu_count if r.allocation else 0,
                reason=r.reason,
            )
        )
    return out


def metric_series(rows: Iterable[tuple[int, str, int | None, float, float]]) -> list[MetricSeries]:
    """Stored metric values -> one series per attempt and name, in attempt then name order."""
    series: dict[tuple[int, str], MetricSeries] = {}
    for attempt, name, step, at, value in rows:
        s = series.setdefault((attempt, name), MetricSeries(attempt=attempt, name=name, steps=[], at=[], reported=[]))
        s.steps.append(step)
        s.at.append(at)
        s.reported.append(value)
    return [series[k] for k in sorted(series)]


def _dependencies(spec: JobSpec) -> list[tuple[str, int]]:
    """(field, id) of every job a spec names as a dependency."""
    out = [(f, i) for f in ("after", "afterok", "afternotok", "afterany") for i in getattr(spec, f)]
    if spec.aftercorr is not None:
        out.append(("aftercorr", spec.aftercorr))
    return out


def to_wire(
    r: JobRecord,
    events: Iterable[object] = (),
    attempts: Iterable[AttemptRecord] | None = None,
    ran_s: float = 0.0,
    *,
    reveal_env: bool = False,
) -> Job:
    """The wire form of a job; `events` and `attempts` only for a single job's detail; `ran_s`
    the seconds its ended attempts ran (Job.ran_s).

    The submitter's exported environment (`spec.exported_env`: their whole shell, tokens and
    passwords included) is left out unless `reveal_env`: teammates see a job's spec, and only its
    owner and cluster admins may see that (`GET /v1/jobs/{id}`).
    """
    spec = r.spec
    wait = stored_wait(r.reason)  # a queued job's wait, kept structured; rendered here in UTC
    if spec.exported_env is not None and not reveal_env:
        spec = spec.model_copy(update={"exported_env": None})
    return Job(
        id=r.id,
        name=r.name,
        state=r.state,
        spec=spec,
        submitted_at=r.submitted_at,
        started_at=r.started_at,
        ended_at=r.ended_at,
        exit_code=r.exit_code,
        reason=render_stored(wait) if wait is not None else r.reason,
        wait_reason=r.wait_reason if r.state is JobState.QUEUED else None,
        wait=wait if r.state is JobState.QUEUED else None,
        estimated_start=r.estimated_start if r.state is JobState.QUEUED else None,
        attempt=r.attempt,
        allocation=_slices(r.allocation),
        events=[JobEvent(at=e.at, state=e.state, reason=e.reason) for e in events],  # type: ignore[attr-defined]
        restarts=r.restarts,
        not_before=r.not_before if r.state is JobState.QUEUED else None,
        progress=Progress(
            step=r.progress_step,
            reported_at=r.progress_at,
            checkpoint_at=r.last_checkpoint_at,
            checkpoint_step=r.checkpoint_step,
        )
        if r.progress_at is not None or r.last_checkpoint_at is not None
        else None,
        attempts=_attempts(r, attempts) if attempts is not None else [],
        owner=r.owner,
        kind=spec.kind,
        ran_s=ran_s,
        held=r.held,
        array_id=r.array_id,
        array_index=r.array_index,
    )


def preparing(run_dir: Path, now: float) -> str | None:
    """'preparing: pulling image X (1.2 of 4.0 GB, 12s)' while a process of the attempt is still
    getting ready (the shim's phase.json, in rank 0's records for several processes; the bytes
    once some have landed, executors/_pull.py); None once it runs."""
    for d in (run_dir, run_dir / "rank-0"):
        try:
            phase = json.loads((d / PHASE).read_text())
            waited = f"{max(0.0, now - float(phase['since'])):.0f}s"
            progress = phase.get("progress")
            return f"preparing: {phase['phase']} ({f'{progress}, ' if progress else ''}{waited})"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _limit_out(limit: Limit) -> LimitOut:
    return LimitOut(
        max_running_gpus=limit.max_running_gpus,
        max_queued_jobs=limit.max_queued_jobs,
        max_gpu_hours_in_flight=limit.max_gpu_hours_in_flight,
    )


@contextmanager
def _queue_limit() -> Iterator[None]:
    """A submission beyond its user's `max_queued_jobs` (refused by the store in its write
    transaction) answers 422 naming the limit, like any other refused field."""
    try:
        yield
    except QueueLimitReached as e:
        raise Rejected("limits", str(e)) from None
