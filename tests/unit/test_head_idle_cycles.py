"""While every GPU is busy and no one may be preempted, a cycle woken by submissions plans
nothing (`core.scheduler.certainly_idle`): the new jobs' waits come with the next periodic
replan, and a job still starts in the very cycle a GPU frees. Real store, fake executor."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from gpucluster.core.states import JobState
from gpucluster.head import loop
from gpucluster.head.loop import REPLAN_EVERY_S

from .headkit import T0, make_cluster


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
