"""Least attained service in the simulator (issue 25): on a workload of a few long jobs holding
every GPU and a stream of short ones behind them, `las` (with its preemption) must cut the mean
wait well below FIFO's and FIFO + backfill's, every job must still finish, and the oracle
reference must run."""

from __future__ import annotations

import math
import random
from pathlib import Path
from statistics import mean

import pytest

from gpucluster.core.queueing import TeamQueues
from gpucluster.core.scheduler import _Cycle
from gpucluster.core.snapshot import Snapshot
from gpucluster.sim.engine import Engine
from gpucluster.sim.learned import trace_shape

from .helpers import cluster_yaml, native_csv, run

H = 3600.0
# Checkpoints every 30 minutes: LAS preempts only jobs that checkpoint.
SPEC = (
    "failures: {gpu_failures_per_day: 0}\n"
    "checkpoints: {interval: 30m, cost: 10s, restart: 30s}\n"
    "trace_fill: {priority: normal, time_limit: none}\n"
)


def _workload(tmp_path: Path) -> tuple[Path, Path]:
    rows: list[dict[str, object]] = [
        {"submit_time": 0, "duration": 20 * H, "gpus": 1, "name": f"long{i}"} for i in range(2)
    ]
    rows += [{"submit_time": 2 * H + i * 1800, "duration": 600, "gpus": 1, "name": f"short{i}"} for i in range(12)]
    return cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=SPEC), native_csv(tmp_path / "t.csv", rows)


def _waits(ran_start: dict[int, float], submit: dict[int, float]) -> list[float]:
    return [ran_start[j] - submit[j] for j in submit]


def test_las_beats_fifo_on_mean_wait(tmp_path: Path) -> None:
    cluster, trace = _workload(tmp_path)
    out = {p: run(cluster, trace, p) for p in ("fifo", "fifo-backfill", "las", "oracle-sjf")}
    res = out["fifo"].result
    submit = dict(zip(res.job_id, res.submit, strict=True))
    waits = {p: mean(_waits(r.start, submit)) for p, r in out.items()}
    # FIFO: every short job waits for a 20 h job to end; LAS: the long jobs, past their first
    # GPU-hour, are preempted (after their minimum slice) for each short one.
    assert waits["fifo"] > 10 * H
    assert waits["las"] < waits["fifo"] / 5
    assert waits["las"] < waits["fifo-backfill"] / 5
    assert out["las"].result.preemptions > 0
    assert out["fifo"].result.preemptions == 0 and out["oracle-sjf"].result.preemptions == 0
    for r in out.values():  # nobody lost: every job ran to its end
        assert all(e >= 0 for e in r.end.values())


def test_las_without_checkpoints_never_preempts(tmp_path: Path) -> None:
    """A job that does not checkpoint would lose all its work: it is never an LAS victim."""
    cluster, trace = _workload(tmp_path)
    cluster.write_text(cluster.read_text().replace("interval: 30m", "interval: none"))
    ran = run(cluster, trace, "las")
    assert ran.result.preemptions == 0


def test_gittins_orders_by_runs_finished_so_far_never_by_the_trace(tmp_path: Path) -> None:
    """One GPU. First, `quick` jobs end in a minute and `slow` ones in 50 minutes, one after
    another, so the replay learns both. Then, behind a running job, a `slow` job and a later
    `quick` one wait; this time the trace gives the `quick` one 50 minutes and the `slow` one a
    minute. `las` starts the older (`slow`); `las-gittins` the one whose kind finished soonest so
    far (`quick`), though its own run is the long one: it learns from what finished, never from
    the trace's run times (the oracle, which reads them, starts `slow`)."""
    rows: list[dict[str, object]] = []
    for i in range(6):
        name, took = ("quick", 60) if i % 2 == 0 else ("slow", 3000)
        rows.append({"submit_time": i * H, "duration": took, "gpus": 1, "name": name})
    rows.append({"submit_time": 10 * H, "duration": 1000, "gpus": 1, "name": "other"})
    rows.append({"submit_time": 10 * H + 10, "duration": 60, "gpus": 1, "name": "slow"})
    rows.append({"submit_time": 10 * H + 20, "duration": 3000, "gpus": 1, "name": "quick"})
    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=1, extra=SPEC)
    trace = native_csv(tmp_path / "t.csv", rows)
    first = {}
    for policy in ("las", "las-gittins", "oracle-sjf"):
        ran = run(cluster, trace, policy)
        slow, quick = sorted(ran.start)[-2:]
        assert ran.start[slow] >= 10 * H + 1000 and ran.start[quick] >= 10 * H + 1000
        first[policy] = "slow" if ran.start[slow] < ran.start[quick] else "quick"
    assert first == {"las": "slow", "las-gittins": "quick", "oracle-sjf": "slow"}


