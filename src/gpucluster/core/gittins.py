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

from gpucluster.core.runtime_predict import RunDistribution

H = 3600.0
INF = float("inf")
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
        # An earlier distribution of the key may have it (runtime_predict._Samples: exact).
        got = dist.carried_index(a, d) if dist.carry else None
        if got is None:
            got = _unscaled(dist.values, dist.prefix, a, d)
        memo[(a, d)] = got
    return got / c


def _unscaled(values: tuple[float, ...], prefix: tuple[float, ...], a: float, d: float) -> float:
    """`index` on the unscaled values. For d between two sample points the number finished is
    constant and the expected service grows, so the sup is reached at a sample point: each
    survivor's value v (at most a + d) is a candidate d = v - a.

    Cost: ~700 k calls over ~50 candidates on whole Philly under `las-gittins` (a key's jobs are
    ranked again each time a run of that key ends), ~11 of its ~90 CPU-s. The run of equal
    values is stepped over by comparison (most runs are one value long) rather than a bisection
    call each, and the best kept by a comparison rather than a `max` call: 1.8x faster, the same
    float operations in the same order (tests/unit/test_gittins.py checks it bit for bit)."""
    n = len(values)
    i0 = bisect_right(values, a)
    end = bisect_right(values, a + d) if d != INF else n
    best = 0.0
    p0 = prefix[i0]
    j = i0
    while j < end:
        v = values[j]
        k = j + 1
        while k < end and values[k] == v:  # ties: every survivor of value v finishes at v - a
            k += 1
        done = k - i0
        # E[min(S - a, v - a)] x survivors: the finished ones' (S - a), the rest's (v - a).
        spent = (prefix[k] - p0) - a * done + (v - a) * (n - k)
        if spent > 0.0:
            r = done / spent
            if r > best:
                best = r
        else:
            return INF  # survivors that finish at once: nothing ranks before them
        j = k
    return best


def rank_fraction(per_gpu_s: float) -> float:
    """An index (per GPU-second) as a fraction of a queue, in [0, 1): higher index, smaller
    fraction (goes first); 1 GPU-hour expected to finish a job maps to 0.5."""
    return min(_LAST, 1.0 / (1.0 + per_gpu_s * H))
