"""One scheduling cycle at scale under default, las and las + gittins, side by side (issue 25):
the cold cycle (no kept ranks) and the head's steady-state cycle (ranks kept across cycles).

  python bench/bench_las_cycle.py [--nodes 10000] [--jobs 100000] [--cycles 3] [--shapes 200] [--churn 100]

What the head would pay per cycle if `las` or `las-gittins` were its policy: bench_scheduler.py's
snapshot (Philly's GPU counts, 50 teams with quotas, ~90% full), the same for every policy, with
a third of the queued jobs having run before (attained service drawn from 0-20 GPU-hours, the
share of requeued jobs on Philly under `las`) and, for `las-gittins`, every queued job given one
of `--shapes` learned distributions (a predictor fed 256 log-normal run times per shape, the
head's window), plus the head's own step of mapping each queued job to its shape's
distribution (RuntimePredictor.distribution once per shape, a dict lookup per job), timed
apart. Each policy's cycles run alternately in this one process, collector paused as the head
pauses it; CPU seconds (on a shared machine wall time mostly measures the others). Prints the
median of `--cycles` cycles per policy and its ratio to default's.

Three rows per policy:
- `cold`: `decide(snap, policy, 0)` with plain maps and no rank book, so every cycle ranks every
  queued job from scratch (attained ranks, Gittins) and sorts every team line by rank. The head
  pays this once: its first plan after a start (or after its policy's ordering changed).
- `probe`: the dry run's cycle (`gpucluster submit --dry-run`, `why --what-if`:
  head/dry_run.py), the `cold` one with `capacity=None` as the dry run hands it (it never
  touches the loop's kept index), so the free capacity is built afresh each time, from the
  inventory the process keeps for these nodes (core/inventory.py: built by the first `cold`
  cycle here, by the loop's index in a head). The estimate replay the dry run adds for a job
  that does not start is not in it.
- `kept`: the head's steady state. The inputs are kept as the head keeps them, with its own code:
  the queue in a `ClusterState` fed `Submitted`/`Ended` events (its told queue index handed to
  `decide`, as head/loop.py's `snapshot` hands `cluster.queue_index`), the attained service and
  the rank book in head/kept_ranks.py's `KeptRanks` (fed a whole attained map each cycle, as the
  head reads it from its store), the learned distributions in core/learned_kinds.py's
  `LearnedKinds` (what head/runtime_model.py keeps). Between two cycles the clock moves 5 s and
  `--churn` queued jobs leave (started or cancelled), as many new ones arrive, a fifth as many
  are requeued with more attained service, and one shape learns a run (its jobs are ranked again
  under Gittins at the next relearn: `ordering.relearn_every`, 10 minutes, so at most once in
  120 kept cycles; the median is a cycle between relearns, as most of the head's are). The
  running jobs stay those of the snapshot, so every cycle sees the same free
  GPUs (the plans start about as many jobs as the cold ones). The first kept cycle builds the
  book (a cold cycle) and the told queue index from every queued job: it is what a head's first
  plan after a start pays, printed apart and not counted in the median. `kept inputs`: the
  head's own per-cycle step for them (`KeptRanks.attained` over the whole attained map,
  `LearnedKinds.distributions`), timed apart.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import build
from gpucluster.core.attained import Ordering
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.cluster_state import ClusterState
from gpucluster.core.events import Ended, Submitted
from gpucluster.core.learned_kinds import LearnedKinds
from gpucluster.core.policy import Policy
from gpucluster.core.runtime_predict import FinishedRun, JobShape, RunDistribution, RuntimePredictor
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.head.kept_ranks import KeptRanks
from gpucluster.head.runtime_model import RuntimeModel
from gpucluster.store import Store

T = TypeVar("T")
H = 3600.0
STEP_S = 5.0  # the clock between two kept cycles


class _AttainedStore:
    """The one store read `KeptRanks.attained` makes: the whole attained map, a new dict each
    plan (as `Store.attained_gpu_seconds` returns)."""

    def __init__(self, attained: dict[int, float]) -> None:
        self.values = attained

    def attained_gpu_seconds(self) -> dict[int, float]:
        return dict(self.values)


class Kept:
    """One policy's head-side state across cycles (see the module docstring)."""

    def __init__(
        self,
        snap: Snapshot,
        policy: Policy,
        attained: dict[int, float],
        predictor: RuntimePredictor,
        shape_of: dict[int, JobShape],
    ) -> None:
        self.base, self.policy = snap, policy
        self.state = ClusterState.build(queued=snap.queued, running=snap.running, nodes=snap.nodes)
        self.store = _AttainedStore(dict(attained))
        # `runtime` is read by `KeptRanks.check` alone (check mode), never here.
        self.ranks = KeptRanks(cast(Store, self.store), cast(RuntimeModel, None))
        self.kinds = LearnedKinds(predictor) if policy.ordering.gittins else None
        if self.kinds is not None:
            for job in snap.queued:
                self.kinds.arrived(job.job_id, shape_of[job.job_id])
        self.shape_of = shape_of
        self.now = 0.0

    def inputs(self) -> tuple[Mapping[int, float], Mapping[int, RunDistribution]]:
        """The head's per-cycle step for the ranked inputs (`kept inputs`)."""
        every = self.policy.ordering.relearn_every_s
        dists: Mapping[int, RunDistribution] = (
            self.kinds.distributions(self.now, every) if self.kinds is not None else {}
        )
        return self.ranks.attained(self.policy.ordering), dists

    def snapshot(self, inputs: tuple[Mapping[int, float], Mapping[int, RunDistribution]]) -> Snapshot:
        attained, dists = inputs
        return replace(
            self.base,
            queued=tuple(self.state.queued.values()),
            capacity=self.state.capacity,
            queue_index=self.state.queue_index,
            attained=attained,
            runtime_dist=dists,
            rank_book=self.ranks.book_for(self.policy.ordering),
        )

    def churn(self, rng: random.Random, n: int, next_id: int) -> int:
        """Between two cycles (the same draws for every policy: `rng` is seeded alike)."""
        self.now += STEP_S
        queued, state = self.state.queued, self.state
        ids = list(queued)
        for job_id in rng.sample(ids, n):  # left: started or cancelled
            state.apply(Ended(job_id))
            self.store.values.pop(job_id, None)
            if self.kinds is not None:
                self.kinds.left(job_id)
        template = list(queued.values())
        for _ in range(n):  # arrived
            like = template[rng.randrange(len(template))]
            job = replace(like, job_id=next_id, submitted_at=self.now, queued_at=None)
            shape = self.shape_of[like.job_id]
            self.shape_of[next_id] = shape
            state.apply(Submitted(job))
            if self.kinds is not None:
                self.kinds.arrived(next_id, shape)
            next_id += 1
        for job_id in rng.sample(list(queued), max(1, n // 5)):  # requeued after another attempt
            job = queued[job_id]
            state.apply(Submitted(replace(job, queued_at=self.now)))
            self.store.values[job_id] = self.store.values.get(job_id, 0.0) + rng.uniform(0, 2 * H)
        shape = self.shape_of[rng.choice(ids)]  # a run of one shape finished
        run = FinishedRun(shape, rng.lognormvariate(8, 1.5))
        if self.kinds is not None:
            self.kinds.predictor.add(run)
            self.kinds.learned(shape)
        return next_id


def _timed(call: Callable[[], T]) -> tuple[float, T]:
    gc.disable()
    t0 = time.process_time()
    try:
        out = call()
    finally:
        gc.enable()
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--shapes", type=int, default=200)
    ap.add_argument("--churn", type=int, default=100, help="queued jobs that leave (and arrive) between kept cycles")
    a = ap.parse_args()
    rng = random.Random(11)
    snap, default = build(a.nodes, a.jobs)
    queued = snap.queued
    attained = {q.job_id: rng.uniform(0, 20 * H) for q in queued if rng.random() < 1 / 3}
    predictor = RuntimePredictor()
    shapes = [JobShape(f"u{i}", f"t{i % 50}", f"name:w{i}", 8, "H100", None) for i in range(a.shapes)]
    runs: list[FinishedRun] = []
    for shape in shapes:
        mu = rng.uniform(5, 11)  # medians from ~2.5 minutes to ~17 hours
        for _ in range(256):
            runs.append(FinishedRun(shape, rng.lognormvariate(mu, 1.5)))
            predictor.add(runs[-1])
    shape_of = {q.job_id: shapes[rng.randrange(len(shapes))] for q in queued}

    def dists() -> dict[int, RunDistribution]:
        by_shape = {s: predictor.distribution(s) for s in shapes}
        return {q.job_id: d for q in queued if (d := by_shape[shape_of[q.job_id]]) is not None}

    t0 = time.process_time()
    runtime_dist = dists()
    mapping_s = time.process_time() - t0
    las = replace(default, ordering=Ordering(mode="las", preempt=True))
    gittins = replace(default, ordering=Ordering(mode="las", preempt=True, runtime_model="gittins"))
    snaps: dict[str, tuple[Snapshot, Policy]] = {
        "default": (replace(snap, capacity=CapacityIndex()), default),
        "las": (replace(snap, capacity=CapacityIndex(), attained=attained), las),
        "las-gittins": (replace(snap, capacity=CapacityIndex(), attained=attained, runtime_dist=runtime_dist), gittins),
    }
    # Each policy's kept state has its own predictor (a learned run changes its distributions).
    kept: dict[str, Kept] = {}
    for name, (s, pol) in snaps.items():
        own = RuntimePredictor()
        for run in runs:
            own.add(run)
        kept[name] = Kept(s, pol, attained if pol.ordering.ranked and s.attained else {}, own, dict(shape_of))
    churn = {name: random.Random(25) for name in snaps}
    next_id = {name: 10_000_000 for name in snaps}
    times: dict[str, list[float]] = {f"{k} {m}": [] for k in snaps for m in ("cold", "kept", "probe")}
    inputs_s: dict[str, list[float]] = {k: [] for k in snaps}
    starts: dict[str, int] = {}
    for _ in range(a.cycles + 1):  # the first cycle of each builds its indexes and book: not counted
        for name, (s, pol) in snaps.items():
            spent, plan = _timed(lambda s=s, pol=pol: decide(s, pol, 0.0))
            times[f"{name} cold"].append(spent)
            starts[f"{name} cold"] = len(plan.starts)
            probe = replace(s, capacity=None, queue_index=None)
            spent, plan = _timed(lambda probe=probe, pol=pol: decide(probe, pol, 0.0))
            times[f"{name} probe"].append(spent)
            starts[f"{name} probe"] = len(plan.starts)
            k = kept[name]
            spent, got = _timed(k.inputs)
            inputs_s[name].append(spent)
            ks = k.snapshot(got)
            spent, plan = _timed(lambda ks=ks, pol=pol, k=k: decide(ks, pol, k.now))
            times[f"{name} kept"].append(spent)
            starts[f"{name} kept"] = len(plan.starts)
            next_id[name] = k.churn(churn[name], a.churn, next_id[name])
    print(
        f"{a.nodes} nodes x 8 GPUs, {len(queued)} queued, {len(attained)} ran before, {a.shapes} shapes, "
        f"kept: churn {a.churn} a cycle"
    )
    base = statistics.median(times["default cold"][1:])
    for name, ts in times.items():
        med = statistics.median(ts[1:])
        worst, ratio = max(ts[1:]), med / base
        print(f"{name:<17} median {med:.3f} CPU-s  max {worst:.3f}  {ratio:.2f}x default cold  starts {starts[name]}")
    for name in snaps:  # the head's first plan after a start: its told index and its book built
        print(f"{name:<12} first kept cycle (a head's first plan after a start) {times[f'{name} kept'][0]:.3f} CPU-s")
    print(f"las-gittins's per-cycle mapping of queued jobs to distributions (cold): {mapping_s:.3f} CPU-s")
    for name, ts in inputs_s.items():
        print(f"kept inputs {name:<12} median {statistics.median(ts[1:]):.3f} CPU-s")


if __name__ == "__main__":
    main()
