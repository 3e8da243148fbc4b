"""The head applying eligibility (head/gates.py): a real store (SQLite and PostgreSQL: arrays are
copied by SQL of their own), a fake executor, a hand-moved clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.executors.base import Exited
from gpucluster.waits_text import reason_text

from .builders import spec
from .headkit import T0, Cluster, make_cluster

STORE_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, gpus=8, store_target=store_target)
    yield c
    c.close()


def running(c: Cluster) -> set[int]:
    return {j.id for j in c.store.list_jobs(states=[JobState.RUNNING])}


def test_a_throttled_array_runs_at_most_its_throttle_and_refills_as_elements_end(cluster: Cluster) -> None:
    first = cluster.service.submit(spec(array="0-9%3"))
    assert first.array_id == first.id and first.array_counts == {"queued": 10}
    cluster.tick_at(T0 + 1)
    now = running(cluster)
    assert len(now) == 3  # 8 GPUs free: the throttle, not the cluster, holds the rest
    waiting = cluster.record(first.id + 5)
    assert waiting.wait_reason == "throttle" and "at most 3 elements at once (3 running)" in reason_text(waiting.reason)
    done = min(now)
    cluster.proc(done).status = Exited(0)
    cluster.tick_at(T0 + 2)
    cluster.tick_at(T0 + 3)
    assert cluster.state(done) is JobState.SUCCEEDED
    assert len(running(cluster)) == 3 and done not in running(cluster)
    # Lowest indices first: elements 0..3 have started.
    started = {cluster.record(i).array_index for i in range(first.id, first.id + 10) if cluster.record(i).attempt}
    assert started == {0, 1, 2, 3}


def test_update_throttle_and_element_env(cluster: Cluster) -> None:
    first = cluster.service.submit(spec(command=["train", "--lr={lr}"], sweep={"lr": [0.1, 0.2]}, throttle=1))
    cluster.tick_at(T0 + 1)
    assert len(running(cluster)) == 1
    launched = cluster.proc(first.id).spec
    assert launched.argv == ["train", "--lr=0.1"]
    assert launched.env["lr"] == "0.1" and launched.env["GPUCLUSTER_ARRAY_INDEX"] == "0"
    assert launched.env["GPUCLUSTER_ARRAY_COUNT"] == "2" and launched.env["SLURM_ARRAY_TASK_ID"] == "0"
    cluster.service.set_throttle(first.id, None)
    cluster.tick_at(T0 + 2)
    assert len(running(cluster)) == 2
    assert cluster.proc(first.id + 1).spec.argv == ["train", "--lr=0.2"]


def test_a_held_job_is_skipped_and_released_jobs_run(cluster: Cluster) -> None:
    held = cluster.submit(hold=True)
    cluster.tick_at(T0 + 1)
    assert cluster.state(held) is JobState.QUEUED and reason_text(cluster.record(held).reason) == "held by user"
    assert cluster.service.hold(held, False).changed == [held]
    cluster.tick_at(T0 + 2)
    assert cluster.state(held) is JobState.RUNNING


def test_a_failed_dependency_cancels_its_chain(cluster: Cluster) -> None:
    first = cluster.submit()
    second = cluster.submit(afterok=[first])
    third = cluster.submit(afterany=[second])
    fourth = cluster.submit(afterok=[second])
    cluster.tick_at(T0 + 1)
    assert running(cluster) == {first}
    assert cluster.record(second).wait_reason == "dependency"
    cluster.proc(first).status = Exited(1)
    for t in range(2, 6):
        cluster.tick_at(T0 + t)
    assert cluster.record(second).state is JobState.CANCELLED
    assert cluster.record(second).reason == f"dependency can never be met: job {first} failed (afterok)"
    assert cluster.record(fourth).reason == f"dependency can never be met: job {second} cancelled (afterok)"
    assert cluster.state(third) is JobState.RUNNING  # afterany: a cancelled end is an end


def test_cancel_of_an_array_ends_queued_and_stops_running_elements(cluster: Cluster) -> None:
    first = cluster.service.submit(spec(array="0-4%2"))
    cluster.tick_at(T0 + 1)
    job = cluster.service.cancel_many(first.id)
    assert job.array_counts == {"cancelled": 3, "running": 2}
    assert all(cluster.record(i).stop_reason == "cancel" for i in running(cluster))


def test_aftercorr_pairs_each_element_with_its_partner(cluster: Cluster) -> None:
    a = cluster.service.submit(spec(array="0-2"))
    b = cluster.service.submit(spec(array="0-3", aftercorr=a.id))
    cluster.tick_at(T0 + 1)
    assert running(cluster) == {a.id, a.id + 1, a.id + 2, b.id + 3}  # element 3 has no partner
    cluster.proc(a.id + 1).status = Exited(0)
    cluster.tick_at(T0 + 2)
    cluster.tick_at(T0 + 3)
    assert cluster.state(b.id + 1) is JobState.RUNNING and cluster.state(b.id) is JobState.QUEUED
    assert reason_text(cluster.record(b.id).reason).startswith(f"waits for job {a.id} (running")


def test_hold_and_release_of_a_whole_array_take_one_statement(cluster: Cluster) -> None:
    first = cluster.service.submit(spec(array="0-5"))
    held = cluster.service.hold(first.id, True)
    assert (held.count, held.changed) == (6, [])
    cluster.tick_at(T0 + 1)
    assert running(cluster) == set() and reason_text(cluster.record(first.id + 3).reason) == "held by user"
    assert cluster.service.hold(first.id, False, index=3).changed == [first.id + 3]
    cluster.tick_at(T0 + 2)
    assert running(cluster) == {first.id + 3}
    assert cluster.service.hold(first.id, False).count == 5
    cluster.tick_at(T0 + 3)
    assert len(running(cluster)) == 6


def test_a_job_after_a_throttled_array_is_estimated_from_its_waves(cluster: Cluster) -> None:
    """6 elements of 10 minutes, 2 at once: 3 waves; the job after the array starts after them."""
    first = cluster.service.submit(spec(array="0-5%2", time_limit="10m"))
    after = cluster.submit(afterok=[first.id])
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    waiting = cluster.record(after)
    assert waiting.wait_reason == "dependency"
    assert waiting.estimated_start == T0 + 1 + 3 * 600
    assert reason_text(waiting.reason).startswith(f"waits for array {first.id} (running, expected to end ")


def test_a_job_after_an_array_is_estimated_from_the_start_of_its_last_wave(cluster: Cluster) -> None:
    """`after` on an array waits for every element to start: with 6 elements of 10 minutes, 2 at
    once, the last wave starts two limits after the first, one limit before the array's end."""
    first = cluster.service.submit(spec(array="0-5%2", time_limit="10m"))
    after = cluster.submit(after=[first.id])
    cluster.tick_at(T0 + 1)
    cluster.tick_at(T0 + 2)
    waiting = cluster.record(after)
    assert waiting.wait_reason == "dependency"
    assert waiting.estimated_start == T0 + 1 + 2 * 600
    assert reason_text(waiting.reason).startswith(f"waits for array {first.id} (running, expected to start ")


