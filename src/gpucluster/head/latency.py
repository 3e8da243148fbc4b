"""What the head learns of its own pace for the estimates: start and stop latency.

Why learned rather than configured: both depend on the machine, the executor and the load (a
local head on an idle laptop starts a job 0.1 s after the GPUs free; a Ray head on a busy
cluster, seconds after), so the head reads them off its own recent history: the median, over
the last attempts, of how long after a job ended its GPUs were committed to a job that waited
for them (start), and of how long after its time limit a job stopped at it had ended (stop).
The numbers go into the core (`core.estimate.Latency`), which stays pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from gpucluster.core.estimate import Latency
from gpucluster.store import Store

# The most either latency is believed to be: a longer one is an outage, not the head's pace.
MAX_LATENCY_S = 600.0


@dataclass(frozen=True)
class PastAttempt:
    """One ended attempt, as far as the latencies need it."""

    started_at: float
    ended_at: float
    gpus: frozenset[tuple[str, int]]  # (node, GPU index) it held
    queued_at: float  # when its job last entered the queue
    time_limit_s: float | None = None
    timed_out: bool = False  # ended by the head at its time limit


def learn(attempts: Sequence[PastAttempt]) -> Latency:
    """The median start and stop latencies of `attempts` (0 where none shows one)."""
    stops = [
        a.ended_at - (a.started_at + a.time_limit_s) for a in attempts if a.timed_out and a.time_limit_s is not None
    ]
    starts = []
    by_end = sorted(attempts, key=lambda a: a.ended_at)
    for b in attempts:
        # The attempt whose GPUs it took: the last to end, before it started, of those sharing a
        # GPU with it, ending after its job was queued (it waited for them, not for something else).
        freed = [a.ended_at for a in by_end if a.ended_at <= b.started_at and a.gpus & b.gpus and a is not b]
        if freed and freed[-1] >= b.queued_at:
            starts.append(b.started_at - freed[-1])
    return Latency(start_s=_median(starts), stop_s=_median(stops))


def _median(values: list[float]) -> float:
    good = [v for v in values if 0 <= v <= MAX_LATENCY_S]
    return float(median(good)) if good else 0.0


# Attempts the latencies are learned from: the recent pace, not the whole history.
SAMPLE = 50


def from_store(store: Store, sample: int = SAMPLE) -> Latency:
    """The latencies learned from the `sample` attempts that ended last in `store`."""
    past = []
    for started, ended, allocation, queued, limit_s, timed_out in store.recent_attempts(sample):
        gpus = frozenset((s.node, i) for s in allocation.slices for i in s.gpu_indices) if allocation else frozenset()
        past.append(PastAttempt(started, ended, gpus, queued, limit_s, timed_out))
    return learn(past)
