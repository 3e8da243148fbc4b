"""Limits on the head (issue 16), in process with the fake executor: the head applies them where
it builds its snapshot, records each held job's own wait (with its estimate), and a submission
through the API beyond `max_queued_jobs` answers 422 naming the limit."""

from __future__ import annotations

from pathlib import Path

from gpucluster.core.states import JobState
from gpucluster.head.policy_source import PolicySource
from gpucluster.waits_text import reason_text

from .builders import spec
from .headkit import T0, Cluster, api_client, make_cluster

POLICY = "limits:\n  per_user: {max_running_gpus: 4, max_queued_jobs: 2}\n"


def cluster(tmp_path: Path, gpus: int) -> Cluster:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return make_cluster(tmp_path, gpus=gpus, policy=PolicySource(path))


def test_the_head_records_a_limit_wait_and_starts_the_job_once_room_frees(tmp_path: Path) -> None:
    c = cluster(tmp_path, 8)
    try:
        first = c.service.submit(spec(gpus=4, time_limit=600), owner="alice").id
        second = c.service.submit(spec(gpus=2), owner="alice").id
        other = c.service.submit(spec(gpus=2), owner="bob").id
        c.tick_at(T0 + 1)
        states = {i: c.store.get_job(i) for i in (first, second, other)}
        assert {i: r.state for i, r in states.items() if r} == {
            first: JobState.RUNNING,
            second: JobState.QUEUED,
            other: JobState.RUNNING,
        }
        held = states[second]
        assert held is not None and held.wait_reason == "user_gpus"
        assert "alice runs 0 GPUs and 4 more are ahead in line" in reason_text(held.reason)  # both started in one cycle
        c.tick_at(T0 + 2)
        held = c.store.get_job(second)
        assert held is not None and held.wait_reason == "user_gpus"
        said = reason_text(held.reason)
        assert "alice runs 4 GPUs, the per-user limit (limits.per_user.max_running_gpus) is 4" in said
        assert held.estimated_start == T0 + 1 + 600  # when her 4-GPU job reaches its time limit
        c.fake.finish(first, 0)  # her first job ends: 4 GPUs of room again
        c.tick_at(T0 + 3)
        c.tick_at(T0 + 4)
        started = c.store.get_job(second)
        assert started is not None and started.state is JobState.RUNNING
    finally:
        c.close()


def test_a_submission_beyond_max_queued_jobs_answers_422_naming_the_limit(tmp_path: Path) -> None:
    c = cluster(tmp_path, 1)
    try:
        api = api_client(c.service, "admin")
        for _ in range(2):
            assert api.post("/v1/jobs", json={"command": ["true"]}).status_code == 201  # no cycle runs: queued
        r = api.post("/v1/jobs", json={"command": ["true"]})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == [
            {
                "field": "limits",
                "message": "admin has 2 jobs queued, the per-user limit (limits.per_user.max_queued_jobs) is 2, "
                "and this submission adds 1: wait for some to start, or cancel some (gpucluster cancel), "
                "then submit again",
            }
        ]
        assert api.post("/v1/jobs", json={"command": ["true"], "array": "0-1"}).status_code == 422
        limits = api.get("/v1/policy").json()["limits"]
        assert limits["per_user"] == {"max_running_gpus": 4, "max_queued_jobs": 2, "max_gpu_hours_in_flight": None}
    finally:
        c.close()
