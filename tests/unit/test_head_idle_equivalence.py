"""The head's idle cycles (issue 18) against full plans: a cycle that is not the periodic replan,
on a cluster where nothing can start (`core.scheduler.certainly_idle`), leaves the waits to the
next replan. Two heads on identical random histories, one that skips such cycles and one that
plans in full every cycle (`Head.skip_idle_plans` off), must start and preempt the same jobs on
the same GPUs at every cycle; a skipped plan must be one whose full plan starts and preempts
nothing; and after each of the skipping head's full plans both must give every queued job the
same wait reason and order. (Written by a helper for its own version of the skip; kept for this one.)
"""

from __future__ import annotations

import random
import signal
from dataclasses import replace
from pathlib import Path

from gpucluster.core.scheduler import decide
from gpucluster.core.states import JobState

from .headkit import T0, Cluster, make_cluster

STEPS = 60


def _running(c: Cluster) -> dict[int, tuple[object, str | None]]:
    return {j.id: (j.allocation, j.stop_reason) for j in c.store.list_jobs() if j.state is JobState.RUNNING}


def test_skipping_heads_start_and_preempt_what_full_plans_do(tmp_path: Path) -> None:
    """Six random histories. A history with high-priority jobs may never be idle (one could
    always preempt); together they are, so skips are compared, not only full plans."""
    assert sum(_compare(tmp_path / str(seed), seed) for seed in range(6)) > 0


def _compare(tmp_path: Path, seed: int) -> int:
    """Run both heads through one random history; how many cycles the skipping head skipped."""
    rng = random.Random(seed)
    gpus = rng.choice((4, 8))
    for name in ("quick", "full"):
        (tmp_path / name).mkdir(parents=True)
    quick = make_cluster(tmp_path / "quick", gpus=gpus, nodes=2)
    full = make_cluster(tmp_path / "full", gpus=gpus, nodes=2)
    full.head.skip_idle_plans = False
    for c in (quick, full):  # replays throttled alike: by a CPU clock that does not move
        c.head.estimates.cpu_clock = lambda: 0.0
    skipped = 0
    try:
        for c in (quick, full):
            c.fake.exit_on_signal[signal.SIGTERM] = 143  # a preempted job leaves at its SIGTERM
        t = T0
        for _ in range(STEPS):
            news = rng.random()
            if news < 0.7:  # a burst of submissions, the common case
                for _ in range(rng.randint(1, 6)):
                    fields = {
                        "gpus": rng.choice((1, 1, 2, 4)),
                        "team": rng.choice(("a", "b", "c")),
                        "priority": rng.choice(("low", "normal", "normal", "high")),
                        "time_limit": rng.choice((600, 3600, 7200)),
                    }
                    assert quick.submit(**fields) == full.submit(**fields)
            elif news < 0.8:  # a cancel of a queued job
                queued = [j.id for j in full.store.list_jobs() if j.state is JobState.QUEUED]
                if queued:
                    victim = rng.choice(queued)
                    quick.service.cancel(victim)
                    full.service.cancel(victim)
            elif news < 0.95:  # a running job ends
                running = full.fake.running()
                if running:
                    ended = rng.choice(running)
                    quick.fake.finish(ended)
                    full.fake.finish(ended)
            t += rng.choice((0.05, 0.05, 0.1, 0.3, 1.2))
            quick.tick_at(t)
            full.tick_at(t)
            assert _running(quick) == _running(full)
            head = quick.head
            if head.idle_skips > skipped:
                skipped += 1
                snap = head.last_snapshot
                assert snap is not None
                # Skipped: the full plan of the same snapshot would have started and preempted nothing.
                plan = decide(replace(snap, queue_index=None, capacity=None), head.planning_policy, t)
                assert not plan.starts and not plan.preemptions
            else:
                assert {k: w.reason for k, w in head._reasons.items()} == {
                    k: w.reason for k, w in full.head._reasons.items()
                }
                assert head.queue_order == full.head.queue_order
        return skipped
    finally:
        quick.close()
        full.close()
