"""The event loop: replay a workload through the real scheduler on a virtual clock.

Why it is built this way (a million jobs must replay in minutes):
- Arrivals come from the sorted trace, merged with a small heap of the other events (ends,
  checkpoints, stops, failures, repairs, drain windows opening and closing, held jobs'
  releases), so the heap holds only what is in flight.
- All events at one timestamp are applied, then the scheduler is called once, and only if the
  queue is not empty and something it could react to changed (a job arrived or came back, GPUs
  were freed, a node came or went): the head's own rule (head/loop.py).
- Per event the loop does O(1) Python work plus O(GPUs of the job); the snapshot's tuples are
  built from dicts kept up to date, at C speed. Stale events (of an interrupted attempt) are
  skipped by a per-job token instead of being searched for and removed.
- Failures draw from a stream seeded from the run's seed alone, so every policy of a
  comparison sees the same failures at the same times.

The plan is checked before it is applied (a queued job; GPUs on a live node with room for the
share; the GPUs the job asked for): a plan that breaks the rules stops the run with
SimulationError, so "GPU-seconds used never exceed capacity" holds by construction.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import accumulate, count
from typing import cast

from gpucluster.core.accounting import Budget, Spend, budget_hold, period_end
from gpucluster.core.admission import admit
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.cluster_state import ClusterState
from gpucluster.core.elastic import grow
from gpucluster.core.eligibility import Target, array_target, eligible
from gpucluster.core.events import (
    Checkpointed,
    Drained,
    Ended,
    Held,
    NodeDown,
    NodeUp,
    Released,
    Started,
    StopRequested,
    Submitted,
    Undrained,
)
from gpucluster.core.lifecycle import Exit, Next, StopReason, Why, after_attempt
from gpucluster.core.rank_book import Logged, RankBook
from gpucluster.core.reasons import WaitFacts
from gpucluster.core.snapshot import Snapshot, held_back_after
from gpucluster.core.states import JobState
from gpucluster.core.types import Allocation, DependencyKind, Drain, JobRequest, Node, Plan, RunningJob, Start
from gpucluster.sim import scheduling
from gpucluster.sim.errors import SimulationError
from gpucluster.sim.estimate_error import EstimateErrors, StartEstimateProbe
from gpucluster.sim.learned import LearnedRuntimes
from gpucluster.sim.runtime import Progress, Timeline, allreduce_slowdown, checkpoint_interval, progress, timeline
from gpucluster.sim.scheduling import SimPolicy, Usage
from gpucluster.sim.spec import CheckpointRule, ClusterSpec, NodeGroup
from gpucluster.sim.workload import TraceJob

INF = math.inf
EPS = 1e-9

# event kinds
_END, _STOPPED, _CKPT, _FAIL, _REPAIR, _REPLAN, _SPARE_BACK, _DRAIN, _UNDRAIN, _RELEASE = range(10)
_BACKOFF, _PERIODIC, _CYCLE = 0, 1, 2  # why a _REPLAN
# outcomes, as RunResult.outcome stores them (one byte per job); the lifecycle says which
SUCCEEDED, FAILED_TIME_LIMIT, FAILED_RESTARTS, NEVER_STARTED, FAILED_BUDGET, CANCELLED_DEPENDENCY = range(6)
_OUTCOME_OF = {
    Why.SUCCEEDED: SUCCEEDED,
    Why.TIME_LIMIT: FAILED_TIME_LIMIT,
    Why.NO_RESTARTS_LEFT: FAILED_RESTARTS,
    Why.FAILED: FAILED_RESTARTS,
    Why.POLICY: FAILED_BUDGET,  # the only policy stop the simulator models: a budget's `on_exceed: stop`
}
# per-team totals: GPU-seconds allocated, money, kWh, GPU-seconds writing periodic checkpoints,
# lost to failures (work since the last checkpoint + restart time), lost to preemption (the
# checkpoint written on preemption, work it could not save, restart time)
USED, COST, ENERGY, CKPT, LOST_FAIL, LOST_PREEMPT = range(6)
CATEGORY_COUNT = 6


class SimJob:
    """A job of the trace while it is in the system (queued, running or stopping)."""

    __slots__ = (
        "attempts",
        "cause",
        "first_start",
        "held",
        "interval",
        "keys",
        "plan",
        "power_w",
        "preemptions",
        "price_s",
        "ran_s",
        "rate",
        "request",
        "restarts",
        "run_start",
        "saves_on_stop",
        "startup",
        "state",
        "stop",
        "stop_elapsed",
        "team",
        "token",
        "trace",
        "useful_gpu_s",
        "work_left",
    )

    def __init__(self, trace: TraceJob, request: JobRequest, interval: float | None, team: int) -> None:
        self.trace = trace
        self.request = request
        self.interval = interval
        self.team = team
        self.state = JobState.QUEUED
        self.stop: StopReason | None = None  # the stop under way (a preemption), as the head's stop_reason
        self.token = 0  # bumped whenever this job's scheduled events become stale
        self.attempts = 0
        self.restarts = 0
        self.preemptions = 0  # times the scheduler preempted it (resizes of an elastic job not counted)
        self.work_left = trace.duration  # seconds of work at speed 1.0
        self.first_start = -1.0
        self.run_start = 0.0
        self.rate = 1.0
        self.startup = 0.0
        self.plan = Timeline(0.0, 0)
        self.keys: tuple[tuple[str, int, float], ...] = ()  # (node, GPU index, share) held
        self.held = 0.0  # GPUs held (a fraction for a shared GPU)
        self.price_s = 0.0
        self.power_w = 0.0
        self.cause = LOST_FAIL  # what the next attempt's restart time is charged to
        self.stop_elapsed = INF  # when stopping: the attempt's elapsed time at which computing stopped
        self.saves_on_stop = True
        self.ran_s = 0.0  # wall seconds holding GPUs, over every attempt (the rest of its life it waited)
        self.useful_gpu_s = 0.0  # GPU-seconds of kept compute (no checkpoint writes, restarts or lost work)


@dataclass
class Series:
    """Time series on a fixed grid of `bin_s` seconds, for plots."""

    bin_s: float
    busy_gpu_s: list[float] = field(default_factory=list)  # integrated exactly per bin
    up_gpu_s: list[float] = field(default_factory=list)
    queued_jobs: list[int] = field(default_factory=list)  # sampled at each bin's end
    running_jobs: list[int] = field(default_factory=list)
    jain: list[float] = field(default_factory=list)  # fairness at each bin's end (nan: no contention)


@dataclass
class RunResult:
    """Everything a finished run knows; metrics.py turns it into numbers."""

    policy: SimPolicy
    teams: list[str]
    job_id: array[int] = field(default_factory=lambda: array("q"))
    submit: array[float] = field(default_factory=lambda: array("d"))
    first_start: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    team: array[int] = field(default_factory=lambda: array("i"))
    outcome: array[int] = field(default_factory=lambda: array("b"))
    # Per job, for metrics that cannot flatter (metrics.py `waiting_metrics`, `goodput_metrics`):
    # GPUs asked, wall seconds it held GPUs, GPU-seconds of useful (kept) compute.
    gpus: array[float] = field(default_factory=lambda: array("d"))
    ran: array[float] = field(default_factory=lambda: array("d"))
    useful: array[float] = field(default_factory=lambda: array("d"))
    # Per job: times preempted (resizes not counted) and restarted after a failure (jobs.csv).
    preempted: array[int] = field(default_factory=lambda: array("i"))
    restarted: array[int] = field(default_factory=lambda: array("i"))
    team_totals: list[list[float]] = field(default_factory=list)  # team -> [USED, COST, ...]
    group_busy_gpu_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> jobs
    skipped_gpu_s: float = 0.0
    series: Series = field(default_factory=lambda: Series(3600.0))
    first_submit: float = 0.0
    last_end: float = 0.0
    busy_gpu_s: float = 0.0
    up_gpu_s: float = 0.0
    node_failures: int = 0
    spare_swaps: list[int] = field(default_factory=lambda: [0, 0])  # failed nodes replaced by a hot, a cold spare
    no_spare: int = 0  # failures that found no spare to take the node's place (it waited for its repair)
    node_down_s: float = 0.0  # node-seconds the scheduler was without a failed node (repair or swap)
    interruptions: int = 0
    preemptions: int = 0
    resizes: int = 0  # elastic jobs grown by checkpoint-and-restart (core/elastic.py)
    restarts: int = 0
    # performance, not part of the deterministic metrics
    events: int = 0
    decide_calls: int = 0
    decide_skipped: int = 0  # calls saved: no GPU free and no preemption (see scheduling.py)
    decide_s: float = 0.0  # CPU seconds in decide(), as decide_times
    decide_queue_max: int = 0
    decide_queue_sum: int = 0
    decide_running_max: int = 0
    decide_times: array[float] = field(default_factory=lambda: array("d"))
    decide_queues: array[int] = field(default_factory=lambda: array("i"))
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the run (time.process_time): steadier than wall on a shared machine
    truncated: bool = False  # stopped by wall_budget_s: the metrics cover only part of the trace
    truncated_at: float = 0.0
    # Teams with a budget: money and GPU-hours spent over the run, seconds and times held,
    # running jobs stopped by `on_exceed: stop` (see Engine._check_budgets).
    budgets: dict[str, dict[str, float]] = field(default_factory=dict)
    # Drains (the spec's `drains:` windows): GPU-seconds of drained nodes (up), of those the
    # ones no job held (capacity lost to the drains), and jobs requeued by a `running: requeue` window.
    drained_gpu_s: float = 0.0
    drain_idle_gpu_s: float = 0.0
    drain_requeues: int = 0
    starts: list[tuple[float, int, Allocation]] = field(default_factory=list)  # with keep_starts
    interruptions_log: list[tuple[float, int, str]] = field(default_factory=list)  # with keep_starts
    start_estimates: EstimateErrors | None = None  # with estimates: sim/estimate_error.py


ProgressFn = Callable[[int, int, float], None]


class Engine:
    """One simulation of one policy over one workload on one cluster."""

    def __init__(
        self,
        spec: ClusterSpec,
        jobs: list[TraceJob],
        policy: SimPolicy,
        seed: int,
        *,
        bin_s: float | None = None,
        on_progress: ProgressFn | None = None,
        clock: Callable[[], float] = time.perf_counter,
        keep_starts: bool = False,
        wall_budget_s: float | None = None,
        cpu_budget_s: float | None = None,
        estimates: bool = False,
        estimate_every: int = 1,
    ) -> None:
        self.spec = spec
        # Measure the start estimates a live head would show (issue 24); off: no cost at all.
        self._estimates = StartEstimateProbe({g.gpu_model for g in spec.groups}, estimate_every) if estimates else None
        self.keep_starts = keep_starts  # record every start with its allocation (RunResult.starts)
        self.wall_budget_s = wall_budget_s  # stop early (RunResult.truncated): for benchmarks
        self.cpu_budget_s = cpu_budget_s  # the same in CPU seconds, for a machine others share
        self.jobs = jobs
        self.policy = policy
        self.clock = clock  # wall clock, for the performance figures only
        self.on_progress = on_progress
        pairs = spec.nodes()
        self._all_nodes: tuple[Node, ...] = tuple(n for n, _ in pairs)
        self._group: dict[str, NodeGroup] = {n.name: g for n, g in pairs}
        self._size: dict[str, int] = {n.name: len(n.gpus) for n in self._all_nodes}
        self._cum_gpus = list(accumulate(len(n.gpus) for n in self._all_nodes))
        self._up_gpus = spec.total_gpus
        # The cluster state the core keeps from events (core/cluster_state.py), as the head's:
        # the queue, the running jobs, the live nodes (failures and repairs are NodeDown/NodeUp),
        # drains (the windows' Drained/Undrained), budget holds, and the told capacity and queue
        # indexes. The names below are its own dicts and indexes, read here; changes go through
        # `apply`.
        self._state = ClusterState()
        for n in self._all_nodes:
            self._state.apply(NodeUp(n))
        self._live: dict[str, Node] = self._state.nodes
        self._nodes: tuple[Node, ...] = self._all_nodes  # the live ones, in spec order (`_live_nodes`)
        self._queued: dict[int, JobRequest] = self._state.queued
        # Attained-service ordering (core/attained.py): GPU-seconds of each job's ended attempts,
        # kept only when the policy ranks jobs; and for the reference oracle, each queued job's
        # true remaining run time (core reads them through the snapshot).
        self._ranked = policy.core.ordering.ranked
        self._oracle = policy.oracle
        self._expected: dict[int, float] = {}
        # `runtime_model: gittins`: run times learned from the jobs finished so far (sim/learned.py).
        # Any ranked ordering: each queued job's rank kept across calls (core/rank_book.py), which
        # learns what changed from the logs of the attained (and learned) maps, and the book's
        # team lines sorted by rank, kept across calls.
        gittins = policy.core.ordering.gittins
        self._attained: dict[int, float] = Logged() if self._ranked else {}
        self._learned = LearnedRuntimes({g.gpu_model for g in spec.groups}) if gittins else None
        self._rank_book = RankBook() if self._ranked else None  # `las` too: its team lines sorted by rank
        # Preempted job -> the job it was preempted for, while that job is queued (as the head).
        self._preempted_for: dict[int, int] = {}
        # Elastic growth, as the head: since when GPUs are free with nothing queued, and whether
        # any job of the trace could ever grow (else none of it runs).
        self._free_since: float | None = None
        self._grow_wake: float | None = None
        self._may_grow = self.policy.core.elastic.enabled and any(j.min_gpus is not None for j in jobs)
        # A CPU-only job may start with no GPU free: then a cycle is never skipped for want of one.
        self._cpu_only = any(j.gpus == 0 for j in jobs)
        self._running: dict[int, RunningJob] = self._state.running
        self._active: dict[int, SimJob] = {}
        self._used: dict[tuple[str, int], float] = {}  # GPU -> share in use
        self._busy_gpus = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = count()
        self._dirty = False
        self._replan_pending = False  # a periodic replan (scheduler.replan_every) is scheduled
        self._timers = 0  # replans pending (backoff ends, periodic replans, cycle ticks)
        self._cycle_pending = False
        self.cycle_s = spec.cycle_s
        self._repairs_pending = 0
        # Free GPUs kept across scheduler calls, as the head does, told what starts and ends.
        self._capacity = self._state.capacity
        # The queue kept sorted into lines across scheduler calls, told what enters and leaves.
        self._queue_index = self._state.queue_index
        self._feasible: dict[tuple[object, ...], str | None] = {}
        # The empty cluster `_infeasible` asks about, built once and forked per new kind of
        # request (a fresh build of 12,500 nodes was ~0.5 s each, ~10-20 times a run).
        self._probe = CapacityIndex()
        self._intervals: dict[tuple[object, float], float | None] = {}
        self._usage = Usage(policy) if policy.fair_share else None
        teams = sorted({j.team for j in jobs})
        self._team_index = {t: i for i, t in enumerate(teams)}
        self._team_running = [0.0] * len(teams)
        self._team_queued = [0.0] * len(teams)
        self._weights = [policy.entitlement(t) for t in teams]
        self._fail_rng = random.Random(f"{seed}/failures")
        # Repair times draw from their own stream, so a distribution leaves the failures alone.
        self._repair_rng = random.Random(f"{seed}/repairs")
        # Each group's spare pool: [hot, cold] spares in it now (out while their node is repaired).
        self._spares = [[g.spares.hot, g.spares.cold] for g in spec.groups]
        self._group_index = {g.name: k for k, g in enumerate(spec.groups)}
        self._regate = False  # a job others wait to see start (`after`) started: apply eligibility again
        # Drains (the spec's windows), fed to the core's admission as the head's drained nodes:
        # node -> its drain while any window holds it (how many do), and for the figures the
        # GPUs of drained live nodes and the share of them jobs still hold.
        self._drains: dict[str, Drain] = self._state.drains
        self._drain_count: dict[str, int] = {}
        self._drained_up = 0
        self._drain_busy = 0.0
        self._changes_pending = 0  # drain starts and ends, hold releases, still to come
        for k, w in enumerate(spec.drains):
            self._push(w.start_s, _DRAIN, k, 0)
            if w.duration_s is not None:
                self._push(w.start_s + w.duration_s, _UNDRAIN, k, 0)
            self._changes_pending += 1 + (w.duration_s is not None)
        self._init_gates(jobs)
        self.result = RunResult(policy=policy, teams=teams)
        self.result.team_totals = [[0.0] * CATEGORY_COUNT for _ in teams]
        self.result.group_busy_gpu_s = {g.name: 0.0 for g in spec.groups}
        last_submit = jobs[-1].submit if jobs else 0.0
        self.result.series = Series(bin_s or nice_bin(last_submit + _p99_duration(jobs)))
        self._last_t = 0.0
        self._next_sample = self.result.series.bin_s
        # Budgets (the policy file's `budgets:`), as the head's accountant applies them: spend
        # accrues with the running jobs' prices (the cluster spec's) and GPUs; a team over its
        # budget for the period has its queued jobs held (Snapshot.holds, admitted by the core)
        # until the period rolls over, and with `on_exceed: stop` its running jobs are stopped.
        self._budgets = {t: b for t, b in policy.accounting.budgets.items() if t in self._team_index}
        self._spend: dict[str, list[float]] = {t: [0.0, 0.0] for t in self._budgets}  # period's money, GPU-s
        self._rate: dict[str, list[float]] = {t: [0.0, 0.0] for t in self._budgets}  # money/s, GPUs
        self._spend_at: dict[str, float] = {t: 0.0 for t in self._budgets}
        self._holds: dict[str, WaitFacts] = self._state.holds
        self._held_since: dict[str, float] = {}
        self._budget_wake: dict[str, float] = {}
        for t in self._budgets:
            self.result.budgets[t] = {
                "spent_money": 0.0,
                "spent_gpu_hours": 0.0,
                "held_s": 0.0,
                "holds": 0,
                "stopped_jobs": 0,
            }

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = self.clock()
        cpu_started = time.process_time()
        res = self.result
        jobs, heap = self.jobs, self._heap
        n, i = len(jobs), 0
        fail_rate = self.spec.failures.gpu_failures_per_day * self.spec.total_gpus / 86400.0
        if fail_rate > 0 and jobs:
            self._push(self._fail_rng.expovariate(fail_rate), _FAIL, 0, 0)
        res.first_submit = jobs[0].submit if jobs else 0.0
        loops = 0
        while True:
            t = jobs[i].submit if i < n else INF
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if t == INF or (i >= n and not self._active):
                break
            if (
                i >= n
                and not self._running
                and not self._repairs_pending
                and not self._timers
                and not self._changes_pending
            ):
                break  # nothing runs and nothing will change: what is queued can never start
            self._advance(t)
            while i < n and jobs[i].submit == t:
                self._arrive(jobs[i], t)
                i += 1
            at_cycle = False
            while heap and heap[0][0] == t:
                _, _, kind, a, b = heapq.heappop(heap)
                res.events += 1
                if kind == _END:
                    self._on_end(a, b, t)
                elif kind == _CKPT:
                    self._on_checkpoint(a, b, t)
                elif kind == _STOPPED:
                    self._on_stopped(a, b, t)
                elif kind == _FAIL:
                    self._on_failure(t, fail_rate)
                elif kind == _REPAIR:
                    self._on_repair(a)
                elif kind == _SPARE_BACK:
                    self._spares[a][b] += 1  # the node it stood in for is repaired: back in the pool
                elif kind == _DRAIN:
                    self._on_drain(a, t, requeue=b == 1)
                elif kind == _UNDRAIN:
                    self._on_undrain(a)
                elif kind == _RELEASE:
                    self._on_release(a)
                else:
                    self._timers -= 1
                    if a == _PERIODIC:
                        self._replan_pending = False
                    elif a == _CYCLE:
                        self._cycle_pending = False
                        at_cycle = True
                    self._dirty = True
            if self._budgets:
                self._check_budgets(t)
            tick = math.ceil(t / self.cycle_s) * self.cycle_s if self.cycle_s else t
            if self._dirty and self._queued and tick > t and not at_cycle:
                if not self._cycle_pending:  # a fixed cycle: plan at its next tick, not now
                    self._cycle_pending = True
                    self._wake(tick, _CYCLE)
            elif self._dirty:
                self._dirty = False
                while True:
                    if self._gated and self._gate_dirty:
                        self._gate(t)
                    if self._queued and (
                        self._cpu_only or scheduling.can_change_anything(self.policy, self._up_gpus - self._busy_gpus)
                    ):
                        self._schedule(t)
                    elif self._queued:
                        res.decide_skipped += 1
                        if self._estimates is not None and self._estimates.waiting_for_plan:
                            self._estimate_only(t)  # the head shows new jobs an estimate all the same
                    if not self._regate:
                        break
                    self._regate = False  # a job others wait to see start (`after`) just started
                if self._may_grow:
                    self._grow(t)
            loops += 1
            if loops & 255 == 0:
                if self.on_progress is not None:
                    self.on_progress(len(res.end) + sum(res.skipped.values()), n, t)
                if (self.wall_budget_s is not None and self.clock() - started > self.wall_budget_s) or (
                    self.cpu_budget_s is not None and time.process_time() - cpu_started > self.cpu_budget_s
                ):
                    res.truncated = True
                    res.truncated_at = t
                    break
        res.events += i
        for job in list(self._active.values()):
            self._record(job, -1.0, NEVER_STARTED)
        self._active.clear()
        res.last_end = max(res.end) if len(res.end) else res.first_submit
        self._advance(max(res.last_end, self._last_t))
        for team in self._budgets:
            self._bring_spend(team, max(res.last_end, self._last_t))
            if team in self._held_since:
                res.budgets[team]["held_s"] += max(res.last_end, self._last_t) - self._held_since.pop(team)
        self._close_series()
        if self._estimates is not None:
            res.start_estimates = self._estimates.close()
        res.wall_s = self.clock() - started
        res.cpu_s = time.process_time() - cpu_started
        if self.on_progress is not None:
            done = len(res.end) + sum(res.skipped.values())
            self.on_progress(done if res.truncated else n, n, res.truncated_at if res.truncated else res.last_end)
        return res

    def _push(self, t: float, kind: int, a: int, b: int) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, a, b))

    def _wake(self, t: float, why: int = 0) -> None:
        """Plan again at t: when a restart's backoff ends (0), a periodic replan (_PERIODIC), or
        the next tick of a fixed cycle (_CYCLE)."""
        self._timers += 1
        self._push(t, _REPLAN, why, 0)

    # ---- arrivals and the scheduler -----------------------------------------------------------

    def _arrive(self, trace: TraceJob, now: float) -> None:
        request = scheduling.job_request(trace, host=self.policy.core.host, oracle=self._oracle)
        why = self._infeasible(request, now)
        if why is not None:
            res = self.result
            res.skipped[why] = res.skipped.get(why, 0) + 1
            res.skipped_gpu_s += trace.duration * trace.gpus
            if self._is_target(trace):  # its dependents see it as cancelled: it never runs
                self._ended[trace.job_id] = (JobState.CANCELLED, False)
                self._count(trace, None, JobState.CANCELLED)
                self._gate_dirty = True
            return
        if trace.hold_until is not None and trace.hold_until > now:
            # held by its user (submit --hold) until released: eligibility keeps it back
            request = replace(request, held=True)
            if trace.hold_until < INF:
                self._push(trace.hold_until, _RELEASE, trace.job_id, 0)
                self._changes_pending += 1
        job = SimJob(trace, request, self._interval(trace), self._team_index[trace.team])
        if self._array_counts:
            self._count(trace, None, JobState.QUEUED)
        self._active[trace.job_id] = job
        if self._estimates is not None:
            self._estimates.arrived(trace)
        self._enqueue(job)

    def _enqueue(self, job: SimJob) -> None:
        if self._array_counts and job.state is not JobState.QUEUED:
            self._count(job.trace, job.state, JobState.QUEUED)
        job.state = JobState.QUEUED
        job.stop = None
        trace = job.trace
        if self._learned is not None:  # queued (again): the learned map holds the waiting jobs
            self._learned.arrived(trace)
        if self._targets_any and self._is_target(trace):
            self._gate_dirty = True  # a target back in the queue (requeued): its dependents may see it
        if trace.throttle is not None and trace.array_id is not None:
            self._gated[trace.job_id] = job.request  # eligibility (`_gate`) admits it
            insort(self._pending[trace.array_id], trace.job_id)
        elif trace.after or job.request.held:
            self._gated[trace.job_id] = job.request
            self._unmet[trace.job_id] = job.request
        else:
            self._admit(job)
            return
        self._gate_dirty = True
        self._dirty = True

    def _admit(self, job: SimJob) -> None:
        """Into the queue the scheduler sees."""
        if job.trace.throttle is not None and job.trace.array_id is not None:
            self._admitted[job.trace.array_id].add(job.trace.job_id)
        self._state.apply(Submitted(job.request))
        if self._oracle:
            self._expected[job.trace.job_id] = job.work_left
        self._team_queued[job.team] += job.trace.gpus
        self._dirty = True

    def _infeasible(self, request: JobRequest, now: float) -> str | None:
        """Why the scheduler could never start this job, asked of the scheduler itself: would it
        start the job alone on the whole cluster, every node up? Cached per kind of request."""
        key: tuple[object, ...] = (
            request.gpus,
            request.gpu_types,
            request.gpu_memory_mb,
            request.min_gpu_memory_mb,
            request.nodes,
            request.team if self.policy.has_quotas or self.policy.core.pools else "",
            request.priority if self.policy.core.pools else None,  # pools admit by team and class
            request.selection,
        )
        if key not in self._feasible:
            probe = scheduling.snapshot(self._all_nodes, (), (request,), {}, self._probe)
            plan = scheduling.decide(probe, self.policy, now, reasons=True)
            if any(s.job_id == request.job_id for s in plan.starts):
                self._feasible[key] = None
            else:
                said = scheduling.wait_message(plan, request.job_id)
                self._feasible[key] = f"the scheduler would not start it even on the empty cluster: {said}"
        return self._feasible[key]

    def _interval(self, trace: TraceJob) -> float | None:
        rule = self.spec.checkpoints.interval if trace.checkpoint == "spec" else cast(CheckpointRule, trace.checkpoint)
        key = (rule, trace.gpus)
        if key not in self._intervals:
            f, c = self.spec.failures, self.spec.checkpoints
            self._intervals[key] = checkpoint_interval(rule, max(1.0, trace.gpus), f.gpu_failures_per_day, c.cost_s)
        return self._intervals[key]

    def _snapshot(self, now: float) -> Snapshot:
        """What `decide` sees now: the one snapshot both a real cycle and an estimate-only plan
        use, so an estimate is planned on the same inputs (attained service included)."""
        usage = self._usage.at(now) if self._usage is not None else {}
        by_class = self._state.running_by_class()
        return scheduling.snapshot(
            self._nodes,
            by_class.running,
            self._state.queued_jobs(),
            usage,
            self._capacity,
            self._queue_index,
            self._preempted_for,
            self._holds,
            self._attained,
            self._expected,
            self._learned.distributions(now, self.policy.core.ordering.relearn_every_s)
            if self._learned is not None
            else None,
            self._drains,
            self._state.drained,
            self._rank_book,
            by_class,
        )

    def _schedule(self, now: float) -> None:
        res = self.result
        if self._preempted_for:  # forget preemptors that started or left the queue
            self._preempted_for = {v: p for v, p in self._preempted_for.items() if p in self._queued}
        snap = self._snapshot(now)
        t0 = time.process_time()  # CPU time: on a shared machine wall time mostly measures the others
        # Estimates need every waiting job in line (the head's full cycle); the starts and
        # preemptions are the same either way (scheduling.decide).
        full = self._estimates is not None and self._estimates.waiting_for_plan
        plan = scheduling.decide(snap, self.policy, now, reasons=full)
        spent = time.process_time() - t0
        res.decide_calls += 1
        res.decide_s += spent
        res.decide_times.append(spent)
        res.decide_queues.append(len(snap.queued))
        res.decide_queue_sum += len(snap.queued)
        res.decide_queue_max = max(res.decide_queue_max, len(snap.queued))
        res.decide_running_max = max(res.decide_running_max, len(snap.running))
        if self._estimates is not None:
            self._estimate(snap, now, plan)
        for victim in scheduling.preemptions(plan):
            self._preempt(victim, now)
        if plan.preemptions or (plan.starts and self._preempted_for):
            self._preempted_for = held_back_after(self._preempted_for, plan)
        for start in plan.starts:
            self._start(start, now)
        if self.spec.replan_every_s and self._queued and not self._replan_pending:
            self._replan_pending = True
            self._wake(now + self.spec.replan_every_s, _PERIODIC)

    def _estimate_only(self, now: float) -> None:
        """A plan only to estimate new jobs' starts, when nothing could start (decide skipped):
        nothing of it is applied, so the run is the same with and without `estimates`."""
        snap = self._snapshot(now)
        plan = scheduling.decide(snap, self.policy, now, reasons=True)
        if plan.starts or plan.preemptions:
            raise SimulationError(f"t={now}: a plan said to change nothing starts or preempts jobs")
        self._estimate(snap, now, plan)

    def _estimate(self, snap: Snapshot, now: float, plan: Plan) -> None:
        """The start estimates the head would show new jobs now (sim/estimate_error.py)."""
        assert self._estimates is not None
        active, group = self._active, self._group

        def trace_of(job_id: int) -> TraceJob | None:
            job = active.get(job_id)
            return job.trace if job is not None else None

        def model_of(job_id: int) -> str:
            job = active.get(job_id)
            return group[job.keys[0][0]].gpu_model if job is not None and job.keys else ""

        self._estimates.planned(snap, self.policy.core, now, plan, trace_of, model_of)

    def _grow(self, now: float) -> None:
        """Grow an elastic job as the head does (core/elastic.py): GPUs free with nothing queued
        for `grow_after_s`, then checkpoint-and-restart (a stop like a preemption, then a start
        at the larger size that pays `restart_s` again, as every restart does)."""
        rule = self.policy.core.elastic
        if self._queued or self._up_gpus - self._busy_gpus < 1:
            self._free_since = None
            return
        since = self._free_since = now if self._free_since is None else self._free_since
        snap = admit(
            scheduling.snapshot(
                self._nodes, tuple(self._running.values()), (), {}, drains=self._drains, drained=self._state.drained
            )
        )[0]
        resizes = grow(snap, self.policy.core, now, since)
        for r in resizes:
            self._preempt(r.job_id, now, resize=True)
            self._free_since = None
        if resizes:
            return
        young = [
            j.started_at + rule.grow_every_s
            for j in self._running.values()
            if j.max_gpus is not None and not j.stopping and j.allocation.gpu_count < j.max_gpus
        ]
        if not young:
            return
        due = max(since + rule.grow_after_s, min(young))
        if due > now and (self._grow_wake is None or self._grow_wake <= now or due < self._grow_wake):
            self._grow_wake = due
            self._wake(due)

    # ---- starting and ending attempts ---------------------------------------------------------

    def _start(self, start: Start, now: float) -> None:
        job = self._active.get(start.job_id)
        if job is None or job.state is not JobState.QUEUED:
            raise SimulationError(f"t={now}: the plan starts job {start.job_id}, which is not queued")
        alloc = start.allocation
        if self._learned is not None:  # no rank for a running job (the head's map holds the queued)
            self._learned.left(start.job_id)
        self._claim(job, alloc, now)
        if self.keep_starts:
            self.result.starts.append((now, start.job_id, alloc))
        trace = job.trace
        if trace.throttle is not None and trace.array_id is not None:
            self._gated.pop(start.job_id, None)
            pending = self._pending[trace.array_id]
            del pending[bisect_left(pending, start.job_id)]
            self._admitted[trace.array_id].discard(start.job_id)
            self._array_running[trace.array_id] = self._array_running.get(trace.array_id, 0) + 1
            self._gate_dirty = True
        if self._targets_any and self._is_target(trace):
            self._gate_dirty = True
            if trace.job_id in self._after_jobs or trace.array_id in self._after_arrays:
                self._regate = True
        team = job.team
        self._team_queued[team] -= job.trace.gpus
        self._team_running[team] += job.held
        if self._usage is not None:
            self._usage.change(job.trace.team, job.held, now)
        self._state.apply(Started(scheduling.running_job(job.request, alloc, now)))
        self._busy_gpus += job.held
        speed, price_s, power_w = INF, 0.0, 0.0
        for s in alloc.slices:
            if not s.gpu_indices:
                continue  # a CPU-only job: no GPU model sets its speed, price or power
            g = self._group[s.node]
            speed = min(speed, self.spec.speed(g.gpu_model))
            gpus = len(s.gpu_indices) * s.share
            price_s += gpus * g.price_per_gpu_hour / 3600.0
            power_w += gpus * g.power_busy_w
        if len(alloc.slices) > 1:
            g = self._group[alloc.slices[0].node]
            gpus = int(alloc.gpu_count)
            speed /= allreduce_slowdown(self.spec.allreduce, gpus, len(alloc.slices), g.nvlink_gbps, g.network_gbps)
        if speed == INF:
            speed = 1.0  # CPU-only: its trace run time replays as recorded
        if job.trace.gpus >= 1 and job.held < job.trace.gpus:
            speed *= job.held / job.trace.gpus  # elastic, started smaller: the same work takes longer
        if self._array_counts:
            self._count(job.trace, job.state, JobState.RUNNING, first=job.first_start < 0)
        job.state = JobState.RUNNING
        if job.trace.team in self._budgets:
            self._budget_rate(job.trace.team, price_s, job.held, now)
        job.price_s = price_s
        job.power_w = power_w
        job.rate = speed
        job.startup = self.spec.checkpoints.restart_s if job.attempts > 0 else 0.0
        job.attempts += 1
        job.run_start = now
        if job.first_start < 0:
            job.first_start = now
            if self._estimates is not None:
                self._estimates.started(start.job_id, now)
        cost = self.spec.checkpoints.cost_s
        job.plan = timeline(job.work_left / speed, job.interval, cost, job.startup)
        job.token += 1
        limit = job.trace.time_limit
        end = now + (job.plan.total_s if limit is None or job.plan.total_s <= limit else limit)
        self._push(end, _END, start.job_id, job.token)
        if job.plan.checkpoints and job.interval is not None:
            self._push(now + job.startup + job.interval + cost, _CKPT, start.job_id, job.token)

    def _claim(self, job: SimJob, alloc: Allocation, now: float) -> None:
        jid = job.trace.job_id
        want = job.trace.gpus
        least = job.trace.min_gpus or want  # an elastic job may get fewer
        got = alloc.gpu_count
        if want == 0:  # CPU-only: a slice with no GPU on one node that is up
            if got or len(alloc.slices) != 1 or alloc.slices[0].node not in self._live:
                raise SimulationError(f"t={now}: CPU-only job {jid} was given {got:g} GPUs on {alloc.slices}")
        elif (want >= 1 and not least - EPS <= got <= want + EPS) or got <= 0 or got > max(want, 1.0) + EPS:
            raise SimulationError(f"t={now}: job {jid} asked for {want:g} GPUs and was given {got:g}")
        keys = []
        for s in alloc.slices:
            size = self._size.get(s.node)
            for i in s.gpu_indices:
                if size is None or s.node not in self._live or not 0 <= i < size:
                    raise SimulationError(f"t={now}: job {jid} placed on {s.node} GPU {i}, which is not up")
                if s.node in self._drains:
                    raise SimulationError(f"t={now}: job {jid} placed on {s.node}, which is drained")
                used = self._used.get((s.node, i), 0.0) + s.share
                if used > 1.0 + EPS:
                    raise SimulationError(f"t={now}: job {jid} placed on {s.node} GPU {i}, which is already in use")
                keys.append((s.node, i, s.share))
        for node, i, share in keys:
            self._used[(node, i)] = self._used.get((node, i), 0.0) + share
        job.keys = tuple(keys)
        job.held = got

    def _release(self, job: SimJob, now: float, lost_to: int, saved_all: bool) -> Progress:
        """Free the job's GPUs and charge the attempt's GPU time to its team, by category.

        `saved_all`: the attempt's work is kept (it ended, or checkpointed when stopped); else
        the work since its last checkpoint is lost, charged to `lost_to`, as is any time spent
        on a stop."""
        jid = job.trace.job_id
        self._state.apply(Ended(jid))
        if job.trace.throttle is not None and job.trace.array_id is not None:
            self._array_running[job.trace.array_id] -= 1
            self._gate_dirty = True
        drains = self._drains
        for node, i, share in job.keys:
            if drains and node in drains:
                self._drain_busy -= share
            left = self._used[(node, i)] - share
            if left <= EPS:
                del self._used[(node, i)]
            else:
                self._used[(node, i)] = left
        held = job.held
        if job.trace.team in self._budgets:
            self._budget_rate(job.trace.team, -job.price_s, -held, now)
        self._busy_gpus -= held
        self._team_running[job.team] -= held
        if self._usage is not None:
            self._usage.change(job.trace.team, -held, now)
        elapsed = now - job.run_start
        if self._ranked:
            self._attained[jid] = self._attained.get(jid, 0.0) + elapsed * held
        computing = min(elapsed, job.stop_elapsed)
        p = progress(computing, job.plan, job.interval, self.spec.checkpoints.cost_s, job.startup)
        unsaved = 0.0 if saved_all else p.computed_s - p.saved_s + p.partial_write_s
        totals = self.result.team_totals[job.team]
        totals[USED] += elapsed * held
        totals[COST] += elapsed * job.price_s
        totals[ENERGY] += elapsed * job.power_w / 3.6e6
        totals[CKPT] += (p.checkpoint_s + (p.partial_write_s if saved_all else 0.0)) * held
        totals[job.cause] += p.startup_s * held
        totals[lost_to] += (unsaved + elapsed - computing) * held
        job.ran_s += elapsed
        writes = p.checkpoint_s + (p.partial_write_s if saved_all else 0.0)
        job.useful_gpu_s += max(0.0, elapsed - writes - p.startup_s - unsaved - (elapsed - computing)) * held
        busy = self.result.group_busy_gpu_s
        for node, _, share in job.keys:
            busy[self._group[node].name] += elapsed * share
        job.keys = ()
        job.held = 0.0
        job.stop_elapsed = INF
        return p

    def _on_end(self, job_id: int, token: int, now: float) -> None:
        job = self._active.get(job_id)
        if job is None or job.token != token or job.state is not JobState.RUNNING or job.stop is not None:
            return  # an attempt that was interrupted meanwhile
        timed_out = now - job.run_start < job.plan.total_s - EPS
        if self._estimates is not None and job.keys:  # a run that tells how long such work takes
            self._estimates.finished(job.trace, now - job.run_start, self._group[job.keys[0][0]].gpu_model)
        if self._learned is not None and job.keys:
            self._learned.finished(job.trace, now - job.run_start, self._group[job.keys[0][0]].gpu_model)
        self._release(job, now, LOST_FAIL, saved_all=True)
        self._dirty = True
        if timed_out:  # the head asks a time-limit stop, and the job's processes die of it
            after = after_attempt(StopReason.TIME_LIMIT, Exit.FAILURE)
        else:
            after = after_attempt(None, Exit.SUCCESS, signalled=False)
        self._finish(job, now, after)

    def _on_checkpoint(self, job_id: int, token: int, now: float) -> None:
        """The job finished writing a periodic checkpoint: it reports it, as a live job would."""
        job = self._active.get(job_id)
        if job is None or job.token != token or job.stop is not None or job.interval is None:
            return
        self._state.apply(Checkpointed(job_id, now))
        done = round((now - job.run_start - job.startup) / (job.interval + self.spec.checkpoints.cost_s))
        if done < job.plan.checkpoints:
            self._push(now + job.interval + self.spec.checkpoints.cost_s, _CKPT, job_id, token)

    def _finish(self, job: SimJob, now: float, after: Next) -> None:
        del self._active[job.trace.job_id]
        if self._array_counts:
            self._count(job.trace, job.state, after.state)
        job.state = after.state
        if self._targets_any and self._is_target(job.trace):
            self._ended[job.trace.job_id] = (after.state, job.first_start >= 0)
            self._gate_dirty = True
        self._record(job, now, _OUTCOME_OF[after.why])

    def _record(self, job: SimJob, now: float, outcome: int) -> None:
        res = self.result
        if self._learned is not None:
            self._learned.gone(job.trace.job_id)
        res.job_id.append(job.trace.job_id)
        res.submit.append(job.trace.submit)
        res.first_start.append(job.first_start)
        res.end.append(now)
        res.team.append(job.team)
        res.outcome.append(outcome)
        res.gpus.append(job.trace.gpus)
        res.ran.append(job.ran_s)
        res.useful.append(job.useful_gpu_s)
        res.preempted.append(job.preemptions)
        res.restarted.append(job.restarts)

    # ---- eligibility: dependencies and array throttles ---------------------------------------

    def _init_gates(self, jobs: list[TraceJob]) -> None:
        """What eligibility needs from the trace: the throttled arrays, and the jobs and arrays
        that others depend on (their ends are remembered, an array's elements counted by state)."""
        # Queued jobs eligibility looks at, admitted to the scheduler's queue or not: elements of
        # throttled arrays until they start, and dependents until their dependencies are met
        # (for good: a met verdict never changes) or can never be.
        self._gated: dict[int, JobRequest] = {}
        self._unmet: dict[int, JobRequest] = {}  # dependents, not in a throttled array, still waiting
        self._pending: dict[int, list[int]] = {}  # throttled array -> its queued elements' ids, sorted
        self._admitted: dict[int, set[int]] = {}  # throttled array -> its elements in the scheduler's queue
        self._gate_dirty = False  # something eligibility depends on changed since it last ran
        self._targets_any = False
        self._array_counts: dict[int, dict[JobState, int]] = {}  # target arrays: elements by state
        self._array_started: dict[int, int] = {}  # target arrays: elements that ever started
        self._throttles: dict[int, int] = {}
        self._array_running: dict[int, int] = {}
        self._target_jobs: set[int] = set()
        self._target_arrays: set[int] = set()
        self._after_jobs: set[int] = set()  # targets of `after`: their start matters at once
        self._after_arrays: set[int] = set()
        self._ended: dict[int, tuple[JobState, bool]] = {}  # targets that ended: state, ever started
        if not any(j.array_id is not None or j.after for j in jobs):
            return  # a trace without arrays or dependencies pays nothing more
        for j in jobs:
            if j.array_id is not None and j.throttle is not None and j.array_id not in self._throttles:
                self._throttles[j.array_id] = j.throttle
                self._pending[j.array_id] = []
                self._admitted[j.array_id] = set()
            for d in j.after:
                (self._target_arrays if d.array else self._target_jobs).add(d.job_id)
                if d.kind is DependencyKind.AFTER:
                    (self._after_arrays if d.array else self._after_jobs).add(d.job_id)
        self._targets_any = bool(self._target_jobs or self._target_arrays)
        self._array_counts = {a: {} for a in self._target_arrays}
        self._array_started = dict.fromkeys(self._target_arrays, 0)

    def _count(self, trace: TraceJob, old: JobState | None, new: JobState, first: bool = False) -> None:
        """Keep a target array's elements counted by state (and how many ever started), so a
        dependency on a 100,000-element array is summed up without looking at each element."""
        counts = self._array_counts.get(trace.array_id) if trace.array_id is not None else None
        if counts is None:
            return
        if old is not None:
            counts[old] -= 1
        counts[new] = counts.get(new, 0) + 1
        if first:
            self._array_started[cast(int, trace.array_id)] += 1

    def _is_target(self, trace: TraceJob) -> bool:
        return trace.job_id in self._target_jobs or trace.array_id in self._target_arrays

    def _gate(self, now: float) -> None:
        """Apply the head's eligibility rules (core/eligibility.py) to the queued jobs that have
        dependencies or belong to a throttled array: admit the eligible ones to the scheduler's
        queue, take back those no longer eligible (a requeued lower element takes its place under
        the throttle), and cancel those whose dependency can never be met; their own dependents
        follow in the next pass, at the same instant.

        Why not the whole gated queue each time: of a throttled array only its `throttle` lowest
        queued elements can be eligible (the rule takes the lowest first), and a dependent whose
        dependencies are met stays met, so it leaves eligibility once admitted: a 100,000-element
        sweep costs each pass its throttle, not its size."""
        self._gate_dirty = False
        while True:
            candidates = list(self._unmet.values())
            for array_id, ids in self._pending.items():
                head = ids[: self._throttles[array_id]]
                candidates.extend(self._gated[i] for i in head)
                for jid in self._admitted[array_id].difference(head):
                    self._withdraw(jid)  # a lower element came back and takes its place
            if not candidates:
                return
            result = eligible(
                candidates,
                self._targets(candidates),
                self._array_running,
                self._throttles,
                now,
                self.policy.core.default_time_limit_s,
            )
            ok = {r.job_id for r in result.eligible}
            for r in candidates:
                jid = r.job_id
                if jid in ok:
                    if jid not in self._queued:
                        self._admit(self._active[jid])
                    if jid in self._unmet:  # met for good: a plain queued job from now on
                        del self._unmet[jid]
                        del self._gated[jid]
                elif jid in self._queued:
                    self._withdraw(jid)
            for jid in result.doomed:
                self._cancel_doomed(self._active[jid], now)
            if not result.doomed:
                return

    def _targets(self, candidates: list[JobRequest]) -> dict[tuple[int, bool], Target]:
        wanted = {(d.job_id, d.array) for r in candidates for d in r.after}
        out: dict[tuple[int, bool], Target] = {}
        for jid, is_array in wanted:
            if not is_array:
                seen = self._state_of(jid)
                if seen is not None:
                    out[(jid, False)] = Target(seen[0], seen[1])
                continue
            counts = {state: n for state, n in self._array_counts.get(jid, {}).items() if n}
            if counts:
                out[(jid, True)] = array_target(counts, self._array_started[jid])
        return out

    def _state_of(self, job_id: int) -> tuple[JobState, bool] | None:
        job = self._active.get(job_id)
        if job is not None:
            return job.state, job.attempts > 0
        return self._ended.get(job_id)

    def _withdraw(self, job_id: int) -> None:
        """Out of the scheduler's queue, back to waiting on eligibility."""
        self._state.apply(Ended(job_id))
        job = self._active[job_id]
        if job.trace.throttle is not None and job.trace.array_id is not None:
            self._admitted[job.trace.array_id].discard(job_id)
        self._team_queued[job.team] -= job.trace.gpus
        self._dirty = True

    def _cancel_doomed(self, job: SimJob, now: float) -> None:
        """A dependency that can never be met cancels the job, as on the head."""
        jid = job.trace.job_id
        if jid in self._queued:
            self._withdraw(jid)
        del self._gated[jid]
        self._unmet.pop(jid, None)
        if job.trace.throttle is not None and job.trace.array_id is not None:
            pending = self._pending[job.trace.array_id]
            del pending[bisect_left(pending, jid)]
        job.token += 1
        del self._active[jid]
        if self._array_counts:
            self._count(job.trace, job.state, JobState.CANCELLED)
        job.state = JobState.CANCELLED
        if self._is_target(job.trace):
            self._ended[jid] = (JobState.CANCELLED, job.first_start >= 0)
        self._record(job, now, CANCELLED_DEPENDENCY)

    # ---- budgets ----------------------------------------------------------------------------

    def _bring_spend(self, team: str, now: float) -> None:
        """The team's spending in its current period, brought up to `now` at its running rate
        (rolling over at each period's end on the way)."""
        budget, spend, rate, total = self._budgets[team], self._spend[team], self._rate[team], self.result.budgets[team]
        at = self._spend_at[team]
        while at < now:
            end = period_end(budget, at)
            until = min(now, end)
            dt = until - at
            spend[0] += rate[0] * dt
            spend[1] += rate[1] * dt
            total["spent_money"] += rate[0] * dt
            total["spent_gpu_hours"] += rate[1] * dt / 3600.0
            at = until
            if at == end:  # a new period: its spending starts at 0
                spend[0] = spend[1] = 0.0
        self._spend_at[team] = max(at, self._spend_at[team])

    def _budget_rate(self, team: str, money_s: float, gpus: float, now: float) -> None:
        self._bring_spend(team, now)
        rate = self._rate[team]
        rate[0] += money_s
        rate[1] += gpus
        if team not in self._holds:
            self._wake_at_crossing(team, self._budgets[team], now)

    def _check_budgets(self, now: float) -> None:
        """Hold a team once it is over its budget (and stop its running jobs if the budget says
        so), release it when its period rolls over; wake up when a team will cross its budget
        at its present rate, and when a held team's period ends."""
        for team, budget in self._budgets.items():
            self._bring_spend(team, now)
            money, gpu_s = self._spend[team]
            hold = budget_hold(budget, Spend(money, gpu_s / 3600.0), now)
            if hold is not None and team not in self._holds:
                self._state.apply(Held(team, hold))
                self._held_since[team] = now
                self.result.budgets[team]["holds"] += 1
                self._dirty = True
                self._wake(period_end(budget, now))
                if budget.on_exceed == "stop":
                    for jid in [j for j, r in self._running.items() if r.team == team]:
                        self._stop_for_budget(self._active[jid], now)
            elif hold is None and team in self._holds:
                self._state.apply(Released(team))
                self.result.budgets[team]["held_s"] += now - self._held_since.pop(team)
                self._dirty = True
            if hold is None:
                self._wake_at_crossing(team, budget, now)

    def _wake_at_crossing(self, team: str, budget: Budget, now: float) -> None:
        rate, spend = self._rate[team], self._spend[team]
        waits = []
        if budget.money is not None and rate[0] > 0:
            waits.append((budget.money - spend[0]) / rate[0])
        if budget.gpu_hours is not None and rate[1] > 0:
            waits.append((budget.gpu_hours * 3600.0 - spend[1]) / rate[1])
        if not waits:
            return
        at = min(period_end(budget, now), now + max(0.0, min(waits)))
        pending = self._budget_wake.get(team)
        if pending is None or pending <= now or at < pending:
            self._budget_wake[team] = at
            self._wake(at)

    def _stop_for_budget(self, job: SimJob, now: float) -> None:
        """A budget's `on_exceed: stop`: the job ends now, failed by policy (the lifecycle's
        POLICY stop); its work since the last checkpoint is lost."""
        if job.stop is not None:
            return
        self._release(job, now, LOST_FAIL, saved_all=False)
        job.token += 1
        self.result.budgets[job.trace.team]["stopped_jobs"] += 1
        self._dirty = True
        self._finish(job, now, after_attempt(StopReason.POLICY, Exit.FAILURE))

    # ---- drains and holds ---------------------------------------------------------------------

    def _on_drain(self, k: int, now: float, requeue: bool = False) -> None:
        """A drain window opens: its nodes take no new job (the core's admission leaves them out
        of the plan, as on the head); with `running: requeue` their running jobs are stopped
        and requeued the way the head's `requeue` does it (the preemption path).

        Why the requeue is an event of its own at the same instant: it then comes after the
        ends due at that instant (pushed earlier), so a job that ends by itself just as the
        drain begins has succeeded, not been requeued, as on the head (the lifecycle's rule)."""
        self._changes_pending -= 1
        w = self.spec.drains[k]
        if requeue:
            hit = set(w.nodes)
            for jid, rj in list(self._running.items()):
                if any(s.node in hit for s in rj.allocation.slices):
                    self._preempt(jid, now, drain=True)
            return
        until = now + w.duration_s if w.duration_s is not None else None
        for node in w.nodes:
            self._drain_count[node] = self._drain_count.get(node, 0) + 1
            if node not in self._drains and node in self._live:
                self._drained_up += self._size[node]
                self._drain_busy += sum(self._used.get((node, i), 0.0) for i in range(self._size[node]))
            self._state.apply(Drained(node, Drain(w.reason, until)))  # the latest drain's why and end, as on the head
        if w.requeue:
            self._push(now, _DRAIN, k, 1)
            self._changes_pending += 1
        self._dirty = True

    def _on_undrain(self, k: int) -> None:
        """A drain window ends: each node whose last window it was takes jobs again."""
        self._changes_pending -= 1
        for node in self.spec.drains[k].nodes:
            left = self._drain_count[node] - 1
            if left:
                self._drain_count[node] = left
                continue
            del self._drain_count[node]
            self._state.apply(Undrained(node))
            if node in self._live:
                self._drained_up -= self._size[node]
                self._drain_busy -= sum(self._used.get((node, i), 0.0) for i in range(self._size[node]))
        if not self._drains:
            self._drained_up, self._drain_busy = 0, 0.0  # no rounding drift carried to the next drain
        self._dirty = True

    def _on_release(self, job_id: int) -> None:
        """Its user released a held job (`gpucluster release`): eligibility may admit it now."""
        self._changes_pending -= 1
        job = self._active.get(job_id)
        if job is None or not job.request.held:
            return
        job.request = replace(job.request, held=False)
        if job_id in self._gated:
            self._gated[job_id] = job.request
        if job_id in self._unmet:
            self._unmet[job_id] = job.request
        self._gate_dirty = True
        self._dirty = True

    # ---- interruptions ----------------------------------------------------------------------

    def _preempt(self, job_id: int, now: float, resize: bool = False, drain: bool = False) -> None:
        """The plan stops a running job: like on the live head it gets SIGTERM, writes a
        checkpoint (if it checkpoints at all and the grace period allows) and exits; its GPUs
        stay held until then. Then it goes back to the queue. `resize`: an elastic job grown;
        `drain`: requeued by a drain window (the head's `requeue`, the same path)."""
        job = self._active.get(job_id)
        if job is None or job.stop is not None:
            return
        if job.state is not JobState.RUNNING:
            raise SimulationError(f"t={now}: the plan preempts job {job_id}, which is not running")
        cost, grace = self.spec.checkpoints.cost_s, self.policy.grace_period_s
        job.saves_on_stop = job.interval is not None and cost <= grace
        job.stop_elapsed = now - job.run_start
        job.stop = StopReason.PREEMPT
        job.token += 1
        self._state.apply(StopRequested(scheduling.stopping(self._running[job_id]), job.stop))
        if resize:
            self.result.resizes += 1
        elif drain:
            self.result.drain_requeues += 1
        else:
            self.result.preemptions += 1
            job.preemptions += 1
        delay = cost if job.saves_on_stop else (0.0 if job.interval is None else grace)
        self._push(now + delay, _STOPPED, job_id, job.token)

    def _on_stopped(self, job_id: int, token: int, now: float) -> None:
        job = self._active.get(job_id)
        if job is None or job.token != token or job.stop is not StopReason.PREEMPT:
            return
        after = after_attempt(job.stop, Exit.REQUEUE if job.saves_on_stop else Exit.FAILURE)
        assert after.requeued and not after.backoff_s  # a preemption: straight back to the queue
        saves = job.saves_on_stop
        p = self._release(job, now, LOST_PREEMPT, saved_all=saves)
        if self.keep_starts:
            self.result.interruptions_log.append((now, job_id, "preemption"))
        job.work_left = max(0.0, job.work_left - (p.computed_s if saves else p.saved_s) * job.rate)
        job.cause = LOST_PREEMPT
        job.request = scheduling.job_request(
            job.trace, queued_at=now, host=self.policy.core.host, oracle=self._oracle
        )  # as the head requeues it
        self._dirty = True
        self._enqueue(job)

    def _on_failure(self, now: float, rate: float) -> None:
        self._push(now + self._fail_rng.expovariate(rate), _FAIL, 0, 0)
        gpu = self._fail_rng.randrange(self.spec.total_gpus)
        index = bisect_right(self._cum_gpus, gpu)
        node = self._all_nodes[index].name
        if node not in self._live:
            return  # its node is already down: no new failure (keeps the rate per live GPU)
        res = self.result
        res.node_failures += 1
        self._state.apply(NodeDown(node))
        self._nodes = self._live_nodes()
        self._up_gpus -= self._size[node]
        if node in self._drains:
            self._drained_up -= self._size[node]
        self._repairs_pending += 1
        back = self._replace(node, now)
        res.node_down_s += back
        self._push(now + back, _REPAIR, index, 0)
        self._dirty = True
        hit = [jid for jid, rj in self._running.items() if any(s.node == node for s in rj.allocation.slices)]
        for jid in hit:
            res.interruptions += 1
            self._interrupt(self._active[jid], now)

    def _replace(self, node: str, now: float) -> float:
        """After how long the failed `node`'s place is filled again: at once by a hot spare of
        its group, after the cold delay by a cold one (if that beats the repair), else after its
        repair. The spare leaves the pool until the repair is done. Why the node keeps its name:
        a spare takes its place in the racks and in the scheduler's view; which box it is does
        not matter to any job."""
        group = self._group[node]
        k = self._group_index[group.name]
        repair = self.spec.failures.repair.draw(self._repair_rng)
        pool = self._spares[k]
        use = 0 if pool[0] > 0 else 1 if pool[1] > 0 and group.spares.cold_delay_s < repair else -1
        if use < 0:
            self.result.no_spare += 1
            return repair
        pool[use] -= 1
        self.result.spare_swaps[use] += 1
        self._push(now + repair, _SPARE_BACK, k, use)
        return 0.0 if use == 0 else group.spares.cold_delay_s

    def _interrupt(self, job: SimJob, now: float) -> None:
        """A failure stopped the job: keep its work up to the last checkpoint and requeue it,
        after the head's backoff, up to `max_restarts` times (then it fails), as the live head does."""
        p = self._release(job, now, LOST_FAIL, saved_all=False)
        if self.keep_starts:
            self.result.interruptions_log.append((now, job.trace.job_id, "failure"))
        job.work_left = max(0.0, job.work_left - p.saved_s * job.rate)
        job.token += 1
        job.cause = LOST_FAIL
        limit = job.trace.max_restarts
        after = after_attempt(
            None,
            Exit.FAILURE,
            restarts=job.restarts,
            max_restarts=self.spec.failures.max_restarts if limit is None else limit,
            first_backoff_s=self.spec.failures.backoff_first_s,
            max_backoff_s=self.spec.failures.backoff_max_s,
        )
        if not after.requeued:
            self._finish(job, now, after)
            return
        job.restarts = after.restart
        self.result.restarts += 1
        wake = now + after.backoff_s
        job.request = scheduling.job_request(
            job.trace, queued_at=now, not_before=wake, host=self.policy.core.host, oracle=self._oracle
        )
        self._wake(wake)
        self._enqueue(job)

    def _on_repair(self, node_index: int) -> None:
        node = self._all_nodes[node_index]
        self._state.apply(NodeUp(node))  # repaired, or a spare in its place under its name
        self._nodes = self._live_nodes()
        self._up_gpus += len(node.gpus)
        if node.name in self._drains:
            self._drained_up += len(node.gpus)
        self._repairs_pending -= 1
        self._dirty = True

    def _live_nodes(self) -> tuple[Node, ...]:
        """The state's live nodes in the spec's order (the order placement breaks ties in, so a
        node back from repair takes its old place, not the last one)."""
        return tuple(n for n in self._all_nodes if n.name in self._live)

    # ---- time series ------------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Integrate busy and live GPU-seconds up to t, taking the samples due on the way."""
        bin_s = self.result.series.bin_s
        while self._next_sample <= t:
            self._integrate(self._next_sample)
            self._sample()
            self._next_sample += bin_s
        self._integrate(t)

    def _integrate(self, t: float) -> None:
        dt = t - self._last_t
        if dt <= 0:
            return
        res, series = self.result, self.result.series
        res.busy_gpu_s += self._busy_gpus * dt
        res.up_gpu_s += self._up_gpus * dt
        if self._drains:
            res.drained_gpu_s += self._drained_up * dt
            res.drain_idle_gpu_s += (self._drained_up - self._drain_busy) * dt
        b = int(self._last_t // series.bin_s)
        while len(series.busy_gpu_s) <= b:
            series.busy_gpu_s.append(0.0)
            series.up_gpu_s.append(0.0)
        series.busy_gpu_s[b] += self._busy_gpus * dt
        series.up_gpu_s[b] += self._up_gpus * dt
        self._last_t = t

    def _sample(self) -> None:
        series = self.result.series
        # queued as on the head: also the jobs eligibility holds back (dependencies, throttles)
        held_back = len(self._unmet) + sum(len(ids) - len(self._admitted[a]) for a, ids in self._pending.items())
        series.queued_jobs.append(len(self._queued) + held_back)
        series.running_jobs.append(len(self._running))
        series.jain.append(self._jain())

    def _jain(self) -> float:
        """Jain's index of each team's GPUs against its fair share of what it asked for.

        Fair shares are the policy's entitlements applied by weighted max-min (water-filling)
        to the live GPUs, capped by each team's demand (running + queued GPUs); NaN when the
        demand fits the cluster (no contention, nothing to be fair about)."""
        demand = [r + q for r, q in zip(self._team_running, self._team_queued, strict=True)]
        if sum(demand) <= self._up_gpus + EPS:
            return math.nan
        active = [k for k, d in enumerate(demand) if d > EPS]
        fair = water_fill(self._up_gpus, [demand[k] for k in active], [self._weights[k] for k in active])
        x = [self._team_running[k] / f for k, f in zip(active, fair, strict=True) if f > EPS]
        squares = sum(v * v for v in x)
        return sum(x) ** 2 / (len(x) * squares) if x and squares > 0 else 0.0

    def _close_series(self) -> None:
        series = self.result.series
        while len(series.queued_jobs) < len(series.busy_gpu_s):
            self._sample()
        n = len(series.queued_jobs)
        for lst in (series.busy_gpu_s, series.up_gpu_s):
            lst.extend([0.0] * (n - len(lst)))


def water_fill(capacity: float, demands: list[float], weights: list[float]) -> list[float]:
    """Weighted max-min fair shares of `capacity`, none above its demand."""
    shares = [0.0] * len(demands)
    left = list(range(len(demands)))
    cap = float(capacity)
    while left and cap > EPS:
        total_w = sum(weights[k] for k in left)
        if total_w <= 0:
            break
        per_w = cap / total_w
        sated = [k for k in left if demands[k] - shares[k] <= per_w * weights[k]]
        if not sated:
            for k in left:
                shares[k] += per_w * weights[k]
            break
        for k in sated:
            cap -= demands[k] - shares[k]
            shares[k] = demands[k]
        left = [k for k in left if k not in sated]
    return shares


def nice_bin(span_s: float) -> float:
    """A readable bin width giving at most ~1000 points over `span_s`."""
    for b in (60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400):
        if span_s / b <= 1000:
            return float(b)
    return float(30 * 86400)


def _p99_duration(jobs: list[TraceJob]) -> float:
    if not jobs:
        return 0.0
    durations = sorted(j.duration for j in jobs[:: max(1, len(jobs) // 10000)])
    return durations[int(0.99 * (len(durations) - 1))]