def test_the_learned_map_holds_the_queued_jobs_requeued_ones_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `las-gittins` the replay's learned map (sim/learned.py) holds the queued jobs, as the
    head's does: a job leaves it when it starts and comes back, with its kind's distribution of
    the moment, when preempted back to the queue. Checked at every snapshot against a look-up of
    the predictor: no running job in it, every queued job with history in it."""
    rows: list[dict[str, object]] = [
        {"submit_time": i * 60, "duration": 300 + 60 * i, "gpus": 1, "name": "long"} for i in range(4)
    ]
    rows += [{"submit_time": H, "duration": 20 * H, "gpus": 1, "name": "long"} for _ in range(2)]
    rows += [{"submit_time": 3 * H + i * 1800, "duration": 600, "gpus": 1, "name": f"short{i}"} for i in range(8)]
    cluster = cluster_yaml(tmp_path / "c.yaml", nodes=1, gpus=2, extra=SPEC)
    trace = native_csv(tmp_path / "t.csv", rows)
    requeued_with_history = 0
    snapshot = Engine._snapshot

    def checked(engine: Engine, now: float) -> Snapshot:
        nonlocal requeued_with_history
        snap = snapshot(engine, now)
        learned = engine._learned
        assert learned is not None
        assert not snap.runtime_dist.keys() & {r.job_id for r in snap.running}
        for q in snap.queued:
            shape = trace_shape(engine._active[q.job_id].trace, "", learned._only_model)
            want = learned.predictor.distribution(shape)
            got = snap.runtime_dist.get(q.job_id)
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert (got.values, got.scale) == (want.values, want.scale)
                requeued_with_history += q.queued_at is not None
        return snap

    monkeypatch.setattr(Engine, "_snapshot", checked)
    ran = run(cluster, trace, "las-gittins")
    assert ran.result.preemptions > 0 and requeued_with_history > 0


def test_jobs_skipped_by_request_number_replay_as_jobs_popped_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A contended replay under `las-gittins` (kept ranks, kept team lines, requests numbered):
    the plan-only cycle takes the jobs whose (request, queue) changed nothing off the line by
    their numbers (`_AfterPreemptor.skip_kept` through `TeamQueues.front_requests`). The same
    replay with every job popped and looked at (`_Cycle.skip_answered` off) starts every job at
    the same time. And the numbered skip was taken, or this tests nothing."""
    rng = random.Random(7)
    rows: list[dict[str, object]] = []
    t = 0.0
    for _ in range(600):
        t += rng.expovariate(1 / 120)
        rows.append(
            {
                "submit_time": round(t),
                "duration": round(math.exp(rng.uniform(math.log(60), math.log(12 * H)))),
                "gpus": rng.choice((1, 1, 1, 2, 4, 8)),
                "name": rng.choice(("a", "b", "c", "d")),
                "user": f"u{rng.randrange(6)}",
                "team": f"t{rng.randrange(3)}",
            }
        )
    groups = (  # two models: a reservation on one, then on the other, clears what was answered
        "node_groups:\n"
        "  - {name: h, count: 2, gpus_per_node: 8, gpu_model: H100-80GB, price_per_gpu_hour: 2.0}\n"
        "  - {name: a, count: 2, gpus_per_node: 4, gpu_model: A100-40GB, price_per_gpu_hour: 1.0}\n"
    )
    cluster = cluster_yaml(tmp_path / "c.yaml", extra=SPEC, groups=groups)
    trace = native_csv(tmp_path / "t.csv", rows)
    numbered = 0
    front = TeamQueues.front_requests

    def counted(queues: TeamQueues) -> object:
        nonlocal numbered
        got = front(queues)
        numbered += got is not None
        return got

    monkeypatch.setattr(TeamQueues, "front_requests", counted)
    skipped = run(cluster, trace, "las-gittins")
    assert numbered > 0
    monkeypatch.setattr(_Cycle, "skip_answered", False)
    popped = run(cluster, trace, "las-gittins")
    assert skipped.start == popped.start and skipped.end == popped.end
    assert skipped.result.preemptions == popped.result.preemptions > 0
