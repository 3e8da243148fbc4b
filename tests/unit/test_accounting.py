"""Accounting on hand-computed cases: a head driven by hand (real store, fake executor, a clock
the test moves), GPU time, money and energy per attempt, budgets holding and releasing jobs, and
max cost stopping a job."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpucluster.core.accounting import Budget, Spend, over_budget, period_end, period_start, rate
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, NodeSlice
from gpucluster.head.loop import Head
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.service import ClusterService
from gpucluster.store.accounting import UsageRow
from gpucluster.store.telemetry import GpuSample
from gpucluster.waits_text import reason_text

from .headkit import T0, Cluster, api_client, make_cluster

PRICE = {"H100": 3.60}


STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py


@pytest.fixture
def cluster(tmp_path: Path, store_target: Path | str) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, default_command=["train"], prices=PRICE, grace_period_s=5.0, store_target=store_target)
    yield c
    c.close()


def rows(c: Cluster, job_id: int) -> list[UsageRow]:
    return sorted(c.head.accounting.usage.rows_of_jobs([job_id]), key=lambda r: r.attempt)


def test_rules_by_hand() -> None:
    models = {("n1", 0): "H100", ("n1", 1): "H100", ("n2", 0): "A100"}
    r = rate(Allocation((NodeSlice("n1", (0, 1)), NodeSlice("n2", (0,), share=0.5))), models, {"H100": 3.6})
    assert (r.gpus, r.model) == (2.5, "A100+H100")
    assert r.cost_per_s * 3600 == pytest.approx(7.2)  # the A100 has no price: its half costs nothing
    month = Budget("t", "month", None, money=10)
    assert (period_start(month, 1_740_000_000), period_end(month, 1_740_000_000)) == (1_738_368_000, 1_740_787_200)
    day = Budget("t", "1d", 86400.0, gpu_hours=2)
    assert (period_start(day, 86400 * 3 + 5), period_end(day, 86400 * 3 + 5)) == (86400 * 3, 86400 * 4)
    assert over_budget(day, Spend(0, 1.99)) is None
    assert over_budget(day, Spend(0, 2.0)) == "team t used 2.00 of its 2 GPU-hour budget for this 1d period"


def test_a_2_gpu_job_for_90_s_at_3_60_per_gpu_hour_costs_0_18(cluster: Cluster) -> None:
    job = cluster.submit(gpus=2, team="vision")
    cluster.tick_at(T0)  # starts
    cluster.tick_at(T0 + 30)
    [row] = rows(cluster, job)
    # Accrued while running: a crash now would lose nothing before T0 + 30.
    assert (row.accrued_until, row.gpu_seconds, row.final) == (T0 + 30, 60.0, False)
    assert row.cost == pytest.approx(0.06, abs=1e-12)
    cluster.tick_at(T0 + 61)
    cluster.fake.finish(job, 0)
    cluster.tick_at(T0 + 90)
    [row] = rows(cluster, job)
    assert (row.final, row.outcome, row.accrued_until, row.gpu_seconds) == (True, "succeeded", T0 + 90, 180.0)
    assert row.cost == pytest.approx(0.18, abs=1e-12)
    cluster.tick_at(T0 + 200)  # nothing accrues after the end
    assert rows(cluster, job)[0].cost == pytest.approx(0.18, abs=1e-12)

    with api_client(cluster.service) as api:
        body = api.get("/v1/usage", params={"by": "job", "since": "1d"}).json()
        assert [r["job_id"] for r in body["rows"]] == [job]
        assert body["rows"][0]["cost"] == pytest.approx(0.18)
        assert body["rows"][0]["gpu_hours"] == pytest.approx(0.05)
        assert body["total"]["cost"] == pytest.approx(0.18)
        # A window that holds a third of the attempt (now is T0 + 200: T0 + 60 to T0 + 90) gets a third.
        third = api.get("/v1/usage", params={"by": "team", "since": "140s", "until": "110s"}).json()
        assert [(r["team"], r["jobs"]) for r in third["rows"]] == [("vision", 1)]
        assert third["rows"][0]["cost"] == pytest.approx(0.06)
        bad = api.get("/v1/usage", params={"since": "yesterday"})
        assert bad.status_code == 422 and bad.json()["error"].startswith("since: cannot read 'yesterday'")
        assert api.get("/v1/usage", params={"by": "node"}).status_code == 422
        metrics = {
            (s.name, s.labels.get("team"), s.labels.get("model")): s.value
            for f in text_string_to_metric_families(api.get("/metrics").text)
            for s in f.samples
        }
    assert metrics[("gpucluster_team_cost_total", "vision", None)] == pytest.approx(0.18)
    assert metrics[("gpucluster_team_gpu_hours_total", "vision", "H100")] == pytest.approx(0.05)


def test_a_fraction_pays_its_share_of_time_money_and_energy(cluster: Cluster) -> None:
    job = cluster.submit(gpus=0.25)
    cluster.tick_at(T0)
    record = cluster.record(job)
    assert record.allocation is not None
    [s] = record.allocation.slices
    gpu = s.gpu_indices[0]
    # Telemetry: 10 s samples of the GPU at 200 W, 80% busy, while the job held it; one of
    # another GPU it does not hold, and one with no holder, count for nothing.
    samples = [GpuSample("n1", gpu, T0 + 10 * i, 10.0, (job,), utilization=80, power_w=200) for i in range(36)]
    samples += [
        GpuSample("n1", (gpu + 1) % 8, T0, 10.0, (job,), utilization=5, power_w=300),
        GpuSample("n1", gpu, T0, 10.0, (), utilization=0, power_w=50),
    ]
    cluster.head.telemetry.add_samples(samples)
    cluster.fake.finish(job, 0)
    cluster.tick_at(T0 + 3600)
    [row] = rows(cluster, job)
    assert row.gpu_seconds == pytest.approx(900.0)  # 0.25 GPU x 1 h
    assert row.cost == pytest.approx(0.90)  # 0.25 x 3.60
    assert row.energy_j == pytest.approx(36 * 200 * 10 * 0.25)  # 18 kJ: its quarter of 72 kJ
    assert row.used_gpu_seconds / row.sampled_gpu_seconds == pytest.approx(0.80)
    out = cluster.head.accounting.usage.window(None, None)
    assert len(out) == 1
    with api_client(cluster.service) as api:
        body = api.get("/v1/usage", params={"by": "gpu-model", "since": "all"}).json()
    assert body["rows"][0]["gpu_model"] == "H100"
    assert body["rows"][0]["energy_kwh"] == pytest.approx(18000 / 3.6e6)
    assert body["rows"][0]["utilization"] == pytest.approx(80.0)


def test_accrual_survives_a_head_restart_and_lost_work_is_reported(cluster: Cluster) -> None:
    job = cluster.submit(gpus=1, max_restarts=1)
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 20)
    # The head dies; a new one on the same store carries on from what was accrued.
    head = Head(store=cluster.store, executor=cluster.fake, data_dir=cluster.data_dir, clock=cluster.clock,
                base_env={"HOME": "/h"}, prices=PRICE)  # fmt: skip
    assert head.accounting.open[(job, 1)].gpu_seconds == 20.0
    cluster.fake.finish(job, 3)  # fails after 40 s without a checkpoint: 40 GPU-seconds of work lost
    cluster.clock.t = T0 + 40
    head.tick()
    [row] = rows(cluster, job)
    assert (row.final, row.outcome, row.gpu_seconds, row.work_lost_s) == (True, "failed", 40.0, 40.0)
    service = ClusterService(head)
    with api_client(service) as api:
        body = api.get("/v1/usage", params={"by": "user"}).json()
    service.close()
    assert body["total"]["lost_gpu_hours_failures"] == pytest.approx(40 / 3600)
    assert body["total"]["lost_gpu_hours_preemption"] == 0.0


BUDGET = """
teams: {vision: {}, nlp: {}}
prices: {H100: 3.60}
budgets:
  vision: {period: 1d, money: %s, on_exceed: %s}
