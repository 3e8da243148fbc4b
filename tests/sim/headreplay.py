"""A native trace replayed on a real head loop and store, for tests that require the simulator
and the head to take the same decisions.

The head is the real one (head.loop.Head, its store on a real SQLite file, its gates,
admission, lifecycle and requeues), with the fake executor and a clock the driver moves to
each instant something happens: a submission, a process's end, a time limit, a release of a
held job (`release_time`), a drain window's start and end (the spec's `drains:`, applied as
`gpucluster drain NODE --until T` does, plus `gpucluster requeue` of the node's running jobs
for `running: requeue`). Every instant runs to rest before the clock moves on. Trace ids must
be the head's job ids (rows in id order), so rows submit unchanged.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucluster.core.states import JobState
from gpucluster.core.types import Node
from gpucluster.executors.base import Exited, Running
from gpucluster.executors.fake import FakeExecutor
from gpucluster.head.loop import Head
from gpucluster.head.paths import DataDir
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.service import ClusterService
from gpucluster.models import JobSpec
from gpucluster.sim.spec import ClusterSpec
from gpucluster.sim.workload import TraceJob
from gpucluster.store import Store
from tests.unit.headkit import Clock

SIM_ONLY = ("id", "submit_time", "duration", "release_time")


@dataclass
class HeadRun:
    starts: list[tuple[float, int, str]]  # (when, job, node of its first slice), every attempt
    states: dict[int, JobState]
    requeues: int  # attempts that ended preempted (a drain's requeue, here)


def replay_on_head(
    tmp: Path, spec: ClusterSpec, policy_file: Path, rows: list[dict[str, Any]], jobs: list[TraceJob]
) -> HeadRun:
    """Replay `rows` (a native trace, submit times from 0) on a head; `jobs` is the trace as the
    simulator read it (durations and limits per job id)."""
    clock = Clock(-1.0)  # before the first submission
    head, service, store, fake = head_on_clock(tmp, [n for n, _ in spec.nodes()], policy_file, clock)
    duration = {j.job_id: j.duration for j in jobs}
    limit = {j.job_id: j.time_limit for j in jobs}
    submits = sorted(rows, key=lambda r: float(r["submit_time"]))
    releases = sorted((float(r["release_time"]), int(r["id"])) for r in rows if r.get("release_time") is not None)
    drains = sorted((w.start_s, k) for k, w in enumerate(spec.drains))
    ends = [w.start_s + w.duration_s for w in spec.drains if w.duration_s is not None]
    starts: list[tuple[float, int, str]] = []
    started_at: dict[tuple[int, int], float] = {}
    try:
        while True:
            running = {k: p for k, p in fake.processes.items() if isinstance(p.status, Running)}
            times = [started_at[k] + duration[k[0]] for k in running]
            times += [started_at[k] + (limit[k[0]] or 0) for k in running if limit[k[0]]]
            times += [float(r["submit_time"]) for r in submits[:1]]
            times += [t for t, _ in releases[:1]] + [t for t, _ in drains[:1]] + ends
            times = [x for x in times if x > clock.t]
            if not times:
                break
            clock.t = min(times)
            while submits and float(submits[0]["submit_time"]) == clock.t:
                row = submits.pop(0)
                fields = {k: v for k, v in row.items() if k not in SIM_ONLY}
                got = service.submit(JobSpec.model_validate({"command": ["train"], **fields}))
                assert got.id == row["id"]
            for k, p in running.items():  # a process that ends now ends before an admin acts
                if started_at[k] + duration[k[0]] == clock.t:
                    p.status = Exited(0)
            while releases and releases[0][0] == clock.t:
                service.hold(releases.pop(0)[1], False)
            while drains and drains[0][0] == clock.t:
                _drain(head, service, spec, drains.pop(0)[1], clock.t)
            quiet = 0
            while quiet < 2:  # every instant runs to rest: a stop takes a tick, its requeue another
                before = [(r.id, r.state, r.attempt) for r in store.list_jobs()], len(fake.processes)
                head.tick()
                after = [(r.id, r.state, r.attempt) for r in store.list_jobs()], len(fake.processes)
                quiet = quiet + 1 if after == before else 0
                for key in fake.processes:
                    if key not in started_at:
                        started_at[key] = clock.t
                        rec = store.get_job(key[0])
                        assert rec is not None and rec.allocation is not None
                        starts.append((clock.t, key[0], rec.allocation.slices[0].node))
        states = {r.id: r.state for r in store.list_jobs()}
        requeues = sum(1 for a in store_attempts(tmp / "state.db") if a == "preempted")
    finally:
        service.close()
        store.close()
    return HeadRun(starts, states, requeues)


def head_on_clock(
    tmp: Path, nodes: list[Node], policy_file: Path, clock: Clock
) -> tuple[Head, ClusterService, Store, FakeExecutor]:
    """A real head loop and store (a SQLite file under `tmp`) on `nodes` (virtual GPUs), with
    the fake executor (a stopped process exits 143 on SIGTERM) and `clock` as its time."""
    store = Store(tmp / "state.db")
    for n in nodes:
        store.put_node(n, virtual=True, now=0.0)
    fake = FakeExecutor()
    fake.exit_on_signal[int(signal.SIGTERM)] = 143
    head = Head(
        store=store,
        executor=fake,
        data_dir=DataDir(tmp / "data"),
        clock=clock,
        policy=PolicySource(policy_file),
        base_env={"HOME": "/h"},
    )
    return head, ClusterService(head), store, fake


def _drain(head: Head, service: ClusterService, spec: ClusterSpec, k: int, now: float) -> None:
    """One window's start as an admin does it: `drain NODE --until T` for each node (the head
    ends it by itself then), and for `running: requeue`, `requeue` of each job running there."""
    w = spec.drains[k]
    until = now + w.duration_s if w.duration_s is not None else None
    for node in w.nodes:
        head.telemetry.set_drained(node, True, w.reason, "user", now, until)
    head.nodes_changed()
    if w.requeue:
        hit = set(w.nodes)
        for rec in head.store.list_jobs(states=[JobState.RUNNING]):
            if rec.allocation is not None and any(s.node in hit for s in rec.allocation.slices):
                service.requeue(rec.id)


def store_attempts(db: Path) -> list[str]:
    """Every ended attempt's outcome, in order."""
    import sqlite3

    with sqlite3.connect(db) as c:
        return [o for (o,) in c.execute("SELECT outcome FROM attempts ORDER BY ended_at, rowid")]
