"""How long a job will run, predicted from the cluster's own finished jobs (issue 24).

Why: every estimate used to assume a job runs to its time limit, and users write limits with a
wide margin (a 2 h job asks for 8 h so it is never killed), so start estimates were hours late.
The cluster has the better number in its history: the same user's earlier runs of the same
workload, on the same GPUs, took about as long.

The model is deliberately simple and explainable ("from 37 similar jobs"): finished runs are
grouped by similarity keys, from most to least specific, and the first key with at least
`min_samples` runs answers with quantiles of their run times (median as the point, 10% and
90% as a range):

  1. user, workload, GPU count, GPU model
  2. user, workload
  3. team, workload, GPU count
  4. user, GPU count
  5. team, GPU count
  6. team

A workload is the job's name, or its command's program and first argument when the name is a
generated `job-N`. On the keys that name the workload, run times count in seconds: the same
workload runs about as long whatever limit its user wrote. On the coarser keys (different
workloads) a job's own time limit is the best sign of its scale, so those answer with the
ratio of run time to time limit, multiplied by the job's limit (when both have limits).

Never above the limit: a job is stopped at its limit, so no prediction may say later. With no
key holding enough runs, the prediction is the time limit (the old assumption), marked as
such. Each key keeps only its `window` most recent runs, so the model follows a workload
that got faster, and memory stays bounded. Pure: no I/O, no clock; the caller feeds runs
(the head from its store, incrementally; the simulator as its jobs end).
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, cast

# Similarity keys, most specific first: (name shown to users, fields, counts in seconds).
LEVELS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("same user, workload, GPUs and model", ("user", "workload", "gpus", "model"), True),
    ("same user and workload", ("user", "workload"), True),
    ("same team, workload and GPUs", ("team", "workload", "gpus"), True),
    ("same user and GPUs", ("user", "gpus"), False),
    ("same team and GPUs", ("team", "gpus"), False),
    ("same team", ("team",), False),
)
MIN_SAMPLES = 3
INF = float("inf")
_EXACT_BELOW = float(2**53)  # whole numbers below this add exactly in floats
_CARRY_DEPTH = 4  # earlier distributions of a key a new one reads (`_Samples`)
WINDOW = 256
_GENERATED_NAME = re.compile(r"^(job-\d+|line\d+)$")


def workload_of(name: str, command: tuple[str, ...] | list[str] = ()) -> str:
    """What makes two jobs "the same workload": the name the user gave it; for a generated
    name (`job-17`), the command's program and first argument (`python train.py`), paths
    reduced to their last part so a different checkout still matches."""
    if name and not _GENERATED_NAME.match(name):
        return "name:" + name
    parts = [p.rsplit("/", 1)[-1] for p in list(command)[:2]]
    return "cmd:" + " ".join(parts) if parts else ""


@dataclass(frozen=True)
class JobShape:
    """What the predictor knows of a job before it runs."""

    user: str
    team: str
    workload: str  # workload_of(name, command); "" when unknown
    gpus: float
    model: str  # the GPU model it ran on (finished) or will most likely get ("" if unknown)
    time_limit_s: float | None


@dataclass(frozen=True)
class FinishedRun:
    """One finished job: its shape and how long its last attempt ran (a run stopped at its
    limit counts as the limit: it ran at least that long)."""

    shape: JobShape
    run_s: float


@dataclass(frozen=True)
class Prediction:
    run_s: float  # the point prediction (median), never above the time limit
    low_s: float  # 10% quantile
    high_s: float  # 90% quantile
    samples: int  # similar finished jobs it comes from; 0: the time-limit fallback
    basis: str  # which similarity key answered, or "time limit"

    @property
    def learned(self) -> bool:
        return self.samples > 0

    def sentence(self) -> str:
        """'expected to run ~2 h 10 m (from 37 similar jobs: same user and workload)'."""
        if not self.learned:
            return f"expected to run up to its time limit, {duration_words(self.run_s)} (no similar finished jobs yet)"
        jobs = "job" if self.samples == 1 else "jobs"
        return f"expected to run ~{duration_words(self.run_s)} (from {self.samples} similar {jobs}: {self.basis})"


def duration_words(seconds: float) -> str:
    """2 h 10 m, 45 m, 30 s, 3 d 4 h: two units at most, rounded, for people."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    m = round(s / 60)
    if m < 60:
        return f"{m} m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} m" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


