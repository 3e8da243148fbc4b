"""The Gittins index of a queued job, from the learned run times of jobs like it (issue 25).

Why: least attained service (core/attained.py) assumes nothing about a job beyond what it has
had, so inside one attained-service queue it can only keep arrival order. When the cluster has
seen jobs like this one finish (core/runtime_predict.py's similarity keys, the same ones its
start estimates use), it knows the distribution of their run times, and with a known
distribution the Gittins index is the order that minimises mean completion time (Gittins 1989;
Tiresias, NSDI '19, uses it "when the distribution is known"). A job that has already run `a`
seconds, out of a distribution S, has the index

    G(a) = sup over 0 < d <= quantum of  P(S - a <= d | S > a) / E[min(S - a, d) | S > a]

the best rate at which it can be expected to finish per unit of service it is given, looking no
further than the service it may still have in its queue (`quantum`: up to the next threshold;
the last queue: no end), per GPU-second (divided by its GPUs, as attained service counts
GPU-seconds). Higher goes first. A job whose similar jobs have all finished by its attained
time (it outlived every one of them) has index 0: what is known says it is one of the long ones.

The index only orders jobs inside one queue: `rank_fraction` maps it into [0, 1) and
core/attained.py adds it to the queue number, so queues, promotion, classes, fair share and
quotas keep their order exactly as under plain `las`, and attained-service preemption still
compares queues only (`int(rank)`).

Cost: with sorted run times and their prefix sums (`RunDistribution`), each candidate `d` is
O(1); the sup is over the sample points within the quantum (at most the predictor's window, 256),
and a distribution memoises its answers per (attained, quantum) (`RunDistribution.memo`), so a
job that waits many cycles is worked out once per change of its key's runs. Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import compress, repeat
from operator import add, mul, ne, sub, truediv

from gpucluster.core.runtime_predict import RunDistribution

H = 3600.0
# The largest fraction below 1: an index of 0 must still rank inside its own queue.
_LAST = 1.0 - 2.0**-30


def index(dist: RunDistribution, attained_s: float, quantum_s: float) -> float:
    """G(attained_s) of a job whose run time (seconds) is distributed as `dist`, looking at most
    `quantum_s` seconds ahead (inf: no limit): completions per second of service."""
    c = dist.scale
    a, d = attained_s / c, quantum_s / c
    memo = dist.memo
    got = memo.get((a, d))
    if got is None:
        got = memo[(a, d)] = _unscaled(dist.values, dist.prefix, a, d)
    return got / c


def _unscaled(values: tuple[float, ...], prefix: tuple[float, ...], a: float, d: float) -> float:
    """`index` on the unscaled values. For d between two sample points the number finished is
    constant and the expected service grows, so the sup is reached at a sample point: each
    survivor's value v (at most a + d) is a candidate d = v - a; of equal values, the last (every
    survivor of value v finishes at v - a), so a candidate k is where a run of equal values ends.

    Worked out with C-level maps over the candidates, not a Python step each: ~700 k calls over
    ~60 candidates on whole Philly under `las-gittins` (a key's jobs are ranked again each time a
    run of that key ends) were ~11 of its ~95 CPU-s. Each candidate's figures are the same float
    operations in the same order as the loop they replace (tests/unit/test_gittins.py keeps it)."""
    n = len(values)
    i0 = bisect_right(values, a)
    end = bisect_right(values, a + d) if d != float("inf") else n
    if i0 >= end:
        return 0.0
    # Candidates k (one past a run of equal values): where the next value differs, and `end`.
    ks = list(compress(range(i0 + 1, end), map(ne, values[i0 : end - 1], values[i0 + 1 : end])))
    ks.append(end)
    done = list(map(sub, ks, repeat(i0)))
    # E[min(S - a, v - a)] x survivors: the finished ones' (S - a), the rest's (v - a), i.e.
    # (prefix[k] - prefix[i0]) - a * done + (v - a) * (n - k), v = values[k - 1].
    finished = map(sub, map(sub, map(prefix.__getitem__, ks), repeat(prefix[i0])), map(mul, repeat(a), done))
    rest = map(mul, map(sub, map(values.__getitem__, map(sub, ks, repeat(1))), repeat(a)), map(sub, repeat(n), ks))
    spent = list(map(add, finished, rest))
    if min(spent) <= 0.0:
        return float("inf")  # survivors that finish at once: nothing ranks before them
    best: float = max(map(truediv, done, spent))
    return best


def rank_fraction(per_gpu_s: float) -> float:
    """An index (per GPU-second) as a fraction of a queue, in [0, 1): higher index, smaller
    fraction (goes first); 1 GPU-hour expected to finish a job maps to 0.5."""
    return min(_LAST, 1.0 / (1.0 + per_gpu_s * H))
