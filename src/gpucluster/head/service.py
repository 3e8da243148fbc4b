"""What the API may ask of the head: submit, read, cancel, logs, nodes.

Checks that need the cluster's inventory (does this GPU type exist, could the job ever fit)
live here, so a job that can never run is refused at submit rather than queued forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpucluster.core.states import JobState
from gpucluster.head.loop import Head
from gpucluster.head.submit_batcher import SubmitBatcher
from gpucluster.models import GpuOut, Job, JobEvent, JobSpec, NodeOut, SliceOut
from gpucluster.store import JobRecord


class NotFound(LookupError):
    pass


class Rejected(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Conflict(RuntimeError):
    pass


class ClusterService:
    def __init__(self, head: Head) -> None:
        self.head = head
        self.store = head.store
        self.batcher = SubmitBatcher(head.store, on_committed=head.wake.set)

    def close(self) -> None:
        self.batcher.close()

    def submit(self, spec: JobSpec) -> Job:
        self._check_fits(spec)
        now = self.head.clock()
        job_id = self.store.create_job(spec, now)
        self.head.wake.set()
        return self._queued(job_id, spec, now)

    async def submit_async(self, spec: JobSpec) -> Job:
        """As `submit`, for the event loop: the commit is batched by the writer thread."""
        self._check_fits(spec)
        now = self.head.clock()
        job_id = await self.batcher.submit(spec, now)
        return self._queued(job_id, spec, now)

    def _queued(self, job_id: int, spec: JobSpec, now: float) -> Job:
        # Built from what was just committed: a re-read would cost a third of the submit.
        return Job(
            id=job_id,
            name=spec.name or f"job-{job_id}",
            state=JobState.QUEUED,
            spec=spec,
            submitted_at=now,
            reason="submitted",
            events=[JobEvent(at=now, state=JobState.QUEUED, reason="submitted")],
        )

    def _check_fits(self, spec: JobSpec) -> None:
        nodes = [r.node for r in self.store.nodes()]
        models = sorted({g.model for n in nodes for g in n.gpus})
        if spec.gpu_type is not None and spec.gpu_type not in models:
            raise Rejected(
                "gpu_type", f"unknown GPU type {spec.gpu_type!r}; this cluster has: {', '.join(models) or 'no GPUs'}"
            )
        per_node = [
            max((sum(1 for g in n.gpus if g.model == m) for m in models if spec.gpu_type in (None, m)), default=0)
            for n in nodes
        ]
        most = max(per_node, default=0)
        if spec.gpu_count > most:
            kind = f"{spec.gpu_type} " if spec.gpu_type else ""
            raise Rejected(
                "gpus",
                f"asks for {spec.gpu_count} {kind}GPUs but the largest node has {most}; a job must fit on one node",
            )

    def job(self, job_id: int) -> Job:
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        return to_wire(record, self.store.events(job_id))

    def jobs(self, states: Iterable[JobState] | None, team: str | None, limit: int | None) -> list[Job]:
        return [to_wire(r) for r in self.store.list_jobs(states=states, team=team, limit=limit)]

    def cancel(self, job_id: int) -> Job:
        now = self.head.clock()
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        if record.state is JobState.QUEUED:
            if not self.store.transition(
                job_id, JobState.CANCELLED, now, "cancelled by user while queued", expect=[JobState.QUEUED]
            ):
                return self.cancel(job_id)  # it started meanwhile: stop it as a running job
            self.head.queue.remove(job_id)
        elif record.state is JobState.RUNNING:
            if record.stop_reason != "cancel":
                self.head.request_stop(job_id, "cancel")
        else:
            raise Conflict(f"job {job_id} already ended ({record.state.value})")
        return self.job(job_id)

    def log_path(self, job_id: int, attempt: int | None) -> tuple[Path | None, JobRecord]:
        record = self.store.get_job(job_id)
        if record is None:
            raise NotFound(f"no job with id {job_id}")
        n = attempt if attempt is not None else record.attempt
        if n < 1 or n > max(record.attempt, 0):
            if attempt is None:
                return None, record
            raise NotFound(f"job {job_id} has no attempt {attempt} (it has {record.attempt})")
        return self.head.data_dir.log(job_id, n), record

    def nodes(self) -> list[NodeOut]:
        holder = {
            (s.node, i): job_id
            for job_id, a in self.store.running_allocations()
            for s in a.slices
            for i in s.gpu_indices
        }
        return [
            NodeOut(
                name=r.node.name,
                virtual=r.virtual,
                gpus=[
                    GpuOut(
                        index=g.index,
                        model=g.model,
                        memory_mb=g.memory_mb,
                        uuid=g.uuid,
                        job_id=holder.get((r.node.name, g.index)),
                    )
                    for g in r.node.gpus
                ],
            )
            for r in self.store.nodes()
        ]


def to_wire(r: JobRecord, events: Iterable[object] = ()) -> Job:
    return Job(
        id=r.id,
        name=r.name,
        state=r.state,
        spec=r.spec,
        submitted_at=r.submitted_at,
        started_at=r.started_at,
        ended_at=r.ended_at,
        exit_code=r.exit_code,
        reason=r.reason,
        attempt=r.attempt,
        allocation=[
            SliceOut(node=s.node, gpu_indices=list(s.gpu_indices))
            for s in (r.allocation.slices if r.allocation else ())
        ],
        events=[JobEvent(at=e.at, state=e.state, reason=e.reason) for e in events],  # type: ignore[attr-defined]
    )
