"""The policy's session class at submit (head/sessions.py, the API's submit): limits, priority,
time limit, and what a head that cannot host sessions says."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.policy import InteractivePolicy
from gpucluster.head.service import Rejected
from gpucluster.head.sessions import apply_class
from gpucluster.models import JobSpec

from .headkit import api_client, make_cluster


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"command": ["bash"], "interactive": True, **fields})


def test_the_class_sets_priority_and_time_limit_and_bounds_gpus_per_user() -> None:
    policy = InteractivePolicy(max_gpus_per_user=2, time_limit_s=3600, priority="high")
    got = apply_class(spec(gpus=1), policy, held_gpus=1)
    assert (got.priority, got.time_limit, got.kind) == ("high", 3600, "session")
    assert apply_class(spec(gpus=1, time_limit="30m"), policy, held_gpus=0).time_limit == 1800
    with pytest.raises(Rejected, match="your sessions would hold 3 GPUs; the policy allows 2 per user"):
        apply_class(spec(gpus=2), policy, held_gpus=1)
    with pytest.raises(Rejected, match=r"sessions may run at most 1h \(asked for 2h\)"):
        apply_class(spec(time_limit="2h"), policy, held_gpus=0)
    same = spec(gpus=0.5)
    assert apply_class(same, InteractivePolicy(), held_gpus=100) is same  # no class: as submitted


def test_a_session_is_one_process_never_restarted() -> None:
    for bad, words in (
        ({"per_gpu": True, "gpus": 2}, "one process on one node"),
        ({"gpus": "2..4"}, "one process on one node"),
        ({"nodes": 2, "gpus": 2}, "one process on one node"),
        ({"max_restarts": 1}, "never restarted"),
    ):
        with pytest.raises(ValueError, match=words):
            spec(**bad)


def test_a_head_whose_executor_cannot_host_sessions_refuses_them(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path)  # the fake executor: no sessions
    try:
        with api_client(cluster.service) as api:
            r = api.post("/v1/jobs", json={"command": ["bash"], "interactive": True})
            assert r.status_code == 422
            assert r.json()["error"].startswith("interactive: this head cannot host interactive sessions")
            assert api.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    finally:
        cluster.close()


def test_a_preempted_session_ends_instead_of_starting_again_with_nobody_attached(tmp_path: Path) -> None:
    from signal import SIGTERM

    from gpucluster.core.states import JobState
    from gpucluster.executors.base import Exited

    from .headkit import T0

    cluster = make_cluster(tmp_path)
    try:
        session = cluster.service.submit(spec(gpus=8, priority="low")).id
        cluster.tick_at(T0)
        assert cluster.state(session) is JobState.RUNNING
        high = cluster.submit(command=["train"], gpus=8, priority="high")
        cluster.tick_at(T0 + 1)  # the preemption is planned
        cluster.tick_at(T0 + 2)  # SIGTERM
        cluster.proc(session).status = Exited(128 + SIGTERM, SIGTERM)
        cluster.tick_at(T0 + 3)
        record = cluster.record(session)
        assert record.state is JobState.CANCELLED and "not requeued after a preemption" in record.reason
        assert [e.state for e in cluster.store.events(session)][-2:] == [JobState.PREEMPTED, JobState.CANCELLED]
        assert cluster.state(high) is JobState.RUNNING
    finally:
        cluster.close()


def test_concurrent_session_submissions_never_pass_the_per_user_limit_together(tmp_path: Path) -> None:
    """The count of a user's session GPUs and the insert of the next session are one step per
    user: six submissions at once, each reading the count while the others do, must still queue
    only as many as `max_gpus_per_user` allows. The read is slowed down so that, without the
    per-user step, all six would read the count from before the others (the race it closes)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from gpucluster.head.policy_source import PolicySource

    cluster = make_cluster(tmp_path)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("interactive: {max_gpus_per_user: 2}\n")
    cluster.head.policy_source = PolicySource(policy_file)
    cluster.head.executor.supports_sessions = True  # type: ignore[attr-defined]  # admission only: nothing starts
    counted = cluster.store.session_gpus

    def slow_count(user: str) -> float:
        held = counted(user)
        time.sleep(0.3)  # every other submission that can read now does
        return held

    cluster.store.session_gpus = slow_count  # type: ignore[method-assign]
    try:
        with api_client(cluster.service) as api, ThreadPoolExecutor(6) as pool:
            body = {"command": ["bash"], "interactive": True, "gpus": 1}
            codes = sorted(pool.map(lambda _: api.post("/v1/jobs", json=body).status_code, range(6)))
        assert codes == [201, 201, 422, 422, 422, 422]
        assert cluster.store.session_gpus("admin") == 2
    finally:
        cluster.close()