"""


def policy_cluster(tmp_path: Path, money: str = "0.18", on_exceed: str = "finish") -> tuple[Cluster, Path]:
    path = tmp_path / "policy.yaml"
    path.write_text(BUDGET % (money, on_exceed))
    return make_cluster(tmp_path, default_command=["train"], policy=PolicySource(path), grace_period_s=5.0), path


def test_a_team_over_budget_has_new_jobs_held_until_the_budget_grows_or_the_period_rolls(tmp_path: Path) -> None:
    c, path = policy_cluster(tmp_path)
    try:
        first = c.submit(gpus=2, team="vision")
        c.tick_at(T0)
        c.fake.finish(first, 0)
        c.tick_at(T0 + 90)  # 0.18 spent: the whole budget
        held = c.submit(gpus=1, team="vision")
        other = c.submit(gpus=1, team="nlp")
        c.tick_at(T0 + 91)
        assert (c.state(held), c.state(other)) == (JobState.QUEUED, JobState.RUNNING)
        assert list(c.head.cluster.holds) == ["vision"]  # told to the cluster state, as in the simulator
        r = c.record(held)
        assert r.wait_reason == "budget"
        assert reason_text(r.reason).startswith(
            "held: team vision spent 0.18 of its 0.18 money budget for this 1d period"
        )
        assert [e.job.id for e in c.service.queue().entries] == [held]
        with api_client(c.service) as api:
            [b] = api.get("/v1/budgets").json()["budgets"]
            assert (b["team"], b["over"], b["held_jobs"]) == ("vision", True, 1)
            assert b["money_spent"] == pytest.approx(0.18)

        path.write_text(BUDGET % ("1000", "finish"))  # the budget grows
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        c.tick_at(T0 + 95)
        c.tick_at(T0 + 96)
        assert c.state(held) is JobState.RUNNING
        assert c.head.cluster.holds == {}  # and its release
    finally:
        c.close()


def test_the_period_rolling_over_releases_held_jobs(tmp_path: Path) -> None:
    c, _ = policy_cluster(tmp_path, money="0.05")
    try:
        first = c.submit(gpus=1, team="vision")
        c.tick_at(86400 - 100)
        c.fake.finish(first, 0)
        c.tick_at(86400 - 40)  # 60 s at 3.60: 0.06 of 0.05 in the day that ends at 86400
        held = c.submit(gpus=1, team="vision")
        c.tick_at(86400 - 30)
        assert c.record(held).wait_reason == "budget"
        assert "released when the period rolls over (1970-01-02 00:00 UTC)" in reason_text(c.record(held).reason)
        c.tick_at(86400 + 1)
        c.tick_at(86400 + 2)
        assert c.state(held) is JobState.RUNNING
    finally:
        c.close()


def test_on_exceed_stop_stops_the_teams_running_jobs(tmp_path: Path) -> None:
    c, _ = policy_cluster(tmp_path, money="0.10", on_exceed="stop")
    try:
        c.fake.exit_on_signal[signal.SIGTERM] = 143
        job = c.submit(gpus=2, team="vision")
        c.tick_at(T0)
        for t in range(5, 60, 5):
            c.tick_at(T0 + t)
        # 0.002 per second: over 0.10 from 50 s, seen by the step at 50 s.
        assert c.record(job).stop_reason == "policy"
        c.tick_at(T0 + 56)  # SIGTERM
        c.tick_at(T0 + 57)  # it exited
        r = c.record(job)
        assert r.state is JobState.FAILED
        assert r.reason.startswith("stopped: team vision spent 0.10 of its 0.1 money budget")
    finally:
        c.close()


def test_max_cost_stops_a_job_before_it_would_exceed_it(cluster: Cluster) -> None:
    cluster.fake.exit_on_signal[signal.SIGTERM] = 143
    job = cluster.submit(gpus=1, max_cost=0.05)  # 0.001 per second; a stop may take the 5 s grace
    cluster.tick_at(T0)
    cluster.tick_at(T0 + 44)
    assert cluster.record(job).stop_reason is None
    cluster.tick_at(T0 + 45)  # 0.045 spent + 5 s of grace = 0.05
    assert cluster.record(job).stop_reason == "policy"
    cluster.tick_at(T0 + 46)
    cluster.tick_at(T0 + 50)
    r = cluster.record(job)
    assert r.state is JobState.FAILED
    assert r.reason.startswith("stopped: its cost would exceed its max cost of 0.05 (0.0450 spent")
    assert rows(cluster, job)[0].cost <= 0.05
    with api_client(cluster.service) as api:
        bad = api.post("/v1/jobs", json={"command": ["x"], "max_cost": -1})
    assert bad.status_code == 422 and "max_cost" in bad.json()["error"]


def test_a_released_job_gets_its_schedulers_reason_back(tmp_path: Path) -> None:
    c, path = policy_cluster(tmp_path, money="0.10")
    try:
        running = c.submit(gpus=8, team="vision")  # 0.008 per second: over from 12.5 s
        waiting = c.submit(gpus=8, team="vision")
        c.tick_at(T0)
        c.tick_at(T0 + 1)
        assert c.record(waiting).wait_reason in ("resources", "reserved")
        for t in (5, 10, 15, 16):
            c.tick_at(T0 + t)
        assert (c.state(running), c.record(waiting).wait_reason) == (JobState.RUNNING, "budget")  # it finishes
        path.write_text(BUDGET % ("1000", "finish"))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        c.tick_at(T0 + 20)
        c.tick_at(T0 + 21)
        r = c.record(waiting)  # waits for GPUs again, and says so
        assert r.wait_reason in ("resources", "reserved") and not r.reason.startswith("held:"), r.reason
    finally:
        c.close()


def test_usage_reports_the_gpu_hours_sessions_held_and_how_many_idle(cluster: Cluster) -> None:
    session = cluster.submit(gpus=1, interactive=True)
    batch = cluster.submit(gpus=1)
    cluster.tick_at(T0)
    held = {j: cluster.record(j).allocation for j in (session, batch)}
    samples = []
    for job, busy in ((session, [0.0] * 90 + [50.0] * 270), (batch, [0.0] * 360)):
        alloc = held[job]
        assert alloc is not None
        [s] = alloc.slices
        # 10 s samples for an hour: the session idle its first quarter hour (the batch job idle
        # throughout, which is not a session's and counts in no session column).
        samples += [
            GpuSample("n1", s.gpu_indices[0], T0 + 10 * i, 10.0, (job,), utilization=u) for i, u in enumerate(busy)
        ]
    cluster.head.telemetry.add_samples(samples)
    cluster.tick_at(T0 + 3600)
    cluster.fake.finish(session, 0)
    cluster.fake.finish(batch, 0)
    cluster.tick_at(T0 + 3600)
    [row] = rows(cluster, session)
    assert (row.kind, row.idle_gpu_seconds) == ("session", pytest.approx(900.0))
    with api_client(cluster.service) as api:
        body = api.get("/v1/usage", params={"by": "job", "since": "all"}).json()
    by_job = {r["job_id"]: r for r in body["rows"]}
    assert by_job[session]["session_gpu_hours"] == pytest.approx(1.0)
    assert by_job[session]["session_idle_gpu_hours"] == pytest.approx(0.25)
    assert by_job[batch]["session_gpu_hours"] == 0.0 and by_job[batch]["session_idle_gpu_hours"] == 0.0
    assert body["total"]["gpu_hours"] == pytest.approx(2.0) and body["total"]["session_gpu_hours"] == pytest.approx(1.0)