_Carry = tuple[tuple[dict[tuple[float, float], float], dict[tuple[float, float, tuple[float, ...]], float], float], ...]


class _Samples:
    """The `window` latest values of one key, with their sorted copy (and the distribution made
    of it) made when first asked after a change.

    A new distribution reads the Gittins indexes and ranks of the key's last ones
    (`RunDistribution.memo`, `ranks`) that cannot have changed (`carried_index`, `carried_rank`:
    a link to each, not a copy: copying the memos at each new distribution cost most of what
    it saved). Why: a key's every finished run makes a new
    distribution, and each queued job of that key that ran before had its index worked out
    again (~700 k times on whole Philly under `las-gittins`, the largest cost of its ranks). An
    index at attained `a` reads only the values above `a` (core/gittins.py's `_unscaled`: the
    others enter through `prefix[k] - prefix[i0]` and counts), so where every value that came
    or went since is at most `a`, it is the same number, bit for bit, provided both prefix
    sums are exact: every value a whole number and the sum below 2**53 (`RunDistribution.exact`),
    as run times in whole seconds are. Ratios to a time limit mostly are not: nothing is carried
    for them. At most `_CARRY_DEPTH` links, so old memos are let go."""

    __slots__ = ("_dist", "_fraction", "_moved", "_prev", "_sorted", "values")

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] | None = None
        self._dist: RunDistribution | None = None
        self._fraction = 0  # values of the window that are not whole numbers
        self._prev: RunDistribution | None = None  # the last distribution made, while exact
        self._moved = -INF  # the largest value that came or went since `_prev` was made

    def add(self, v: float) -> None:
        values = self.values
        moved = v
        ordered = self._sorted
        # Kept sorted: a copy with one value in and one out, not a sort of the window (a NaN,
        # which no order holds, is sorted again as before).
        ordered = ordered.copy() if ordered is not None and v == v else None
        if len(values) == values.maxlen:
            old = values[0]  # leaves as `v` comes
            moved = max(moved, old)
            self._fraction -= not float(old).is_integer()
            if ordered is not None:
                if old == old:
                    del ordered[bisect_left(ordered, old)]
                else:
                    ordered = None
        self._fraction += not float(v).is_integer()
        if ordered is not None:
            insort(ordered, v)
        if self._dist is not None:
            self._prev = self._dist if self._dist.exact else None
        if moved > self._moved:
            self._moved = moved
        values.append(v)
        self._sorted = ordered
        self._dist = None

    def sorted(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self.values)
        return self._sorted

    def distribution(self) -> RunDistribution:
        if self._dist is None:
            prev, carry = self._prev, cast(_Carry, ())
            if prev is not None and self._fraction == 0:
                low = self._moved  # an older link's bound takes this one's: its answers held for every change since
                older = ((m, r, max(b, low)) for m, r, b in prev.carry[: _CARRY_DEPTH - 1])
                carry = ((prev.memo, prev.ranks, low), *older)
            self._dist = RunDistribution.of(self.sorted(), exact=self._fraction == 0, carry=carry)
            self._prev, self._moved = None, -INF
        return self._dist


