"""What telemetry does to jobs: the memory-share stop, idle flags and their actions, synthetic
readings from a job's own reports, and the samples it keeps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM

import pytest

from gpucluster.core.policy import IdlePolicy
from gpucluster.core.states import JobState
from gpucluster.store.telemetry import TelemetryStore
from gpucluster.telemetry.monitor import TelemetryMonitor
from gpucluster.telemetry.synthetic import LoadBook, SyntheticSource

from .headkit import make_cluster
from .telemetrykit import Telemetry, make_telemetry


@pytest.fixture
def t(tmp_path: Path) -> Iterator[Telemetry]:
    tel = make_telemetry(tmp_path)
    tel.cluster.fake.exit_on_signal[SIGTERM] = 143
    yield tel
    tel.close()


def test_fractional_job_over_its_memory_share_is_stopped_with_that_reason(t: Telemetry) -> None:
    c = t.cluster
    small = c.submit(gpus=0.25)  # a quarter of an 80 GiB H100: 20 GiB
    neighbour = c.submit(gpus=0.25)
    t.step()
    assert c.state(small) is JobState.RUNNING and c.state(neighbour) is JobState.RUNNING
    gpu = c.record(small).allocation.slices[0].gpu_indices[0]  # type: ignore[union-attr]
    t.resolver.owners.update({4242: small, 4343: neighbour})
    t.script(**{f"g{gpu}": {"processes": [{"pid": 4242, "memory_mb": 20 * 1024}, {"pid": 4343, "memory_mb": 1024}]}})
    t.step()
    assert c.record(small).stop_reason is None  # at its share: fine
    t.script(**{f"g{gpu}": {"processes": [{"pid": 4242, "memory_mb": 30 * 1024}, {"pid": 4343, "memory_mb": 1024}]}})
    t.step()  # found: SIGTERM
    t.step()  # it exits
    r = c.record(small)
    assert r.state is JobState.FAILED
    assert r.reason == (
        f"stopped: used 30.0 GiB of GPU memory on n1 GPU {gpu}, over its share of 20.0 GiB (killed by SIGTERM)"
    )
    assert c.state(neighbour) is JobState.RUNNING  # the neighbour within its share goes on


def test_whole_gpu_jobs_are_never_stopped_for_memory(t: Telemetry) -> None:
    c = t.cluster
    job = c.submit(gpus=1)
    t.step()
    t.resolver.owners[4242] = job
    t.script(g0={"processes": [{"pid": 4242, "memory_mb": 80 * 1024}]})
    t.step()
    assert c.state(job) is JobState.RUNNING


def test_idle_job_is_flagged_and_unflagged_notify_only_by_default(t: Telemetry) -> None:
    c = t.cluster
    t.policy(idle=IdlePolicy(after_s=60, threshold=1))
    job = c.submit(gpus=2)
    t.step()
    t.script(g0={"util": 0}, g1={"util": 1})
    for _ in range(12):
        t.step()
    assert c.head.telemetry.flags(job) == []  # 55 s: not yet
    t.step()
    flags = c.head.telemetry.flags(job)
    assert [f.flag for f in flags] == ["idle"] and "for 1m" in flags[0].message
    assert c.state(job) is JobState.RUNNING
    assert t.monitor.jobs[job].idle_since is not None
    t.script(g0={"util": 0}, g1={"util": 40})  # busy again: the flag goes
    t.step()
    assert c.head.telemetry.flags(job) == []


def test_idle_action_stop_ends_the_job_failed_with_why(t: Telemetry) -> None:
    c = t.cluster
    t.policy(idle=IdlePolicy(after_s=60, action="stop"))
    job = c.submit(gpus=1)
    t.step()
    t.script(g0={"util": 0})
    for _ in range(14):
        t.step()
    r = c.record(job)
    assert r.state is JobState.FAILED
    assert r.reason == "stopped: its GPUs were idle for 1m (killed by SIGTERM)"


def test_idle_action_requeue_puts_the_job_back_in_line(t: Telemetry) -> None:
    c = t.cluster
    t.policy(idle=IdlePolicy(after_s=60, action="requeue"))
    job = c.submit(gpus=8)
    t.step()
    t.script(**{f"g{i}": {"util": 0} for i in range(8)})
    for _ in range(15):
        t.step()
    events = [e.reason for e in c.store.events(job)]
    assert any(e.startswith("requeued: its GPUs were idle for 1m") for e in events), events
    assert c.record(job).attempt >= 1


def test_samples_are_batched_and_attributed_to_the_holding_jobs(tmp_path: Path) -> None:
    t = make_telemetry(tmp_path, flush_s=20)
    try:
        c = t.cluster
        job = c.submit(gpus=2)
        t.step()
        ts: TelemetryStore = c.head.telemetry
        t.step()
        assert ts.samples() == []  # nothing written before the flush interval
        t.step(dt=20)
        held = ts.samples(job_id=job)
        assert {s.gpu for s in held} == {0, 1}
        assert all(s.jobs == (job,) and s.power_w == 300 for s in held)
        assert len(ts.samples(node="n1", gpu=5)) == len(held) // 2
    finally:
        t.close()


def test_synthetic_source_reads_what_a_job_reports_and_stops_it_over_its_share(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, default_command=["sleep", "1000"], grace_period_s=5.0)
    try:
        c.fake.exit_on_signal[SIGTERM] = 143
        n1 = c.store.nodes()[0].node
        loads = LoadBook()
        monitor = TelemetryMonitor(c.head, [SyntheticSource(n1, loads)], loads=loads)
        job = c.submit(gpus=0.5)  # 40 GiB of an 80 GiB H100
        busy = c.submit(gpus=1)
        c.head.tick()
        monitor.step()
        gpu = c.record(job).allocation.slices[0].gpu_indices[0]  # type: ignore[union-attr]
        assert monitor.gpus[("n1", gpu)].reading.utilization == 50.0  # unreported: 100% of its half
        monitor.report_load(busy, 0.0, None)
        monitor.report_load(job, None, 50 * 1024)
        c.clock.advance(5)
        monitor.step()
        c.head.tick()  # SIGTERM
        c.head.tick()  # it exited
        r = c.record(job)
        assert r.state is JobState.FAILED
        assert "used 50.0 GiB of GPU memory" in r.reason and "share of 40.0 GiB" in r.reason
        busy_gpu = c.record(busy).allocation.slices[0].gpu_indices[0]  # type: ignore[union-attr]
        reading = monitor.gpus[("n1", busy_gpu)].reading
        assert reading.utilization == 0.0 and reading.power_w == 60.0
    finally:
        c.close()
