"""While every GPU is busy and no one may be preempted, a cycle woken by submissions plans
nothing (`core.scheduler.certainly_idle`): the new jobs' waits come with the next periodic
replan, and a job still starts in the very cycle a GPU frees. Real store, fake executor."""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

from gpucluster.core.placement import Capacity
from gpucluster.core.queue_index import highest_queued_class
from gpucluster.core.states import JobState
from gpucluster.core.types import Priority
from gpucluster.head import loop
from gpucluster.head.idle_wake import IdleBar, idle_bar, needs_plan
from gpucluster.head.loop import REPLAN_EVERY_S
from gpucluster.models import JobSpec

from .builders import job, node, running
from .headkit import T0, Cluster, make_cluster

WAIT_S = 60  # for the submit writer's thread to tell the head: an event, bounded for a hang


def test_submissions_on_a_full_cluster_plan_nothing_until_the_replan(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, gpus=8)
    try:
        running = [c.submit(gpus=1, command=["sleep", "1000"]) for _ in range(8)]
        c.tick_at(T0)
        assert all(c.state(j) is JobState.RUNNING for j in running)
        with mock.patch.object(loop, "decide", wraps=loop.decide) as decide:
            burst = [c.submit(gpus=1, command=["sleep", "1000"]) for _ in range(5)]
            c.tick_at(T0 + 0.2)
            more = c.submit(gpus=1, command=["sleep", "1000"])
            c.tick_at(T0 + 0.4)
            assert decide.call_count == 0 and c.head.idle_skips == 2
            assert all(c.record(j).wait_reason is None for j in [*burst, more])  # not planned yet
            c.tick_at(T0 + REPLAN_EVERY_S)  # the periodic replan answers every one of them
            assert decide.call_count == 1
        assert all(c.record(j).wait_reason is not None and c.state(j) is JobState.QUEUED for j in [*burst, more])
        # A GPU frees: that cycle plans (a capacity change leaves room), whatever the last replan.
        c.fake.finish(running[0])
        c.tick_at(T0 + REPLAN_EVERY_S + 0.1)
        assert c.state(burst[0]) is JobState.RUNNING
    finally:
        c.close()


def test_a_job_that_may_preempt_is_planned_at_once(tmp_path: Path) -> None:
    """A high-priority job on a cluster full of normal ones: someone may be preempted, so the
    cycle plans and the victim is asked to stop in that cycle, not at the next replan."""
    c = make_cluster(tmp_path, gpus=8)
    try:
        running = [c.submit(gpus=1, command=["sleep", "1000"]) for _ in range(8)]
        c.tick_at(T0)
        urgent = c.submit(gpus=1, command=["sleep", "1000"], priority="high")
        c.tick_at(T0 + 0.1)
        assert c.head.idle_skips == 0
        assert any(c.record(j).stop_requested_at is not None for j in running), [c.record(j) for j in running]
        assert c.state(urgent) is JobState.QUEUED
    finally:
        c.close()


def _told(c: Cluster) -> Callable[[dict[str, object]], bool]:
    """Submit through the service and say whether the commit woke the loop: the head is told of
    each commit by the submit writer (`Head.submitted`), after the submitter's answer, so the
    wake is read once the writer has told it."""
    told: queue.Queue[bool] = queue.Queue()
    tell = c.head.submitted

    def spy(specs: Sequence[JobSpec]) -> None:
        c.head.wake.clear()
        tell(specs)
        told.put(c.head.wake.is_set())

    c.service.batcher._on_committed = spy

    def submit(fields: dict[str, object]) -> bool:
        c.submit(**fields)
        return told.get(timeout=WAIT_S)

    return submit


def test_submissions_that_cannot_start_do_not_wake_an_idle_loop(tmp_path: Path) -> None:
    """After a cycle found every GPU busy and no one to preempt, a whole-GPU job of no higher
    class than those queued leaves the loop asleep until its periodic cycle (head/idle_wake.py);
    a job that might start or preempt now (a share of a GPU, a higher class) wakes it at once,
    and so does any job once a plan (not skipped) has run."""
    c = make_cluster(tmp_path, gpus=8)
    try:
        running = [c.submit(gpus=1, command=["sleep", "1000"]) for _ in range(8)]
        c.tick_at(T0)
        submit = _told(c)
        assert submit({"gpus": 1, "command": ["sleep", "1000"]})  # no idle cycle yet: woken
        c.tick_at(T0 + 0.1)
        assert c.head.idle_skips == 1 and c.head.idle_bar is not None
        assert not submit({"gpus": 1, "command": ["sleep", "1000"]})
        assert not submit({"gpus": 2, "command": ["sleep", "1000"], "priority": "low"})
        assert submit({"gpus": 0.5, "command": ["true"]})  # a share of a GPU
        assert submit({"gpus": 1, "gpu_memory": "10GiB", "command": ["true"]})  # a share by memory
        assert submit({"gpus": 1, "command": ["true"], "priority": "high"})  # may preempt
        # The jobs left asleep are read by the next cycle, which the periodic timer brings.
        c.fake.finish(running[0])
        c.tick_at(T0 + 0.2)  # a GPU freed: this cycle plans (and starts the first in line)
        assert c.head.idle_bar is None
        assert sum(c.state(j) is JobState.RUNNING for j in c.head.queue_order + running) >= 1
        assert submit({"gpus": 1, "command": ["sleep", "1000"]})  # no idle plan to lean on
    finally:
        c.close()


def test_an_idle_bar_only_where_no_whole_gpu_is_free() -> None:
    nodes = (node("n1").gpus(4).build(),)
    queued = [job(1).gpus(2).build(), job(2).gpus(3).priority("low").build()]
    full = Capacity(nodes, [running(9, "n1", 0, 1, 2, 3)])
    one_free = Capacity(nodes, [running(9, "n1", 0, 1, 2)])
    assert idle_bar(full, highest_queued_class(queued, None)) == IdleBar(int(Priority.NORMAL))
    assert idle_bar(one_free, highest_queued_class(queued, None)) is None  # a 1-GPU job may fit where none queued did
    assert idle_bar(full, highest_queued_class([], None)) is None
    bar = IdleBar(int(Priority.NORMAL))
    assert not needs_plan(bar, [JobSpec(command=["x"], gpus=4)])
    assert needs_plan(bar, [JobSpec(command=["x"], gpus=4), JobSpec(command=["x"], gpus=4, priority="high")])
    assert needs_plan(None, [JobSpec(command=["x"], gpus=4)])
    assert needs_plan(bar, [JobSpec(command=["x"], gpus=0, cpus=1)])  # CPU only: may start on free CPUs
