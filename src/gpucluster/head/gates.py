"""The head's side of eligibility (core/eligibility.py): gather what the rules need from the store,
apply them to the queue a cycle's snapshot is built from, and carry out what they decide.

Why apart from the loop: holds, dependencies and throttles only filter the queue; the loop
calls `eligible` where it builds the snapshot and merges `waits` into the reasons it records, and
otherwise knows nothing of them. An array element's per-element environment and command are
made here too (`element`), at launch, so its elements can share one stored spec.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from gpucluster.core.arrays import Sweep, element_env, substitute
from gpucluster.core.eligibility import Eligibility, eligible
from gpucluster.core.states import JobState
from gpucluster.core.types import DependencyKind, JobRequest, Wait

if TYPE_CHECKING:
    from gpucluster.head.loop import Head
    from gpucluster.store import JobRecord

log = logging.getLogger(__name__)


class Gates:
    def __init__(self, head: Head) -> None:
        self.head = head
        self.waits: dict[int, Wait] = {}  # the jobs eligibility kept back in the last cycle, and why
        # Some queued job waits for another to start (`after`): a cycle that starts jobs must be
        # followed by another at once, not at the next periodic replan, as in the simulator.
        self.awaits_start = False

    def eligible(self, queued: tuple[JobRequest, ...], now: float, gated: int = 1) -> tuple[JobRequest, ...]:
        """The queue the scheduler may start from; the rest get their reason in `waits`, and a
        job whose dependency can never be met is cancelled with that reason. `gated`: how many
        of `queued` are held, wait on another job or are array elements (the cluster state's
        `gated`); none: all of them, with no pass over the queue."""
        if not gated:
            self.waits = {}
            self.awaits_start = False
            return queued
        wanted: set[tuple[int, bool]] = set()
        arrays: set[int] = set()
        held = False
        self.awaits_start = False
        for r in queued:  # one pass: at 100,000 queued every pass over the queue shows in a cycle
            if r.after:
                wanted.update((d.job_id, d.array) for d in r.after)
                self.awaits_start = self.awaits_start or any(d.kind is DependencyKind.AFTER for d in r.after)
            if r.array_id is not None:
                arrays.add(r.array_id)
            held = held or r.held
        store = self.head.store
        policy = self.head.policy
        throttles = store.throttles(arrays) if arrays else {}
        if not wanted and not throttles and not held:
            self.waits = {}
            return queued  # nothing held, nothing waits on another job, no array throttled
        targets = store.dependency_targets(wanted, policy.default_time_limit_s, now) if wanted else {}
        running = store.running_by_array() if throttles else {}
        result: Eligibility = eligible(queued, targets, running, throttles, now, policy.default_time_limit_s)
        for job_id, why in result.doomed.items():
            if store.transition(job_id, JobState.CANCELLED, now, why, expect=[JobState.QUEUED]):
                log.info("job %s: %s", job_id, why)
                self.head.queue.remove(job_id)
                self.head.nodes_changed()  # its own dependents learn of it in the next cycle
        self.waits = result.waits
        return result.eligible

    def element(self, job: JobRecord) -> JobRecord:
        """An array element as it is launched: its array's variables (and its sweep values) in
        its environment, its sweep values in the `{name}` placeholders of its command."""
        if job.array_id is None or job.array_index is None:
            return job
        array = self.head.store.array(job.array_id)
        if array is None:
            return job
        count, _, sweep_json = array
        values = {}
        if sweep_json:
            from gpucluster.core.arrays import parse_sweep

            sweep: Sweep = parse_sweep(json.loads(sweep_json))
            values = sweep.values(job.array_index)
        env = {**job.spec.env, **element_env(job.array_id, job.array_index, count, values)}
        command = substitute(job.spec.command, values) if values else job.spec.command
        return replace(job, spec=job.spec.model_copy(update={"env": env, "command": command}))
