"""Estimated starts for every waiting job, merged into the wait reasons the head records.

With a run-time model (head/runtime_model.py) every replay plans with learned run times; each
estimate gets an 80% interval from how far recent first estimates were from real starts
(core/start_interval.py), learned from the plans' starts.

Why a separate, throttled step: `decide` runs every second and gives an estimate only to the
job first in line per GPU model; the replay that estimates every job (core/estimate.py) costs
about 10 us a job, and an estimate need not be fresher than a few seconds. So the replay runs
after a change (a submit, a job's end, a node's: the plan the loop made for it), at most every
`min_gap_s`, and with no change every `every_s`; never so often that it takes more than a tenth
of the time. In between, each waiting job keeps its last estimate (a job new since then has
none until the next refresh). Issue 24's goal is every estimate refreshed within 5 s of a
change: with only the periodic `every_s` (5 s) a change waited up to 5 s for the replay and
then the replay's own time (bench/bench_estimate_refresh.py). Estimates that moved by less than
`jitter_s` keep their recorded value, so the store is not rewritten for every queued job on
every refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpucluster.core.estimate import DEFAULT_LIMIT, NO_LATENCY, Estimate, Latency, estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.start_interval import Interval, WaitCalibration
from gpucluster.core.types import Plan, Wait

# Waits whose own estimate the replay's replaces: a drain's end is only a lower bound, and a
# reservation's shadow leaves out the head's start and stop latencies (the replay has them).
_REPLAYED = (WaitReason.DRAINED, WaitReason.RESERVED)


class EstimateRefresher:
    def __init__(
        self,
        every_s: float = 5.0,
        min_gap_s: float = 1.0,
        limit: int = DEFAULT_LIMIT,
        jitter_s: float = 30.0,
        latency: Callable[[], Latency] | None = None,
        runs: Callable[[Snapshot, Policy, float], Mapping[int, float]] | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.every_s = every_s
        # The loop thread's CPU clock: the throttle's measure. Injected so that two heads fed the
        # same history replay at the same plans (tests/unit/test_head_idle_equivalence.py): with
        # the real clock, one loaded more than the other throttled its replays otherwise, and a
        # replay a change waits for makes the loop plan at a tick the other skipped.
        self.cpu_clock = cpu_clock
        self.min_gap_s = min_gap_s  # after a change, the replay waits this long since the last one
        # Expected run times of queued and running jobs (head/runtime_model.py), learned again
        # at each replay; None: every job is planned to its time limit.
        self.runs = runs
        # The 80% interval of each estimate, calibrated on how far the first estimates of the
        # jobs that started lately were from their starts (core/start_interval.py). In memory
        # only: a new head shows intervals again once MIN_SAMPLES jobs have started under it.
        self.calibration = WaitCalibration()
        self.intervals: dict[int, Interval] = {}
        self.last_runs: Mapping[int, float] = {}  # the last refresh's run times (submit --dry-run reuses them)
        self._first: dict[int, tuple[float, float]] = {}  # job -> (when estimated, its first estimate)
        # The head's start and stop latencies, learned again at each replay (head/latency.py).
        self.latency = latency
        self.last_latency = NO_LATENCY
        self.limit = limit
        self.jitter_s = jitter_s
        self._at: float | None = None
        self._changed = False  # something changed since the last replay
        self.last_cost_s = 0.0  # how long the last replay took
        self.last_cpu_s = 0.0  # the loop thread's CPU seconds in it: what the throttle bounds
        # Replays so far, and the loop thread's CPU seconds in `waits` (the replays, and each
        # plan's merge of the last replay into its waits), for /metrics: the estimates' share of
        # the head's CPU (bench/bench_estimate_refresh.py).
        self.refreshes = 0
        self.cpu_s = 0.0
        self._estimates: dict[int, Estimate] = {}
        self._last: dict[int, Wait] = {}
        self._canon: dict[Wait, Wait] = {}  # a wait's value -> the object given for it last time
        # (id of a canonical wait, its estimate's floor) -> (that wait, the wait merged with it)
        self._inexact: dict[tuple[int, float], tuple[Wait, Wait]] = {}

    def _every(self) -> float:
        """How long after the last replay the next one is due."""
        # At scale the replay is not free (~1 s at 10,000 nodes and 60,000 running jobs on a
        # loaded 2-core machine): never spend more than a tenth of a core on it. Its CPU time,
        # not its wall time: on a loaded machine the wall time was twice the CPU time, and the
        # throttle put a change's replay 7 s after it (bench/bench_estimate_refresh.py).
        return max(self.min_gap_s if self._changed else self.every_s, 10 * self.last_cpu_s)

    def pending(self, now: float) -> bool:
        """A change waits for its replay, which is due: the loop plans now, not at its next
        periodic plan (up to a second later), so that the replay runs."""
        return self._changed and (self._at is None or now - self._at >= self._every() or now < self._at)

    def forget(self) -> None:
        """A queued job changed (`gpucluster update`): replay at the next cycle, not in `every_s`."""
        self._at = None

    def waits(self, snap: Snapshot, policy: Policy, now: float, plan: Plan, changed: bool = False) -> dict[int, Wait]:
        """`plan.waiting` in the same (scheduling) order, each with its estimated start.
        `changed`: the plan was made for a change (a submit, a cancel, a job's end), not only
        because time passed; the estimates are replayed for it within `min_gap_s`."""
        cpu = self.cpu_clock()
        self._changed = self._changed or changed
        every = self._every()
        for st in plan.starts:
            first = self._first.pop(st.job_id, None)
            if first is not None:
                self.calibration.observe(first[0], first[1], now)
        due = self._at is None or now - self._at >= every or now < self._at
        if due and plan.waiting:
            started, replay_cpu = time.perf_counter(), self.cpu_clock()
            if self.latency is not None:
                self.last_latency = self.latency()
            runs = self.runs(snap, policy, now) if self.runs is not None else None
            self.last_runs = runs or {}
            self._estimates = estimate_starts(snap, policy, now, plan, self.limit, self.last_latency, runs)
            self._first = {j: v for j, v in self._first.items() if j in plan.waiting}
            self.intervals = {}
            for job_id, est in self._estimates.items():
                if est.exact and est.start is not None:
                    self._first.setdefault(job_id, (now, est.start))
                    interval = self.calibration.interval(now, est.start)
                    if interval is not None:
                        self.intervals[job_id] = interval
            self.last_cost_s = time.perf_counter() - started
            self.last_cpu_s = self.cpu_clock() - replay_cpu
            self.refreshes += 1
            self._at = now
            self._changed = False
        out = self._merged_waits(plan.waiting, now)
        self._last = out
        self.cpu_s += self.cpu_clock() - cpu
        return out

    def _merged_waits(self, waiting: Mapping[int, Wait], now: float) -> dict[int, Wait]:
        """Each waiting job's wait with its estimate merged in, in `waiting`'s order.

        Why not one new Wait per job: at 100,000 queued this merge, and the head comparing every
        job's wait with the one it last wrote (`Head._record_waits`), cost ten times `decide`
        itself (1.6 s of a 2 s cycle; bench/bench_head_cycle.py). `decide` shares one Wait among
        the jobs that wait alike, so a wait is looked up by value once per distinct object
        (`_canon`: the object given for that value the last time) and each merged wait once
        per (wait, estimate) (`_inexact`). Equal waits are then the same object from one
        cycle to the next, and the head's comparison is an identity test for almost every job.
        """
        canon, inexact = self._canon, self._inexact
        canon_next: dict[Wait, Wait] = {}
        inexact_next: dict[tuple[int, float], tuple[Wait, Wait]] = {}
        seen: dict[int, Wait] = {}  # id of decide's wait -> its canonical object (this call: kept alive by `waiting`)
        estimates, last_of, jitter, limit = self._estimates, self._last.get, self.jitter_s, self.limit
        out: dict[int, Wait] = {}
        for job_id, wait in waiting.items():
            cw = seen.get(id(wait))
            if cw is None:
                cw = seen[id(wait)] = canon.get(wait, wait)
                canon_next[cw] = cw
            est = estimates.get(job_id)
            merged: Wait | None = None
            if est is None or est.start is None or (cw.estimated_start is not None and cw.reason not in _REPLAYED):
                merged = cw  # not estimated yet, never fits, or a backoff or begin time: exact
                start = cw.estimated_start
                if start is None:
                    out[job_id] = cw
                    continue
            elif not est.exact:
                start = est.start
                key = (id(cw), start)
                got = inexact_next.get(key)
                if got is None:
                    got = inexact.get(key)
                    if got is None:
                        facts = replace(cw.facts, no_earlier_than=start, estimated_first=limit)
                        got = (cw, Wait(cw.reason, facts, None))
                    inexact_next[key] = got  # holds `cw`, so its id names it while the entry lives
                out[job_id] = got[1]
                continue
            else:
                start = est.start
            last = last_of(job_id)
            if (
                last is not None
                and last.estimated_start is not None
                and last.estimated_start >= now
                and abs(last.estimated_start - start) < jitter
                and last.reason is cw.reason
                and (last.facts is cw.facts or last.facts == cw.facts)
            ):
                out[job_id] = last  # moved by less than the jitter: the recorded one stays
            else:
                out[job_id] = merged if merged is not None else Wait(cw.reason, cw.facts, start)
        self._canon, self._inexact = canon_next, inexact_next
        return out