@dataclass(frozen=True, eq=False)
class RunDistribution:
    """The run times of one similarity key's finished jobs, as the Gittins index reads them
    (core/gittins.py): sorted, with prefix sums so a conditional mean over any range is two
    bisections. `scale` multiplies every value: 1 for keys counted in seconds, the job's time
    limit for the coarser keys counted as ratios of run time to limit (`RuntimePredictor.
    distribution`). Compared by identity: one object per key and change, shared by every job
    of that key, so callers may cache what they derive from it."""

    values: tuple[float, ...]  # ascending
    prefix: tuple[float, ...]  # prefix[i] = sum(values[:i]); len(values) + 1 entries
    scale: float = 1.0
    # What core/gittins.py worked out from it: (attained, look-ahead) -> index. It goes with the
    # object, which its key's next run replaces.
    memo: dict[tuple[float, float], float] = field(default_factory=dict, repr=False)
    # core/attained.py's rank of a job of this distribution: (GPUs, attained GPU-seconds, the
    # queues' thresholds) -> rank. Its own (not a scaled copy's: the rank reads the scale).
    # Why: a queued job that ran before is ranked every cycle with the same three, and
    # working it out each time was most of `las-gittins`'s cost beyond `las`.
    ranks: dict[tuple[float, float, tuple[float, ...]], float] = field(default_factory=dict, repr=False)
    # Every prefix sum exact (whole-number values, sum below 2**53): `_Samples` lets the next
    # such distribution of its key read this one's memo and ranks (see there).
    exact: bool = False
    # The memos and ranks of the key's earlier exact distributions, newest first, each with the
    # attained time (unscaled) at and above which its answers are this one's (`carried`).
    carry: _Carry = field(default=(), repr=False)

    @classmethod
    def of(cls, ascending: list[float], scale: float = 1.0, exact: bool = False, carry: _Carry = ()) -> RunDistribution:
        """`exact`: the caller knows every value is a whole number (the sum is checked here);
        `carry`: what an exact one may read of its key's earlier ones (`_Samples`)."""
        prefix = (0.0, *accumulate(ascending))
        exact = exact and scale == 1.0 and prefix[-1] < _EXACT_BELOW
        return cls(tuple(ascending), prefix, scale, exact=exact, carry=carry if exact else ())

    def carried_index(self, a: float, d: float) -> float | None:
        """The index at (unscaled) attained `a` and look-ahead `d` an earlier distribution of the
        key worked out, where it is this one's (every run that came or went since is at most `a`)."""
        return self._carried(0, (a, d), a)

    def carried_rank(self, key: tuple[float, float, tuple[float, ...]]) -> float | None:
        """`carried_index` for a rank of `ranks` ((GPUs, attained GPU-seconds, queues); unscaled)."""
        return self._carried(1, key, key[1] / key[0])

    def _carried(self, table: int, key: Any, a: float) -> float | None:
        """`key` in the memos (`table` 0) or ranks (1) of the linked distributions whose answers at `a` hold."""
        for link in self.carry:
            if a < link[2]:
                return None
            got = cast("dict[Any, float]", link[table]).get(key)
            if got is not None:
                return got
        return None

    def scaled(self, scale: float) -> RunDistribution:
        # The memo is of unscaled values (core/gittins.py): a scaled copy shares it.
        return RunDistribution(self.values, self.prefix, scale, self.memo) if scale != self.scale else self


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values`, linear between neighbours (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    pos = q * (len(values) - 1)
    i = int(pos)
    if i + 1 >= len(values):
        return values[-1]
    return values[i] + (values[i + 1] - values[i]) * (pos - i)


def _key(shape: JobShape, fields: tuple[str, ...]) -> tuple[object, ...] | None:
    out: list[object] = []
    for f in fields:
        v: object = shape.workload if f == "workload" else getattr(shape, f)
        if v == "" and f in ("user", "workload"):
            return None  # unknown: never "similar" to another unknown
        out.append(v)
    return tuple(out)


# A shape's similarity keys, where to look each up (`RuntimePredictor.lookups`).
Lookups = tuple[tuple[str, "dict[tuple[object, ...], _Samples]", tuple[object, ...], float], ...]


class RuntimePredictor:
    """Finished runs in, predictions out; `add` is O(keys), `predict` O(keys) plus a sort of
    at most `window` values the first time a key is asked after it changed."""

    def __init__(self, min_samples: int = MIN_SAMPLES, window: int = WINDOW) -> None:
        if min_samples < 1 or window < min_samples:
            raise ValueError(f"min_samples must be >= 1 and window >= min_samples, got {min_samples}, {window}")
        self.min_samples = min_samples
        self.window = window
        self._seconds: list[dict[tuple[object, ...], _Samples]] = [{} for _ in LEVELS]
        self._ratios: list[dict[tuple[object, ...], _Samples]] = [{} for _ in LEVELS]
        self.runs = 0  # runs added so far

    def add(self, run: FinishedRun) -> None:
        if run.run_s < 0:
            raise ValueError(f"run_s must be >= 0, got {run.run_s}")
        self.runs += 1
        limit = run.shape.time_limit_s
        for i, (_, fields, seconds) in enumerate(LEVELS):
            key = _key(run.shape, fields)
            if key is None:
                continue
            if seconds:
                self._slot(self._seconds[i], key).add(run.run_s)
            elif limit:
                self._slot(self._ratios[i], key).add(min(1.0, run.run_s / limit))
            else:
                self._slot(self._seconds[i], key).add(run.run_s)

    def _slot(self, table: dict[tuple[object, ...], _Samples], key: tuple[object, ...]) -> _Samples:
        s = table.get(key)
        if s is None:
            s = table[key] = _Samples(self.window)
        return s

    def lookups(self, shape: JobShape) -> Lookups:
        """Where `shape`'s similarity keys are looked up, most specific first: (the key's name,
        its table, the key, what multiplies its runs into seconds). Fixed for a shape (the
        tables are the predictor's own, kept for its life), so a caller that asks about one
        shape often (sim/learned.py, after every finished run of its team or user) keeps them
        and asks `distribution_from`: building the keys was most of that question's cost."""
        out: list[tuple[str, dict[tuple[object, ...], _Samples], tuple[object, ...], float]] = []
        for i, (basis, fields, seconds) in enumerate(LEVELS):
            key = _key(shape, fields)
            if key is None:
                continue
            if not seconds and shape.time_limit_s:
                out.append((basis, self._ratios[i], key, shape.time_limit_s))
            else:
                out.append((basis, self._seconds[i], key, 1.0))
        return tuple(out)

    def _first(self, lookups: Lookups) -> tuple[str, _Samples, float] | None:
        """The first of `lookups` holding `min_samples` runs: its name, its runs, and what
        multiplies them into seconds (None: no key has enough)."""
        for basis, table, key, scale in lookups:
            s = table.get(key)
            if s is not None and len(s.values) >= self.min_samples:
                return basis, s, scale
        return None

    def _lookup(self, shape: JobShape) -> tuple[str, _Samples, float] | None:
        return self._first(self.lookups(shape))

    def predict(self, shape: JobShape, default_limit_s: float) -> Prediction:
        """The prediction for a job of `shape`; `default_limit_s` stands for a missing limit
        (the policy's `backfill.default_time_limit`, what the scheduler plans with)."""
        limit = shape.time_limit_s or default_limit_s
        found = self._lookup(shape)
        if found is None:
            return Prediction(run_s=limit, low_s=limit, high_s=limit, samples=0, basis="time limit")
        basis, s, scale = found
        vs = s.sorted()
        mid, lo, hi = (min(limit, quantile(vs, q) * scale) for q in (0.5, 0.1, 0.9))
        return Prediction(run_s=mid, low_s=lo, high_s=hi, samples=len(vs), basis=basis)

    def distribution(self, shape: JobShape) -> RunDistribution | None:
        """The run times of the jobs similar to `shape`, from the same key `predict` answers
        from (None where it would fall back to the time limit): what a Gittins-index ordering
        ranks by (core/gittins.py). The same object until that key learns another run."""
        return self.distribution_from(self.lookups(shape))

    def distribution_from(self, lookups: Lookups) -> RunDistribution | None:
        """`distribution` of the shape whose `lookups` these are."""
        found = self._first(lookups)
        if found is None:
            return None
        return found[1].distribution().scaled(found[2])

    def expected_total(self, shape: JobShape, elapsed_s: float, default_limit_s: float) -> float:
        """A running job's expected total run time, knowing it has already run `elapsed_s`: the
        prediction if not yet passed; past it, halfway from there to the limit (a job that
        outlived similar ones is likely one of the long ones), never above the limit."""
        limit = shape.time_limit_s or default_limit_s
        p = self.predict(shape, default_limit_s)
        if elapsed_s < p.run_s:
            return p.run_s
        return min(limit, max(elapsed_s, elapsed_s + (limit - elapsed_s) / 2))
