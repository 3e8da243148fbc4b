"""Progress reports: right URL and body, rate-limited, never blocking or failing training."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")  # gpucluster.train needs it

from gpucluster.launch.ranks import pick_free_port
from gpucluster.train.progress import ProgressReporter
from tests.train.fakehead import FakeHead


@pytest.fixture
def head() -> Iterator[FakeHead]:
    h = FakeHead()
    yield h
    h.close()


def test_reports_step_and_last_checkpoint(head: FakeHead) -> None:
    r = ProgressReporter(head.url, 42, min_interval_s=0.05)
    r.report(5)
    time.sleep(0.3)
    r.report(10, checkpoint_at=1000.5, checkpoint_step=10)
    time.sleep(0.3)
    r.report(11)
    r.close()
    assert [p for p, _ in head.posts] == ["/v1/jobs/42/progress"] * 3
    assert [b for _, b in head.posts] == [
        {"step": 5, "checkpoint_at": None, "checkpoint_step": None},
        {"step": 10, "checkpoint_at": 1000.5, "checkpoint_step": 10},
        {"step": 11, "checkpoint_at": 1000.5, "checkpoint_step": 10},  # the checkpoint sticks
    ]


def test_rate_limited_and_the_newest_value_wins(head: FakeHead) -> None:
    r = ProgressReporter(head.url, 1, min_interval_s=0.5)
    started = time.monotonic()
    for step in range(1, 2001):
        r.report(step)
    assert time.monotonic() - started < 0.5  # report() never waits for the network
    time.sleep(0.2)
    r.close()
    steps = [b["step"] for _, b in head.posts]
    assert len(steps) <= 3
    assert steps[-1] == 2000  # close() flushes the newest


def test_an_unreachable_head_never_disturbs_training() -> None:
    dead = f"http://127.0.0.1:{pick_free_port('127.0.0.1')}"
    r = ProgressReporter(dead, 1, min_interval_s=0.01, timeout_s=0.2)
    started = time.monotonic()
    for step in range(1000):
        r.report(step)
    assert time.monotonic() - started < 0.5
    time.sleep(0.3)
    r.close(flush_timeout_s=1.0)
    assert r.failed >= 1 and r.sent == 0


def test_a_head_without_the_endpoint_is_a_quiet_failure() -> None:
    head = FakeHead(status=404)
    try:
        r = ProgressReporter(head.url, 1, min_interval_s=0.01)
        r.report(1)
        time.sleep(0.2)
        r.close()
        assert r.failed >= 1 and r.sent == 0
    finally:
        head.close()


def test_off_outside_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCLUSTER_URL", raising=False)
    monkeypatch.delenv("GPUCLUSTER_JOB_ID", raising=False)
    r = ProgressReporter()
    assert not r.enabled
    r.report(1)
    r.close()
    monkeypatch.setenv("GPUCLUSTER_URL", "http://h:1/")
    monkeypatch.setenv("GPUCLUSTER_JOB_ID", "9")
    r = ProgressReporter(enabled=False)  # e.g. not rank 0
    assert r.endpoint == "http://h:1/v1/jobs/9/progress" and not r.enabled


def test_report_sends_metrics_through_the_jobs_reporter(head: FakeHead, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpucluster.train.report (issue 17): metrics ride with the next progress report, at most
    one request per interval, never blocking; closing flushes them."""
    from gpucluster import train
    from gpucluster.train import progress

    monkeypatch.setattr(progress, "_current", None)
    r = ProgressReporter(head.url, 42, min_interval_s=60)  # only close() flushes after the first
    train.report({"loss": 0.5}, step=10)
    train.report({"loss": 0.25, "accuracy": 0.9}, step=20)  # the newest step wins
    r.close()
    bodies = [b for _, b in head.posts]
    assert bodies[-1]["metrics"] == {"loss": 0.25, "accuracy": 0.9} and bodies[-1]["metrics_step"] == 20
    assert all("metrics" not in b or b["metrics_step"] in (10, 20) for b in bodies)


def test_report_is_a_no_op_outside_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster import train
    from gpucluster.train import progress

    monkeypatch.setattr(progress, "_current", None)
    monkeypatch.setattr(progress, "_started", False)
    monkeypatch.delenv("GPUCLUSTER_URL", raising=False)
    train.report({"loss": 1.0}, step=1)
    assert progress._current is None
