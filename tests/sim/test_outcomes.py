"""Tiny workloads whose outcome is computed by hand, through the real scheduler core."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.sim.engine import CKPT, FAILED_RESTARTS, FAILED_TIME_LIMIT, LOST_FAIL, LOST_PREEMPT, SUCCEEDED, USED
from tests.sim.helpers import cluster_yaml, native_csv, run

QUIET = "failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: none}\n"


@pytest.fixture
def two_gpus(tmp_path: Path) -> Path:
    return cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=QUIET)


def three_jobs(tmp_path: Path, **c_extra: object) -> Path:
    return native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 10, "gpus": 1, "name": "A"},
            {"submit_time": 1, "duration": 5, "gpus": 2, "name": "B"},
            {"submit_time": 2, "duration": 3, "gpus": 1, "name": "C", **c_extra},
        ],
    )


def test_fifo_three_jobs_on_two_gpus(tmp_path: Path, two_gpus: Path) -> None:
    # A runs 0-10 on one GPU. B needs both: it waits for A. FIFO lets nobody pass B, so C,
    # which would fit beside A, waits too: B 10-15, C 15-18.
    r = run(two_gpus, three_jobs(tmp_path, priority="high"), "fifo")
    assert r.start == {1: 0.0, 2: 10.0, 3: 15.0}
    assert r.end == {1: 10.0, 2: 15.0, 3: 18.0}
    jct = r.result
    assert sorted(e - s for e, s in zip(jct.end, jct.submit, strict=True)) == [10.0, 14.0, 16.0]


def test_strict_priority_lets_the_high_job_take_the_free_gpu(tmp_path: Path, two_gpus: Path) -> None:
    r = run(two_gpus, three_jobs(tmp_path, priority="high"), "priority")
    assert r.start == {1: 0.0, 2: 10.0, 3: 2.0}
    assert r.end == {1: 10.0, 2: 15.0, 3: 5.0}


def test_backfill_starts_a_short_job_that_ends_before_the_reservation(tmp_path: Path, two_gpus: Path) -> None:
    # With time limits, B's reservation starts when A's limit (20 s) runs out; C (limit 5 s)
    # ends by then, so the default policy backfills it at t=2. FIFO does not.
    trace = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 10, "gpus": 1, "time_limit": 20},
            {"submit_time": 1, "duration": 5, "gpus": 2, "time_limit": 20},
            {"submit_time": 2, "duration": 3, "gpus": 1, "time_limit": 5},
        ],
    )
    assert run(two_gpus, trace, "default").end == {1: 10.0, 2: 15.0, 3: 5.0}
    assert run(two_gpus, trace, "fifo").end == {1: 10.0, 2: 15.0, 3: 18.0}


def test_preemption_costs_a_checkpoint_and_a_restart(tmp_path: Path) -> None:
    # Checkpoint every 10 s of compute, 1 s to write, 2 s to restart. L (low, 100 s of work on
    # both GPUs) is preempted at t=50 by H (high): 4 checkpoints written (44 s) + 6 s computed
    # = 46 s of work, saved by the checkpoint on SIGTERM (1 s, within the 30 s grace): L frees
    # the GPUs at 51. H: 20 s + 1 checkpoint = 51-72. L again from 72: 2 s restart + 54 s of
    # work + 5 checkpoints = 61 s -> 133.
    c = cluster_yaml(
        tmp_path / "c.yaml",
        gpus=2,
        extra="failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: 10s, cost: 1s, restart: 2s}\n",
    )
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 100, "gpus": 2, "priority": "low"},
            {"submit_time": 50, "duration": 20, "gpus": 2, "priority": "high"},
        ],
    )
    r = run(c, t, "default")
    assert r.result.preemptions == 1
    assert r.start == {1: 0.0, 2: 51.0}
    assert r.end == {1: 133.0, 2: 72.0}
    (team,) = r.result.team_totals
    assert team[USED] == pytest.approx(2 * (51 + 61 + 21))
    assert team[LOST_PREEMPT] == pytest.approx(2 * (1 + 2))  # the SIGTERM checkpoint + the restart
    # Without preemption (strict priority) H simply waits: L 100 s + 9 checkpoints = 109.
    r = run(c, t, "priority")
    assert r.result.preemptions == 0
    assert r.end == {1: 109.0, 2: 130.0}


def test_relative_speed_scales_run_time(tmp_path: Path) -> None:
    groups = (
        "node_groups:\n"
        "  - {name: fast, count: 1, gpus_per_node: 1, gpu_model: V100}\n"
        "  - {name: slow, count: 1, gpus_per_node: 1, gpu_model: T4}\n"
        "speeds: {V100: 2.0, T4: 0.5}\n"
    )
    c = cluster_yaml(tmp_path / "c.yaml", groups=groups + QUIET)
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 100, "gpus": 1, "gpu_type": "V100"},
            {"submit_time": 0, "duration": 100, "gpus": 1, "gpu_type": "T4"},
        ],
    )
    assert run(c, t, "fifo").end == {1: 50.0, 2: 200.0}


def test_multi_node_job_slowed_by_ring_all_reduce(tmp_path: Path) -> None:
    # 16 GPUs over two 8-GPU nodes; per step 1 GB of gradients, 1 s of compute. Ring factor
    # 2(16-1)/16 = 1.875: over the 100 Gbit/s network 1.875 x 8 / 100 = 0.15 s, over 800 Gbit/s
    # NVLink 0.01875 s; run time 100 x 1.15 / 1.01875.
    groups = (
        "node_groups:\n"
        "  - {name: n, count: 2, gpus_per_node: 8, gpu_model: H100, nvlink_gbps: 800, network_gbps: 100}\n"
        "allreduce: {enabled: true, model_size_gb: 1, step_time: 1s}\n"
    )
    c = cluster_yaml(tmp_path / "c.yaml", groups=groups + QUIET)
    t = native_csv(tmp_path / "t.csv", [{"submit_time": 0, "duration": 100, "gpus": 16}])
    assert run(c, t, "fifo").end[1] == pytest.approx(100 * 1.15 / 1.01875)


def test_time_limit_stops_the_attempt_and_fails_the_job(tmp_path: Path, two_gpus: Path) -> None:
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 10, "gpus": 1, "time_limit": 4},
            {"submit_time": 0, "duration": 10, "gpus": 1, "time_limit": 40},
        ],
    )
    r = run(two_gpus, t, "fifo")
    assert r.end == {1: 4.0, 2: 10.0}
    assert r.outcome == {1: FAILED_TIME_LIMIT, 2: SUCCEEDED}


def test_job_the_scheduler_could_never_place_is_skipped_with_its_reason(tmp_path: Path, two_gpus: Path) -> None:
    t = native_csv(
        tmp_path / "t.csv",
        [{"submit_time": 0, "duration": 10, "gpus": 4}, {"submit_time": 1, "duration": 10, "gpus": 1}],
    )
    r = run(two_gpus, t, "fifo")
    assert r.end == {2: 11.0}
    ((reason, n),) = r.result.skipped.items()
    assert n == 1 and "empty cluster" in reason


def test_fractional_jobs_share_one_gpu(tmp_path: Path) -> None:
    c = cluster_yaml(tmp_path / "c.yaml", gpus=1, extra=QUIET)
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 10, "gpus": 0.5},
            {"submit_time": 0, "duration": 10, "gpus": 0.5},
            {"submit_time": 0, "duration": 10, "gpus": 0.5},
        ],
    )
    r = run(c, t, "fifo")
    assert r.end == {1: 10.0, 2: 10.0, 3: 20.0}
    assert r.result.busy_gpu_s == pytest.approx(15.0)


def test_failures_restart_from_the_last_checkpoint_up_to_max_restarts(tmp_path: Path) -> None:
    # A GPU failure every ~86 s on average on the only GPU; checkpoints every 20 s of compute.
    c = cluster_yaml(
        tmp_path / "c.yaml",
        gpus=1,
        extra="failures: {gpu_failures_per_day: 1000, node_repair_time: 10s, max_restarts: 100000}\n"
        "checkpoints: {interval: 20s, cost: 1s, restart: 2s}\n",
    )
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 2000, "gpus": 1},  # restarts as often as needed (the spec's rule)
            {"submit_time": 0, "duration": 2000, "gpus": 1, "max_restarts": 0},  # its own rule: never
        ],
    )
    r = run(c, t, "fifo", seed=4)
    assert r.outcome == {1: SUCCEEDED, 2: FAILED_RESTARTS}
    assert r.result.restarts > 5
    (team,) = r.result.team_totals
    # the work done is exactly what job 1 asked for, plus job 2's saved part; the rest is overhead
    useful = team[USED] - team[CKPT] - team[LOST_FAIL] - team[LOST_PREEMPT]
    assert 2000 <= useful < 4000
    assert team[LOST_FAIL] > 0


def test_a_restart_waits_out_the_heads_backoff(tmp_path: Path) -> None:
    # Two 1-GPU nodes, frequent failures, quick repairs: after its n-th failure the job starts
    # again exactly 1 s x 2^(n-1) (at most 300 s) later if a node is up then, as the head does.
    from gpucluster.sim.engine import Engine
    from gpucluster.sim.readers import read_trace
    from gpucluster.sim.scheduling import load_policy, restart_delay
    from gpucluster.sim.spec import load_cluster_spec

    c = cluster_yaml(
        tmp_path / "c.yaml",
        nodes=2,
        gpus=1,
        extra="failures: {gpu_failures_per_day: 500, node_repair_time: 1s, max_restarts: 1000}\n"
        "checkpoints: {interval: 60s, cost: 1s, restart: 2s}\n",
    )
    t = native_csv(tmp_path / "t.csv", [{"submit_time": 0, "duration": 3000, "gpus": 1}])
    spec = load_cluster_spec(c)
    res = Engine(spec, read_trace(t, spec, 0).jobs, load_policy("fifo"), 9, keep_starts=True).run()
    failures = [at for at, _, why in res.interruptions_log if why == "failure"]
    starts = [at for at, _, _ in res.starts]
    assert len(failures) >= 3 and len(starts) == len(failures) + 1
    from gpucluster.core.restarts import MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S

    base, cap = RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S
    assert [restart_delay(n) for n in (1, 2, 3, 30)] == [base, 2 * base, 4 * base, cap]
    for n, (failed_at, next_start) in enumerate(zip(failures, starts[1:], strict=True), start=1):
        assert next_start >= failed_at + restart_delay(n) - 1e-9
    assert any(
        abs(s - (f + restart_delay(n))) < 1e-9 for n, (f, s) in enumerate(zip(failures, starts[1:], strict=True), 1)
    )


def test_a_fixed_scheduling_cycle_batches_decisions(tmp_path: Path) -> None:
    # scheduler.cycle 10s: plans happen only at t = 0, 10, 20, ... A starts at once (t=0 is a
    # tick); B waits for A's GPU, freed at the tick 10; C, blocked behind B by FIFO, is seen
    # after B ends at 15 only at the next tick, 20.
    c = cluster_yaml(tmp_path / "c.yaml", gpus=2, extra=QUIET + "scheduler: {cycle: 10s}\n")
    r = run(c, three_jobs(tmp_path), "fifo")
    assert r.start == {1: 0.0, 2: 10.0, 3: 20.0}
    assert r.end == {1: 10.0, 2: 15.0, 3: 23.0}


def test_an_elastic_job_grows_when_gpus_stay_free_and_pays_the_restart(tmp_path: Path) -> None:
    """Issue 17: E (elastic 2..4, 400 s of work on 4 GPUs) starts on 2 beside B (2 GPUs, 50 s).
    B ends at 50; with nothing queued the 2 GPUs stay free for grow_after (60 s) and E has run
    grow_every (60 s): at 110 it checkpoints (1 s), restarts on 4 (2 s restart) and finishes
    sooner than on 2 GPUs, having paid the stop and the restart once."""
    c = cluster_yaml(
        tmp_path / "c.yaml",
        gpus=4,
        extra="failures: {gpu_failures_per_day: 0}\ncheckpoints: {interval: 1000s, cost: 1s, restart: 2s}\n",
    )
    t = native_csv(
        tmp_path / "t.csv",
        [
            {"submit_time": 0, "duration": 50, "gpus": 2},
            {"submit_time": 0, "duration": 400, "gpus": 4, "min_gpus": 2},
        ],
    )
    policy = tmp_path / "p.yaml"
    policy.write_text("elastic: {grow_after: 60s, grow_every: 60s, restart_cost: 30s}\n")
    grown = run(c, t, str(policy))
    assert grown.result.resizes == 1 and grown.result.preemptions == 0
    policy.write_text("elastic: {enabled: false}\n")
    fixed = run(c, t, str(policy))
    assert fixed.result.resizes == 0
    assert fixed.end[2] == pytest.approx(800.0)  # 400 s of 4-GPU work on 2 GPUs, no periodic checkpoint
    # grown: 110 s on 2 GPUs (55 s of 4-GPU work, saved by the checkpoint on SIGTERM: 1 s), then a
    # 2 s restart and 345 s on 4 -> 111 + 2 + 345 = 458
    assert grown.end[2] == pytest.approx(458.0)