def test_a_pipeline_is_the_chain_through_a_job_and_leaves_out_other_teams_steps(cluster: Cluster) -> None:
    """prepare -> sweep (an array) -> evaluate -> report, and a job of another team after the
    sweep: asked about evaluate, the chain runs from prepare to report; a caller of team default
    alone does not see the other team's step (nor an arrow to it)."""
    prepare = cluster.submit(time_limit="10m")
    sweep = cluster.service.submit(spec(array="0-2", afterok=[prepare], time_limit="10m")).id
    evaluate = cluster.submit(afterok=[sweep])
    report = cluster.submit(after=[evaluate])
    theirs = cluster.service.submit(spec(team="vision", afterany=[sweep])).id
    unrelated = cluster.submit(afterok=[prepare])  # beside the chain, not through evaluate
    for t in range(1, 5):  # each cycle's estimates are the next one's targets: one step per cycle
        cluster.tick_at(T0 + t)
    seen = cluster.service.pipeline(evaluate, None)
    assert [(j.id, j.depth, j.state.value) for j in seen.jobs] == [
        (prepare, -2, "running"),
        (sweep, -1, "queued"),
        (evaluate, 0, "queued"),
        (report, 1, "queued"),
    ]
    assert {(e.source, e.target, e.kind) for e in seen.edges} == {
        (prepare, sweep, "afterok"),
        (sweep, evaluate, "afterok"),
        (evaluate, report, "after"),
    }
    assert seen.jobs[1].array_counts == {"queued": 3}
    assert seen.jobs[2].expected_start == T0 + 1 + 600 + 600  # after prepare's and the sweep's limits
    assert seen.jobs[3].expected_start == seen.jobs[2].expected_start  # `after`: once evaluate starts
    from_sweep = cluster.service.pipeline(sweep + 1, None)  # an element: its array's chain
    assert {j.id for j in from_sweep.jobs} == {prepare, sweep, evaluate, report, theirs}
    mine = cluster.service.pipeline(sweep, {"default"})
    assert theirs not in {j.id for j in mine.jobs} and all(theirs not in (e.source, e.target) for e in mine.edges)
    assert unrelated not in {j.id for j in mine.jobs}


def test_a_job_after_an_array_submitted_while_the_throttle_is_full_waits_for_every_element(cluster: Cluster) -> None:
    """The queue index the head keeps holds every queued job; eligibility keeps some back, so the
    cycle must not plan on that index. It did: diffed down to the eligible jobs (none, the throttle
    full), it then took in the blocked job submitted meanwhile, and when one element ended its one
    job matched the one eligible element by count: the job after the array started."""
    first = cluster.service.submit(spec(array="0-5%2"))
    cluster.tick_at(T0 + 1)
    after = cluster.service.submit(spec(afterok=[first.id])).id
    for k in range(8):
        cluster.tick_at(T0 + 1.2 + 0.2 * k)
        now = running(cluster)
        assert after not in now or all(cluster.state(i) is JobState.SUCCEEDED for i in range(first.id, first.id + 6))
        for job_id in sorted(now)[:1]:
            cluster.proc(job_id).status = Exited(0)
